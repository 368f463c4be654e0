"""Payloads built to cost the server memory or time (issue 9 §2), against a real listening
server over TCP: messages that never end, and a decode bomb. The engine's own tests
(tests/amqp/test_limits.py) pin the bounds frame by frame; these check the served process."""

from __future__ import annotations

import struct

import trio

from pairlink import connect, handler, open_server, service
from pairlink._amqp import errors
from pairlink._amqp.framing import encode_frame
from pairlink._amqp.messaging import Message, Properties
from pairlink._amqp.performatives import ROLE_SENDER, Detach, Transfer
from pairlink._amqp.types import ULong
from pairlink._config.limits import Limits
from pairlink._rpc import deadline, wire
from tests.service_peers import app_property, raw_client, status

LINKS = 8
FRAME = 60_000  # message bytes per transfer frame, under the 64 KiB max-frame-size


@service("svc", mailbox=64)
class Svc:
    @handler
    async def echo(self, x: object) -> object:
        return x


async def test_messages_that_never_end_are_bounded_per_connection() -> None:
    """8 links each start a message and never finish it: together they may hold no more than
    ``max_incomplete_bytes``; past it the link whose frame would pass it is detached."""
    bound = 2 << 20
    limits = Limits(max_incomplete_bytes=bound)
    async with (
        open_server(Svc, listen="amqp://127.0.0.1:0", limits=limits) as server,
        raw_client(server.url) as raw,
    ):
        links = [
            raw.attach(f"endless-{i}", ROLE_SENDER, source=f"me-{i}", target="svc")
            for i in range(LINKS)
        ]
        with trio.fail_after(20):  # the service shares its credit out by draining links
            while not all(link.link_credit > 0 for link in links):
                for link in links:
                    raw.engine.complete_drain(link)  # nothing to send yet: give it back
                await raw.read_once()
        sent = 0
        with trio.fail_after(20):
            # frames round-robin over the links, each link's message never ending
            for frame in range(bound // FRAME // LINKS + 2):
                out = bytearray()
                for i, link in enumerate(links):
                    first = frame == 0
                    transfer = Transfer(
                        handle=link.handle,
                        delivery_id=i if first else None,
                        delivery_tag=bytes([i]) if first else None,
                        more=True,
                    )
                    encode_frame(out, raw.session.channel, transfer, b"\x00" * FRAME)
                    sent += FRAME
                await raw.stream.send_all(out)
            await raw.read_until(lambda: bool(raw.of(Detach)))
        detaches = raw.of(Detach)
        assert detaches and all(d.closed for d in detaches)
        assert {str(d.error.condition) for d in detaches if d.error} == {
            errors.RESOURCE_LIMIT_EXCEEDED
        }
        assert sent > bound  # the peer pushed past the bound, and was cut off there
        # the connection and the service go on
        async with connect(server.url) as client:
            svc = await client.service("svc")
            assert await svc.echo("fine") == "fine"


def decode_bomb(elements: int) -> bytes:
    """A request whose amqp-value body is an array of ``elements`` described values of one
    byte each: a few bytes on the wire per element, a Python object each if decoded."""
    constructor = b"\x00\x53\x01\x50"  # described by ulong 1, each element a ubyte
    size = 4 + len(constructor) + elements
    array = b"\xf0" + struct.pack(">II", size, elements) + constructor + b"\x07" * elements
    head = Message(
        properties=Properties(message_id=ULong(42), reply_to=wire.ME),
        application_properties={wire.OPERATION: "echo"},
    ).encode()
    return head + b"\x00\x53\x77" + array


async def test_a_decode_bomb_is_refused_without_decoding_it() -> None:
    async with (
        open_server(Svc, listen="amqp://127.0.0.1:0") as server,
        raw_client(server.url) as raw,
        connect(server.url) as client,
    ):
        svc = await client.service("svc")
        assert await svc.echo("warm") == "warm"
        sender, _receiver = raw.pair("svc")
        raw.send(sender, decode_bomb(8 << 20), settled=False)  # 8 MiB, 8 M values
        replies: list[Message] = []

        async def bomb_reply() -> None:
            replies.append(await raw.wait_reply(42, within=20))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(bomb_reply)
            with trio.fail_after(20):
                assert await svc.echo("meanwhile") == "meanwhile"
        # its head names a reply path: a 400 there, the body never decoded
        (reply,) = replies
        assert status(reply) == wire.BAD_REQUEST
        assert "values" in str(app_property(reply, wire.STATUS_DESCRIPTION))
        assert await svc.echo("after") == "after"


async def test_a_presettled_decode_bomb_with_no_reply_path_detaches_its_link() -> None:
    async with (
        open_server(Svc, listen="amqp://127.0.0.1:0") as server,
        raw_client(server.url) as raw,
    ):
        sender = raw.attach("bomber", ROLE_SENDER, source="me", target="svc")
        bomb = decode_bomb(8 << 20)
        raw.send(sender, bomb.replace(wire.ME.encode(), b"$no"), settled=True)
        await raw.read_until(lambda: bool(raw.of(Detach)), 20)
        (detach,) = raw.of(Detach)
        assert detach.error is not None
        assert detach.error.condition == errors.DECODE_ERROR


async def test_a_request_in_our_layout_cut_short_is_a_400_and_the_connection_lives() -> None:
    """Our client's own request bytes, the body's four-byte size cut short: the fast reader
    steps aside and the general path answers 400 on the reply path; the same connection then
    serves the next call."""
    async with (
        open_server(Svc, listen="amqp://127.0.0.1:0") as server,
        raw_client(server.url) as raw,
    ):
        sender, _receiver = raw.pair("svc")
        now = deadline.wall_time()
        whole = wire.encode_request("echo", (b"x" * 300,), {}, message_id=7, now=now, timeout=20)
        cut = whole[: whole.rindex(b"\x00\x53\x75\xb0") + 6]  # two bytes of its size
        raw.send(sender, cut)
        reply = await raw.wait_reply(7)
        assert status(reply) == wire.BAD_REQUEST
        raw.send(
            sender, wire.encode_request("echo", ("ok",), {}, message_id=8, now=now, timeout=20)
        )
        assert wire.parse_reply(await raw.wait_reply(8)) == "ok"
