"""Services: ``@service`` classes whose ``@handler`` methods answer calls over AMQP 1.0.

```python
@service("calc")
class Calculator:
    @handler
    async def add(self, a: int, b: int) -> int:
        return a + b

await serve(Calculator, listen="amqp://127.0.0.1:5672")
```

The decorators only *check and record*: the class stays an ordinary class (callable and
testable without any network), and every mistake that can be seen in a signature is a
``TypeError`` naming the function at import time, not a 500 at the first call.

Three kinds of handler, chosen as FastAPI and Starlette users expect:

* ``async def``: awaited in the actor's worker task, cancelled if the call's deadline passes
  while it runs (the caller has given up; the reply says 408);
* plain ``def``: run in a thread of the service's own pool, so it may block on
  files, sockets, locks or C code without stalling the other services and the heartbeats of
  the process. At most ``max_concurrency`` threads per service. A thread cannot be
  interrupted: neither a deadline nor a shutdown's grace period stops it early;
* ``@handler(inline=True)`` on a plain ``def``: run on the event loop, in the task that read
  the request when it can start at once, else in the actor's worker task. The cheapest kind
  (no thread, no task switch) for quick computations; it holds the whole event loop while it
  runs, so it must never block.

Calls may come one to a message or many to a message (a batch, :mod:`pairlink._rpc.batch`:
``proxy.map``, Spark's ``call_service``). A handler serves both unchanged: a batch runs its
rows through it one after another, in one running slot, each row's failure its own.
``@handler(batch=True)`` declares a vectorised handler instead: it takes a whole batch at once,
each parameter receiving a list (the column of that argument's values, one per row), and
returns a sequence of as many results, in order (an exception in it fails that row alone);
``batch="arrow"`` passes each column as a ``pyarrow.Array`` (for ``pyarrow.compute``, or
``pyarrow.RecordBatch.from_arrays`` to hand a model one table) and takes an Arrow array back
as well. A single call reaches it as a batch of one.

``@handler(blocking=True)``, which asked for a thread before that was the default, still works
and warns (``DeprecationWarning``).

Each served instance is an actor (:mod:`pairlink._server.actor`): ``max_concurrency`` calls run
at once (default 1, so handler state needs no locks) and at most ``mailbox`` calls are held: callers
get link credit only from its free slots.

What a caller learns of a failure is what the service chose to tell. A handler may raise
``pairlink._rpc.CallError`` to answer with a status of its own choosing; an exception of a type
declared with ``expose_errors`` (on ``@service`` or ``@handler``) is a 500 carrying its type and
message. Anything else may hold what must not leave the process (a password in a connection
string, an internal host): the caller gets a 500 saying only "internal error" and a reference
id (``RemoteError.ref``), and the server logs the traceback under that id.
``debug_errors=True`` (for development) sends every exception's type and message.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, TypeVar, cast, overload

import attrs

from pairlink._rpc.wire import ME
from pairlink._server.context import Middleware, check_middleware

DEFAULT_DEDUP_SIZE = 100_000
"""Replies a deduplicating service keeps at most (the oldest go first), whatever its window."""
DEFAULT_MAILBOX = 128
"""Calls a service holds (queued + running + replies waiting for the caller's credit) unless
told otherwise; also what one busy caller can have in flight without waiting for credit."""

_HANDLER = "__pairlink_handler__"
_SERVICE = "__pairlink_service__"

F = TypeVar("F", bound=Callable[..., Any])  # a handler: its arguments and result are the call's
T = TypeVar("T")
C = TypeVar("C", bound=type)
Mode = Literal["async", "thread", "inline"]
Batch = Literal["rows", "list", "arrow"]
"""How a handler takes a batch: row by row (a plain handler), or whole, as lists or Arrow."""
ExceptionTypes = tuple[type[Exception], ...]

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


@attrs.frozen
class _Mark:
    """What ``@handler`` records on a function, until ``@service`` collects it."""

    name: str | None
    inline: bool
    expose: ExceptionTypes = ()
    batch: Batch = "rows"


@attrs.frozen
class Operation:
    """One operation of a service: its name on the wire and the function that answers it.

    ``check_arguments`` rejects a call whose arguments do not fit the signature *before* the
    handler runs, so that a wrong call is a 400 for the caller, never a ``TypeError`` (500)
    raised somewhere inside the handler.
    """

    name: str
    function: Callable[..., Any]
    mode: Mode
    signature: inspect.Signature  # without ``self``
    min_positional: int
    max_positional: int | None  # None: takes *args
    simple: bool  # no keyword-only parameter without a default: positional counts suffice
    exposed: ExceptionTypes = ()  # raised, these reach the caller with type and message
    batch: Batch = "rows"
    parameters: tuple[str, ...] = ()  # the names of its parameters (a vectorised handler's columns)

    @classmethod
    def of(
        cls,
        name: str,
        function: Callable[..., Any],
        mode: Mode,
        exposed: ExceptionTypes = (),
        batch: Batch = "rows",
    ) -> Operation:
        params = list(inspect.signature(function).parameters.values())[1:]
        positional = [p for p in params if p.kind in _POSITIONAL]
        required = [p for p in positional if p.default is p.empty]
        varargs = any(p.kind is p.VAR_POSITIONAL for p in params)
        required_keywords = any(p.kind is p.KEYWORD_ONLY and p.default is p.empty for p in params)
        return cls(
            name,
            function,
            mode,
            inspect.Signature(params),
            len(required),
            None if varargs else len(positional),
            not required_keywords,
            exposed,
            batch,
            tuple(p.name for p in params),
        )

    def check_arguments(self, args: list[Any], kwargs: dict[str, Any]) -> None:
        """Raise ``TypeError`` (saying why) unless ``args``/``kwargs`` bind to the handler."""
        if not kwargs and self.simple:  # the common case, without building a BoundArguments
            n = len(args)
            most = self.max_positional
            if n >= self.min_positional and (most is None or n <= most):
                return
        self.signature.bind(*args, **kwargs)


@attrs.frozen
class ServiceSpec:
    """Everything ``@service`` learnt about a class; the server reads only this."""

    address: str
    max_concurrency: int
    mailbox: int
    pairing: bool
    operations: Mapping[str, Operation]
    cls: type
    dedup_window: float | None = None
    dedup_size: int = DEFAULT_DEDUP_SIZE
    debug_errors: bool = False
    middleware: tuple[Middleware, ...] = ()  # around each call, inside the server's


@attrs.frozen
class Hosted:
    """A service instance as served: the instance and its (possibly overridden) spec."""

    instance: object
    spec: ServiceSpec

    @property
    def address(self) -> str:
        return self.spec.address


# -- @handler ----------------------------------------------------------------------------------


@overload
def handler(function: F, /) -> F: ...
@overload
def handler(
    name: str | None = None,
    /,
    *,
    inline: bool = False,
    blocking: bool = False,
    expose_errors: type[Exception] | Iterable[type[Exception]] = (),
    batch: bool | Literal["arrow"] = False,
) -> Callable[[F], F]: ...


def handler(
    target: object = None,
    /,
    *,
    inline: bool = False,
    blocking: bool = False,
    expose_errors: type[Exception] | Iterable[type[Exception]] = (),
    batch: bool | Literal["arrow"] = False,
) -> object:
    """Mark a method as an operation: ``@handler``, ``@handler("name")``,
    ``@handler(inline=True)`` (a plain ``def`` run on the event loop, not in a thread).

    ``expose_errors``: exception types (subclasses included, as in ``except``) this handler
    raises on purpose, added to its service's: the caller gets their type and message in a
    500. Any other exception's text stays in the server's log (see the module's docstring).
    ``batch=True``: a vectorised handler, called with a whole batch's columns (lists);
    ``batch="arrow"``: with a ``pyarrow.Array`` per column (see the module's docstring).
    ``blocking=True`` is deprecated: a plain ``def`` runs in a thread without it."""
    if callable(target) or isinstance(target, staticmethod | classmethod):
        return _mark(target, None, inline=False)
    if target is not None and not isinstance(target, str):
        raise TypeError(f"@handler takes an operation name (str), not {target!r}")
    if target is not None and not target:
        raise ValueError("@handler: the operation name must not be empty")
    where = f"@handler({target!r})" if target else "@handler"
    expose = _exception_types(where, expose_errors)
    if batch not in (False, True, "arrow"):
        raise TypeError(f'{where}: batch takes True, False or "arrow", not {batch!r}')
    kind: Batch = "arrow" if batch == "arrow" else "list" if batch else "rows"
    if blocking:
        if inline:
            raise TypeError(f"{where}: inline=True and blocking=True contradict each other")
        warnings.warn(
            "@handler(blocking=True) is deprecated: a plain def handler runs in a worker "
            "thread by default now; drop the argument",
            DeprecationWarning,
            stacklevel=2,
        )

    def decorate(function: F) -> F:
        if blocking and inspect.iscoroutinefunction(function):
            raise TypeError(
                f"handler {function.__qualname__} is async: blocking=True was for plain def "
                "functions, run in a thread"
            )
        return _mark(function, target, inline=bool(inline), expose=expose, batch=kind)

    return decorate


def _exception_types(where: str, value: object) -> ExceptionTypes:
    """``expose_errors`` as a tuple of exception classes (one class is accepted alone)."""
    items: tuple[object, ...] = (value,)
    if isinstance(value, Iterable) and not isinstance(value, str | bytes):
        items = tuple(value)
    for item in items:
        if not (isinstance(item, type) and issubclass(item, Exception)):
            raise TypeError(
                f"{where}: expose_errors takes exception classes (Exception subclasses), "
                f"not {item!r}"
            )
    return cast(ExceptionTypes, items)


def _mark(
    function: T,
    name: str | None,
    *,
    inline: bool,
    expose: ExceptionTypes = (),
    batch: Batch = "rows",
) -> T:
    if isinstance(function, staticmethod | classmethod):
        kind = type(function).__name__
        raise TypeError(
            f"@handler cannot serve the {kind} {function.__func__.__qualname__}: "
            "handlers are plain methods taking self"
        )
    if not inspect.isfunction(function):
        raise TypeError(f"@handler expects a function, got {function!r}")
    where = function.__qualname__
    parts = where.split(".")
    if len(parts) < 2 or parts[-2] == "<locals>":
        raise TypeError(
            f"@handler {where}: a handler must be a method defined in a class body "
            "(and the class decorated with @service)"
        )
    params = list(inspect.signature(function).parameters.values())
    if not params or params[0].kind not in _POSITIONAL:
        raise TypeError(f"handler {where} must take self as its first positional parameter")
    if inspect.isasyncgenfunction(function) or inspect.isgeneratorfunction(function):
        raise TypeError(f"handler {where} is a generator: a call has exactly one reply")
    if inline and inspect.iscoroutinefunction(function):
        raise TypeError(
            f"handler {where} is async: inline=True is for plain def functions "
            "(an async def always runs on the event loop)"
        )
    if batch != "rows" and any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        raise TypeError(
            f"handler {where}: a batch handler takes one column per named parameter, "
            "not *args or **kwargs"
        )
    setattr(function, _HANDLER, _Mark(name, inline, expose, batch))
    return function


# -- @service ----------------------------------------------------------------------------------


def service(
    address: str,
    *,
    max_concurrency: int = 1,
    mailbox: int | None = None,
    pairing: bool = True,
    dedup_window: float | None = None,
    dedup_size: int = DEFAULT_DEDUP_SIZE,
    expose_errors: type[Exception] | Iterable[type[Exception]] = (),
    debug_errors: bool = False,
    middleware: Sequence[Middleware] = (),
) -> Callable[[C], C]:
    """Serve the decorated class at ``address``.

    ``max_concurrency``: calls run at once (1: handlers never overlap, state needs no locks).
    ``mailbox``: calls held at most, which bounds the link credit callers get (default
    ``max(DEFAULT_MAILBOX, 2 * max_concurrency)``). ``pairing=False``: serve only classic
    request-response callers; a paired attach is refused with ``amqp:not-implemented`` (LP-6).
    ``dedup_window``: seconds to keep the reply to each call whose message-id is a string (a
    caller's stable key, e.g. ``call_service(key=...)``); a repeat of that id within the
    window gets the kept reply and the handler does not run again. ``dedup_size``: replies
    kept at most, the oldest dropped first, so memory stays bounded.
    ``expose_errors``: exception types (subclasses included) any handler raises on purpose,
    e.g. ``(KeyError, ValueError)``: the caller gets their type and message in a 500, as it
    does a ``CallError``'s. Every other exception's text may hold secrets, so the caller gets
    "internal error" and a reference id, and the server logs the traceback under that id.
    ``debug_errors=True``: send every exception's type and message (for development only).
    ``middleware``: async callables ``mw(call, proceed)`` run around each call, the first
    outermost, inside the server's own (:data:`pairlink.Middleware`).
    """
    if not isinstance(address, str):
        raise TypeError(f'@service needs the address first: @service("name"), got {address!r}')
    _check_limits(address, max_concurrency, mailbox)
    expose = _exception_types(f"@service({address!r})", expose_errors)
    _check_dedup(address, dedup_window, dedup_size)
    around = check_middleware(f"@service({address!r})", middleware)

    def decorate(cls: C) -> C:
        if not inspect.isclass(cls):
            raise TypeError(f"@service({address!r}) decorates a class, not {cls!r}")
        spec = ServiceSpec(
            address,
            max_concurrency,
            _mailbox(mailbox, max_concurrency),
            pairing,
            _collect_operations(cls, expose),
            cls,
            dedup_window,
            dedup_size,
            bool(debug_errors),
            around,
        )
        for hook in ("on_start", "on_stop"):
            _check_hook(cls, hook)
        setattr(cls, _SERVICE, spec)
        return cls

    return decorate


def _check_limits(address: str, max_concurrency: int, mailbox: int | None) -> None:
    if not address or address == ME:
        raise ValueError(f"@service: {address!r} cannot be a service address")
    if not isinstance(max_concurrency, int) or max_concurrency < 1:
        raise ValueError(f"@service({address!r}): max_concurrency must be an int >= 1")
    if mailbox is not None and (not isinstance(mailbox, int) or mailbox < max_concurrency):
        raise ValueError(
            f"@service({address!r}): mailbox must be an int >= max_concurrency "
            f"({max_concurrency}), or the extra concurrency could never be used"
        )


def _check_dedup(address: str, dedup_window: float | None, dedup_size: int) -> None:
    if dedup_window is not None and not dedup_window > 0:
        raise ValueError(f"@service({address!r}): dedup_window must be > 0 seconds, or None")
    if not isinstance(dedup_size, int) or dedup_size < 1:
        raise ValueError(f"@service({address!r}): dedup_size must be an int >= 1")


def _mailbox(mailbox: int | None, max_concurrency: int) -> int:
    return max(DEFAULT_MAILBOX, 2 * max_concurrency) if mailbox is None else mailbox


def _collect_operations(cls: type, expose: ExceptionTypes) -> dict[str, Operation]:
    """The marked methods of ``cls`` and its bases (a subclass's definition of a name wins,
    marked or not), by operation name; two functions claiming one name is an error. Each
    exposes the service's ``expose`` types and its own."""
    functions: dict[str, object] = {}
    for klass in reversed(cls.__mro__):
        for attr, value in vars(klass).items():
            if isinstance(value, staticmethod | classmethod) and hasattr(value.__func__, _HANDLER):
                _mark(value, None, inline=False)  # raises the TypeError that names it
            functions[attr] = value
    operations: dict[str, Operation] = {}
    for attr, function in functions.items():
        if not inspect.isfunction(function):
            continue
        mark = getattr(function, _HANDLER, None)
        if not isinstance(mark, _Mark):
            continue
        name = mark.name or attr
        if name in operations:
            raise TypeError(
                f"@service {cls.__qualname__}: operation {name!r} is defined twice, by "
                f"{operations[name].function.__qualname__} and {function.__qualname__}"
            )
        if inspect.iscoroutinefunction(function):
            mode: Mode = "async"
        else:
            mode = "inline" if mark.inline else "thread"
        operations[name] = Operation.of(name, function, mode, expose + mark.expose, mark.batch)
    if not operations:
        raise TypeError(f"@service {cls.__qualname__} has no @handler methods")
    return operations


def _check_hook(cls: type, name: str) -> None:
    hook = getattr(cls, name, None)
    if hook is None:
        return
    where = f"{cls.__qualname__}.{name}"
    if not inspect.iscoroutinefunction(hook):
        raise TypeError(f"{where} must be an async def method (the server awaits it)")
    try:
        inspect.signature(hook).bind(None)
    except TypeError:
        raise TypeError(f"{where} must take no arguments besides self") from None


def spec_of(obj: object) -> ServiceSpec:
    """The spec of a ``@service`` class or instance; ``TypeError`` for anything else."""
    cls = obj if inspect.isclass(obj) else type(obj)
    spec = getattr(cls, _SERVICE, None)
    if not isinstance(spec, ServiceSpec):
        raise TypeError(f"{cls.__qualname__} is not a @service class")
    return spec


def hosted(
    service: object,
    *,
    address: str | None = None,
    max_concurrency: int | None = None,
    mailbox: int | None = None,
    debug_errors: bool | None = None,
    dedup_window: float | None = None,
    dedup_size: int | None = None,
) -> Hosted:
    """A ``@service`` class or instance, to serve with some settings overridden (the CLI's
    ``--address``, two instances of one class at two addresses, ``debug_errors=True`` on a
    developer's machine, a config file's ``dedup_window``). A class is instantiated without
    arguments; pass an instance to give it some."""
    spec = spec_of(service)
    if debug_errors is not None:
        spec = attrs.evolve(spec, debug_errors=bool(debug_errors))
    if dedup_window is not None or dedup_size is not None:
        window = spec.dedup_window if dedup_window is None else dedup_window
        size = spec.dedup_size if dedup_size is None else dedup_size
        _check_dedup(spec.address if address is None else address, window, size)
        spec = attrs.evolve(spec, dedup_window=window, dedup_size=size)
    if address is not None or max_concurrency is not None or mailbox is not None:
        address = spec.address if address is None else address
        concurrency = spec.max_concurrency if max_concurrency is None else max_concurrency
        if mailbox is None and max_concurrency is not None:
            mailbox = max(spec.mailbox, _mailbox(None, concurrency))
        _check_limits(address, concurrency, mailbox)
        spec = attrs.evolve(
            spec,
            address=address,
            max_concurrency=concurrency,
            mailbox=spec.mailbox if mailbox is None else mailbox,
        )
    instance = service
    if inspect.isclass(service):
        try:
            instance = service()
        except TypeError as exc:
            raise TypeError(
                f"cannot create {service.__qualname__}() without arguments ({exc}): "
                "pass an instance to serve() instead"
            ) from exc
    return Hosted(instance, spec)
