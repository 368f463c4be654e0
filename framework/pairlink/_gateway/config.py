"""A gateway's configuration: where it listens, who may connect, and its routes.

Read from TOML (``load_config``); every mistake is refused at start with a message that names
the key and the line, so a gateway never runs half-configured. Secrets are never in the file:
passwords come from the environment variables the file names (``password_env``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence, Set
from pathlib import Path
from typing import Literal, TypedDict

import attrs

from pairlink._client.health import HEALTH
from pairlink._config.limits import Limits
from pairlink._config.toml_config import Table, TomlReader, read_config_text, type_name
from pairlink._config.toml_lines import KeyPath, dotted
from pairlink.errors import ConfigError

__all__ = ["MAX_PAIRS", "ConfigError", "GatewayConfig", "Route", "load_config", "parse_config"]

MAX_PAIRS = 10_000
"""Pairs a gateway carries at once unless configured otherwise (``max_pairs``). A relayed pair
measured about 13 KiB of gateway memory (RSS, its downstream and upstream halves and relay
state), so the default holds pairs to about 130 MiB; past it a new pair is refused with
``amqp:resource-limit-exceeded``."""


def _urls(value: str | Sequence[str]) -> tuple[str, ...]:
    """One URL, or several (replicas), as a tuple."""
    return (value,) if isinstance(value, str) else tuple(value)


@attrs.frozen
class Route:
    """One public address of this gateway and where its paired links go next (LP-11).

    ``public``: the address peers attach to here. ``upstream``: the next hop's
    ``amqp[s]://host[:port]`` (no credentials in it), or several of them: replicas of one
    next hop, each new pair placed on a ready one (README, "Replicas behind a route"); read
    as a tuple either way. ``address``: the address at the next
    hop (the public one at the next gateway, or the service's internal one). ``user`` and
    ``password``: SASL PLAIN credentials for the upstream (none: ANONYMOUS). ``allow``: the
    inbound users that may attach this route (None: every peer that passed SASL). ``ca``: a
    PEM file of CAs that verify the upstream's TLS certificate (None: the system's).
    """

    public: str
    upstream: tuple[str, ...] = attrs.field(converter=_urls)
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
    ``vouching_users``: users (gateways before this one) trusted to vouch for the callers
    they carry, so that this gateway vouches for those callers in turn, not for them;
    ``tls_cert``/``tls_key``: PEM files for an ``amqps`` listener; ``tls_client_ca``: PEM CAs
    that must have signed every inbound peer's certificate (mutual TLS); ``idle_timeout``: seconds
    of silence after which a connection (inbound or upstream) is declared dead;
    ``attach_timeout``: how long a peer's attach may wait for the upstream pair;
    ``max_pairs``: the most pairs carried at once (each pair a peer attaches, and each next
    hop a routing node pairs with), past which new ones are refused; ``max_pairs_per_user``
    and ``max_pairs_per_connection``: the most of them one user, and one connection, may hold
    (None: half of ``max_pairs``, and a quarter), so that no party takes them all;
    ``max_pairs_by_user``: a user's own share, instead of ``max_pairs_per_user`` (its
    ``[users]`` entry's ``max_pairs``);
    ``limits``: what peers may make the gateway hold (the ``[limits]`` table,
    :class:`pairlink.Limits`);
    ``metrics_listen``: ``HOST:PORT`` of its Prometheus endpoint (None: no metrics)."""

    listen: str
    routes: tuple[Route, ...]
    users: dict[str, str] | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    certificate_users: frozenset[str] = frozenset()
    vouching_users: frozenset[str] = frozenset()
    container_id: str | None = None
    idle_timeout: float = 30.0
    attach_timeout: float = 10.0
    max_pairs: int = MAX_PAIRS
    max_pairs_per_user: int | None = None
    max_pairs_per_connection: int | None = None
    max_pairs_by_user: dict[str, int] = attrs.field(factory=dict)
    limits: Limits = attrs.field(factory=Limits)
    metrics_listen: str | None = None

    def pairs_per_user(self) -> int:
        """The most pairs one user holds unless ``max_pairs_by_user`` says otherwise:
        ``max_pairs_per_user``, else half of the total."""
        if self.max_pairs_per_user is not None:
            return self.max_pairs_per_user
        return max(1, self.max_pairs // 2)

    def pairs_per_connection(self) -> int:
        """The most pairs one connection holds: ``max_pairs_per_connection``, else a quarter
        of the total."""
        if self.max_pairs_per_connection is not None:
            return self.max_pairs_per_connection
        return max(1, self.max_pairs // 4)


# -- reading a TOML config -----------------------------------------------------------------------

_TOP_KEYS = (
    "listen",
    "container_id",
    "idle_timeout",
    "attach_timeout",
    "max_pairs",
    "max_pairs_per_user",
    "max_pairs_per_connection",
    "limits",
    "tls",
    "users",
    "route",
    "metrics_listen",
)
_ROUTE_KEYS = ("public", "upstream", "address", "user", "password_env", "allow", "ca")


def load_config(
    path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None
) -> GatewayConfig:
    """Read the config file at ``path``; relative file names in it are relative to its folder.
    ``ConfigError`` also for a file that cannot be read."""
    text = read_config_text(path)
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
    return reader.config(reader.parse(text))


class _Bounds(TypedDict, total=False):
    """The top-level settings that ``GatewayConfig`` takes as keywords."""

    idle_timeout: float
    attach_timeout: float
    max_pairs: int
    max_pairs_per_user: int
    max_pairs_per_connection: int
    max_pairs_by_user: dict[str, int]
    limits: Limits


_PAIR_COUNTS: tuple[Literal["max_pairs", "max_pairs_per_user", "max_pairs_per_connection"], ...] = (
    "max_pairs",
    "max_pairs_per_user",
    "max_pairs_per_connection",
)
_TIMEOUTS: tuple[Literal["idle_timeout", "attach_timeout"], ...] = (
    "idle_timeout",
    "attach_timeout",
)


class _Reader(TomlReader):
    """The gateway's document, with the shared checks of :class:`TomlReader`."""

    user_keys = (*TomlReader.user_keys, "max_pairs")

    def config(self, document: Table) -> GatewayConfig:
        self.keys(document, (), _TOP_KEYS)
        listen = self.url(self.required(document, (), "listen"), ("listen",))
        users = None
        certificate_users: frozenset[str] = frozenset()
        limits: _Bounds = {}  # absent: GatewayConfig's defaults
        if "users" in document:
            users, certificate_users = self.users(document["users"])
            shares = self.user_shares(document["users"])
            if shares:
                limits["max_pairs_by_user"] = shares
        tls = self.tls(document, ("listen",), listen.startswith("amqps:"))
        self.certificates_verified(certificate_users, tls)
        client_ca = None if tls is None else tls.client_ca
        for key in _TIMEOUTS:
            if key in document:
                limits[key] = self.seconds(document[key], (key,))
        for count in _PAIR_COUNTS:
            if count in document:
                limits[count] = self.count(document[count], (count,), "pairs")
        if "limits" in document:
            limits["limits"] = self.limits(document["limits"])
        return GatewayConfig(
            listen=listen,
            routes=self.routes(document, None if users is None else {*users, *certificate_users}),
            users=users,
            tls_cert=None if tls is None else tls.cert,
            tls_key=None if tls is None else tls.key,
            tls_client_ca=client_ca,
            certificate_users=certificate_users,
            vouching_users=self.vouching_users(document),
            container_id=self.optional(document, (), "container_id"),
            metrics_listen=self.metrics_listen(document),
            **limits,
        )

    def user_shares(self, value: object) -> dict[str, int]:
        """The users' own ``max_pairs`` in the ``[users]`` table (read by ``users`` first)."""
        shares: dict[str, int] = {}
        for name, entry in self.table(value, ("users",), None).items():
            here: KeyPath = ("users", name, "max_pairs")
            table = self.table(entry, here[:2], None)
            if "max_pairs" in table:
                shares[name] = self.count(table["max_pairs"], here, "pairs")
        return shares

    def routes(self, document: Table, users: Set[str] | None) -> tuple[Route, ...]:
        tables = document.get("route")
        if not isinstance(tables, list) or not tables:
            problem = "missing" if tables is None else f"{type_name(tables)}, not [[route]] tables"
            self.fail(("route",), f"{problem}: a gateway needs at least one [[route]] table")
        routes: list[Route] = []
        for index, table in enumerate(tables):
            here: KeyPath = ("route", index)
            route = self.table(table, here, _ROUTE_KEYS)
            public = self.required(route, here, "public")
            if public == HEALTH:
                self.fail((*here, "public"), f"{HEALTH!r} is the gateway's own health node")
            for earlier, other in enumerate(routes):
                if other.public == public:
                    where = dotted(("route", earlier))
                    self.fail((*here, "public"), f"{public!r} is already the public of {where}")
            upstream = self.upstreams(route, here)
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
                if not all(url.startswith("amqps:") for url in upstream):
                    self.fail((*here, "ca"), "only for an amqps:// upstream")
                ca = self.ca_file(ca, (*here, "ca"))
            address = self.required(route, here, "address")
            routes.append(Route(public, upstream, address, user, password, allow, ca))
        return tuple(routes)

    def upstreams(self, route: Table, here: KeyPath) -> tuple[str, ...]:
        """A route's ``upstream``: one URL, or a non-empty array of distinct URLs (its
        replicas)."""
        path: KeyPath = (*here, "upstream")
        value = route.get("upstream")
        if not isinstance(value, list):
            return (self.url(self.required(route, here, "upstream"), path),)
        if not value:
            self.fail(path, "an empty array: name at least one next hop")
        urls: list[str] = []
        for index, item in enumerate(value):
            if not isinstance(item, str):
                self.fail(path, f"expected URLs (strings), got {type_name(item)} {item!r}")
            if item in urls:
                self.fail(path, f"{item!r} is named twice")
            urls.append(self.url(item, (*path, index)))
        return tuple(urls)

    def allow(self, value: object, path: KeyPath, users: Set[str] | None) -> list[str]:
        if not isinstance(value, list) or not value:
            got = "an empty array" if value == [] else type_name(value)
            self.fail(path, f"expected a non-empty array of [users] names, got {got}")
        for name in value:
            if not isinstance(name, str):
                self.fail(path, f"expected names (strings), got {type_name(name)} {name!r}")
            if users is None or name not in users:
                self.fail(path, f"{name!r} is not a user of the [users] table")
        return value
