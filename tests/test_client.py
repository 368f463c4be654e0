"""The client's behaviour over real TCP: correlation, timeouts, cancellation, connection loss,
reconnection, settlement, deadlines. Peers: a Proton paired-link server and the raw engine
server of ``tests.client_peers``, which lets each test decide when (and whether) to reply.
"""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing
from structlog.testing import capture_logs

from pairlink import connect
from pairlink._amqp import errors as conditions
from pairlink._amqp.messaging import Accepted, Error, Rejected, Released
from pairlink._amqp.performatives import SND_UNSETTLED, Attach, Close, Flow, Transfer
from pairlink._rpc import deadline, wire
from pairlink._rpc.payload import JSON, Encoding
from pairlink.errors import ConnectionLostError, RemoteError
from tests.client_peers import Incoming, RawPeer, RawServer, proton_arithmetic, raw_server
from tests.interop.proton_peers import ProtonServer


def held(server: RawServer) -> list[Incoming]:
    """Requests the tests answer themselves (``on_request`` does nothing)."""
    return server.peers[-1].incoming


def nothing(_incoming: Incoming) -> None:
    """An ``on_request`` that leaves every request for the test to answer."""


# -- interop ---------------------------------------------------------------------------------


async def test_our_client_against_a_proton_paired_link_server() -> None:
    with ProtonServer(offered_capabilities=["LINK_PAIR_V1_0"], responder=proton_arithmetic) as px:
        async with connect(px.url(), timeout=5) as client:
            calc = await client.service("calc")
            assert await calc.add(1, 2) == 3
            assert await calc.options(timeout=5).call("mul", 2.0, 4.0) == 8.0
            results: dict[int, int] = {}
            async with trio.open_nursery() as nursery:
                for i in range(100):

                    async def one(i: int = i) -> None:
                        results[i] = await calc.add(i, i)

                    nursery.start_soon(one)
            assert results == {i: 2 * i for i in range(100)}
            with pytest.raises(RemoteError) as exc:
                await calc.divide(1, 0)
            assert exc.value.status == wire.NOT_FOUND
    assert len(px.links) == 2 and not px.errors  # one pair carried all 103 calls


# -- correlation and sharing -----------------------------------------------------------------


async def test_concurrent_calls_each_get_their_own_reply_out_of_order() -> None:
    """Twenty calls wait until all have arrived; the server answers them backwards."""
    n = 20

    def reverse_when_all_came(incoming: Incoming) -> None:
        if len(incoming.peer.incoming) == n:
            for request in reversed(incoming.peer.incoming):
                request.reply(request.request.args[0] * 10)

    async with (
        raw_server(on_request=reverse_when_all_came) as server,
        connect(server.url, sasl=False, timeout=5) as client,
    ):
        results: dict[int, int] = {}
        async with trio.open_nursery() as nursery:
            for i in range(n):

                async def one(i: int = i) -> None:
                    results[i] = await client.call("calc", "times_ten", i)

                nursery.start_soon(one)
        assert results == {i: 10 * i for i in range(n)}
    peer = server.peers[0]
    ids = [incoming.request.message_id for incoming in peer.incoming]
    assert len(set(ids)) == n  # unique message-ids (a counter of the connection)
    assert len(peer.performatives(Attach)) == 2  # one pair for all of them


async def test_many_pairs_on_one_connection_each_created_once() -> None:
    async with (
        raw_server() as server,
        connect(server.url, sasl=False, timeout=5) as client,
    ):
        proxies = [await client.service(address) for address in ("a", "b", "c")]
        async with trio.open_nursery() as nursery:
            for proxy in proxies:
                for i in range(10):
                    nursery.start_soon(proxy.add, i, 1)
        assert await client.call("a", "echo", "again") == "again"
    (peer,) = server.peers
    attaches = peer.performatives(Attach)
    assert len(attaches) == 6
    assert sorted(a.target.address for a in attaches if a.target and not a.role) == ["a", "b", "c"]


async def test_reply_credit_is_granted_again_in_batches() -> None:
    async with (
        raw_server() as server,
        connect(server.url, sasl=False, timeout=5, reply_credit=10) as client,
    ):
        for i in range(100):
            assert await client.call("calc", "add", i, 1) == i + 1
    peer = server.peers[0]
    reply_handle = next(a.handle for a in peer.performatives(Attach) if a.role)  # our receiver
    flows = [f for f in peer.performatives(Flow) if f.handle == reply_handle]
    assert 15 <= len(flows) <= 25  # about one flow per 5 replies (half the credit), not 100
    assert all(f.link_credit == 10 for f in flows)


async def test_proxy_encoding_and_attribute_access() -> None:
    async with (
        raw_server() as server,
        connect(server.url, sasl=False, timeout=5) as client,
    ):
        calc = await client.service("calc", encoding=Encoding.JSON)
        assert await calc.add(1, 2) == 3
        with pytest.raises(AttributeError):
            calc._secret  # noqa: B018 - private names are not operations
        assert "calc" in repr(calc)
    request = server.peers[0].incoming[0].message
    assert request.properties is not None and request.properties.content_type == JSON


# -- errors from the service -----------------------------------------------------------------


async def test_error_reply_raises_remote_error_with_status_type_and_message() -> None:
    def fail(incoming: Incoming) -> None:
        incoming.fail(wire.INTERNAL_ERROR, "division by zero", "ZeroDivisionError")

    async with (
        raw_server(on_request=fail) as server,
        connect(server.url, sasl=False, timeout=5) as client,
    ):
        with pytest.raises(RemoteError) as exc:
            await client.call("calc", "divide", 1, 0)
    assert (exc.value.status, exc.value.type, exc.value.message) == (
        500,
        "ZeroDivisionError",
        "division by zero",
    )


# -- timeouts and cancellation ---------------------------------------------------------------


async def test_timeout_raises_and_the_late_reply_is_discarded(
    io_clock: trio.testing.MockClock,
) -> None:
    with capture_logs() as logs:
        async with (
            raw_server(on_request=nothing) as server,
            connect(server.url, sasl=False, timeout=5) as client,
        ):
            start = trio.current_time()
            with pytest.raises(TimeoutError):
                await client.call("calc", "slow", timeout=0.2)
            assert trio.current_time() - start == pytest.approx(0.2)
            assert client.in_flight("calc") == 0
            (late,) = held(server)
            late.reply("too late")

            async def answer_next() -> None:
                await server.peers[0].wait_for(Transfer, 2)
                held(server)[1].reply("in time")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(answer_next)
                assert await client.call("calc", "fast") == "in time"
            assert client.late_replies == 1
    (line,) = [entry for entry in logs if entry["event"] == "call.late_reply"]
    assert line["log_level"] == "debug"
    assert line["correlation_id"] == late.request.message_id
    assert line["address"] == "calc" and line["link"].startswith("pair-")


async def test_timeout_includes_waiting_for_credit(io_clock: trio.testing.MockClock) -> None:
    """A service that grants no more credit pushes back; the caller's timeout still holds."""
    async with (
        raw_server(credit=1) as server,
        connect(server.url, sasl=False, timeout=5) as client,
    ):
        assert await client.call("calc", "add", 1, 2) == 3  # the pipelined first request
        start = trio.current_time()
        with pytest.raises(TimeoutError):
            await client.call("calc", "add", 1, 2, timeout=0.2)
        assert trio.current_time() - start == pytest.approx(0.2)
    assert len(server.peers[0].incoming) == 1  # the second request never left


async def test_cancelled_caller_frees_its_slot(io_clock: trio.testing.MockClock) -> None:
    async with (
        raw_server(on_request=nothing) as server,
        connect(server.url, sasl=False, timeout=5) as client,
    ):
        with trio.move_on_after(0.2) as scope:
            await client.call("calc", "hang")
        assert scope.cancelled_caught
        assert client.in_flight("calc") == 0
        held(server)[0].reply("nobody waits")

        async def answer_second() -> None:
            await server.peers[0].wait_for(Transfer, 2)
            held(server)[1].reply(2)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(answer_second)
            assert await client.call("calc", "two") == 2
        assert client.late_replies == 1


# -- deadlines -------------------------------------------------------------------------------


async def test_deadline_travels_with_the_request(io_clock: trio.testing.MockClock) -> None:
    """On a clock that stands still, each deadline is exactly the timeout from now (to the
    millisecond that the wire's expiry time and ttl carry)."""
    async with (
        raw_server() as server,
        connect(server.url, sasl=False, timeout=7) as client,
    ):
        before = deadline.wall_time()
        assert await client.call("calc", "add", 1) == 1  # the connection's default
        assert await client.call("calc", "add", 2, timeout=3) == 2  # the call's own
        assert await client.call("calc", "add", 3, timeout=math.inf) == 3  # none at all
    first, second, third = (i.request for i in server.peers[0].incoming)
    assert first.deadline == pytest.approx(before + 7, abs=0.001)
    ttl = first.message.header.ttl if first.message.header else None
    assert ttl is not None and 6999 <= ttl <= 7000
    assert second.deadline == pytest.approx(before + 3, abs=0.001)
    assert third.deadline is None and third.message.header is None


async def test_deadline_of_the_served_call_cuts_the_inner_calls_timeout(
    io_clock: trio.testing.MockClock,
) -> None:
    async with (
        raw_server() as server,
        connect(server.url, sasl=False, timeout=30) as client,
    ):
        outer = deadline.wall_time() + 0.5
        with deadline.serving(outer):
            assert await client.call("calc", "add", 1, timeout=10) == 1
        with deadline.serving(deadline.wall_time() - 1), pytest.raises(TimeoutError):
            await client.call("calc", "add", 2)  # already too late: nothing is sent
    (request,) = (i.request for i in server.peers[0].incoming)
    assert request.deadline == pytest.approx(outer, abs=0.001)


# -- settlement ------------------------------------------------------------------------------


async def test_unsettled_requests_get_the_services_disposition() -> None:
    def outcome(incoming: Incoming) -> object:
        operation = incoming.request.operation
        if operation == "missing":
            return Rejected(error=Error(condition=conditions.NOT_FOUND, description="no node"))
        if operation == "busy":
            return Released()
        return Accepted()

    def reply_if_accepted(incoming: Incoming) -> None:
        if incoming.request.operation == "add":
            incoming.reply(sum(incoming.request.args))

    async with (
        raw_server(outcome=outcome, on_request=reply_if_accepted) as server,
        connect(server.url, sasl=False, timeout=5, settled=False) as client,
    ):
        assert await client.call("calc", "add", 1, 2) == 3
        with pytest.raises(RemoteError) as rejected:
            await client.call("calc", "missing")
        with pytest.raises(RemoteError) as released:
            await client.call("calc", "busy")
    assert (rejected.value.status, rejected.value.type) == (404, conditions.NOT_FOUND)
    assert rejected.value.message == "no node"
    assert released.value.status == wire.UNAVAILABLE
    peer = server.peers[0]
    assert all(not t.settled for t in peer.performatives(Transfer))
    assert all(a.snd_settle_mode == SND_UNSETTLED for a in peer.performatives(Attach))


# -- connection loss and reconnection --------------------------------------------------------


async def test_connection_loss_fails_every_call_in_flight_at_once() -> None:
    n = 10
    async with (
        raw_server(on_request=nothing) as server,
        connect(server.url, sasl=False, timeout=30, reconnect=False) as client,
    ):
        errors: list[BaseException] = []
        ended: list[float] = []

        async def one() -> None:
            try:
                await client.call("calc", "hang")
            except ConnectionLostError as exc:
                errors.append(exc)
                ended.append(trio.current_time())

        async with trio.open_nursery() as nursery:
            for _ in range(n):
                nursery.start_soon(one)
            await server.connected.wait()
            await server.peers[0].wait_for(Transfer, n)
            lost_at = trio.current_time()
            await server.peers[0].abort()
        assert len(errors) == n
        assert max(ended) - lost_at < 1  # at once, not at their 30 s timeout
        with pytest.raises(ConnectionLostError):  # reconnect=False: the client is done
            await client.call("calc", "add", 1)


async def test_reconnect_re_pairs_for_new_calls() -> None:
    async with (
        raw_server() as server,
        connect(server.url, sasl=False, timeout=5, reconnect=True) as client,
    ):
        assert await client.call("calc", "add", 1, 1) == 2
        await server.peers[0].abort()
        await client.wait_connection_lost()
        with trio.fail_after(5):
            assert await client.call("calc", "add", 2, 2) == 4
        assert len(server.peers) == 2
        assert len(server.peers[1].performatives(Attach)) == 2  # paired again


async def test_reconnect_backs_off_until_the_server_is_back(
    io_clock: trio.testing.MockClock,
) -> None:
    server = RawServer()
    listening = trio.CancelScope()

    async def listen_until_cancelled(task_status: trio.TaskStatus[None]) -> None:
        with listening:
            await server.run(task_status=task_status)

    async def listen_again_after(delay: float) -> None:
        await trio.sleep(delay)
        await server.run()  # the same port

    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await nursery.start(listen_until_cancelled)
            async with connect(
                server.url, sasl=False, timeout=10, reconnect=True, retry_delay=0.05
            ) as client:
                assert await client.call("calc", "add", 1, 1) == 2
                listening.cancel()  # the server goes away, its connection with it
                await client.wait_connection_lost()
                start = trio.current_time()
                nursery.start_soon(listen_again_after, 0.6)
                assert await client.call("calc", "add", 2, 2) == 4
                assert trio.current_time() - start >= 0.6
            nursery.cancel_scope.cancel()
    delays = [e["retry_in"] for e in logs if e["event"] == "client.reconnect_failed"]
    assert len(delays) >= 3
    assert delays[0] <= 0.05 and max(delays) <= 5.0
    assert delays[2] > delays[0]  # exponential, despite the jitter (each in [d/2, d])


async def test_connect_failure_is_raised_at_once() -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    await listeners[0].aclose()  # nothing listens there now
    with pytest.raises(OSError):
        async with connect(f"amqp://127.0.0.1:{port}", reconnect=True):
            pass


async def test_user_errors_in_the_block_come_out_bare() -> None:
    async with raw_server() as server:
        with pytest.raises(KeyError):
            async with connect(server.url, sasl=False):
                raise KeyError("mine")


# -- waiting for credit ----------------------------------------------------------------------


async def test_calls_wait_for_credit_in_turn_and_leaving_ones_pass_it_on() -> None:
    """A service granting one credit at a time: queued calls get it first come first served;
    a call that gives up while queued leaves the queue, and one woken for credit that is
    cancelled before it could send hands that credit to the next in line."""
    async with (
        raw_server(credit=1, on_request=nothing) as server,
        connect(server.url, sasl=False, timeout=5) as client,
    ):
        results: list[str] = []

        async def call(name: str, scope: trio.CancelScope | None = None) -> None:
            with scope or trio.CancelScope():
                results.append(await client.call("calc", name))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call, "a")  # pipelined: uses the one credit
            peer = await _first_peer(server)
            await peer.wait_for(Transfer, 1)
            await trio.testing.wait_all_tasks_blocked()
            # white box: the race below is staged inside the pair's sender, which no public
            # surface reaches
            pair = client._conn.pairs["calc"] if client._conn else None
            assert pair is not None and pair.sender.link.link_credit == 0
            quitter = trio.CancelScope()
            woken_quitter = trio.CancelScope()
            for name, scope in (("b", quitter), ("c", woken_quitter), ("d", None)):
                nursery.start_soon(call, name, scope)
                await trio.testing.wait_all_tasks_blocked()
            quitter.cancel()  # b gives up while queued
            await trio.testing.wait_all_tasks_blocked()
            assert pair.sender.waiting == 2
            # c gives up, and before it has run, one credit comes and wakes it: it must hand
            # that credit to d (the server's flow frame goes out after the fact)
            woken_quitter.cancel()
            peer.engine.flow(peer.incoming[0].link, 1)
            # what our reader does when that flow arrives, done now, before c has run
            pair.sender.link.link_credit = 1
            pair.sender.end.owner.link_flowed(pair.sender.end)
            peer.kick()
            await peer.wait_for(Transfer, 2)
            for incoming in peer.incoming:
                incoming.reply(incoming.request.operation)
        assert sorted(results) == ["a", "d"]
        assert [i.request.operation for i in peer.incoming] == ["a", "d"]
        assert pair.sender.waiting == 0


async def _first_peer(server: RawServer) -> RawPeer:
    await server.connected.wait()
    return server.peers[0]


async def test_a_call_right_after_a_protocol_violation_raises_connection_lost() -> None:
    """The peer broke the protocol and our close is on its way, but the socket is still
    open: a call that needs a new pair fails as ConnectionLostError (with the condition),
    not as an engine-internal error."""
    async with (
        raw_server() as server,
        connect(server.url, sasl=False, timeout=5, reconnect=False) as client,
    ):
        assert await client.call("a", "echo", 1) == 1
        (peer,) = server.peers
        await peer.stream.send_all(b"\x00\x00\x00\x08\x02\x09\x00\x00")  # frame type 9
        with trio.fail_after(5):
            await peer.wait_for(Close)  # our answer: the violation is known, the socket open
        with pytest.raises(ConnectionLostError) as exc:
            await client.call("b", "echo", 2)
        assert exc.value.condition == "amqp:connection:framing-error"
