"""``@service`` and ``@handler``: what they record, and the mistakes they refuse at once."""

from __future__ import annotations

from typing import Any

import pytest

from pairlink._server.service import DEFAULT_MAILBOX, handler, hosted, service, spec_of


@service("calc", max_concurrency=2, mailbox=8)
class Calc:
    @handler
    async def add(self, a: int, b: int = 0) -> int:
        return a + b

    @handler("mul")
    def multiply(self, a: float, b: float) -> float:
        return a * b

    @handler
    def slow(self, *values: int, scale: int) -> int:
        return sum(values) * scale

    @handler(inline=True)
    def neg(self, a: int) -> int:
        return -a

    def helper(self) -> None:
        """Not a handler: not an operation."""

    async def on_start(self) -> None:
        pass


def test_operations_modes_and_limits_are_recorded() -> None:
    spec = spec_of(Calc)
    assert spec.address == "calc" and spec.max_concurrency == 2 and spec.mailbox == 8
    assert spec.pairing is True
    modes = {name: op.mode for name, op in spec.operations.items()}
    assert modes == {"add": "async", "mul": "thread", "slow": "thread", "neg": "inline"}
    assert spec_of(Calc()) is spec


def test_the_class_stays_an_ordinary_class() -> None:
    assert Calc().multiply(2, 3) == 6
    assert Calc().slow(1, 2, scale=3) == 9


def test_default_mailbox_leaves_room_for_the_concurrency() -> None:
    @service("a")
    class A:
        @handler
        def f(self) -> None: ...

    @service("b", max_concurrency=500)
    class B:
        @handler
        def f(self) -> None: ...

    assert spec_of(A).mailbox == DEFAULT_MAILBOX
    assert spec_of(B).mailbox == 1000


@pytest.mark.parametrize(
    ("operation", "args", "kwargs", "ok"),
    [
        ("add", [1], {}, True),
        ("add", [1, 2], {}, True),
        ("add", [], {"a": 1, "b": 2}, True),
        ("add", [], {}, False),
        ("add", [1, 2, 3], {}, False),
        ("add", [1], {"c": 3}, False),
        ("slow", [1, 2, 3], {"scale": 2}, True),
        ("slow", [1, 2, 3], {}, False),  # a required keyword-only argument is missing
    ],
)
def test_arguments_are_checked_against_the_signature(
    operation: str, args: list[Any], kwargs: dict[str, Any], ok: bool
) -> None:
    op = spec_of(Calc).operations[operation]
    if ok:
        op.check_arguments(args, kwargs)
    else:
        with pytest.raises(TypeError):
            op.check_arguments(args, kwargs)


def test_handlers_are_inherited_and_a_subclass_definition_wins() -> None:
    class Base:
        @handler
        def ping(self) -> str:
            return "base"

        @handler
        def gone(self) -> None: ...

    @service("derived")
    class Derived(Base):
        @handler
        def ping(self) -> str:
            return "derived"

        def gone(self) -> None:  # overridden without @handler: no longer an operation
            ...

    ops = spec_of(Derived).operations
    assert set(ops) == {"ping"}
    assert ops["ping"].function is Derived.ping


def test_exposed_errors_are_the_services_and_the_handlers_own() -> None:
    @service("svc", expose_errors=[KeyError, PermissionError])
    class Svc:
        @handler(expose_errors=ValueError)
        def parse(self) -> None: ...

        @handler
        def other(self) -> None: ...

    ops = spec_of(Svc).operations
    assert ops["parse"].exposed == (KeyError, PermissionError, ValueError)
    assert ops["other"].exposed == (KeyError, PermissionError)
    assert spec_of(Svc).debug_errors is False
    assert spec_of(Calc).operations["add"].exposed == ()
    assert hosted(Svc, debug_errors=True).spec.debug_errors is True


@pytest.mark.parametrize("bad", ["ValueError", 3, [ValueError, int], BaseException])
def test_expose_errors_takes_exception_classes(bad: Any) -> None:
    with pytest.raises(TypeError, match=r"@service\('svc'\): expose_errors takes exception"):

        @service("svc", expose_errors=bad)
        class Svc:
            @handler
            def f(self) -> None: ...

    with pytest.raises(TypeError, match=r"@handler\('op'\): expose_errors takes exception"):
        handler("op", expose_errors=bad)


def test_hosted_overrides_address_and_limits() -> None:
    served = hosted(Calc, address="calc2", mailbox=4)
    assert served.address == "calc2" and served.spec.mailbox == 4
    assert isinstance(served.instance, Calc)
    assert spec_of(Calc).address == "calc"  # the class is untouched


# -- mistakes ---------------------------------------------------------------------------------


def test_handler_outside_a_class_names_the_function() -> None:
    def lonely(self: Any) -> None: ...

    with pytest.raises(TypeError, match=r"lonely.*method defined in a class body"):
        handler(lonely)


def test_handler_without_self_names_the_function() -> None:
    with pytest.raises(TypeError, match=r"NoSelf\.f must take self"):

        class NoSelf:
            @handler
            def f(*args: Any) -> None: ...


def test_static_and_class_methods_are_refused() -> None:
    with pytest.raises(TypeError, match=r"cannot serve the staticmethod .*Static\.f"):

        class Static:
            @handler
            @staticmethod
            def f() -> None: ...

    with pytest.raises(TypeError, match=r"cannot serve the classmethod .*Class\.f"):

        class Class:
            @handler
            @classmethod
            def f(cls) -> None: ...


def test_generators_are_refused() -> None:
    with pytest.raises(TypeError, match=r"Gen\.stream is a generator"):

        class Gen:
            @handler
            async def stream(self) -> Any:
                yield 1


def test_inline_async_handler_is_refused() -> None:
    with pytest.raises(TypeError, match=r"Inl\.f is async: inline=True is for plain def"):

        class Inl:
            @handler(inline=True)
            async def f(self) -> None: ...


def test_blocking_is_a_deprecated_way_to_say_thread() -> None:
    with pytest.deprecated_call(match=r"blocking=True\) is deprecated"):

        @service("old")
        class Old:
            @handler(blocking=True)
            def f(self) -> None: ...

    assert spec_of(Old).operations["f"].mode == "thread"


def test_blocking_async_or_inline_handler_is_refused() -> None:
    with (
        pytest.deprecated_call(),
        pytest.raises(TypeError, match=r"Blk\.f is async: blocking=True was for plain def"),
    ):

        class Blk:
            @handler(blocking=True)
            async def f(self) -> None: ...

    with pytest.raises(TypeError, match=r"inline=True and blocking=True contradict"):
        handler(inline=True, blocking=True)


def test_duplicate_operation_names_name_both_functions() -> None:
    with pytest.raises(
        TypeError, match=r"operation 'op' is defined twice, by .*Dup\.a and .*Dup\.b"
    ):

        @service("dup")
        class Dup:
            @handler("op")
            def a(self) -> None: ...

            @handler("op")
            def b(self) -> None: ...


def test_lifecycle_hooks_must_be_async() -> None:
    with pytest.raises(TypeError, match=r"Starts\.on_start must be an async def"):

        @service("svc")
        class Starts:
            @handler
            def f(self) -> None: ...

            def on_start(self) -> None: ...

    with pytest.raises(TypeError, match=r"Stops\.on_stop must be an async def"):

        @service("svc")
        class Stops:
            @handler
            def f(self) -> None: ...

            def on_stop(self) -> None: ...


def test_lifecycle_hooks_take_no_arguments() -> None:
    with pytest.raises(TypeError, match=r"Hooked\.on_start must take no arguments"):

        @service("svc")
        class Hooked:
            @handler
            def f(self) -> None: ...

            async def on_start(self, config: dict[str, Any]) -> None: ...


def test_service_without_handlers_or_address_or_class() -> None:
    with pytest.raises(TypeError, match="Empty has no @handler methods"):

        @service("empty")
        class Empty:
            pass

    with pytest.raises(TypeError, match="needs the address first"):
        service(Calc)  # type: ignore[arg-type]  # @service without ("address")

    with pytest.raises(TypeError, match="decorates a class"):
        service("x")(lambda: None)  # type: ignore[type-var]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_concurrency": 0}, "max_concurrency must be an int >= 1"),
        ({"max_concurrency": 4, "mailbox": 2}, "mailbox must be an int >= max_concurrency"),
    ],
)
def test_impossible_limits_are_value_errors(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        service("svc", **kwargs)


def test_me_is_no_service_address() -> None:
    with pytest.raises(ValueError, match="cannot be a service address"):
        service("$me")


def test_a_class_needing_arguments_must_be_passed_as_an_instance() -> None:
    @service("needs")
    class Needs:
        def __init__(self, db: str) -> None:
            self.db = db

        @handler
        def f(self) -> str:
            return self.db

    with pytest.raises(TypeError, match=r"cannot create .*Needs\(\) without arguments"):
        hosted(Needs)
    assert hosted(Needs("pg")).address == "needs"


def test_serving_something_that_is_not_a_service() -> None:
    with pytest.raises(TypeError, match="is not a @service class"):
        spec_of(object())
