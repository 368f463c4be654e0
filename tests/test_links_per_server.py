"""Links per server are bounded (issue 22): ``Limits.max_links_total`` counts the links of
every connection together, so many connections of a few thousand links each cannot add up
past it; a link past it is refused with ``amqp:resource-limit-exceeded``, and the links of a
connection that ends count no more.

Bare engines over real TCP against a real server.
"""

from __future__ import annotations

from pairlink import Limits, handler, open_server, service
from pairlink._amqp.errors import RESOURCE_LIMIT_EXCEEDED
from pairlink._amqp.performatives import Attach, Detach
from tests.service_peers import raw_client, wait_for

TOTAL = 6  # three pairs


@service("work")
class Work:
    @handler
    def ping(self) -> str:
        return "pong"


async def test_links_past_the_servers_total_are_refused_whatever_connection_they_come_on() -> None:
    limits = Limits(max_links_total=TOTAL)
    async with open_server(Work, listen="amqp://127.0.0.1:0", limits=limits) as server:
        links = server.container.links
        async with raw_client(server.url) as first:
            async with raw_client(server.url) as second:
                for name in ("a", "b"):
                    sender, _ = first.pair("work", name)
                    await first.wait_attached(sender)
                sender, _ = second.pair("work", "c")
                await second.wait_attached(sender)
                assert links.used == TOTAL
                second.pair("work", "d")  # one pair too many
                await second.read_until(lambda: len(second.of(Detach)) == 2)
                refused = second.of(Detach)
                assert all(d.closed for d in refused)
                assert {d.error.condition for d in refused if d.error} == {RESOURCE_LIMIT_EXCEEDED}
                assert all(
                    "more than 6 links on this server" in (d.error.description or "")
                    for d in refused
                    if d.error
                )
                answers = [a for a in second.of(Attach) if a.name == "d"]
                assert answers and all(
                    (a.target if a.role else a.source) is None for a in answers
                )  # null terminus: never created
                assert links.used == TOTAL
            # the second connection is gone: its links count no more, new ones are taken
            await wait_for(lambda: links.used == TOTAL - 2)
            sender, _ = first.pair("work", "e")
            await first.wait_attached(sender)
            assert not [d for d in first.of(Detach) if d.error is not None]
            assert links.used == TOTAL
