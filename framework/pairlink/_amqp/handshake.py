"""The start of a connection, before any performative: protocol headers (Part 2 §2.2) and the
SASL exchange (Part 5 §5.3), apart from the connection's frame handling as wsproto keeps its
handshake apart from its frames.

``Handshake`` knows which header comes next (a server whose SASL admits anonymous peers takes
the plain AMQP header in its place: no SASL layer), what to answer, and drives ``SaslClient`` or
``SaslServer`` with the decoded SASL frames. It writes its own bytes (headers, SASL frames) to
the connection's output buffer and tells the connection where input stands (``Phase``); the
connection decides when its held AMQP frames may follow our AMQP header.
"""

from __future__ import annotations

import enum

from . import errors
from .errors import RemoteProtocolError
from .events import Event, SaslDone, TransportFailed
from .framing import AMQP_HEADER, FRAME_SASL, SASL_HEADER, Frame, encode_frame
from .performatives import (
    SASL_OK,
    SaslChallenge,
    SaslFrame,
    SaslInit,
    SaslMechanisms,
    SaslOutcome,
)
from .sasl import ANONYMOUS_IDENTITY, SaslClient, SaslFailed, SaslServer
from .types import Symbol


class Phase(enum.Enum):
    """What the connection's input is expected to hold next."""

    HEADER = "header"  # the first protocol header (SASL or AMQP)
    SASL = "sasl"  # SASL frames
    AMQP_HEADER = "amqp-header"  # the AMQP header that follows a successful SASL exchange
    FRAMES = "frames"  # AMQP frames: the connection's own business from here on
    DONE = "done"  # closed or failed: input is ignored


class Handshake:
    """Headers and SASL for one connection; ``initiator`` writes the first header."""

    def __init__(
        self, sasl: SaslClient | SaslServer | None, *, initiator: bool, out: bytearray
    ) -> None:
        self.phase = Phase.HEADER
        self.identity: str | None = None  # who the peer is (server side), once known
        self._sasl = sasl
        self._initiator = initiator
        self._out = out
        if initiator:
            out += SASL_HEADER if sasl is not None else AMQP_HEADER

    @property
    def amqp_header_written(self) -> bool:
        """Whether our AMQP header is (about to be) in the output: at once for an initiator
        without SASL; otherwise the connection writes it when the phase moves on."""
        return self._initiator and self._sasl is None

    def on_header(self, header: bytes, events: list[Event]) -> None:
        """A protocol header arrived (in phase HEADER or AMQP_HEADER).

        A server whose SASL lets anonymous peers in takes the plain AMQP header as well: that
        peer skips SASL and is anonymous, as if it had said ANONYMOUS (``SaslDone`` without a
        mechanism). Any other header we do not want is answered with the one we do, then we
        hang up (§2.2): a server requiring credentials so tells a peer without SASL to use it.
        """
        want_sasl = self.phase is Phase.HEADER and self._sasl is not None
        expected = SASL_HEADER if want_sasl else AMQP_HEADER
        if header != expected:
            sasl = self._sasl
            if want_sasl and header == AMQP_HEADER and isinstance(sasl, SaslServer):
                if sasl.allows_anonymous:
                    self.identity = ANONYMOUS_IDENTITY
                    self.phase = Phase.FRAMES
                    events.append(SaslDone(None, SASL_OK, ANONYMOUS_IDENTITY))
                    return
                why = "the peer skipped SASL, which this server requires"
            else:
                why = f"unsupported protocol header {header!r}"
            if not self._initiator:  # §2.2: answer with the header we support, then hang up
                self._out += expected
            self.phase = Phase.DONE
            events.append(TransportFailed(why))
            return
        if not want_sasl:
            self.phase = Phase.FRAMES
            return
        self.phase = Phase.SASL
        if isinstance(self._sasl, SaslServer):
            self._out += SASL_HEADER
            mechanisms = [Symbol(m) for m in self._sasl.offered()]
            self._write(SaslMechanisms(sasl_server_mechanisms=mechanisms))

    def on_sasl_frame(self, frame: Frame, events: list[Event]) -> None:
        """A frame arrived during SASL; afterwards ``phase`` is SASL, AMQP_HEADER or DONE."""
        perf = frame.performative
        sasl = self._sasl
        if frame.type != FRAME_SASL or perf is None:
            raise RemoteProtocolError(errors.FRAMING_ERROR, "expected a SASL frame")
        if isinstance(sasl, SaslServer) and isinstance(perf, SaslInit):
            outcome, identity = sasl.judge(perf)
            self._write(outcome)
            events.append(SaslDone(str(perf.mechanism), outcome.code, identity))
            if outcome.code == SASL_OK:
                self.identity = identity
                self.phase = Phase.AMQP_HEADER
            else:
                self.phase = Phase.DONE
            return
        if isinstance(sasl, SaslClient):
            if isinstance(perf, SaslMechanisms):
                try:
                    self._write(sasl.start([str(m) for m in perf.sasl_server_mechanisms]))
                except SaslFailed as exc:
                    self.phase = Phase.DONE
                    events.append(TransportFailed(str(exc)))
                return
            if isinstance(perf, SaslChallenge):
                self._write(sasl.challenge(perf.challenge))
                return
            if isinstance(perf, SaslOutcome):
                events.append(SaslDone(sasl.mechanism, perf.code))
                self.phase = Phase.AMQP_HEADER if perf.code == SASL_OK else Phase.DONE
                return
        raise RemoteProtocolError(
            errors.ILLEGAL_STATE, f"unexpected {type(perf).__name__} during SASL"
        )

    def _write(self, performative: SaslFrame) -> None:
        encode_frame(self._out, 0, performative, b"", FRAME_SASL)
