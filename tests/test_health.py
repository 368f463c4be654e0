"""Health (issue 12 §5): every server answers ``$health``/``check``, ``serving`` or, through a
graceful stop, ``draining``; ``pairlink health URL`` exits 0 only for a serving server, and
its ``--timeout`` bounds everything, connecting to a silent peer included."""

from __future__ import annotations

import functools
import socket
import sys

import pytest
import trio
import trio.testing

from pairlink import handler, hosted, open_server, service
from pairlink._amqp.performatives import ROLE_RECEIVER, ROLE_SENDER
from pairlink._client.client import connect
from pairlink._client.health import DRAINING, HEALTH, SERVING, check_health
from pairlink._rpc.payload import Encoding
from pairlink._server.serving import Server
from pairlink.errors import RemoteError
from tests.service_peers import raw_client, status

WITHIN = 10  # seconds a test waits for what should come at once


@service("slow", max_concurrency=1, mailbox=1)
class Slow:
    """Holds each call until the test lets it go: its one mailbox slot stays taken."""

    def __init__(self) -> None:
        self.started = trio.Event()
        self.release = trio.Event()

    @handler
    async def hold(self) -> str:
        self.started.set()
        await self.release.wait()
        return "done"


async def _cli(*args: str) -> tuple[int, str, str]:
    """``pairlink health ARGS`` in a process of its own, as an orchestrator runs it (its
    stdout and stderr are then its own, not the serving test's logs)."""
    argv = [sys.executable, "-m", "pairlink", "health", *args]
    with trio.fail_after(WITHIN):
        done = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def test_a_serving_server_is_healthy() -> None:
    async with open_server(Slow, listen="amqp://127.0.0.1:0") as server:
        assert await _cli(server.url) == (0, "serving\n", "")
        code, out, err = await _cli(server.url, "--service", "nope")
        assert (code, out) == (1, "")
        assert "404" in err and "nope" in err


async def test_the_library_call_from_a_pairlink_client() -> None:
    async with (
        open_server(Slow, listen="amqp://127.0.0.1:0") as server,
        connect(server.url) as client,
    ):
        assert await client.call(HEALTH, "check") == {"status": SERVING}
        health = await client.service(HEALTH)
        assert await health.check("slow") == {"status": SERVING}
        with pytest.raises(RemoteError) as caught:
            await health.check("nope")
        assert caught.value.status == 404
        assert await check_health(server.url) == SERVING


async def test_any_amqp_peer_asks_with_a_plain_request_and_reply_link() -> None:
    """No pairing, an ``amqp-value`` body, the reply routed by ``reply-to`` (LP-8)."""
    async with (
        open_server(Slow, listen="amqp://127.0.0.1:0") as server,
        raw_client(server.url, desired=()) as peer,
    ):
        sender = peer.attach("probe", ROLE_SENDER, source="probe", target=HEALTH)
        receiver = peer.attach("answers", ROLE_RECEIVER, source=HEALTH, target="answers")
        peer.engine.flow(receiver, 10)
        mid, _ = peer.request(sender, "check", reply_to="answers", encoding=Encoding.AMQP_VALUE)
        reply = await peer.wait_reply(mid)
        assert status(reply) == 200
        assert reply.body == {"status": SERVING}


async def test_health_does_not_take_a_full_service_s_credit_and_says_draining_to_the_end() -> None:
    """A graceful stop with a slow call held: probes, new ones and one on a connection made
    before, see ``draining`` (exit 1) until the held call is answered and the listener closes."""
    slow = Slow()
    stop_now, stopped = trio.Event(), trio.Event()
    results: list[object] = []

    async def run_server(*, task_status: trio.TaskStatus[Server]) -> None:
        async with open_server(slow, listen="amqp://127.0.0.1:0") as server:
            task_status.started(server)
            await stop_now.wait()  # leaving the block is the graceful stop
        stopped.set()

    async with trio.open_nursery() as nursery:
        server: Server = await nursery.start(run_server)
        url = server.url
        async with connect(url) as client, connect(url) as prober:

            async def call_slow() -> None:
                results.append(await client.call("slow", "hold"))

            nursery.start_soon(call_slow)
            with trio.fail_after(WITHIN):
                await slow.started.wait()  # the service's only mailbox slot is taken
            assert await check_health(url, "slow") == SERVING

            stop_now.set()
            await trio.testing.wait_all_tasks_blocked()  # the server is draining
            assert await _cli(url) == (1, "draining\n", "")
            assert await prober.call(HEALTH, "check") == {"status": DRAINING}
            assert results == []  # the held call is still running

            slow.release.set()
            with trio.fail_after(WITHIN):
                await stopped.wait()
        assert results == ["done"]
    code, out, err = await _cli(url, "--timeout", "2")
    assert (code, out) == (1, "")
    assert "pairlink health:" in err  # refused now: the listener is closed


async def test_an_unreachable_port_fails_quickly() -> None:
    with socket.socket() as sock:  # a port nobody listens on any more
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    start = trio.current_time()
    code, out, err = await _cli(f"amqp://127.0.0.1:{port}", "--timeout", "10")
    assert (code, out) == (1, "")
    assert err.count("\n") == 1 and "pairlink health:" in err
    assert trio.current_time() - start < 5  # refused at once, long before the timeout


async def test_a_silent_peer_fails_within_the_timeout() -> None:
    """A peer that accepts the connection and never speaks: the handshake is bounded too."""
    accepted = trio.Event()

    async def silent(stream: trio.SocketStream) -> None:
        accepted.set()
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, host="127.0.0.1"), silent, 0
        )
        port = listeners[0].socket.getsockname()[1]
        start = trio.current_time()
        code, out, err = await _cli(f"amqp://127.0.0.1:{port}", "--timeout", "1")
        elapsed = trio.current_time() - start
        nursery.cancel_scope.cancel()
    assert accepted.is_set()
    assert (code, out) == (1, "")
    assert "TimeoutError" in err and err.count("\n") == 1
    assert 1 <= elapsed < 4  # the timeout, plus starting Python


async def test_a_silent_peers_timeout_does_not_show_the_password() -> None:
    async def silent(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, host="127.0.0.1"), silent, 0
        )
        port = listeners[0].socket.getsockname()[1]
        with pytest.raises(TimeoutError) as caught:
            await check_health(f"amqp://ops:s3cret@127.0.0.1:{port}", timeout=0.3)
        nursery.cancel_scope.cancel()
    assert (
        str(caught.value) == f"no health answer from amqp://ops:***@127.0.0.1:{port} within 0.3 s"
    )


async def test_no_service_may_take_the_health_address() -> None:
    with pytest.raises(ValueError, match=r"\$health"):
        async with open_server(hosted(Slow, address=HEALTH), listen="amqp://127.0.0.1:0"):
            pass
