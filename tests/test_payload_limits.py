"""Decoding a request body is bounded like decoding an AMQP message: a msgpack or JSON body of
more values than ``max_elements`` is a ``PayloadError`` (a 400 for the caller), refused before
it is built, and nesting too deep for the JSON decoder is one too, not a ``RecursionError``."""

from __future__ import annotations

import json
import struct
import time
import tracemalloc

import msgpack
import pytest

from pairlink._amqp.codec import MAX_ELEMENTS
from pairlink._amqp.messaging import Message, Properties
from pairlink._amqp.types import Symbol
from pairlink._rpc.payload import JSON, MSGPACK, Encoding, decode_value
from pairlink.errors import PayloadError


def body(data: bytes, content_type: str) -> Message:
    return Message(
        body=data, body_kind="data", properties=Properties(content_type=Symbol(content_type))
    )


def test_eight_mib_of_empty_msgpack_arrays_is_refused_without_building_them() -> None:
    """8 MiB of 1-byte values became 519 MiB; now the count stops it at the bound."""
    n = 8 * 2**20
    data = b"\xdd" + struct.pack(">I", n) + b"\x90" * n
    tracemalloc.start()
    try:
        started = time.process_time()
        with pytest.raises(PayloadError, match=f"more than {MAX_ELEMENTS} values"):
            decode_value(body(data, MSGPACK))
        spent = time.process_time() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20 and spent < 0.5  # refused at the outer array's header


def test_many_small_msgpack_containers_add_up_to_the_bound() -> None:
    inner = [[1, 2, 3]] * (MAX_ELEMENTS // 3)  # each under the bound, together over it
    data = msgpack.packb(inner)
    with pytest.raises(PayloadError, match="values"):
        decode_value(body(data, MSGPACK))
    assert decode_value(body(data, MSGPACK), max_elements=MAX_ELEMENTS * 2)[0] == inner
    maps = msgpack.packb([{"k": 1}] * (MAX_ELEMENTS // 2))  # a map counts key and value
    with pytest.raises(PayloadError):
        decode_value(body(maps, MSGPACK))


def test_bodies_within_the_bound_decode_as_before() -> None:
    value = [list(range(1000)), {"a": "b" * 10_000}]
    assert decode_value(body(msgpack.packb(value), MSGPACK)) == (value, Encoding.MSGPACK)
    assert decode_value(body(json.dumps(value).encode(), JSON)) == (value, Encoding.JSON)


def test_json_bodies_are_bounded_too() -> None:
    data = b"[" + b"[]," * MAX_ELEMENTS + b"[]]"
    with pytest.raises(PayloadError, match="values"):
        decode_value(body(data, JSON))
    with pytest.raises(PayloadError, match="not JSON"):
        decode_value(body(b"[" * 100_000 + b"]" * 100_000, JSON))  # was a RecursionError
