"""The fast paths, registered by name: each reads the one usual shape of something (a request
as our client writes it, a reply as our service writes it) in one pass, and declines (returns
None) anything else, which the general path beside it reads, or refuses, as ever.

A fast path may change what a read costs, never its outcome: the differential tests compare
each with its general path on the same bytes, damaged ones too. For those tests, and for
measuring, :meth:`FastPath.off` makes one decline everything and :meth:`FastPath.recorded`
records which inputs it took; its callers call ``path.read(...)`` and never know.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Generic, ParamSpec, Protocol, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


class FastPath(Generic[P, R]):
    """One fast path: ``read`` is its reader, or, while switched off or recorded, a stand-in."""

    __slots__ = ("name", "read", "reader")

    def __init__(self, name: str, reader: Callable[P, R | None]) -> None:
        self.name = name
        self.reader = reader
        self.read: Callable[P, R | None] = reader

    @contextmanager
    def off(self) -> Iterator[None]:
        """Decline every input while the block runs: the general path reads them all."""

        def decline(*_args: P.args, **_kwargs: P.kwargs) -> R | None:
            return None

        with self._reading(decline):
            yield

    @contextmanager
    def recorded(self) -> Iterator[list[bool]]:
        """While the block runs, append to the list it gives whether each read took its
        input (True) or declined it."""
        taken: list[bool] = []
        reader = self.reader

        def read(*args: P.args, **kwargs: P.kwargs) -> R | None:
            result = reader(*args, **kwargs)
            taken.append(result is not None)
            return result

        with self._reading(read):
            yield taken

    @contextmanager
    def _reading(self, read: Callable[P, R | None]) -> Iterator[None]:
        saved, self.read = self.read, read
        try:
            yield
        finally:
            self.read = saved


class Switch(Protocol):
    """What the registry lets a test do with any fast path, whatever it reads."""

    name: str

    def off(self) -> AbstractContextManager[None]: ...
    def recorded(self) -> AbstractContextManager[list[bool]]: ...


FAST_PATHS: dict[str, Switch] = {}
"""Every fast path by its name, for tests and benchmarks that switch them all."""


def register(name: str, reader: Callable[P, R | None]) -> FastPath[P, R]:
    """Register ``reader`` as the fast path ``name`` and return it, for its callers to call
    ``.read``."""
    if name in FAST_PATHS:
        raise ValueError(f"two fast paths named {name!r}")
    path = FastPath(name, reader)
    FAST_PATHS[name] = path
    return path
