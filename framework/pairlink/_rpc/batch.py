"""Many calls of one operation in one message: the batch a client packs, and the reply that
answers each of its rows.

A batch request is a call (operation, message-id, deadline, reply-to as ever) whose body,
content-type :data:`~pairlink._rpc.payload.BATCH`, is a msgpack array of rows, each a call's
envelope ``[args, kwargs]``. A service answers it with one 200 reply whose msgpack body is an
array of as many results, in the rows' order: ``[200, value]`` for a row whose handler
returned, ``[status, description, error-type, ref]`` for one that failed (the fields of a
failed call's reply, :mod:`pairlink._rpc.wire`). A failing row fails alone; the batch as a
whole fails (a status other than 200) only for what concerns every row: an unknown
operation, a deadline passed before it ran, a body that is no batch, too many rows.

A row costs its arguments' bytes and a few more: the message's header, properties, deadline
and reply, about 40 µs of CPU between client and service, are paid once per batch.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import attrs

from pairlink._amqp.types import Decoded
from pairlink._rpc.payload import msgpack_dumps
from pairlink.errors import RemoteError, RemoteTimeoutError

OK = 200
TIMEOUT = 408
BAD_REPLY = 502
"""A row's status when the batch's reply does not say what became of it (no peer of ours sends
such a reply: it says the service is not what the client takes it for)."""

DEFAULT_BATCH_ROWS = 256
"""Rows a client puts in one batch unless told otherwise: enough that the per-message cost
(about 40 µs) is under a microsecond a row, few enough that a batch is answered in a few
milliseconds and a deadline or a failure costs little work."""
DEFAULT_BATCH_BYTES = 256 << 10
"""Bytes of packed rows a client puts in one batch unless told otherwise (256 KiB): a batch is
cut at whichever of this and the row count comes first, so wide rows make smaller batches and
a batch stays far below the message sizes peers accept (1 MiB is common)."""
MAX_BATCH_ROWS = 4096
"""Rows a service takes in one batch (``[limits] max_batch_rows``): a batch runs in one running
slot, so this bounds the work one slot does (and, with :data:`ROWS_PER_SLOT`, the mailbox
slots one batch can take: 64); a larger batch is answered 400 without running."""

ROWS_PER_SLOT = 64
"""A batch holds a service's mailbox slot per this many rows (a 256-row batch four): credit,
which comes from free slots, counts rows as well as messages, so a mailbox of 128 holds 8,192
rows of batches at most, not 128 batches of 4,096."""

Row = tuple[Sequence[Any], Mapping[str, Any]]
"""One call of a batch: its positional and keyword arguments."""


@attrs.frozen
class Rows:
    """A packed batch: its body (a msgpack array of envelopes) and how many rows it holds."""

    body: bytes
    count: int


ALONE = Rows(b"", 1)
"""Not a batch: a row to send as a call of its own (``batch_rows=1``, or a peer that reads no
batch), where a sender takes batches or rows in turn."""


def _array_header(count: int) -> bytes:
    if count < 16:
        return bytes((0x90 | count,))
    if count < 1 << 16:
        return struct.pack(">BH", 0xDC, count)
    return struct.pack(">BI", 0xDD, count)


def packed(rows: Iterable[Row], max_rows: int, max_bytes: int) -> Iterator[Rows]:
    """``rows`` packed into batches of at most ``max_rows`` rows and ``max_bytes`` bytes (a
    row larger than that goes alone), in order. Each row is packed once, as it comes:
    the cut depends only on the rows, so the same rows always make the same batches (and a
    retry's batches the same message-ids). ``PayloadError`` for a row msgpack cannot hold."""
    parts: list[bytes] = []
    size = 0
    for args, kwargs in rows:  # (msgpack packs a tuple as an array, as a list)
        part = msgpack_dumps(
            (
                args if type(args) is tuple or type(args) is list else list(args),
                kwargs if type(kwargs) is dict else dict(kwargs),
            )
        )
        if parts and (len(parts) >= max_rows or size + len(part) > max_bytes):
            yield Rows(_array_header(len(parts)) + b"".join(parts), len(parts))
            parts, size = [], 0
        parts.append(part)
        size += len(part)
    if parts:
        yield Rows(_array_header(len(parts)) + b"".join(parts), len(parts))


def ok(value: object) -> list[object]:
    """A row's result when its handler returned ``value``."""
    return [OK, value]


def failed(
    status: int, description: str, error_type: str | None = None, ref: str | None = None
) -> list[object]:
    """A row's result when it failed, as a failed call's reply would say it."""
    return [status, description, error_type, ref]


def results(value: Decoded, count: int) -> list[object]:
    """Each row's value, or the ``RemoteError`` (``RemoteTimeoutError`` for a 408) it failed
    with, from the value of a batch's reply of ``count`` rows. A reply that is not such an
    array fails every row with :data:`BAD_REPLY`."""
    if not isinstance(value, list) or len(value) != count:
        size = len(value) if isinstance(value, list) else type(value).__name__
        why = f"the reply to a batch of {count} rows is not {count} results (got {size})"
        return [RemoteError(BAD_REPLY, why)] * count
    out: list[object] = []
    for item in value:
        if type(item) is list and len(item) == 2 and item[0] == OK:
            out.append(item[1])
        else:
            out.append(_row_error(item))
    return out


def _row_error(item: object) -> RemoteError:
    if (
        not isinstance(item, list)
        or len(item) != 4
        or not isinstance(item[0], int)
        or isinstance(item[0], bool)
    ):
        return RemoteError(BAD_REPLY, f"a batch reply's row is not a result: {item!r:.80}")
    status, description, error_type, ref = item
    kind = RemoteTimeoutError if status == TIMEOUT else RemoteError
    return kind(
        status,
        str(description),
        None if error_type is None else str(error_type),
        None if ref is None else str(ref),
    )
