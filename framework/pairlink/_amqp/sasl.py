"""SASL negotiation (Part 5 §5.3) as two small state machines, one per side.

They know mechanisms and credentials, nothing about frames or sockets: the connection engine
feeds them the decoded SASL performatives and writes what they return. Supported: ANONYMOUS,
PLAIN (the server asks a callback), EXTERNAL (the identity comes from the TLS layer, which the
transport hands in as ``external_identity``). A server that offers ANONYMOUS also lets a peer
skip SASL altogether (the plain AMQP header, handshake.py): that peer is anonymous too.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Sequence

import attrs

from .performatives import (
    SASL_AUTH,
    SASL_OK,
    SASL_SYS_PERM,
    SaslInit,
    SaslOutcome,
    SaslResponse,
)

ANONYMOUS = "ANONYMOUS"
PLAIN = "PLAIN"
EXTERNAL = "EXTERNAL"

ANONYMOUS_IDENTITY = "anonymous"
"""The identity of a peer let in without credentials (SASL ANONYMOUS, or no SASL at all): one
value, so whatever judges a peer by its identity treats both alike."""

CheckPlain = Callable[[str, str, str], bool]
"""``check(authzid, username, password) -> bool``, the server's credential check."""


class SaslFailed(Exception):
    """Negotiation cannot go on (no common mechanism, a malformed exchange)."""


@attrs.define
class SaslClient:
    """The initiating side: picks the first of its mechanisms the server offers."""

    mechanism: str
    initial_response: bytes | None = None
    hostname: str | None = None

    @classmethod
    def anonymous(cls, trace: str = "") -> SaslClient:
        return cls(ANONYMOUS, trace.encode())

    @classmethod
    def plain(cls, username: str, password: str, authzid: str = "") -> SaslClient:
        return cls(PLAIN, b"\0".join(s.encode() for s in (authzid, username, password)))

    @classmethod
    def external(cls) -> SaslClient:
        return cls(EXTERNAL, b"")

    def start(self, offered: Sequence[str]) -> SaslInit:
        """Answer the server's ``sasl-mechanisms``."""
        if self.mechanism not in offered:
            raise SaslFailed(f"server offers {list(offered)}, we need {self.mechanism}")
        return SaslInit(
            mechanism=self.mechanism,
            initial_response=self.initial_response,
            hostname=self.hostname,
        )

    def challenge(self, _challenge: bytes) -> SaslResponse:
        """None of our mechanisms has a challenge step; an empty answer lets the server decide."""
        return SaslResponse(response=b"")


@attrs.define
class SaslServer:
    """The accepting side: offers mechanisms, judges the client's ``sasl-init``."""

    mechanisms: Sequence[str] = (ANONYMOUS,)
    check_plain: CheckPlain | None = None
    external_identity: str | None = None

    @classmethod
    def with_users(cls, users: dict[str, str], *, allow_anonymous: bool = False) -> SaslServer:
        """PLAIN against a fixed user table (what tests and small deployments want)."""

        def check(_authzid: str, username: str, password: str) -> bool:
            expected = users.get(username)
            return expected is not None and _constant_time_equal(expected, password)

        mechs = (PLAIN, ANONYMOUS) if allow_anonymous else (PLAIN,)
        return cls(mechanisms=mechs, check_plain=check)

    @property
    def allows_anonymous(self) -> bool:
        """Whether a peer may come in without credentials: then it may skip SASL too."""
        return ANONYMOUS in self.mechanisms

    def offered(self) -> list[str]:
        mechs = list(self.mechanisms)
        if self.external_identity is not None and EXTERNAL not in mechs:
            mechs.insert(0, EXTERNAL)
        return mechs

    def judge(self, init: SaslInit) -> tuple[SaslOutcome, str | None]:
        """Decide on a ``sasl-init``: the outcome to send and the identity, authenticated on
        success; on a refused PLAIN login, the user it claimed to be (for the logs)."""
        mechanism = str(init.mechanism)
        if mechanism not in self.offered():
            return SaslOutcome(code=SASL_AUTH), None
        if mechanism == ANONYMOUS:
            return SaslOutcome(code=SASL_OK), ANONYMOUS_IDENTITY
        if mechanism == EXTERNAL:
            if self.external_identity is None:
                return SaslOutcome(code=SASL_AUTH), None
            return SaslOutcome(code=SASL_OK), self.external_identity
        if mechanism == PLAIN:
            return self._judge_plain(init.initial_response or b"")
        return SaslOutcome(code=SASL_SYS_PERM), None

    def _judge_plain(self, response: bytes) -> tuple[SaslOutcome, str | None]:
        parts = response.split(b"\0")
        if len(parts) != 3 or self.check_plain is None:
            return SaslOutcome(code=SASL_AUTH), None
        try:
            authzid, username, password = (p.decode() for p in parts)
        except UnicodeDecodeError:
            return SaslOutcome(code=SASL_AUTH), None
        if not self.check_plain(authzid, username, password):
            return SaslOutcome(code=SASL_AUTH), username
        return SaslOutcome(code=SASL_OK), username


def _constant_time_equal(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())
