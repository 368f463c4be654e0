"""A gateway's configuration: where it listens, who may connect, and its routes.

Read from TOML (``load_config``); every mistake is refused at start with a message that names
the key and the line, so a gateway never runs half-configured. Secrets are never in the file:
passwords come from the environment variables the file names (``password_env``).
"""

from __future__ import annotations

import math
import os
import re
import ssl
import tomllib
from collections.abc import Mapping, Set
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

import attrs

from framework.gateway.toml_lines import KeyLines, KeyPath, dotted
from framework.io.limits import Limits
from framework.io.net import AmqpUrl

MAX_PAIRS = 10_000
"""Pairs a gateway carries at once unless configured otherwise (``max_pairs``). A relayed pair
measured about 13 KiB of gateway memory (RSS, its downstream and upstream halves and relay
state), so the default holds pairs to about 130 MiB; past it a new pair is refused with
``amqp:resource-limit-exceeded``."""


class ConfigError(ValueError):
    """The configuration is malformed: the message names the file, line and key."""


@attrs.frozen
class Route:
    """One public address of this gateway and where its paired links go next (LP-11).

    ``public``: the address peers attach to here. ``upstream``: the next hop's
    ``amqp[s]://host[:port]`` (no credentials in it). ``address``: the address at the next
    hop (the public one at the next gateway, or the service's internal one). ``user`` and
    ``password``: SASL PLAIN credentials for the upstream (none: ANONYMOUS). ``allow``: the
    inbound users that may attach this route (None: every peer that passed SASL). ``ca``: a
    PEM file of CAs that verify the upstream's TLS certificate (None: the system's).
    """

    public: str
    upstream: str
    address: str
    user: str | None = None
    password: str | None = None
    allow: frozenset[str] | None = None
    ca: str | None = None


@attrs.frozen
class GatewayConfig:
    """``listen``: ``amqp[s]://host:port`` for inbound peers; ``users``: SASL PLAIN users
    (name -> password) allowed to connect inbound (None: anonymous peers are allowed);
    ``certificate_users``: users who log in with a client certificate instead (SASL EXTERNAL:
    the certificate's common name, else its first subjectAltName, is the user);
    ``tls_cert``/``tls_key``: PEM files for an ``amqps`` listener; ``tls_client_ca``: PEM CAs
    that must have signed every inbound peer's certificate (mutual TLS); ``idle_timeout``: seconds
    of silence after which a connection (inbound or upstream) is declared dead;
    ``attach_timeout``: how long a peer's attach may wait for the upstream pair;
    ``max_pairs``: the most pairs carried at once (each pair a peer attaches, and each next
    hop a routing node pairs with), past which new ones are refused; ``limits``: what peers
    may make the gateway hold (the ``[limits]`` table, :class:`framework.io.limits.Limits`)."""

    listen: str
    routes: tuple[Route, ...]
    users: dict[str, str] | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    certificate_users: frozenset[str] = frozenset()
    container_id: str | None = None
    idle_timeout: float = 30.0
    attach_timeout: float = 10.0
    max_pairs: int = MAX_PAIRS
    limits: Limits = attrs.field(factory=Limits)


# -- reading a TOML config -----------------------------------------------------------------------

_TOP_KEYS = (
    "listen",
    "container_id",
    "idle_timeout",
    "attach_timeout",
    "max_pairs",
    "limits",
    "tls",
    "users",
    "route",
)
_TLS_KEYS = ("cert", "key", "client_ca")
_LIMIT_SECONDS = ("handshake_timeout", "login_penalty")
_LIMIT_COUNTS = {  # key: what it counts, for the messages
    "max_connections": "connections",
    "max_outgoing_bytes": "bytes",
    "max_message_size": "bytes",
    "max_incomplete_bytes": "bytes",
    "max_unsettled": "deliveries",
    "max_decoded_elements": "values",
    "handle_max": "handles",
    "max_links": "links",
}
_USER_KEYS = ("password_env", "certificate")
_ROUTE_KEYS = ("public", "upstream", "address", "user", "password_env", "allow", "ca")


def load_config(
    path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None
) -> GatewayConfig:
    """Read the config file at ``path``; relative file names in it are relative to its folder.
    ``ConfigError`` also for a file that cannot be read."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{os.fspath(path)}: cannot read the config: {exc}") from None
    return parse_config(
        text, source=os.fspath(path), environ=environ, base=Path(path).resolve().parent
    )


def parse_config(
    text: str,
    *,
    source: str = "<config>",
    environ: Mapping[str, str] | None = None,
    base: str | os.PathLike[str] | None = None,
) -> GatewayConfig:
    """The gateway config in TOML ``text``; ``source`` names it in error messages.

    Passwords are read from ``environ`` (default ``os.environ``) at the variables the config
    names; relative file names resolve against ``base`` (default: the current directory).
    The first mistake raises ``ConfigError("{source}:{line}: {key}: {problem}")``.
    """
    reader = _Reader(text, source, os.environ if environ is None else environ, base)
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        reader.syntax_error(str(exc))
    return reader.config(document)


_TYPE_NAMES = {
    bool: "a boolean",
    str: "a string",
    int: "an integer",
    float: "a number",
    dict: "a table",
    list: "an array",
}


def _type_name(value: object) -> str:
    return _TYPE_NAMES.get(type(value), "a date/time")


class _Reader:
    """Checks a parsed document key by key; each check names the key's path (for the line)."""

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

    # -- the document ---------------------------------------------------------------------

    def config(self, document: dict[str, Any]) -> GatewayConfig:
        self.keys(document, (), _TOP_KEYS)
        listen = self.url(self.required(document, (), "listen"), ("listen",))
        users = None
        certificate_users: set[str] = set()
        if "users" in document:
            users = {}
            for name, entry in self.table(document["users"], ("users",), None).items():
                here: KeyPath = ("users", name)
                table = self.table(entry, here, _USER_KEYS)
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
        tls_cert = tls_key = client_ca = None
        if "tls" in document:
            tls = self.table(document["tls"], ("tls",), _TLS_KEYS)
            if not listen.startswith("amqps:"):
                self.fail(("tls",), "[tls] is for an amqps:// listen, and listen is amqp://")
            cert, key = self.required(tls, ("tls",), "cert"), self.required(tls, ("tls",), "key")
            tls_cert, tls_key = self.file(cert, ("tls", "cert")), self.file(key, ("tls", "key"))
            try:  # refused now, with its line, rather than at the first inbound peer
                ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
                    tls_cert, tls_key
                )
            except OSError as exc:  # ssl.SSLError included
                self.fail(("tls", "cert"), f"cert and key do not load as a PEM pair: {exc}")
            if "client_ca" in tls:
                client_ca = self.ca_file(tls["client_ca"], ("tls", "client_ca"))
        elif listen.startswith("amqps:"):
            self.fail(("listen",), "an amqps:// listen needs a [tls] table with cert and key")
        if certificate_users and client_ca is None:
            name = min(certificate_users)
            self.fail(("users", name, "certificate"), "needs [tls] client_ca to verify it")
        limits: dict[str, Any] = {  # absent: GatewayConfig's defaults
            key: self.seconds(document[key], (key,))
            for key in ("idle_timeout", "attach_timeout")
            if key in document
        }
        if "max_pairs" in document:
            limits["max_pairs"] = self.count(document["max_pairs"], ("max_pairs",), "pairs")
        if "limits" in document:
            limits["limits"] = self.limits(document["limits"])
        return GatewayConfig(
            listen=listen,
            routes=self.routes(document, None if users is None else {*users, *certificate_users}),
            users=users,
            tls_cert=tls_cert,
            tls_key=tls_key,
            tls_client_ca=client_ca,
            certificate_users=frozenset(certificate_users),
            container_id=self.optional(document, (), "container_id"),
            **limits,
        )

    def limits(self, value: object) -> Limits:
        here: KeyPath = ("limits",)
        table = self.table(value, here, (*_LIMIT_SECONDS, *_LIMIT_COUNTS))
        fields: dict[str, Any] = {}
        for key, item in table.items():
            if key in _LIMIT_SECONDS:
                fields[key] = self.seconds(item, (*here, key))
            else:
                fields[key] = self.count(item, (*here, key), _LIMIT_COUNTS[key])
        return Limits(**fields)

    def routes(self, document: dict[str, Any], users: Set[str] | None) -> tuple[Route, ...]:
        tables = document.get("route")
        if not isinstance(tables, list) or not tables:
            problem = "missing" if tables is None else f"{_type_name(tables)}, not [[route]] tables"
            self.fail(("route",), f"{problem}: a gateway needs at least one [[route]] table")
        routes: list[Route] = []
        for index, table in enumerate(tables):
            here: KeyPath = ("route", index)
            route = self.table(table, here, _ROUTE_KEYS)
            public = self.required(route, here, "public")
            for earlier, other in enumerate(routes):
                if other.public == public:
                    where = dotted(("route", earlier))
                    self.fail((*here, "public"), f"{public!r} is already the public of {where}")
            upstream = self.url(self.required(route, here, "upstream"), (*here, "upstream"))
            user = self.optional(route, here, "user")
            password = None
            if user is not None:
                password = self.password(route, here, "password_env", needed_by="user")
            elif "password_env" in route:
                self.fail((*here, "password_env"), "given without user (the upstream's SASL user)")
            allow = None
            if "allow" in route:
                allow = frozenset(self.allow(route["allow"], (*here, "allow"), users))
            ca = self.optional(route, here, "ca")
            if ca is not None:
                if not upstream.startswith("amqps:"):
                    self.fail((*here, "ca"), "only for an amqps:// upstream")
                ca = self.ca_file(ca, (*here, "ca"))
            address = self.required(route, here, "address")
            routes.append(Route(public, upstream, address, user, password, allow, ca))
        return tuple(routes)

    # -- keys and values ------------------------------------------------------------------

    def keys(self, table: dict[str, Any], path: KeyPath, known: tuple[str, ...]) -> None:
        for key in table:
            if key not in known:
                self.fail((*path, key), f"unknown key (known here: {', '.join(known)})")

    def table(self, value: object, path: KeyPath, known: tuple[str, ...] | None) -> dict[str, Any]:
        """``value`` as a table of ``known`` keys (None: any key, e.g. user names)."""
        if not isinstance(value, dict):
            self.fail(path, f"expected a table, got {_type_name(value)}")
        if known is not None:
            self.keys(value, path, known)
        return value

    def optional(self, table: dict[str, Any], path: KeyPath, key: str) -> str | None:
        """A non-empty string, or None when absent."""
        if key not in table:
            return None
        value = table[key]
        if not isinstance(value, str):
            self.fail((*path, key), f"expected a string, got {_type_name(value)}")
        if not value:
            self.fail((*path, key), "empty")
        return value

    def required(self, table: dict[str, Any], path: KeyPath, key: str) -> str:
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
            self.fail(path, f"expected seconds (a number), got {_type_name(value)}")
        if not (0 < value < math.inf):
            self.fail(path, f"{value} is not a positive number of seconds")
        return float(value)

    def count(self, value: object, path: KeyPath, things: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path, f"expected a number of {things} (an integer), got {_type_name(value)}")
        if value < 1:
            self.fail(path, f"{value} is not a positive number of {things}")
        return value

    def password(
        self, table: dict[str, Any], path: KeyPath, key: str, *, needed_by: str | None = None
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

    def allow(self, value: object, path: KeyPath, users: Set[str] | None) -> list[str]:
        if not isinstance(value, list) or not value:
            got = "an empty array" if value == [] else _type_name(value)
            self.fail(path, f"expected a non-empty array of [users] names, got {got}")
        for name in value:
            if not isinstance(name, str):
                self.fail(path, f"expected names (strings), got {_type_name(name)} {name!r}")
            if users is None or name not in users:
                self.fail(path, f"{name!r} is not a user of the [users] table")
        return value

    def ca_file(self, value: object, path: KeyPath) -> str:
        """A file of PEM CA certificates, checked now."""
        if not isinstance(value, str) or not value:
            self.fail(path, f"expected a file name, got {_type_name(value)}")
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
