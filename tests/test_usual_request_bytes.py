"""The usual request (a counter's message-id past 255, a deadline), which ``wire.encode_request``
writes from bytes made once per ttl, reply-to and encoding, is exactly what the generic encoder
writes; and its expiry, computed without a datetime, is the datetime's to the millisecond, with
the datetime's errors.
"""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pairlink._rpc import wire
from pairlink._rpc.payload import Encoding
from pairlink._rpc.wire import ME, OPERATION, encode_request, request_message

NOW = 1_763_900_000.123456
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def _outcome(encode: Any) -> Any:
    try:
        return encode()
    except (OverflowError, ValueError) as exc:
        return type(exc), str(exc)


def _both(
    message_id: Any,
    reply_to: str | None,
    encoding: Encoding,
    headers: dict[str, str] | None,
    timeout: float = 30.0,
    now: float = NOW,
) -> tuple[Any, Any]:
    args = (b"\x01" * 64,) if encoding is Encoding.RAW else ("x",)
    options: Any = {"message_id": message_id, "now": now, "timeout": timeout}

    def generic() -> bytes:
        message = request_message("op", args, {}, reply_to=reply_to, encoding=encoding, **options)
        if headers:
            message.application_properties = {**headers, OPERATION: "op"}
        return message.encode()

    ours = _outcome(
        lambda: encode_request(
            "op", args, {}, reply_to=reply_to, encoding=encoding, headers=headers, **options
        )
    )
    return ours, _outcome(generic)


@pytest.mark.parametrize("message_id", [255, 256, 257, 2**32, 2**63, 2**64 - 1, 2**64])
@pytest.mark.parametrize("reply_to", [ME, None, "r" * 200, "é" * 150])
@pytest.mark.parametrize("encoding", list(Encoding))
@pytest.mark.parametrize("headers", [None, {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16}])
def test_the_usual_request_is_the_generic_encoders_bytes(
    message_id: int, reply_to: str | None, encoding: Encoding, headers: dict[str, str] | None
) -> None:
    """On both sides of the usual ids (255 and 2**64 are not: the general path, or its error),
    with list8 and list32 properties (a long reply-to), in every encoding."""
    ours, theirs = _both(message_id, reply_to, encoding, headers)
    assert ours == theirs


@pytest.mark.parametrize("timeout", [0.0005, -3.0, 30.0, 2**32 / 1000, 2**32 / 1000 - 0.001])
def test_the_usual_request_keeps_the_ttl_rule_and_its_limit(timeout: float) -> None:
    """The ttl is at least one millisecond, and one past a uint fails as the generic one does."""
    ours, theirs = _both(1000, ME, Encoding.ENVELOPE, None, timeout=timeout)
    assert ours == theirs


def _datetime_ms(now: float, timeout: float) -> Any:
    def compute() -> int:
        return (wire.deadline_fields(now, timeout)[1] - _EPOCH) // datetime.timedelta(
            milliseconds=1
        )

    return _outcome(compute)


@settings(max_examples=2000, deadline=None)
@given(
    now=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.floats(-7e10, 3e11),
        st.integers(-(10**10), 10**11).map(lambda s: s + 0.5e-6),  # half a microsecond
        st.integers(-(10**12), 10**12).map(lambda us: us / 1e6),
    ),
    timeout=st.one_of(st.just(0.0), st.floats(-1e3, 1e6)),
)
@example(now=253_402_300_799.999, timeout=0.0)
@example(now=-62_135_596_800.0, timeout=0.0)
@example(now=-62_135_596_800.0000005, timeout=0.0)
@example(now=1_700_000_000.0000005, timeout=0.0)
@example(now=1_700_000_000.0000015, timeout=0.0)
@example(now=-1_700_000_000.0000005, timeout=0.0)
def test_the_expiry_is_the_datetimes_milliseconds(now: float, timeout: float) -> None:
    """Any float: the milliseconds the timestamp encoder writes for the datetime (its
    microseconds rounded half to even, then floored), or the error the datetime raises."""
    assert _outcome(lambda: wire._expiry_ms(now, timeout)) == _datetime_ms(now, timeout)
