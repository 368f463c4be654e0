"""Scraping a metrics endpoint as Prometheus does: an HTTP GET over TCP, the text format
parsed by ``prometheus_client``'s own parser."""

from __future__ import annotations

from urllib.parse import urlsplit

import trio
from prometheus_client.parser import text_string_to_metric_families

WITHIN = 10  # seconds a scrape may take


class Scrape:
    """The samples of one scrape, by name and labels."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                self.samples[sample.name, frozenset(sample.labels.items())] = sample.value

    def value(self, name: str, **labels: str) -> float | None:
        """The sample ``name`` with exactly these labels (None: there is none)."""
        return self.samples.get((name, frozenset(labels.items())))

    def names(self) -> set[str]:
        return {name for name, _ in self.samples}


async def http_get(url: str, request: bytes | None = None) -> tuple[str, dict[str, str], bytes]:
    """GET ``url`` (or send ``request`` as it is): the status line, headers, and body."""
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    if request is None:
        request = f"GET {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\n\r\n".encode()
    with trio.fail_after(WITHIN):
        stream = await trio.open_tcp_stream(parts.hostname, parts.port)
        async with stream:
            await stream.send_all(request)
            data = b""
            while chunk := await stream.receive_some():
                data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body


async def scrape(url: str) -> Scrape:
    status, headers, body = await http_get(url)
    assert status.split(" ", 2)[1] == "200", status
    assert headers["content-type"].startswith("text/plain")
    assert int(headers["content-length"]) == len(body)
    return Scrape(body.decode())
