"""The blocking client: plain threads, and processes forked from a parent that uses it."""

from __future__ import annotations

import multiprocessing
import os
import queue
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from proton import Message as ProtonMessage

from pairlink._client import blocking
from pairlink.errors import ConnectionLostError, RemoteError
from tests.client_peers import proton_arithmetic
from tests.interop.proton_peers import ProtonServer

FORK_WARNING = "ignore:This process.*is multi-threaded:DeprecationWarning"
"""Python 3.12+ warns when a process with threads forks. Forking such a process is exactly
what Spark and multiprocessing do to the code this module is for, and what is tested here."""


def paired_server() -> ProtonServer:
    return ProtonServer(offered_capabilities=["LINK_PAIR_V1_0"], responder=proton_arithmetic)


def test_blocking_calls_from_many_threads() -> None:
    with paired_server() as px, blocking.connect(px.url(), timeout=5) as client:
        calc = client.service("calc")
        assert calc.add(1, 2) == 3
        assert calc.call("mul", 3, 4) == 12
        assert client.call("calc", "echo", "direct") == "direct"
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda i: calc.add(i, i), range(200)))
        assert results == [2 * i for i in range(200)]
        assert "calc" in repr(calc)
    assert len(px.connections) == 1  # every thread shared the one connection


def test_blocking_errors_are_raised_in_the_calling_thread() -> None:
    with paired_server() as px, blocking.connect(px.url(), timeout=5) as client:
        calc = client.service("calc")
        with pytest.raises(RemoteError) as exc:
            calc.missing()
        assert exc.value.status == 404
        with pytest.raises(TimeoutError):
            calc.options(timeout=0.2).call("hang")
        with pytest.raises(AttributeError):
            calc._private  # noqa: B018 - private names are not operations
    with pytest.raises(ConnectionLostError):
        client.call("calc", "add", 1)  # closed
    client.close()  # idempotent


def test_blocking_request_returns_the_whole_reply() -> None:
    def answer(request: ProtonMessage) -> ProtonMessage:
        return ProtonMessage(
            body={"got": request.body},
            subject="201",
            correlation_id=request.correlation_id,  # the caller's own, as Proton examples do
            properties={"seen-subject": request.subject, **(request.properties or {})},
        )

    with (
        ProtonServer(offered_capabilities=["LINK_PAIR_V1_0"], responder=answer) as px,
        blocking.connect(px.url(), timeout=5) as client,
    ):
        reply = client.request(
            "mgmt",
            b"\x00ab",
            body_kind="data",
            subject="PUT",
            to="/things/1",
            application_properties={"k": "v"},
            message_id="m-1",
            correlation_id="c-1",
            content_type="application/octet-stream",
        )
        with ThreadPoolExecutor(4) as pool:
            bodies = list(pool.map(lambda i: client.request("mgmt", i).body, range(20)))
    assert reply.status == 201 and reply.subject == "201" and reply.outcome is None
    assert reply.body == {"got": b"\x00ab"}
    assert reply.application_properties == {"seen-subject": "PUT", "k": "v"}
    assert bodies == [{"got": i} for i in range(20)]
    request = px.received[0].message
    assert (request.id, request.correlation_id, request.address) == ("m-1", "c-1", "/things/1")


def test_blocking_connect_fails_at_once() -> None:
    with ProtonServer() as px:
        url = px.url()
    with pytest.raises(OSError):
        blocking.connect(url)


def use_after_fork(client: blocking.Client, url: str, results: Any) -> None:
    """In the child: the parent's client (which must open its own connection here) and a
    client of the child's own."""
    results.put(("inherited", client.call("calc", "add", 1, 2), os.getpid()))
    with blocking.connect(url, timeout=5) as own:
        results.put(("own", own.call("calc", "mul", 2, 5), os.getpid()))
    client.close()  # closes the child's connection, never the parent's


def close_after_fork(client: blocking.Client) -> None:
    client.close()  # nothing of the child's to close; the parent's socket is left alone


@pytest.mark.filterwarnings(FORK_WARNING)
def test_blocking_client_used_in_a_forked_child() -> None:
    context = multiprocessing.get_context("fork")
    with paired_server() as px, blocking.connect(px.url(), timeout=5) as client:
        assert client.call("calc", "add", 1, 1) == 2  # the parent's thread and socket exist
        results: multiprocessing.Queue[tuple[str, int, int]] = context.Queue()
        children = [
            context.Process(target=use_after_fork, args=(client, px.url(), results)),
            context.Process(target=close_after_fork, args=(client,)),
        ]
        for child in children:
            child.start()
            child.join(30)
        assert [child.exitcode for child in children] == [0, 0]
        got: dict[str, int] = {}
        for _ in range(2):
            try:
                name, value, pid = results.get(timeout=5)
            except queue.Empty:
                pytest.fail(f"the child reported only {got}")
            assert pid == children[0].pid
            got[name] = value
        assert got == {"inherited": 3, "own": 10}
        assert client.call("calc", "add", 2, 2) == 4  # the parent's connection is intact
    assert len(px.connections) == 3  # the parent's, and two of the child's own
