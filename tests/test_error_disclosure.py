"""What a caller learns of a failure: what the service chose to tell, nothing else (issue 9 §7).

An unexpected exception's text may hold secrets (a password in a connection string, an internal
host): the caller gets a 500 naming only a reference id, the server logs the traceback under
that id. A ``CallError`` and the exception types a service or handler declares keep their type
and message; ``debug_errors`` turns the detail on. Served over real TCP, directly and through the
GN -> GO -> CO gateway chain, where the secret must not cross a single hop.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator, MutableMapping
from typing import Any

import pytest
import trio
from structlog.testing import capture_logs

from pairlink import connect, handler, hosted, open_server, service
from pairlink._server.serving import Server
from pairlink.errors import CallError, RemoteError
from tests.gateway.chain import INTERNAL, LOOPBACK, PUBLIC, open_chain

URL = f"amqp://{LOOPBACK}:0"
PASSWORD = "hunter2-7e1d"
HOST = "10.9.8.7"
SECRET = f"connect failed: db-password={PASSWORD} host {HOST}:5432"


class QuotaExceeded(PermissionError):
    """A subclass of a declared type: declared too, as ``except`` would see it."""


@service("leaky", expose_errors=(PermissionError,))
class Leaky:
    @handler
    async def connect_db(self) -> None:
        raise RuntimeError(SECRET)

    @handler
    def connect_db_sync(self) -> None:
        raise RuntimeError(SECRET)

    @handler(expose_errors=ValueError)
    async def parse(self, text: str) -> int:
        return int(text)  # ValueError: declared by this handler

    @handler
    async def parse_undeclared(self, text: str) -> int:
        return int(text)  # the same ValueError, not declared here

    @handler
    async def quota(self) -> None:
        raise QuotaExceeded("over quota: 10 calls a minute")

    @handler
    async def conflict(self) -> None:
        raise CallError(409, "already there", "Conflict")

    @handler
    async def add(self, a: int, b: int) -> int:
        return a + b


@service("chatty", debug_errors=True)
class Chatty(Leaky):
    """The same handlers, served in debug mode."""


REF = re.compile(r"[0-9a-f]{12}")
Logs = list[MutableMapping[str, Any]]


def undisclosed(exc: RemoteError) -> str:
    """Assert ``exc`` is an undisclosed 500, and return its reference id."""
    ref = exc.ref
    assert ref is not None and REF.fullmatch(ref)
    assert (exc.status, exc.type, exc.message) == (500, None, f"internal error (ref {ref})")
    return ref


def logged(logs: Logs, ref: str) -> MutableMapping[str, Any]:
    """The one log entry under ``ref``."""
    (entry,) = [e for e in logs if e.get("ref") == ref]
    return entry


@pytest.fixture
def logs() -> Iterator[Logs]:
    with capture_logs() as entries:
        yield entries


@pytest.fixture
async def server(logs: Logs) -> AsyncIterator[Server]:
    async with open_server(Leaky, Chatty, listen=URL, grace=1) as s:
        yield s


@pytest.mark.parametrize("operation", ["connect_db", "connect_db_sync"])
async def test_an_unexpected_exception_reaches_the_log_not_the_caller(
    server: Server, logs: Logs, operation: str
) -> None:
    async with connect(server.url, timeout=5) as client:
        with pytest.raises(RemoteError) as exc:
            await client.call("leaky", operation)
        again = await client.call("leaky", "add", 1, 2)  # the service goes on
    ref = undisclosed(exc.value)
    assert PASSWORD not in str(exc.value) and HOST not in str(exc.value)
    assert again == 3
    entry = logged(logs, ref)
    assert (entry["event"], entry["log_level"], entry["service"]) == (
        "call.failed",
        "error",
        "leaky",
    )
    assert entry["operation"] == operation and SECRET in entry["error"]
    failure = entry["exc_info"]
    assert isinstance(failure, RuntimeError) and failure.__traceback__ is not None


async def test_each_failure_gets_its_own_reference(server: Server, logs: Logs) -> None:
    refs = set()
    async with connect(server.url, timeout=5) as client:
        for _ in range(3):
            with pytest.raises(RemoteError) as exc:
                await client.call("leaky", "connect_db")
            refs.add(undisclosed(exc.value))
    assert len(refs) == 3
    assert {logged(logs, ref)["event"] for ref in refs} == {"call.failed"}


async def test_declared_types_and_call_errors_keep_their_type_and_message(
    server: Server, logs: Logs
) -> None:
    async with connect(server.url, timeout=5) as client:
        leaky = await client.service("leaky")
        with pytest.raises(RemoteError) as by_handler:
            await leaky.parse("x1")
        with pytest.raises(RemoteError) as by_service:
            await leaky.quota()
        with pytest.raises(RemoteError) as chosen:
            await leaky.conflict()
        with pytest.raises(RemoteError) as elsewhere:
            await leaky.parse_undeclared("x1")
    assert (by_handler.value.status, by_handler.value.type, by_handler.value.message) == (
        500,
        "ValueError",
        "invalid literal for int() with base 10: 'x1'",
    )
    assert (by_service.value.status, by_service.value.type, by_service.value.message) == (
        500,
        f"{__name__}.QuotaExceeded",
        "over quota: 10 calls a minute",
    )
    assert (chosen.value.status, chosen.value.type, chosen.value.message) == (
        409,
        "Conflict",
        "already there",
    )
    assert by_handler.value.ref is None and by_service.value.ref is None
    assert chosen.value.ref is None
    # a handler's declaration is its own: the same exception from another is undisclosed
    ref = undisclosed(elsewhere.value)
    assert "x1" in logged(logs, ref)["error"]
    assert [e for e in logs if e["event"] == "call.failed"] == [logged(logs, ref)]


async def test_debug_errors_send_the_type_and_message(server: Server, logs: Logs) -> None:
    async with connect(server.url, timeout=5) as client:
        with pytest.raises(RemoteError) as exc:
            await client.call("chatty", "connect_db")
    assert (exc.value.status, exc.value.type, exc.value.message) == (500, "RuntimeError", SECRET)
    assert exc.value.ref is not None  # and the log has the traceback under it, as always
    entry = logged(logs, exc.value.ref)
    assert entry["event"] == "call.failed" and entry["service"] == "chatty"


async def test_hosted_turns_debug_errors_on_and_off(logs: Logs) -> None:
    debug = hosted(Leaky, debug_errors=True)
    quiet = hosted(Chatty, debug_errors=False)
    async with (
        open_server(debug, quiet, listen=URL, grace=1) as server,
        connect(server.url, timeout=5) as client,
    ):
        with pytest.raises(RemoteError) as shown:
            await client.call("leaky", "connect_db")
        with pytest.raises(RemoteError) as hidden:
            await client.call("chatty", "connect_db")
    assert (shown.value.type, shown.value.message) == ("RuntimeError", SECRET)
    undisclosed(hidden.value)


async def test_400_and_404_keep_their_precise_messages(server: Server) -> None:
    async with connect(server.url, timeout=5) as client:
        with pytest.raises(RemoteError) as missing:
            await client.call("leaky", "nope")
        with pytest.raises(RemoteError) as bad:
            await client.call("leaky", "add", 1)
    assert (missing.value.status, missing.value.message) == (
        404,
        "the service has no operation 'nope'",
    )
    assert (bad.value.status, bad.value.message) == (
        400,
        "add: missing a required argument: 'b'",
    )
    assert missing.value.ref is None and bad.value.ref is None


# -- through the gateway chain ----------------------------------------------------------------


async def test_through_the_gateway_chain_the_secret_never_leaves_the_container(
    logs: Logs,
) -> None:
    """CO serves :class:`Leaky` at the internal address GO routes ``billing`` to."""
    async with trio.open_nursery() as nursery:

        async def serve_co(*, task_status: trio.TaskStatus[Server]) -> None:
            leaky = hosted(Leaky, address=INTERNAL)
            async with open_server(leaky, listen=URL, container_id="co", grace=1) as co:
                task_status.started(co)
                await trio.sleep_forever()

        co: Server = await nursery.start(serve_co)
        async with (
            open_chain(co_port=co.port) as chain,
            connect(chain.url, timeout=10) as client,
        ):
            billing = await client.service(PUBLIC)
            with pytest.raises(RemoteError) as failed:
                await billing.connect_db()
            with pytest.raises(RemoteError) as declared:
                await billing.quota()
            with pytest.raises(RemoteError) as missing:
                await billing.nope()
            with pytest.raises(RemoteError) as bad:
                await billing.add(1)
            assert await billing.add(1, 2) == 3
            taps = chain.taps
        nursery.cancel_scope.cancel()

    ref = undisclosed(failed.value)
    assert SECRET in logged(logs, ref)["error"]  # CO's log has it, under the ref the caller got
    assert (declared.value.type, declared.value.message) == (
        f"{__name__}.QuotaExceeded",
        "over quota: 10 calls a minute",
    )
    assert (missing.value.status, bad.value.status) == (404, 400)
    for exc in (failed, declared, missing, bad):
        assert INTERNAL not in str(exc.value)
    for tap in taps:  # not a byte of the secret on any hop, GO -> CO included
        seen = tap.all_bytes()
        assert PASSWORD.encode() not in seen and HOST.encode() not in seen
        assert ref.encode() in tap.down_bytes()  # the ref went the whole way back
    assert INTERNAL.encode() not in taps[0].all_bytes()  # nor CO's address to the client
