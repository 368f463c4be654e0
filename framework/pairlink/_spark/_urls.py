"""The endpoints a fan-out calls, and how they are shown.

``call_service(url=...)`` takes one URL or the replicas of a service (a list of URLs; one URL
whose host name has several addresses is a list the client finds itself). A URL may carry
SASL credentials (``amqp://user:password@host``), and what is shown of it (errors raised in a
Spark task end up in the driver's traceback and the executors' logs) never carries the
password.
"""

from __future__ import annotations

from collections.abc import Sequence

from pairlink._io.net import redacted


def endpoints(url: str | Sequence[str]) -> str | tuple[str, ...]:
    """``url`` checked: one ``amqp[s]://`` URL as it is, several as a tuple (picklable and
    immutable, for the plan a task gets); a ``ValueError`` (the URL shown redacted) else."""
    urls = [url] if isinstance(url, str) else list(url)
    if not urls:
        raise ValueError("url must be an amqp[s]:// URL or a non-empty list of them")
    for one in urls:
        if not isinstance(one, str) or not one.startswith(("amqp://", "amqps://")):
            what = repr(redacted(one) if isinstance(one, str) else one)
            raise ValueError(f"url must be amqp://host:port or amqps://..., not {what}")
    return url if isinstance(url, str) else tuple(urls)


def described(url: str | Sequence[str]) -> str:
    """The endpoints for a message: one URL, or several joined by commas; redacted."""
    urls = [url] if isinstance(url, str) else url
    return ", ".join(redacted(one) for one in urls)


def scrubbed(text: str, url: str | Sequence[str]) -> str:
    """``text`` (an error's message) with every one of the endpoints' URLs in it redacted."""
    for one in [url] if isinstance(url, str) else url:
        safe = redacted(one)
        if safe != one:
            text = text.replace(one, safe)
    return text
