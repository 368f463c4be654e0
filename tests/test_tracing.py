"""W3C trace context (issue 12 §6) over real TCP on 127.0.0.1: ``traceparent`` parsed as the
specification says, continued by a served call and carried on by the calls its handler makes
(``remote()``), passed unchanged through two gateways, absent when there is no trace; and,
with OpenTelemetry's SDK set up, calls as CLIENT and SERVER spans of one trace."""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, SpanKind
from opentelemetry.util._once import Once

from pairlink import (
    CallError,
    Client,
    TraceContext,
    connect,
    current_call,
    current_trace,
    handler,
    hosted,
    open_server,
    remote,
    service,
    use_trace,
)
from pairlink._rpc import wire
from pairlink._rpc.tracing import parse_traceparent
from tests.gateway.chain import INTERNAL, PUBLIC, open_chain

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
STATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"


# -- the header itself --------------------------------------------------------------------------


def test_a_valid_traceparent() -> None:
    assert parse_traceparent(TRACEPARENT, STATE) == TraceContext(TRACE_ID, PARENT_ID, 1, STATE)
    assert parse_traceparent(TRACEPARENT.replace("-01", "-00")) == TraceContext(
        TRACE_ID, PARENT_ID, 0
    )
    # a later version is read by what version 00 defines, and may carry more after a dash
    assert parse_traceparent("cc" + TRACEPARENT[2:] + "-what-comes-next") == TraceContext(
        TRACE_ID, PARENT_ID, 1
    )
    assert TraceContext(TRACE_ID, PARENT_ID, 1, STATE).traceparent == TRACEPARENT


@pytest.mark.parametrize(
    "value",
    [
        None,
        42,
        "",
        TRACEPARENT.upper(),  # lowercase hex only
        TRACEPARENT + "-00",  # version 00 has exactly four fields
        "ff" + TRACEPARENT[2:],  # version ff is invalid
        f"00-{'0' * 32}-{PARENT_ID}-01",  # an all-zero trace id
        f"00-{TRACE_ID}-{'0' * 16}-01",  # an all-zero parent id
        f"00-{TRACE_ID[:-1]}-{PARENT_ID}-01",
        f"00_{TRACE_ID}-{PARENT_ID}-01",
        f"00-{TRACE_ID}-{PARENT_ID}-0g",
        "cc" + TRACEPARENT[2:] + "x",  # a later version's extra fields follow a dash
    ],
)
def test_an_invalid_traceparent_is_ignored(value: object) -> None:
    assert parse_traceparent(value, STATE) is None


def test_a_new_trace_and_its_spans() -> None:
    root = TraceContext.new()
    child = root.child()
    assert parse_traceparent(root.traceparent) == root
    assert (child.trace_id, child.flags) == (root.trace_id, root.flags)
    assert child.span_id != root.span_id


# -- served calls ---------------------------------------------------------------------------------


def _trace() -> list[Any] | None:
    ctx = current_trace()
    return None if ctx is None else [ctx.trace_id, ctx.span_id, ctx.flags, ctx.state]


@service("seen", max_concurrency=4)  # it calls itself through remote(): room for both
class Seen:
    """Tells what trace headers its request carried and which trace its handler runs in."""

    @handler
    async def headers(self) -> dict[str, Any]:
        app = current_call().application_properties
        return {
            "traceparent": app.get("traceparent"),
            "tracestate": app.get("tracestate"),
            "trace": _trace(),
        }

    @handler
    def in_thread(self) -> dict[str, Any]:
        return {"trace": _trace()}

    @handler
    def half(self, n: int) -> float:
        if n < 0:
            raise CallError(400, "negative")
        return n / 2

    @handler
    async def relay(self) -> dict[str, Any]:
        """What this call runs in, and what the call it makes through ``remote()`` saw."""
        onward = await (await remote("seen")).headers()
        return {"mine": _trace(), "onward": onward}


@asynccontextmanager
async def seen_client() -> AsyncIterator[Client]:
    async with (
        open_server(Seen, listen="amqp://127.0.0.1:0") as server,
        connect(server.url) as client,
    ):
        yield client


async def test_a_served_call_continues_the_callers_trace() -> None:
    caller = TraceContext(TRACE_ID, PARENT_ID, 1, STATE)
    async with seen_client() as client:
        with use_trace(caller):
            seen = await client.call("seen", "headers")
            in_thread = await client.call("seen", "in_thread")
    assert (seen["traceparent"], seen["tracestate"]) == (TRACEPARENT, STATE)
    trace_id, span_id, flags, state = seen["trace"]
    assert (trace_id, flags, state) == (TRACE_ID, 1, STATE)
    assert span_id != PARENT_ID  # the server's span is a new one
    assert in_thread["trace"][0] == TRACE_ID  # a def handler's thread runs in it as well


async def test_remote_calls_carry_the_handlers_span_as_their_parent() -> None:
    async with seen_client() as client:
        with use_trace(TraceContext(TRACE_ID, PARENT_ID, 1, STATE)):
            relayed = await client.call("seen", "relay")
    mine = relayed["mine"]
    onward = relayed["onward"]
    assert mine[0] == TRACE_ID
    assert onward["traceparent"] == f"00-{TRACE_ID}-{mine[1]}-01"
    assert onward["tracestate"] == STATE
    assert onward["trace"][0] == TRACE_ID
    assert onward["trace"][1] not in (mine[1], PARENT_ID)


async def test_no_trace_no_header() -> None:
    async with seen_client() as client:
        assert current_trace() is None
        assert await client.call("seen", "headers") == {
            "traceparent": None,
            "tracestate": None,
            "trace": None,
        }
        relayed = await client.call("seen", "relay")
    assert relayed == {
        "mine": None,
        "onward": {"traceparent": None, "tracestate": None, "trace": None},
    }


async def test_an_invalid_traceparent_is_served_untraced() -> None:
    async with seen_client() as client:
        reply = await client.request(
            "seen",
            [],
            application_properties={wire.OPERATION: "headers", "traceparent": "00-nonsense"},
        )
    assert reply.message is not None
    assert wire.parse_reply(reply.message)["trace"] is None


async def test_a_traceparent_the_caller_set_is_never_replaced() -> None:
    async with seen_client() as client:
        with use_trace():  # some other trace is current
            reply = await client.request(
                "seen",
                [],
                application_properties={wire.OPERATION: "headers", "traceparent": TRACEPARENT},
            )
    assert reply.message is not None
    seen = wire.parse_reply(reply.message)
    assert (seen["traceparent"], seen["tracestate"]) == (TRACEPARENT, None)


async def test_traceparent_passes_two_gateways_unchanged() -> None:
    """client -> GN -> GO -> the service at org O's internal address: it sees the exact
    headers the caller sent, whether set by hand or by the current trace."""
    async with (
        open_server(
            hosted(Seen, address=INTERNAL), listen="amqp://127.0.0.1:0", container_id="co"
        ) as co,
        open_chain(co_port=co.port) as chain,
        connect(chain.url) as client,
    ):
        reply = await client.request(
            PUBLIC,
            [],
            application_properties={
                wire.OPERATION: "headers",
                "traceparent": TRACEPARENT,
                "tracestate": STATE,
            },
        )
        with use_trace() as mine:
            by_trace = await client.call(PUBLIC, "headers")
    assert reply.message is not None
    by_hand = wire.parse_reply(reply.message)
    assert (by_hand["traceparent"], by_hand["tracestate"]) == (TRACEPARENT, STATE)
    assert by_hand["trace"][0] == TRACE_ID
    assert by_trace["traceparent"] == mine.traceparent


# -- OpenTelemetry ---------------------------------------------------------------------------------


def _reset_tracer_provider() -> None:
    """OpenTelemetry sets its global provider once per process; its own test utilities reset
    these two globals so that each test has a provider of its own (and the tests after this
    one none: a server or client started then makes no spans)."""
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None


def ids(span: ReadableSpan) -> SpanContext:
    context: SpanContext | None = span.context
    assert context is not None
    return context


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _reset_tracer_provider()
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        _reset_tracer_provider()


async def test_calls_are_client_and_server_spans_of_one_trace(
    exported: InMemorySpanExporter,
) -> None:
    tracer = trace.get_tracer("test")
    async with seen_client() as client:
        with tracer.start_as_current_span("job") as job:
            relayed = await client.call("seen", "relay")
    spans = {(s.name, s.kind): s for s in exported.get_finished_spans()}
    chain = [
        ("job", SpanKind.INTERNAL),
        ("seen/relay", SpanKind.CLIENT),
        ("seen/relay", SpanKind.SERVER),
        ("seen/headers", SpanKind.CLIENT),
        ("seen/headers", SpanKind.SERVER),
    ]
    assert set(spans) == set(chain)
    for parent, child in itertools.pairwise(chain):
        up = spans[child].parent
        assert up is not None
        assert up.span_id == ids(spans[parent]).span_id, child
    trace_id = job.get_span_context().trace_id
    assert {ids(s).trace_id for s in spans.values()} == {trace_id}
    server = spans["seen/relay", SpanKind.SERVER]
    assert server.attributes is not None
    assert dict(server.attributes) == {
        "rpc.system": "pairlink",
        "rpc.service": "seen",
        "rpc.method": "relay",
        "rpc.response.status_code": 200,
    }
    # the handler's current trace is its server span, and so is the parent that remote() sent
    mine = relayed["mine"]
    assert (int(mine[0], 16), int(mine[1], 16)) == (trace_id, ids(server).span_id)
    onward = ids(spans["seen/headers", SpanKind.CLIENT])
    assert relayed["onward"]["traceparent"] == (
        f"00-{mine[0]}-{onward.span_id:016x}-{int(onward.trace_flags):02x}"
    )


async def test_a_failed_call_is_an_error_span(exported: InMemorySpanExporter) -> None:
    tracer = trace.get_tracer("test")
    async with seen_client() as client:
        with tracer.start_as_current_span("job"), pytest.raises(Exception, match="404"):
            await client.call("seen", "missing")
    spans = {(s.name, s.kind): s for s in exported.get_finished_spans()}
    failed = spans["seen/missing", SpanKind.CLIENT]
    assert failed.attributes is not None
    assert failed.attributes["rpc.response.status_code"] == 404
    assert not failed.status.is_ok


async def test_a_batch_is_one_span_that_counts_its_rows_and_their_failures(
    exported: InMemorySpanExporter,
) -> None:
    tracer = trace.get_tracer("test")
    async with seen_client() as client:
        proxy = await client.service("seen")
        with tracer.start_as_current_span("job"):
            got = await proxy.map("half", [2, -1, 4, -3, 6], on_error="return")
    assert got[::2] == [1, 2, 3]
    (server,) = [s for s in exported.get_finished_spans() if s.kind == SpanKind.SERVER]
    assert server.attributes is not None
    assert server.attributes["pairlink.rows"] == 5
    assert server.attributes["pairlink.rows.failed"] == 2
    assert server.attributes["rpc.response.status_code"] == 200


async def test_outside_any_span_a_client_makes_none(exported: InMemorySpanExporter) -> None:
    async with seen_client() as client:
        seen = await client.call("seen", "headers")
    assert seen["traceparent"] is None
    kinds = [(s.name, s.kind) for s in exported.get_finished_spans()]
    assert kinds == [("seen/headers", SpanKind.SERVER)]  # the server's, a root of its own


NO_OPENTELEMETRY = """
import sys
sys.modules["opentelemetry"] = None  # as if the tracing extra were not installed
import trio
from pairlink import (
    TraceContext, connect, current_trace, handler, open_server, remote, service, use_trace
)

@service("hop", max_concurrency=2)
class Hop:
    @handler
    async def here(self):
        return current_trace().trace_id

    @handler
    async def onward(self):
        return await (await remote("hop")).here()

async def main():
    async with open_server(Hop, listen="amqp://127.0.0.1:0") as server:
        async with connect(server.url) as client:
            with use_trace(TraceContext("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")):
                print(await client.call("hop", "onward"))
    assert "opentelemetry.trace" not in sys.modules

trio.run(main)
"""


def test_without_opentelemetry_the_w3c_headers_still_travel() -> None:
    done = subprocess.run(
        [sys.executable, "-c", NO_OPENTELEMETRY],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stdout.strip() == TRACE_ID, done.stderr
