"""Fuzz findings as regression tests, and the fuzz harness kept working (fuzz/README.md).

Each input the fuzzer found failing (``tests/fuzz_cases/``, in the fuzzer's own form: a mode
byte, then the peer's bytes past that mode's stage) is replayed against a real server over TCP
on 127.0.0.1: everything the server says must pass the fuzzer's checks (frames our own decoder
reads, none after our close, no ``amqp:internal-error``), the connection must end with a close,
and the server must go on serving another client. A finding not fixed yet is
``xfail(strict=True)``, so that its fix flips it.

The rest runs the harness itself, so that ``make test`` notices when a change to the layers it
drives breaks ``make fuzz``: the committed seeds pass every target, and each check fails on what
it is there to catch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import structlog
import trio
import trio.testing

from fuzz import TARGET_NAMES, seed_folder
from fuzz.targets import (
    SERVICE,
    TARGETS,
    Failure,
    check_logged,
    errors_logged,
    peer_bytes,
    read_output,
)
from pairlink import connect, open_server
from pairlink._amqp.connection import Connection, ConnectionConfig
from pairlink._amqp.errors import INTERNAL_ERROR, NOT_ALLOWED
from pairlink._amqp.framing import AMQP_HEADER, HEARTBEAT, encode_frame
from pairlink._amqp.messaging import Error
from pairlink._amqp.performatives import Begin, Close, Open, Transfer
from pairlink._io.net import open_connection
from services.echo import Echo

CASES = Path(__file__).parent / "fuzz_cases"
REPLAY_LIMIT = 20.0
"""Seconds a replayed connection may take to end: the server answers a close at once, and
hangs up at most a second after our EOF."""


async def replay(port: int, data: bytes) -> list[Any]:
    """Be the peer of ``data`` (a fuzz input) at ``port``: send it all, then EOF; returns the
    performatives the server sent, once they pass the fuzzer's checks."""
    heard = bytearray()
    with trio.fail_after(REPLAY_LIMIT):
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            await stream.send_all(peer_bytes(data, plain=False))
            await stream.send_eof()
            while chunk := await stream.receive_some():
                heard += chunk
    return read_output(bytes(heard), messages=True)


async def assert_still_serves(url: str) -> None:
    async with connect(url) as client:
        echo = await client.service(SERVICE)
        assert await echo.echo("still here") == "still here"


# -- findings ------------------------------------------------------------------------------------


async def test_a_close_pipelined_after_requests_gets_no_frame_after_ours() -> None:
    """Found by the container target (the recorded client and Proton sessions, replayed in
    one read): a request then a close in one burst got the close answered, then the reply
    transfers after it (Part 2 §2.7.9: nothing may follow a close). Fixed while the harness
    was written; the input stays here."""
    data = (CASES / "container-transfer-after-close").read_bytes()
    async with open_server(Echo, listen="amqp://127.0.0.1:0") as server:
        frames = await replay(server.port, data)
        assert isinstance(frames[-1], Close), frames[-1]
        assert frames[-1].error is None  # the peer closed cleanly: so do we
        await assert_still_serves(server.url)


HEARTBEAT_MARK = 31.079967047048275
"""When the gateway target's timeouts last wrote to the peer (virtual seconds): 15 s later, the
heartbeat time, is a float ``t`` with ``t - HEARTBEAT_MARK < 15``."""


def _peer_open(idle_time_out_ms: int) -> bytes:
    hello = bytearray(AMQP_HEADER)
    encode_frame(hello, 0, Open(container_id="fuzz-peer", idle_time_out=idle_time_out_ms))
    return bytes(hello)


def test_a_heartbeat_falling_due_is_sent_or_scheduled_later() -> None:
    """Found by the gateway target as four ``timeout-*`` inputs, each one with a peer silent
    for 120 s: the container's end of the gateway's upstream connection owed it a heartbeat
    every 15 s, from a mark that a jittered reconnect had made fractional, and hung one run
    in five. The heartbeat check (``now - mark >= period``) and the deadline it named
    (``mark + period``) disagreed by a rounding, so at that deadline nothing was due and the
    next deadline was now: the timer task never slept again. Fixed (one comparison for both)
    while the harness was written. The engine's side: a tick at the heartbeat deadline sends
    the heartbeat or names a later deadline."""
    ours = Connection(ConnectionConfig("fuzz-server", idle_timeout=60.0), initiator=False)
    ours.receive_data(_peer_open(30_000), now=HEARTBEAT_MARK)
    ours.data_to_send(now=HEARTBEAT_MARK)  # our header and open: the last write, at the mark
    now = HEARTBEAT_MARK + 15.0
    ours.tick(now)
    sent = ours.data_to_send(now=now)
    assert ours.next_deadline is not None
    assert sent == HEARTBEAT or ours.next_deadline > now, (sent, ours.next_deadline, now)


@pytest.mark.timeout(5)  # a spinning timer is cancelled then: this runs in milliseconds
async def test_the_timer_sends_heartbeats_on_a_jumping_clock(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The symptom: the connection's timer task spins at the deadline, so virtual time never
    moves again (and a real clock runs one core flat out until it passes the deadline)."""
    autojump_clock.jump(HEARTBEAT_MARK - trio.current_time())
    while (trio.current_time() + 15.0) - trio.current_time() >= 15.0:  # land on a bad mark
        autojump_clock.jump(1e-9)
    peer, ours = trio.testing.memory_stream_pair()
    config = ConnectionConfig("fuzz-server", idle_timeout=60.0)
    async with open_connection(ours, config, initiator=False):
        await peer.send_all(_peer_open(30_000))
        heard = bytearray()
        with trio.fail_after(20):  # virtual: the heartbeat is due after 15
            while not heard.endswith(HEARTBEAT):
                heard += await peer.receive_some()
        await peer.send_eof()


# -- the harness ---------------------------------------------------------------------------------


def _seeds() -> list[Any]:
    return [
        pytest.param(target, path, id=f"{target}-{path.name}")
        for target in TARGET_NAMES
        for path in sorted(seed_folder(target).iterdir())
    ]


@pytest.mark.parametrize(("target", "seed"), _seeds())
def test_each_seed_passes_its_target(target: str, seed: Path) -> None:
    """Real sessions are fine: a failure here is a regression in pairlink (or a harness
    broken by a change to what it drives), and would stop ``make fuzz`` at its first input."""
    TARGETS[target](seed.read_bytes())


def test_the_checks_catch_a_frame_after_our_close() -> None:
    out = bytearray(AMQP_HEADER)
    encode_frame(out, 0, Close())
    read_output(bytes(out), messages=True)  # the control: a close alone is fine
    encode_frame(out, 0, Begin(next_outgoing_id=0, incoming_window=1, outgoing_window=1))
    with pytest.raises(Failure, match=r"Begin\(.*after our close"):
        read_output(bytes(out), messages=True)


def test_the_checks_catch_an_internal_error() -> None:
    for condition, fails in ((NOT_ALLOWED, False), (INTERNAL_ERROR, True)):
        out = bytearray(AMQP_HEADER)
        encode_frame(out, 0, Close(error=Error(condition, "why")))
        if fails:
            with pytest.raises(Failure, match=INTERNAL_ERROR):
                read_output(bytes(out), messages=True)
        else:
            assert read_output(bytes(out), messages=True) == [Close(error=Error(condition, "why"))]


def test_the_checks_catch_unreadable_output() -> None:
    transfer = Transfer(handle=0, delivery_id=0, delivery_tag=b"t", more=False)
    out = bytearray(AMQP_HEADER)
    encode_frame(out, 0, transfer, b"\x00\x53\x77\xa1\x05ab")  # an amqp-value string cut short
    read_output(bytes(out), messages=False)  # frames fine; the message is not looked at
    with pytest.raises(Failure, match="message we sent does not decode"):
        read_output(bytes(out), messages=True)
    with pytest.raises(Failure, match="broken frame"):
        read_output(bytes(out[:-3]), messages=False)


def test_the_checks_catch_a_logged_error_but_not_a_handlers_own() -> None:
    with errors_logged() as caught:
        log = structlog.get_logger("pairlink.test")
        log.warning("peer.backlogged")  # not an error: not even kept
        log.error("call.failed", exc_info=ValueError("the handler's own"))
        check_logged(caught)
        try:
            raise KeyError("ours")
        except KeyError as exc:
            log.error("connection.internal_error", exc_info=exc)
    assert [event["event"] for event in caught] == ["call.failed", "connection.internal_error"]
    with pytest.raises(Failure, match=r"(?s)connection\.internal_error.*KeyError: 'ours'"):
        check_logged(caught)
