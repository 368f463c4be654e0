"""Monitoring survives its own port (issue 22): scrapes of ``--metrics-listen`` succeed while
sockets that say nothing, or half a request, are held against it, many more than it keeps.

Against a real server's endpoint on 127.0.0.1; the stalling sockets are plain TCP.
"""

from __future__ import annotations

import trio

from pairlink import handler, open_server, service
from pairlink._telemetry.metrics_http import HEAD_TIMEOUT, MAX_CONNECTIONS
from tests.scraping import http_get, scrape

URL = "amqp://127.0.0.1:0"
HALF_OPEN = 8
IDLE = 5 * MAX_CONNECTIONS
SCRAPES = 25


@service("calc")
class Calc:
    @handler
    def add(self, a: int, b: int) -> int:
        return a + b


def _port(url: str) -> int:
    return int(url.split("/")[2].rsplit(":", 1)[1])


async def test_scrapes_succeed_while_half_requests_and_idle_sockets_are_held() -> None:
    async with open_server(Calc, listen=URL, metrics_listen="127.0.0.1:0") as server:
        url = server.metrics_url
        assert url is not None
        held: list[trio.SocketStream] = []
        try:
            for _ in range(HALF_OPEN):  # half a request head, never finished
                stream = await trio.open_tcp_stream("127.0.0.1", _port(url))
                await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAcc")
                held.append(stream)
            for _ in range(IDLE):  # connected, silent
                held.append(await trio.open_tcp_stream("127.0.0.1", _port(url)))
            with trio.fail_after(HEAD_TIMEOUT / 2):  # before any of them times out
                for _ in range(SCRAPES):
                    assert "pairlink_" in (await scrape(url)).text
        finally:
            for stream in held:
                await stream.aclose()


async def test_the_endpoint_drops_the_oldest_silent_socket_to_make_room() -> None:
    async with open_server(Calc, listen=URL, metrics_listen="127.0.0.1:0") as server:
        url = server.metrics_url
        assert url is not None
        silent = [
            await trio.open_tcp_stream("127.0.0.1", _port(url)) for _ in range(MAX_CONNECTIONS)
        ]
        try:
            status, _, _ = await http_get(url)  # one more: the oldest silent one makes room
            assert status.startswith("HTTP/1.1 200")
            with trio.fail_after(HEAD_TIMEOUT / 2):
                assert await silent[0].receive_some() == b""  # dropped, before its timeout
        finally:
            for stream in silent:
                await stream.aclose()
