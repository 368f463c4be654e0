"""Codec benchmark: a typical request, ours against Qpid Proton's, in two halves.

Message half: build the request (properties message-id, correlation-id, reply-to, content-type;
application-properties with the operation; a 64-byte data body), encode it, decode it and read
what a service reads, with each stack's own API: our ``Message.encode``/``decode`` against
``proton.Message.encode``/``decode``, which is what Proton users call.

Frame half: the transfer frame around those bytes. Proton users never build frames in Python:
Proton's C engine does it, so Proton is measured the way its users pay for it, through the
engine. A pre-settled delivery (the client's default) goes into a sender of one
``proton.Connection``, its bytes are pulled out of the ``Transport`` and pushed into a second,
and the receiver reads the delivery. The collectors a ``Container`` always binds are drained, as
the container would before dispatching (four events a request: link-flow and transport on the
sender, delivery and transport on the receiver); Proton without collectors (the C engine and the
binding's calls alone, a floor no Python user gets) is printed as well. Ours does the same
between two sans-IO ``Connection`` engines, whose returned events are our collector. Our bare
frame codec (``encode_frame``/``FrameReader``) is printed for profiling; it has no peer, since
Proton's frame codec cannot be reached from Python.

The whole-operation ratio adds each half's median time per request. The stacks run alternately,
several rounds in one process (the machines are noisy), and each line is the median of the
rounds. Run: ``python -m benchmarks.codec [--rounds N] [-n N] [--profile]``.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from collections.abc import Callable
from typing import Any

import proton

from pairlink._amqp.events import LinkAttachRequested, MessageReceived
from pairlink._amqp.framing import FrameReader, encode_frame
from pairlink._amqp.messaging import Message, Properties, Source, Target
from pairlink._amqp.performatives import ROLE_SENDER, SND_SETTLED, Transfer
from pairlink._amqp.testing import engine_pair, pump
from pairlink._amqp.types import Symbol

BODY = bytes(range(64))
OPERATION = "add"
CONTENT_TYPE = "application/msgpack"
_CONTENT_SYMBOL = Symbol(CONTENT_TYPE)
_NO_EVENTS = "proton no events"


def our_messages(n: int) -> None:
    """``n`` requests built, encoded and decoded with our ``Message``."""
    for i in range(n):
        message_id = f"req-{i}"
        payload = Message(
            body=BODY,
            body_kind="data",
            properties=Properties(
                message_id=message_id,
                correlation_id=message_id,
                reply_to="$me",
                content_type=_CONTENT_SYMBOL,
            ),
            application_properties={"operation": OPERATION},
        ).encode()
        got = Message.decode(payload)
        props = got.properties
        app = got.application_properties
        if (
            got.body != BODY
            or props is None
            or props.message_id != message_id
            or props.reply_to != "$me"
            or app is None
            or app["operation"] != OPERATION
        ):
            raise AssertionError("our codec lost the message")


def proton_messages(n: int) -> None:
    """The same ``n`` requests with ``proton.Message``."""
    for i in range(n):
        message_id = f"req-{i}"
        msg = proton.Message(
            body=BODY,
            id=message_id,
            correlation_id=message_id,
            reply_to="$me",
            content_type=CONTENT_TYPE,
            properties={"operation": OPERATION},
            inferred=True,  # bytes as a data section, as ours
        )
        payload = msg.encode()
        got = proton.Message()
        got.decode(payload)
        body: Any = got.body
        app: Any = got.properties  # typed None: set to None in Message.__init__
        if (
            bytes(body) != BODY
            or got.id != message_id
            or got.reply_to != "$me"
            or app["operation"] != OPERATION
        ):
            raise AssertionError("proton lost the message")


def request_payload() -> bytes:
    """The encoded request both stacks' engines carry in the frame half."""
    return Message(
        body=BODY,
        body_kind="data",
        properties=Properties(
            message_id="req-0", correlation_id="req-0", reply_to="$me", content_type=_CONTENT_SYMBOL
        ),
        application_properties={"operation": OPERATION},
    ).encode()


class OurEngines:
    """Two of our engines joined in memory, a pre-settled sender attached to a receiver."""

    def __init__(self, payload: bytes) -> None:
        self.payload = payload
        self.client, self.server = engine_pair()
        self.client.open()
        self.server.open()
        session = self.client.begin()
        self.sender = self.client.attach(
            session,
            name="requests",
            role=ROLE_SENDER,
            source=Source(),
            target=Target(address="svc"),
            snd_settle_mode=SND_SETTLED,
        )
        _, events = pump(self.client, self.server)
        (request,) = [e for e in events if isinstance(e, LinkAttachRequested)]
        self.receiver = request.link
        self.server.answer_attach(
            self.receiver, source=self.receiver.remote_source, target=self.receiver.remote_target
        )
        pump(self.client, self.server)

    def transfers(self, n: int) -> None:
        """``n`` deliveries: credit for them, then each sent, its bytes read by the peer."""
        client, server, sender, payload = self.client, self.server, self.sender, self.payload
        server.flow(self.receiver, n)
        pump(client, server)
        for _ in range(n):
            client.send(sender, payload, settled=True)
            got = None
            for event in server.receive_data(client.data_to_send()):
                if type(event) is MessageReceived:
                    got = event.payload
            back = server.data_to_send()
            if back:
                client.receive_data(back)
            if got != payload:
                raise AssertionError("our engine lost the message")


def _drain(collector: proton.Collector) -> None:
    while collector.peek():
        collector.pop()


class ProtonEngines:
    """Two Proton engines (connection, transport, collector) joined in memory, likewise;
    ``events=False`` binds no collectors."""

    def __init__(self, payload: bytes, *, events: bool = True) -> None:
        self.payload = payload
        self.events = events
        self.client, self.server = proton.Connection(), proton.Connection()
        self.client_events, self.server_events = proton.Collector(), proton.Collector()
        if events:
            self.client.collect(self.client_events)
            self.server.collect(self.server_events)
        self.client_wire = proton.Transport()
        self.client_wire.bind(self.client)
        self.server_wire = proton.Transport(proton.Transport.SERVER)
        self.server_wire.bind(self.server)
        self.client.open()
        session = self.client.session()
        session.open()
        self.sender = session.sender("requests")
        self.sender.snd_settle_mode = proton.Link.SND_SETTLED
        self.sender.target.address = "svc"
        self.sender.open()
        self._pump()
        self.server.open()
        peer_session = self.server.session_head(proton.Endpoint.LOCAL_UNINIT)
        receiver = self.server.link_head(proton.Endpoint.LOCAL_UNINIT)
        if peer_session is None or not isinstance(receiver, proton.Receiver):
            raise AssertionError("the Proton link was not requested")
        peer_session.open()
        receiver.open()
        self.receiver = receiver
        self._pump()
        if self.sender.state != receiver.state:
            raise AssertionError("the Proton link did not attach")

    @staticmethod
    def _move(src: proton.Transport, dst: proton.Transport) -> bool:
        size = src.pending()
        if size <= 0:
            return False
        data = src.peek(size)
        src.pop(size)
        assert data is not None
        dst.push(data)
        return True

    def _pump(self) -> None:
        while self._move(self.client_wire, self.server_wire) | self._move(
            self.server_wire, self.client_wire
        ):
            pass
        _drain(self.client_events)
        _drain(self.server_events)

    def transfers(self, n: int) -> None:
        """As ``OurEngines.transfers``, through Proton's engine."""
        sender, receiver, payload = self.sender, self.receiver, self.payload
        client_wire, server_wire = self.client_wire, self.server_wire
        client_events, server_events = self.client_events, self.server_events
        events = self.events
        receiver.flow(n)
        self._pump()
        for i in range(n):
            delivery = sender.delivery(str(i))
            sender.send(payload)
            sender.advance()
            delivery.settle()
            if events:
                _drain(client_events)
            self._move(client_wire, server_wire)
            got = receiver.current
            assert got is not None
            data = receiver.recv(got.pending)
            receiver.advance()
            got.settle()
            if events:
                _drain(server_events)
            self._move(server_wire, client_wire)
            if data != payload:
                raise AssertionError("proton's engine lost the message")


def our_frame_codec(payload: bytes) -> Callable[[int], None]:
    """Our bare frame codec, no engine: a transfer frame encoded and parsed back."""

    def frames(n: int) -> None:
        reader = FrameReader()
        for i in range(n):
            out = bytearray()
            transfer = Transfer(
                handle=0, delivery_id=i, delivery_tag=i.to_bytes(4, "big"), settled=True
            )
            encode_frame(out, 0, transfer, payload)
            reader.feed(out)
            frame = reader.read_frame()
            if frame is None or frame.performative.delivery_id != i or frame.payload != payload:
                raise AssertionError("our frame codec lost the frame")

    return frames


def _rate(fn: Callable[[int], None], n: int) -> float:
    start = time.perf_counter()
    fn(n)
    return n / (time.perf_counter() - start)


def _line(name: str, rates: list[float], unit: str) -> float:
    med = statistics.median(rates)
    spread = f"{min(rates):,.0f}..{max(rates):,.0f}"
    print(f"{name:>17}: median {med:,.0f} {unit}/s ({1e6 / med:.1f} us each; {spread})")
    return med


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("-n", type=int, default=5000, help="requests per round, half and stack")
    parser.add_argument("--profile", action="store_true", help="cProfile our side and exit")
    args = parser.parse_args()
    payload = request_payload()
    ours_frames = OurEngines(payload).transfers
    if args.profile:
        run = {"messages": our_messages, "frames": ours_frames, "n": args.n}
        cProfile.runctx("messages(n); frames(n)", run, {}, "/tmp/codec.prof")
        pstats.Stats("/tmp/codec.prof").sort_stats("tottime").print_stats(25)
        return
    halves: dict[str, list[tuple[str, Callable[[int], None]]]] = {
        "message": [("ours", our_messages), ("proton", proton_messages)],
        "frame": [
            ("ours", ours_frames),
            ("proton", ProtonEngines(payload).transfers),
            (_NO_EVENTS, ProtonEngines(payload, events=False).transfers),
        ],
        "bare": [("ours", our_frame_codec(payload))],
    }
    for pairs in halves.values():
        for _, fn in pairs:
            fn(200)  # warm up
    rates: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        for half, pairs in halves.items():
            for name, fn in reversed(pairs) if r % 2 else pairs:
                rates.setdefault((half, name), []).append(_rate(fn, args.n))
    print("message half: build, encode, decode a typical request (Message API of each stack)")
    msg = {s: _line(s, rates["message", s], "messages") for s in ("ours", "proton")}
    print(f"codec message ratio vs proton: {msg['ours'] / msg['proton']:.2f}")
    print("frame half: a pre-settled transfer through the engine, out as the peer's delivery")
    frame = {s: _line(s, rates["frame", s], "transfers") for s in ("ours", "proton", _NO_EVENTS)}
    print(f"codec frame ratio vs proton: {frame['ours'] / frame['proton']:.2f}")
    print(f"codec frame ratio vs proton without events: {frame['ours'] / frame[_NO_EVENTS]:.2f}")
    print("our bare frame codec (encode_frame + FrameReader; Proton's is not reachable)")
    _line("ours", rates["bare", "ours"], "frames")
    whole = {s: 1 / (1 / msg[s] + 1 / frame[s]) for s in ("ours", "proton")}
    print("whole request: message and frame half, their median times added")
    for name, rate in whole.items():
        print(f"{name:>17}: {rate:,.0f} requests/s ({1e6 / rate:.1f} us each)")
    print(f"codec ratio vs proton: {whole['ours'] / whole['proton']:.2f}")


if __name__ == "__main__":
    main()
