"""``pairlink serve --config FILE``: where a server listens, who may connect, and what it serves.

Read from TOML with the gateway's checks (:mod:`pairlink._config.toml_config`): every mistake is
refused at start as ``file:line: key: problem``. Command-line flags override the file (the CLI
merges them); passwords come from the environment variables the file names (``password_env``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, TypedDict

import attrs

from pairlink._config.limits import Limits
from pairlink._config.toml_config import Table, TlsFiles, TomlReader, read_config_text, type_name
from pairlink._config.toml_lines import KeyPath
from pairlink.errors import ConfigError

__all__ = ["ConfigError", "ServeConfig", "ServiceEntry", "load_serve_config", "parse_serve_config"]

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("console", "json")


@attrs.frozen
class ServiceEntry:
    """One ``[[service]]`` table: ``module`` as the CLI's positional takes it
    (``MODULE[:Class]``), and the settings that override the class's ``@service`` ones."""

    module: str
    address: str | None = None
    max_concurrency: int | None = None
    mailbox: int | None = None
    dedup_window: float | None = None
    dedup_size: int | None = None


@attrs.frozen
class ServeConfig:
    """``listen``: the ``amqp[s]://host:port`` URLs to listen on, one listener each (empty:
    the CLI's); ``tls``: the ``[tls]`` files for the ``amqps`` ones; ``users``: SASL PLAIN
    users (None: anonymous peers allowed); ``certificate_users``: users who log in with a
    client certificate that ``tls.client_ca`` verified (SASL EXTERNAL); ``vouching_users``:
    the users with ``vouches = true``, gateways trusted to vouch for the callers they carry;
    ``services``: the ``[[service]]`` tables; ``limits``: the ``[limits]`` table;
    ``log_level``/``log_format``: the ``[log]`` table (None: the CLI's); ``metrics_listen``:
    ``host:port`` of the Prometheus endpoint (None: none); ``workers``: the worker processes to
    run (None: the CLI's)."""

    listen: tuple[str, ...] = ()
    tls: TlsFiles | None = None
    users: dict[str, str] | None = None
    certificate_users: frozenset[str] = frozenset()
    vouching_users: frozenset[str] = frozenset()
    services: tuple[ServiceEntry, ...] = ()
    limits: Limits | None = None
    log_level: str | None = None
    log_format: str | None = None
    metrics_listen: str | None = None
    workers: int | None = None


_TOP_KEYS = ("listen", "tls", "users", "service", "limits", "log", "metrics_listen", "workers")
_SERVICE_KEYS = ("module", "address", "max_concurrency", "mailbox", "dedup_window", "dedup_size")
_LOG_KEYS = ("level", "format")


def load_serve_config(
    path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None
) -> ServeConfig:
    """Read the config file at ``path``; relative file names in it are relative to its folder."""
    text = read_config_text(path)
    reader = _Reader(
        text,
        os.fspath(path),
        os.environ if environ is None else environ,
        Path(path).resolve().parent,
    )
    return reader.config(reader.parse(text))


def parse_serve_config(
    text: str, *, source: str = "<config>", environ: Mapping[str, str] | None = None
) -> ServeConfig:
    """The serve config in TOML ``text`` (relative file names: from the current directory)."""
    reader = _Reader(text, source, os.environ if environ is None else environ, None)
    return reader.config(reader.parse(text))


class _Overrides(TypedDict, total=False):
    """The settings of a ``[[service]]`` table that ``ServiceEntry`` takes as keywords."""

    max_concurrency: int
    mailbox: int
    dedup_window: float
    dedup_size: int


_CALL_COUNTS: tuple[Literal["max_concurrency", "mailbox"], ...] = ("max_concurrency", "mailbox")


class _Reader(TomlReader):
    """The serve document, with the shared checks of :class:`TomlReader`."""

    def __init__(
        self, text: str, source: str, environ: Mapping[str, str], base: Path | None
    ) -> None:
        super().__init__(text, source, environ, base)
        self.text_lines = text.splitlines()

    def config(self, document: Table) -> ServeConfig:
        self.keys(document, (), _TOP_KEYS)
        listen = self.listen(document)
        users = None
        certificate_users: frozenset[str] = frozenset()
        if "users" in document:
            users, certificate_users = self.users(document["users"])
        secure = [index for index, url in enumerate(listen) if url.startswith("amqps:")]
        if secure and "tls" not in document:
            where: KeyPath = ("listen", secure[0]) if len(listen) > 1 else ("listen",)
            self.fail(where, "an amqps:// listen needs a [tls] table with cert and key")
        # no listen here: a [tls] is for the command line's --listen amqps://
        tls = self.tls(document, ("listen",), bool(secure) or ("tls" in document and not listen))
        self.certificates_verified(certificate_users, tls)
        log: dict[str, str | None] = {}  # log_level, log_format
        if "log" in document:
            table = self.table(document["log"], ("log",), _LOG_KEYS)
            for key, known in (("level", LOG_LEVELS), ("format", LOG_FORMATS)):
                value = self.optional(table, ("log",), key)
                if value is not None and value not in known:
                    self.fail(("log", key), f"{value!r} is not one of {', '.join(known)}")
                log[f"log_{key}"] = value
        return ServeConfig(
            listen=listen,
            tls=tls,
            users=users,
            certificate_users=certificate_users,
            vouching_users=self.vouching_users(document),
            services=self.services(document),
            limits=self.limits(document["limits"]) if "limits" in document else None,
            metrics_listen=self.metrics_listen(document),
            workers=(
                self.count(document["workers"], ("workers",), "processes")
                if "workers" in document
                else None
            ),
            **log,
        )

    def listen(self, document: Table) -> tuple[str, ...]:
        """One URL, or an array of them (one listener each)."""
        if "listen" not in document:
            return ()
        value = document["listen"]
        if not isinstance(value, list):
            value = [value]
        elif not value:
            self.fail(("listen",), "an empty array: give a URL, or leave listen out")
        else:
            self.locate_elements(value)
        for index, url in enumerate(value):
            path: KeyPath = ("listen",) if len(value) == 1 else ("listen", index)
            if not isinstance(url, str):
                self.fail(path, f"expected a URL (a string), got {type_name(url)}")
            if value.index(url) != index:
                self.fail(path, f"{url!r} is listed twice")
            self.url(url, path)
        return tuple(value)

    def locate_elements(self, urls: list[object]) -> None:
        """Record the line of each of ``listen``'s URLs (``("listen", index)``): an array may
        span lines, one URL each, and a mistake is named where it is written."""
        number = self.lines.line(("listen",))
        for index, url in enumerate(urls):
            quoted = (f'"{url}"', f"'{url}'")
            for candidate in range(number, len(self.text_lines) + 1):
                if any(q in self.text_lines[candidate - 1] for q in quoted):
                    number = candidate
                    break
            self.lines.lines[("listen", index)] = number

    def services(self, document: Table) -> tuple[ServiceEntry, ...]:
        tables = document.get("service", [])
        if not isinstance(tables, list):
            self.fail(("service",), f"{type_name(tables)}, not [[service]] tables")
        entries = []
        for index, table in enumerate(tables):
            here: KeyPath = ("service", index)
            entry = self.table(table, here, _SERVICE_KEYS)
            overrides: _Overrides = {}
            for key in _CALL_COUNTS:
                if key in entry:
                    overrides[key] = self.count(entry[key], (*here, key), "calls")
            if "dedup_window" in entry:
                window = self.seconds(entry["dedup_window"], (*here, "dedup_window"))
                overrides["dedup_window"] = window
            if "dedup_size" in entry:
                size = self.count(entry["dedup_size"], (*here, "dedup_size"), "replies")
                overrides["dedup_size"] = size
            entries.append(
                ServiceEntry(
                    self.required(entry, here, "module"),
                    self.optional(entry, here, "address"),
                    **overrides,
                )
            )
        return tuple(entries)
