"""Trio nursery helpers shared by the layers that run background tasks for a ``with`` block."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType


class BodyError:
    """Remembers what the ``async with`` body raised, so it can be re-raised bare."""

    error: BaseException | None = None

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(
        self,
        _type: type[BaseException] | None,
        value: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        self.error = value


@contextmanager
def body_errors_unwrapped() -> Iterator[BodyError]:
    """For a context manager that runs its ``async with`` body inside a nursery whose
    background tasks never raise: a group holding only the body's own exception is noise, so
    the caller gets that exception as raised, as with a plain ``with``. Use as::

        with body_errors_unwrapped() as body:
            async with trio.open_nursery() as nursery:
                ...
                async with body:
                    yield thing
    """
    body = BodyError()
    try:
        yield body
    except BaseExceptionGroup as group:
        if body.error is not None and list(group.exceptions) == [body.error]:
            raise body.error from None
        raise


@contextmanager
def lone_errors_unwrapped() -> Iterator[None]:
    """Nested nurseries wrap even a single exception in groups several levels deep; whatever
    failed (a startup hook, the body of the ``async with``) is raised as itself. Several
    exceptions at once stay a group."""
    try:
        yield
    except BaseExceptionGroup as group:
        error: BaseException = group
        while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
            error = error.exceptions[0]
        if error is group:
            raise
        raise error from None
