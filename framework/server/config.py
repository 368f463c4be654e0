"""``pairlink serve --config FILE``: where a server listens, who may connect, and what it serves.

Read from TOML with the gateway's checks (:mod:`framework.io.toml_config`): every mistake is
refused at start as ``file:line: key: problem``. Command-line flags override the file (the CLI
merges them); passwords come from the environment variables the file names (``password_env``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from framework.io.limits import Limits
from framework.io.toml_config import (
    ConfigError,
    TlsFiles,
    TomlReader,
    read_config_text,
    type_name,
)
from framework.io.toml_lines import KeyPath

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


@attrs.frozen
class ServeConfig:
    """``listen``: the ``amqp[s]://host:port`` to listen on (one listener today: the server
    takes one URL); ``tls``: the ``[tls]`` files for ``amqps``; ``users``: SASL PLAIN users
    (None: anonymous peers allowed); ``services``: the ``[[service]]`` tables; ``limits``: the
    ``[limits]`` table; ``log_level``/``log_format``: the ``[log]`` table (None: the CLI's)."""

    listen: str | None = None
    tls: TlsFiles | None = None
    users: dict[str, str] | None = None
    services: tuple[ServiceEntry, ...] = ()
    limits: Limits | None = None
    log_level: str | None = None
    log_format: str | None = None


_TOP_KEYS = ("listen", "tls", "users", "service", "limits", "log")
_SERVICE_KEYS = ("module", "address", "max_concurrency", "mailbox")
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


class _Reader(TomlReader):
    """The serve document, with the shared checks of :class:`TomlReader`."""

    def config(self, document: dict[str, Any]) -> ServeConfig:
        self.keys(document, (), _TOP_KEYS)
        listen = self.listen(document)
        users = None
        if "users" in document:
            users, certificate_users = self.users(document["users"])
            if certificate_users:  # the server has no SASL EXTERNAL yet
                self.fail(
                    ("users", min(certificate_users), "certificate"), "not supported by serve"
                )
        secure = listen is not None and listen.startswith("amqps:")
        tls = self.tls(document, ("listen",), secure)
        log: dict[str, Any] = {}
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
            services=self.services(document),
            limits=self.limits(document["limits"]) if "limits" in document else None,
            **log,
        )

    def listen(self, document: dict[str, Any]) -> str | None:
        """One URL, as a string or a one-element array (several listeners: not yet)."""
        if "listen" not in document:
            return None
        value = document["listen"]
        if isinstance(value, list):
            if len(value) != 1:
                self.fail(("listen",), f"{len(value)} URLs: serve listens on exactly one today")
            value = value[0]
        if not isinstance(value, str):
            self.fail(("listen",), f"expected a URL (a string), got {type_name(value)}")
        return self.url(value, ("listen",))

    def services(self, document: dict[str, Any]) -> tuple[ServiceEntry, ...]:
        tables = document.get("service", [])
        if not isinstance(tables, list):
            self.fail(("service",), f"{type_name(tables)}, not [[service]] tables")
        entries = []
        for index, table in enumerate(tables):
            here: KeyPath = ("service", index)
            entry = self.table(table, here, _SERVICE_KEYS)
            counts = {
                key: self.count(entry[key], (*here, key), "calls")
                for key in ("max_concurrency", "mailbox")
                if key in entry
            }
            entries.append(
                ServiceEntry(
                    self.required(entry, here, "module"),
                    self.optional(entry, here, "address"),
                    **counts,
                )
            )
        return tuple(entries)
