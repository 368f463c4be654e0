"""The checks behind pairlink's TOML config files (the gateway's, ``pairlink serve``'s): every
mistake is refused at start as ``file:line: key: problem``, so a process never runs
half-configured. Secrets are never in a file: passwords come from the environment variables it
names (``password_env``). Shared here, below both the gateway and the server, which each read
their own document with a :class:`TomlReader`.
"""

from __future__ import annotations

import math
import os
import re
import ssl
import tomllib
from collections.abc import Mapping, Set
from pathlib import Path
from typing import Any, NoReturn, TypeAlias
from urllib.parse import urlsplit

import attrs

from pairlink._config.limits import Limits
from pairlink._config.toml_lines import KeyLines, KeyPath, dotted
from pairlink._io.net import AmqpUrl
from pairlink._telemetry.metrics import parse_listen
from pairlink.errors import ConfigError


@attrs.frozen
class TlsFiles:
    """The ``[tls]`` table: PEM files of a listener's certificate chain and key, and the CAs
    that must have signed every inbound peer's certificate (``client_ca``: mutual TLS)."""

    cert: str
    key: str
    client_ca: str | None = None


def server_tls_context(cert: str, key: str, client_ca: str | None = None) -> ssl.SSLContext:
    """The server side of an ``amqps://`` listener; with ``client_ca``, no peer without a
    certificate that CA signed."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cafile=client_ca)
    return context


def read_config_text(path: str | os.PathLike[str]) -> str:
    """The text of the config file at ``path``; ``ConfigError`` if it cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{os.fspath(path)}: cannot read the config: {exc}") from None


Table: TypeAlias = dict[str, object]
"""A TOML table (or the whole document) as tomllib parses it: its values are whatever the file
says, each checked where it is read."""

_TLS_KEYS = ("cert", "key", "client_ca")
_USER_KEYS = ("password_env", "certificate", "vouches")
_LIMIT_SECONDS = ("handshake_timeout", "login_penalty", "drain_timeout")
_LIMIT_COUNTS = {  # key: what it counts, for the messages
    "max_connections": "connections",
    "max_outgoing_bytes": "bytes",
    "max_message_size": "bytes",
    "max_incomplete_bytes": "bytes",
    "max_unsettled": "deliveries",
    "max_session_unsettled": "deliveries",
    "max_decoded_elements": "values",
    "handle_max": "handles",
    "max_links": "links",
    "max_links_total": "links",
    "max_batch_rows": "rows",
}


_TYPE_NAMES = {
    bool: "a boolean",
    str: "a string",
    int: "an integer",
    float: "a number",
    dict: "a table",
    list: "an array",
}


def type_name(value: object) -> str:
    return _TYPE_NAMES.get(type(value), "a date/time")


class TomlReader:
    """Checks a parsed document key by key; each check names the key's path (for the line).
    Subclasses read their own documents (the gateway's, ``serve``'s) with these checks."""

    user_keys: tuple[str, ...] = _USER_KEYS
    """The keys a ``[users]`` entry may have (a subclass may allow more, and read them)."""

    def __init__(
        self,
        text: str,
        source: str,
        environ: Mapping[str, str],
        base: str | os.PathLike[str] | None,
    ) -> None:
        self.lines = KeyLines(text)
        self.line_count = max(1, len(text.splitlines()))
        self.source = source
        self.environ = environ
        self.base = Path.cwd() if base is None else Path(base)

    def fail(self, path: KeyPath, problem: str, *, line: int | None = None) -> NoReturn:
        line = self.lines.line(path) if line is None else line
        raise ConfigError(f"{self.source}:{line}: {dotted(path)}: {problem}")

    def syntax_error(self, message: str) -> NoReturn:
        """tomllib says where, not which key: the locator reads the key on that line."""
        at = re.search(r"\s*\(at line (\d+), column (\d+)\)$", message)
        line = int(at.group(1)) if at else self.line_count  # "(at end of document)"
        problem = message[: at.start()] if at else message.removesuffix(" (at end of document)")
        where = f" at column {at.group(2)}" if at else " at the end"
        self.fail(self.lines.key_at(line), f"not valid TOML: {problem}{where}", line=line)

    def parse(self, text: str) -> Table:
        """The TOML document of ``text``; a syntax error names its line and key."""
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            self.syntax_error(str(exc))

    def users(self, value: object) -> tuple[dict[str, str], frozenset[str]]:
        """The ``[users]`` table: SASL PLAIN users (name -> password, from ``password_env``),
        and the users who log in with a client certificate instead (``certificate = true``)."""
        users: dict[str, str] = {}
        certificate_users: set[str] = set()
        for name, entry in self.table(value, ("users",), None).items():
            here: KeyPath = ("users", name)
            table = self.table(entry, here, self.user_keys)
            if "certificate" not in table:
                users[name] = self.password(table, here, "password_env")
            elif table["certificate"] is not True or "password_env" in table:
                self.fail(
                    (*here, "certificate"),
                    "certificate = true (a client certificate's user), or password_env",
                )
            else:
                certificate_users.add(name)
        if not users and not certificate_users:
            self.fail(("users",), "no users: remove [users] to let anonymous peers in")
        return users, frozenset(certificate_users)

    def vouching_users(self, document: Table) -> frozenset[str]:
        """The ``[users]`` with ``vouches = true``: gateways trusted to vouch for the callers
        they carry (:mod:`pairlink._rpc.caller`)."""
        names = set()
        for name, entry in self.table(document.get("users", {}), ("users",), None).items():
            table = self.table(entry, ("users", name), self.user_keys)
            if "vouches" in table:
                if table["vouches"] is not True:
                    why = "vouches = true (a gateway trusted to vouch for its callers), or none"
                    self.fail(("users", name, "vouches"), why)
                names.add(name)
        return frozenset(names)

    def certificates_verified(self, certificate_users: Set[str], tls: TlsFiles | None) -> None:
        """Certificate users need ``[tls] client_ca``: only a certificate that CA verified
        may name a user."""
        if certificate_users and (tls is None or tls.client_ca is None):
            name = min(certificate_users)
            self.fail(("users", name, "certificate"), "needs [tls] client_ca to verify it")

    def tls(self, document: Table, listen: KeyPath, secure: bool) -> TlsFiles | None:
        """The ``[tls]`` table, checked now (files load as PEM) rather than at the first peer;
        required exactly when the listener at ``listen`` is ``amqps://`` (``secure``)."""
        if "tls" not in document:
            if secure:
                self.fail(listen, "an amqps:// listen needs a [tls] table with cert and key")
            return None
        tls = self.table(document["tls"], ("tls",), _TLS_KEYS)
        if not secure:
            self.fail(("tls",), "[tls] is for an amqps:// listen, and listen is amqp://")
        cert, key = self.required(tls, ("tls",), "cert"), self.required(tls, ("tls",), "key")
        cert, key = self.file(cert, ("tls", "cert")), self.file(key, ("tls", "key"))
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
        except OSError as exc:  # ssl.SSLError included
            self.fail(("tls", "cert"), f"cert and key do not load as a PEM pair: {exc}")
        client_ca = None
        if "client_ca" in tls:
            client_ca = self.ca_file(tls["client_ca"], ("tls", "client_ca"))
        return TlsFiles(cert, key, client_ca)

    def metrics_listen(self, document: Table) -> str | None:
        """The top-level ``metrics_listen``: ``HOST:PORT`` of the Prometheus endpoint."""
        value = self.optional(document, (), "metrics_listen")
        if value is not None:
            try:
                parse_listen(value)
            except ValueError:
                self.fail(
                    ("metrics_listen",), f'{value!r} is not HOST:PORT (e.g. "127.0.0.1:9464")'
                )
        return value

    def limits(self, value: object) -> Limits:
        here: KeyPath = ("limits",)
        table = self.table(value, here, (*_LIMIT_SECONDS, *_LIMIT_COUNTS))
        fields: dict[str, Any] = {}  # Limits' keyword arguments: Any, as mypy cannot tie the
        # table's keys (each checked against Limits' fields) to their types
        for key, item in table.items():
            if key in _LIMIT_SECONDS:
                fields[key] = self.seconds(item, (*here, key))
            else:
                fields[key] = self.count(item, (*here, key), _LIMIT_COUNTS[key])
        return Limits(**fields)

    # -- keys and values ------------------------------------------------------------------

    def keys(self, table: Table, path: KeyPath, known: tuple[str, ...]) -> None:
        for key in table:
            if key not in known:
                self.fail((*path, key), f"unknown key (known here: {', '.join(known)})")

    def table(self, value: object, path: KeyPath, known: tuple[str, ...] | None) -> Table:
        """``value`` as a table of ``known`` keys (None: any key, e.g. user names)."""
        if not isinstance(value, dict):
            self.fail(path, f"expected a table, got {type_name(value)}")
        if known is not None:
            self.keys(value, path, known)
        return value

    def optional(self, table: Table, path: KeyPath, key: str) -> str | None:
        """A non-empty string, or None when absent."""
        if key not in table:
            return None
        value = table[key]
        if not isinstance(value, str):
            self.fail((*path, key), f"expected a string, got {type_name(value)}")
        if not value:
            self.fail((*path, key), "empty")
        return value

    def required(self, table: Table, path: KeyPath, key: str) -> str:
        value = self.optional(table, path, key)
        if value is None:
            self.fail((*path, key), "missing (required)")
        return value

    def url(self, value: str, path: KeyPath) -> str:
        try:
            url = AmqpUrl.parse(value)
        except ValueError:
            self.fail(path, f"{value!r} is not an amqp:// or amqps:// URL")
        parts = urlsplit(value)
        if url.username is not None or url.password is not None:
            self.fail(path, "no credentials in the URL: use user and password_env")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            self.fail(path, f"{value!r}: only amqp[s]://host[:port], no path or query")
        return value

    def seconds(self, value: object, path: KeyPath) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(path, f"expected seconds (a number), got {type_name(value)}")
        if not (0 < value < math.inf):
            self.fail(path, f"{value} is not a positive number of seconds")
        return float(value)

    def count(self, value: object, path: KeyPath, things: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path, f"expected a number of {things} (an integer), got {type_name(value)}")
        if value < 1:
            self.fail(path, f"{value} is not a positive number of {things}")
        return value

    def password(
        self, table: Table, path: KeyPath, key: str, *, needed_by: str | None = None
    ) -> str:
        """The password in the environment variable that ``table[key]`` names."""
        if needed_by is not None and key not in table:
            self.fail((*path, needed_by), f"needs {key} (the variable holding its password)")
        variable = self.required(table, path, key)
        password = self.environ.get(variable)
        if password is None:
            self.fail((*path, key), f"environment variable {variable} is not set")
        if not password:
            self.fail((*path, key), f"environment variable {variable} is empty")
        return password

    def ca_file(self, value: object, path: KeyPath) -> str:
        """A file of PEM CA certificates, checked now."""
        if not isinstance(value, str) or not value:
            self.fail(path, f"expected a file name, got {type_name(value)}")
        name = self.file(value, path)
        try:
            ssl.create_default_context(cafile=name)
        except OSError as exc:
            self.fail(path, f"no PEM CA certificates in {name}: {exc}")
        return name

    def file(self, value: str, path: KeyPath) -> str:
        """``value`` made absolute against the base folder; the file must exist."""
        resolved = self.base / Path(value).expanduser()
        if not resolved.is_file():
            self.fail(path, f"no such file: {resolved}")
        return str(resolved)
