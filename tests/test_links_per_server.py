"""Links per server are bounded (issue 22): ``Limits.max_links_total`` counts the links of
every connection together, so many connections of a few thousand links each cannot add up
past it; a link past it is refused with ``amqp:resource-limit-exceeded``, and the links of a
connection that ends count no more. Inside it, one user holds half at most, and the last
``max_links_total // RESERVE_DIVISOR`` are kept for connections holding few links, so one party
cannot lock the others out.

Bare engines over real TCP against a real server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from pairlink import Limits, handler, open_server, service
from pairlink._amqp.errors import RESOURCE_LIMIT_EXCEEDED
from pairlink._amqp.performatives import Attach, Detach
from pairlink._amqp.sasl import SaslClient
from pairlink._server.link_budget import FEW_LINKS, RESERVE_DIVISOR
from pairlink._server.serving import Server
from tests.service_peers import RawClient, raw_client, wait_for

USERS = {name: f"{name}-pw" for name in ("alice", "bob", "carol")}


@service("work")
class Work:
    @handler
    def ping(self) -> str:
        return "pong"


@asynccontextmanager
async def served(total: int) -> AsyncIterator[Server]:
    limits = Limits(max_links_total=total)
    async with open_server(Work, listen="amqp://127.0.0.1:0", limits=limits, users=USERS) as s:
        yield s


def as_user(server: Server, name: str) -> AbstractAsyncContextManager[RawClient]:
    return raw_client(server.url, sasl=SaslClient.plain(name, USERS[name]))


async def pairs(client: RawClient, *names: str) -> None:
    for name in names:
        sender, _ = client.pair("work", name)
        await client.wait_attached(sender)
    assert not [d for d in client.of(Detach) if d.error is not None]


async def refused(client: RawClient, name: str) -> str:
    """Pair ``name``, expecting both halves refused (null terminus, never created): the
    refusal's description."""
    before = len(client.of(Detach))
    client.pair("work", name)
    await client.read_until(lambda: len(client.of(Detach)) == before + 2)
    detaches = client.of(Detach)[before:]
    assert all(d.closed and d.error is not None for d in detaches)
    assert {d.error.condition for d in detaches if d.error} == {RESOURCE_LIMIT_EXCEEDED}
    answers = [a for a in client.of(Attach) if a.name == name]
    assert answers and all((a.target if a.role else a.source) is None for a in answers)
    (why,) = {d.error.description for d in detaches if d.error}
    assert isinstance(why, str)
    return why


async def test_links_past_the_servers_total_are_refused_whatever_connection_they_come_on() -> None:
    async with served(8) as server:
        links = server.container.links
        async with as_user(server, "alice") as alice:
            await pairs(alice, "a", "b")
            async with as_user(server, "bob") as bob:
                await pairs(bob, "c", "d")
                assert links.used == 8
                assert await refused(bob, "e") == "more than 8 links on this server"
                assert links.used == 8
            # bob's connection is gone: its links count no more, new ones are taken
            await wait_for(lambda: links.used == 4)
            async with as_user(server, "carol") as carol:
                await pairs(carol, "f")
                assert links.used == 6


async def test_one_user_holds_half_of_the_servers_links_at_most() -> None:
    """Connections of many links are held to their user's share; one of a few links (a
    client's pairs) is not."""
    total = 128
    share = total // 2
    per = FEW_LINKS // 2  # pairs: FEW_LINKS links, a connection of many
    async with (
        served(total) as server,
        as_user(server, "alice") as first,
        as_user(server, "alice") as second,  # the same user on another connection
    ):
        await pairs(first, *(f"a{i}" for i in range(2 * per)))
        await pairs(second, *(f"b{i}" for i in range(2 * per)))
        assert server.container.links.by_user["alice"] == share
        why = await refused(second, "b-more")
        assert why == f"'alice' hold {share} links, their share of this server's {total}"
        async with as_user(server, "alice") as few:
            await pairs(few, "c")  # a client's pair is not a swarm
        async with as_user(server, "bob") as bob:
            await pairs(bob, *(f"d{i}" for i in range(per + 1)))


async def test_the_last_links_are_kept_for_connections_holding_few() -> None:
    total = 64
    reserve = total // RESERVE_DIVISOR
    async with served(total) as server:
        links = server.container.links
        async with as_user(server, "alice") as alice, as_user(server, "bob") as bob:
            await pairs(alice, *(f"a{i}" for i in range(15)))
            await pairs(bob, *(f"b{i}" for i in range(16)))
            assert links.used == total - reserve  # each far past FEW_LINKS, under its share
            assert len(alice.of(Attach)) >= FEW_LINKS  # the server answered each link
            why = await refused(alice, "a-more")
            assert why == (
                f"this server's links are taken but for the last {reserve}, kept for "
                f"connections holding fewer than {FEW_LINKS}"
            )
            async with as_user(server, "carol") as carol:  # a new caller still pairs
                await pairs(carol, "c0")
                assert links.used == total
