"""What a caller learns of a failure in a service: what the service chose to tell, never more.

A ``CallError`` answers with its own status and words; an exception of a type the service or
handler exposes (``expose_errors``) is a 500 with its type and message. Any other exception's
text may hold what must not leave the process (a password in a connection string, an internal
host): it is logged with its traceback under a fresh reference id, and the caller gets
"internal error" and that id, or, with ``debug_errors``, its type and message.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from pairlink._rpc import batch
from pairlink._rpc.wire import INTERNAL_ERROR, Request
from pairlink._server.calls import Answer, Call, Origin, log_ids
from pairlink._telemetry.logs import Logger, new_ref
from pairlink.errors import CallError


@attrs.frozen
class Disclosure:
    """One service's rules: its log and whether it is in debug mode."""

    log: Logger
    debug_errors: bool

    def failure(self, call: Call, exc: BaseException) -> Answer:
        """The answer to ``call`` whose handler raised ``exc``."""
        if isinstance(exc, CallError):
            return Answer(exc.status, exc.description, error_type=exc.error_type)
        if isinstance(exc, call.operation.exposed):
            return Answer(INTERNAL_ERROR, str(exc), error_type=type_name(exc))
        description, error_type, ref = self.undisclosed(
            "call.failed", call.origin, call.request, exc, str(exc)
        )
        return Answer(INTERNAL_ERROR, description, error_type=error_type, ref=ref)

    def row_failure(self, call: Call) -> RowFailed:
        """A result for a row of the batch ``call`` whose handler raised: what
        :meth:`failure` would answer the row as a call."""

        def failed(exc: BaseException) -> list[object]:
            answer = self.failure(call, exc)
            return batch.failed(answer.status, answer.description, answer.error_type, answer.ref)

        return failed

    def undisclosed(
        self, event: str, origin: Origin, request: Request, exc: BaseException, detail: str
    ) -> tuple[str, str | None, str]:
        """Log an unexpected failure under a fresh reference id (``event``, with its
        traceback) and return what the caller gets instead, as (description, error type,
        ref): "internal error" and the ref, or ``detail`` and the type in debug mode."""
        ref = new_ref()
        self.log.error(
            event,
            **log_ids(origin, request.message_id),
            ref=ref,
            operation=request.operation,
            error=repr(exc),
            exc_info=exc,
        )
        if self.debug_errors:
            return detail, type_name(exc), ref
        return f"internal error (ref {ref})", None, ref


RowFailed = Callable[[BaseException], list[object]]
"""A batch row's result for its handler's exception (:meth:`Disclosure.row_failure`)."""


def type_name(exc: BaseException) -> str:
    """An exception's type as the caller is told it: a builtin's bare name, else qualified."""
    cls = type(exc)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"
