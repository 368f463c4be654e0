"""Helpers for tests of code built on pairlink: two engines joined by an in-memory wire."""

from __future__ import annotations

from pairlink._amqp.connection import Connection, ConnectionConfig
from pairlink._amqp.events import Event
from pairlink._amqp.sasl import SaslClient, SaslServer


def engine_pair(
    client_config: ConnectionConfig | None = None,
    server_config: ConnectionConfig | None = None,
) -> tuple[Connection, Connection]:
    """A client engine (initiator) and a server engine, neither opened yet."""
    client = Connection(client_config or ConnectionConfig("client"), initiator=True)
    server = Connection(server_config or ConnectionConfig("server"), initiator=False)
    return client, server


def sasl_engine_pair(
    client_sasl: SaslClient, server_sasl: SaslServer
) -> tuple[Connection, Connection]:
    return engine_pair(
        ConnectionConfig("client", sasl=client_sasl), ConnectionConfig("server", sasl=server_sasl)
    )


def pump(
    a: Connection, b: Connection, *, chunk: int | None = None, rounds: int = 100
) -> tuple[list[Event], list[Event]]:
    """Move bytes both ways until both engines are quiet; returns (a's events, b's events).

    ``chunk=1`` feeds the bytes one at a time, which proves the parsers resume anywhere.
    Attach requests are left unanswered (the caller answers them afterwards).
    """
    events_a: list[Event] = []
    events_b: list[Event] = []
    for _ in range(rounds):
        moved = False
        for src, dst, sink in ((a, b, events_b), (b, a, events_a)):
            data = src.data_to_send()
            if not data:
                continue
            moved = True
            step = chunk or len(data)
            for i in range(0, len(data), step):
                sink.extend(dst.receive_data(data[i : i + step]))
                while dst.input_paused:
                    sink.extend(dst.resume_input())
        if not moved:
            return events_a, events_b
    raise AssertionError("engines kept talking: a livelock")
