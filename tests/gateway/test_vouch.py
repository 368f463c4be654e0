"""Issue 22: a gateway vouches for the caller it carries (``pairlink:caller`` on its upstream
attach), and a service believes it only from users it trusts to vouch (``vouching_users``).

Real servers and gateways on 127.0.0.1: a deduplicating service that answers who called
(``current_call().user`` and ``.via``), gateways in front of it, our client through them, and
hand-made pairs for claims no honest client makes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from structlog.testing import capture_logs

from pairlink import connect, current_call, handler, open_server, service
from pairlink._amqp import errors as conditions
from pairlink._amqp.types import Fields
from pairlink._io import net
from pairlink._io.links import open_receiver, open_sender
from pairlink._rpc import wire
from pairlink._rpc.caller import CALLER, MAX_NAME, MAX_VIA, Identity, InvalidClaim, judge_caller
from pairlink._rpc.deadline import wall_time
from pairlink._rpc.linkpair import paired_properties
from pairlink.errors import LinkDetachedError
from pairlink.gateway import Gateway, GatewayConfig, Route, open_gateway
from tests.gateway.chain import LOOPBACK, routed_request
from tests.test_cli_serve import PAIRLINK
from tests.test_client_cli import Served

PASSWORDS = {
    "alice": "a-secret",
    "bob": "b-secret",
    "gw": "gw-secret",  # the front gateway's user upstream
    "gw2": "gw2-secret",  # the second gateway's, in a chain
    "mallory": "m-secret",  # a user of the service, not trusted to vouch
}


def users(*names: str) -> dict[str, str]:
    return {name: PASSWORDS[name] for name in names}


def url_as(url: str, user: str) -> str:
    return url.replace("amqp://", f"amqp://{user}:{PASSWORDS[user]}@")


@service("who", dedup_window=60)
class Who:
    """Says who called, and counts how often it ran: a kept reply runs nothing."""

    def __init__(self) -> None:
        self.runs = 0

    @handler
    def whoami(self, note: str) -> list[Any]:
        self.runs += 1
        call = current_call()
        return [call.user, list(call.via), note]


@attrs.define
class Hops:
    who: Who
    service_url: str
    front: Gateway  # where callers connect


def gateway_config(upstream: str, user: str, inbound: dict[str, str], **more: Any) -> GatewayConfig:
    route = Route("who", upstream, "who", user=user, password=PASSWORDS[user])
    return GatewayConfig(
        listen=f"amqp://{LOOPBACK}:0", routes=(route,), users=inbound, attach_timeout=5, **more
    )


@asynccontextmanager
async def hops(*, chain: bool = False, second_trusts_first: bool = True) -> AsyncIterator[Hops]:
    """The service (trusting "gw", or "gw2" with ``chain``) behind one gateway (alice and bob
    log in there, it logs in upstream as "gw"), or behind two: the front one, then one whose
    peer is "gw" (trusted to vouch if ``second_trusts_first``) and that logs in as "gw2"."""
    who = Who()
    voucher = "gw2" if chain else "gw"
    async with (
        open_server(
            who,
            listen=f"amqp://{LOOPBACK}:0",
            users=users(voucher, "mallory"),
            vouching_users={voucher},
        ) as server,
        trio.open_nursery() as nursery,
    ):
        upstream = server.url
        if chain:
            trusted = frozenset({"gw"}) if second_trusts_first else frozenset()
            config = gateway_config(upstream, "gw2", users("gw"), vouching_users=trusted)
            second = await nursery.start(_run, config)
            upstream = second.url
        front = await nursery.start(_run, gateway_config(upstream, "gw", users("alice", "bob")))
        yield Hops(who, server.url, front)
        nursery.cancel_scope.cancel()


async def _run(config: GatewayConfig, *, task_status: trio.TaskStatus[Gateway]) -> None:
    async with open_gateway(config) as gateway:
        task_status.started(gateway)
        await trio.sleep_forever()


async def whoami_claiming(
    url: str, claim: object, note: str, message_id: str = "m-1", name: str = "claiming"
) -> Any:
    """``whoami(note)`` on a hand-made pair whose attaches carry ``claim`` as
    ``pairlink:caller`` (what no client of ours sends): the reply's value."""
    properties: Fields = {**paired_properties(), CALLER: claim}
    async with net.connect(url) as conn:
        sender = open_sender(conn, "who", name=name, source_address=name, properties=properties)
        receiver = open_receiver(
            conn, "who", name=name, target_address=name, properties=properties, credit=1
        )
        request = wire.request_message(
            "whoami", [note], {}, message_id=message_id, now=wall_time(), timeout=10
        )
        with trio.fail_after(10):
            await sender.send(request, settled=True)
            return wire.parse_reply((await receiver.receive()).message)


# -- through a gateway ------------------------------------------------------------------------


async def test_two_users_behind_one_gateway_keep_their_own_replies() -> None:
    async with (
        hops() as setup,
        connect(url_as(setup.front.url, "alice")) as alice,
        connect(url_as(setup.front.url, "bob")) as bob,
    ):
        # the same message-id and the same call: each gets their own answer, none the other's
        assert await alice.call("who", "whoami", "x", message_id="m-1") == ["alice", ["gw"], "x"]
        assert await bob.call("who", "whoami", "x", message_id="m-1") == ["bob", ["gw"], "x"]
        # the same id for different calls: two callers' own ids, not a conflict (no 409)
        assert await bob.call("who", "whoami", "b", message_id="m-2") == ["bob", ["gw"], "b"]
        assert await alice.call("who", "whoami", "a", message_id="m-2") == ["alice", ["gw"], "a"]
        assert setup.who.runs == 4
        # a true repeat, through the gateway, is still answered from the store
        assert await alice.call("who", "whoami", "x", message_id="m-1") == ["alice", ["gw"], "x"]
        assert setup.who.runs == 4


async def test_the_gateway_vouches_for_its_peer_never_for_whom_the_peer_claims() -> None:
    async with hops() as setup, connect(url_as(setup.front.url, "alice")) as alice:
        assert await alice.call("who", "whoami", "x", message_id="m-1") == ["alice", ["gw"], "x"]
        with capture_logs() as logs:
            got = await whoami_claiming(url_as(setup.front.url, "bob"), ["alice"], "x")
        assert got == ["bob", ["gw"], "x"]  # bob's own call, run as his: not alice's reply
        assert setup.who.runs == 2
    ignored = [e for e in logs if e["event"] == "caller.claim_ignored"]
    assert [(e["log_level"], e["user"], e["name"]) for e in ignored] == [
        ("debug", "bob", "claiming")
    ]


async def test_a_claim_from_a_user_not_trusted_to_vouch_is_ignored() -> None:
    async with hops() as setup, connect(url_as(setup.front.url, "alice")) as alice:
        assert await alice.call("who", "whoami", "x", message_id="m-1") == ["alice", ["gw"], "x"]
        mallory = url_as(setup.service_url, "mallory")  # straight to the service
        with capture_logs() as logs:
            assert await whoami_claiming(mallory, ["alice"], "x") == ["mallory", [], "x"]
            assert await whoami_claiming(mallory, ["alice", "gw"], "x") == ["mallory", [], "x"]
        assert setup.who.runs == 2  # mallory's first call ran; her second is her own repeat
    ignored = [e for e in logs if e["event"] == "caller.claim_ignored"]
    assert [(e["log_level"], e["user"]) for e in ignored] == [("debug", "mallory")] * 2


async def test_gateways_in_a_chain_compose_when_the_second_trusts_the_first() -> None:
    async with hops(chain=True) as setup, connect(url_as(setup.front.url, "alice")) as alice:
        assert await alice.call("who", "whoami", "x") == ["alice", ["gw", "gw2"], "x"]
    # not trusted: the second gateway vouches for the first, its peer, as for any user
    async with (
        hops(chain=True, second_trusts_first=False) as setup,
        connect(url_as(setup.front.url, "alice")) as alice,
    ):
        assert await alice.call("who", "whoami", "x") == ["gw", ["gw2"], "x"]


@pytest.mark.parametrize(
    "claim",
    [
        "alice",  # not a list
        [],
        ["alice", ""],
        ["a" * (MAX_NAME + 1)],
        ["alice", *["gw"] * MAX_VIA],  # one gateway more than MAX_VIA
        [None, 7],
    ],
)
async def test_a_malformed_claim_of_a_trusted_user_refuses_the_link(claim: object) -> None:
    async with hops() as setup:
        with pytest.raises(LinkDetachedError) as refused:
            await whoami_claiming(url_as(setup.service_url, "gw"), claim, "x")
    assert refused.value.condition == conditions.INVALID_FIELD
    assert setup.who.runs == 0


async def test_the_routing_node_vouches_for_its_peer_too() -> None:
    name = "routing-pair"
    async with hops() as setup, net.connect(url_as(setup.front.url, "bob")) as conn:
        properties: Fields = {**paired_properties(), CALLER: ["alice"]}
        sender = open_sender(conn, None, name=name, source_address=name, properties=properties)
        receiver = open_receiver(
            conn, None, name=name, target_address=name, properties=properties, credit=1
        )
        with trio.fail_after(10):
            await sender.send(routed_request(0, "who", "whoami"), settled=True)
            reply = wire.parse_reply((await receiver.receive()).message)
    assert reply == ["bob", ["gw"], "routed-0"]


# -- pairlink serve --config ------------------------------------------------------------------

WHO_MODULE = """
from pairlink import current_call, handler, service

@service("who")
class Who:
    @handler
    def whoami(self, note):
        call = current_call()
        return [call.user, list(call.via), note]
"""

SERVE_TOML = """
listen = "amqp://127.0.0.1:0"

[users.gw]
password_env = "PAIRLINK_TEST_GW"
vouches = true

[users.mallory]
password_env = "PAIRLINK_TEST_MALLORY"

[[service]]
module = "whomodule"
"""


async def test_serve_config_names_the_users_trusted_to_vouch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "whomodule.py").write_text(WHO_MODULE)
    (tmp_path / "serve.toml").write_text(SERVE_TOML)
    monkeypatch.setenv("PAIRLINK_TEST_GW", PASSWORDS["gw"])
    monkeypatch.setenv("PAIRLINK_TEST_MALLORY", PASSWORDS["mallory"])
    with Served("--config", str(tmp_path / "serve.toml"), program=PAIRLINK, cwd=tmp_path) as served:
        url = await trio.to_thread.run_sync(served.url)
        assert await whoami_claiming(url_as(url, "gw"), ["alice"], "x") == ["alice", ["gw"], "x"]
        assert await whoami_claiming(url_as(url, "mallory"), ["alice"], "x") == [
            "mallory",
            [],
            "x",
        ]


# -- the rule itself -------------------------------------------------------------------------


def test_a_claim_is_believed_only_from_a_vouching_user_and_extends_via() -> None:
    trusted = {"gw"}
    assert judge_caller("alice", None, trusted) == (Identity("alice"), False)
    assert judge_caller("alice", {CALLER: ["bob"]}, trusted) == (Identity("alice"), True)
    assert judge_caller(None, {CALLER: ["bob"]}, trusted) == (Identity(None), True)
    assert judge_caller("gw", {}, trusted) == (Identity("gw"), False)  # the gateway's own call
    assert judge_caller("gw", {CALLER: ["bob"]}, trusted) == (Identity("bob", ("gw",)), False)
    anonymous = judge_caller("gw", {CALLER: [None, "g0"]}, trusted)
    assert anonymous == (Identity(None, ("g0", "gw")), False)
    with pytest.raises(InvalidClaim):
        judge_caller("gw", {CALLER: ["bob", *["g"] * MAX_VIA]}, trusted)
    longest = judge_caller("gw", {CALLER: ["bob", *["g"] * (MAX_VIA - 1)]}, trusted)
    assert len(longest[0].via) == MAX_VIA
    assert Identity("bob", ("gw",)).properties() == {CALLER: ["bob", "gw"]}
