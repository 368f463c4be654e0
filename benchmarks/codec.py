"""Codec benchmark: one transfer frame carrying a typical request, ours against Qpid Proton's.

One operation = build the request message and the transfer performative, encode both into a
frame, then parse that frame back (performative and message). Proton does the same with
``proton.Message`` encode/decode and ``proton.Data`` for the transfer's described list. The two
stacks run alternately, several rounds in one process (the machines are noisy), and the report
is the median rate of each. Run: ``python -m benchmarks.codec [--rounds N] [--profile]``.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import struct
import time
from collections.abc import Callable
from typing import Any

import proton

from framework.amqp.framing import FrameReader, encode_frame
from framework.amqp.messaging import Message, Properties
from framework.amqp.performatives import Transfer
from framework.amqp.types import Symbol

BODY = bytes(range(64))
CONTENT_TYPE = Symbol("application/msgpack")
_FRAME_HEADER = struct.Struct(">IBBH")


def ours(n: int) -> None:
    """``n`` request frames through our codec, encode then decode."""
    content_type = CONTENT_TYPE
    reader = FrameReader()
    for i in range(n):
        msg = Message(
            body=BODY,
            body_kind="data",
            properties=Properties(message_id=f"req-{i}", reply_to="$me", content_type=content_type),
            application_properties={"operation": "add"},
        )
        out = bytearray()
        transfer = Transfer(
            handle=0, delivery_id=i, delivery_tag=i.to_bytes(4, "big"), message_format=0
        )
        encode_frame(out, 1, transfer, msg.encode())
        reader.feed(out)
        frame = reader.read_frame()
        assert frame is not None
        got = Message.decode(frame.payload)
        if got.body != BODY or frame.performative.delivery_id != i:
            raise AssertionError("our codec lost the message")


def _proton_transfer(i: int) -> bytes:
    d = proton.Data()
    d.put_described()
    d.enter()
    d.put_ulong(0x14)
    d.put_list()
    d.enter()
    d.put_uint(0)
    d.put_uint(i)
    d.put_binary(i.to_bytes(4, "big"))
    d.put_uint(0)
    d.exit()
    d.exit()
    return bytes(d.encode())


def theirs(n: int) -> None:
    """The same ``n`` frames through python-qpid-proton's codec."""
    for i in range(n):
        msg = proton.Message(
            id=f"req-{i}", reply_to="$me", properties={"operation": "add"}, body=BODY
        )
        msg.inferred = True  # bytes body as a data section, as ours
        msg.content_type = "application/msgpack"
        perf = _proton_transfer(i)
        payload = msg.encode()
        out = bytearray(_FRAME_HEADER.pack(8 + len(perf) + len(payload), 2, 0, 1))
        out += perf
        out += payload
        # decode
        size, doff, _, _ = _FRAME_HEADER.unpack_from(out, 0)
        body = bytes(out[doff * 4 : size])
        d = proton.Data()
        used = d.decode(body)
        d.rewind()
        d.next()
        described: Any = d.get_object()
        got = proton.Message()
        got.decode(body[used:])
        got_body: Any = got.body
        if bytes(got_body) != BODY or described.value[1] != i:
            raise AssertionError("proton lost the message")


def _rate(fn: Callable[[int], None], n: int) -> float:
    start = time.perf_counter()
    fn(n)
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("-n", type=int, default=5000, help="frames per round and stack")
    parser.add_argument("--profile", action="store_true", help="cProfile our side and exit")
    args = parser.parse_args()
    if args.profile:
        cProfile.runctx("ours(args.n)", globals(), {"args": args}, "/tmp/codec.prof")
        pstats.Stats("/tmp/codec.prof").sort_stats("tottime").print_stats(25)
        return
    ours(200)
    theirs(200)  # warm up both
    rates: dict[str, list[float]] = {"ours": [], "proton": []}
    for r in range(args.rounds):
        pair = [("ours", ours), ("proton", theirs)]
        if r % 2:
            pair.reverse()
        for name, fn in pair:
            rates[name].append(_rate(fn, args.n))
    med = {name: statistics.median(v) for name, v in rates.items()}
    for name, v in rates.items():
        spread = f"{min(v):,.0f}..{max(v):,.0f}"
        per_op = 1e6 / med[name]
        print(f"{name:>7}: median {med[name]:,.0f} frames/s ({per_op:.1f} us/frame; {spread})")
    print(f"codec ratio vs proton: {med['ours'] / med['proton']:.2f}")


if __name__ == "__main__":
    main()
