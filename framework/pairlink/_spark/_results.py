"""Replies into the result columns of ``call_service``, never silently wrong.

A reply that does not fit its column is an error naming the row, the column and the value,
never a quiet null or a truncated number. Arrow's own conversion (``pa.array`` with the
column's type) already keeps kinds apart: a string, a bool or a float is not taken for an int,
nor an int for a string or a bool, and an int goes into a floating column only if it is exactly
representable there. Its one lossy step, a float into an integer column (0.89 -> 0), goes
through Arrow's safe cast instead, which takes an integral float (2.0 -> 2) and refuses the rest.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import attrs

from pairlink._spark._task import OnError

if TYPE_CHECKING:
    import pyarrow as pa

ArrowArray: TypeAlias = "pa.Array[Any]"
"""A result column's Arrow array: its scalar type is the column's, known only at run time
(the stubs' ``Array[Scalar[DataType]]`` would refuse ``to_pylist`` and the like)."""

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 60

# pyarrow's ArrowInvalid and ArrowTypeError are ValueError and TypeError; a Python int past
# 64 bits is an OverflowError
_ARROW_ERRORS = (ValueError, TypeError, OverflowError)


@attrs.frozen
class Column:
    """A result column: its name, its Spark type as written in DDL (for messages), its Arrow
    type."""

    name: str
    ddl: str
    arrow: pa.DataType


def result_fields(value: object, names: Sequence[str]) -> Sequence[object] | None:
    """A reply as the values of the result columns, in order: a dict by name (every column
    must be there; an explicit None is a null), a list or tuple by position, a plain value for
    a one-column schema. A None reply is a row of nulls."""
    if value is None:
        return None
    if isinstance(value, dict):
        missing = [name for name in names if name not in value]
        if missing:
            raise ValueError(
                f"result column {missing[0]!r}: the reply {_repr.repr(value)} has no such field"
            )
        return [value[name] for name in names]
    if isinstance(value, list | tuple):
        if len(value) != len(names):
            raise ValueError(
                f"a reply of {len(value)} values for {len(names)} result columns: "
                f"{_repr.repr(value)}"
            )
        return value
    if len(names) == 1:
        return [value]
    raise TypeError(
        f"a reply of type {type(value).__name__} for {len(names)} result columns: "
        f"{_repr.repr(value)}"
    )


def result_arrays(
    columns: Sequence[Column],
    replies: Sequence[object],
    errors: list[str | None],
    row_name: Callable[[int], str],
    on_error: OnError,
) -> list[ArrowArray]:
    """The result columns of a chunk's rows (``replies[i]`` is unused where ``errors[i]`` is
    set). A row whose reply does not fit raises ``ValueError`` (``on_error="raise"``: the first
    such row) or gets the reason in ``errors`` and nulls in every result column ("column").
    ``row_name(i)`` names row ``i`` in messages; it is only called for a row that failed."""
    names = [column.name for column in columns]
    problems: dict[int, str] = {}
    by_column = _dict_columns(replies, names, errors)
    if by_column is None:
        fields: list[Sequence[object] | None] = []
        for index, reply in enumerate(replies):
            try:
                fields.append(None if errors[index] is not None else result_fields(reply, names))
            except (ValueError, TypeError) as exc:
                problems[index] = str(exc)
                fields.append(None)
        by_column = [
            [None if row is None else row[position] for row in fields]
            for position in range(len(columns))
        ]
    arrays = []
    for column, values in zip(columns, by_column, strict=True):
        try:
            arrays.append(_array(values, column.arrow))
        except _ARROW_ERRORS:
            if not _find_misfits(column, values, problems):
                raise  # no one value is to blame
    if not problems:
        return arrays
    if on_error == "raise":
        first = min(problems)
        raise ValueError(f"{row_name(first)}: {problems[first]}")
    for index, problem in problems.items():
        errors[index] = f"{row_name(index)}: {problem}"
    return [
        _array([None if i in problems else value for i, value in enumerate(values)], column.arrow)
        for column, values in zip(columns, by_column, strict=True)
    ]


def _dict_columns(
    replies: Sequence[object], names: Sequence[str], errors: Sequence[str | None]
) -> list[list[object]] | None:
    """The usual chunk's result columns, read column by column: every row answered with a
    dict that has every field. None for any other chunk, which is read row by row (where a
    row that does not fit is found and named)."""
    if any(error is not None for error in errors):
        return None
    try:
        return [[reply[name] for reply in replies] for name in names]  # type: ignore[index]
    except (KeyError, TypeError, IndexError):
        return None


def _find_misfits(column: Column, values: list[object], problems: dict[int, str]) -> bool:
    """Which values of a column that failed as a whole do not fit, and why (Arrow's words;
    a row keeps its first problem); whether there were any."""
    found = False
    for index, value in enumerate(values):
        if value is None:
            continue
        try:
            _array([value], column.arrow)
        except _ARROW_ERRORS as exc:
            found = True
            problems.setdefault(
                index,
                f"result column {column.name!r} ({column.ddl}) cannot hold "
                f"the {type(value).__name__} {_repr.repr(value)}: {exc}",
            )
    return found


def _array(values: list[object], arrow_type: pa.DataType) -> ArrowArray:
    import pyarrow as pa

    if _holds_integers(arrow_type):
        floats: dict[pa.DataType, list[float]] = {}
        for value in values:
            for number, integer_type in _floats_in_integers(value, arrow_type):
                floats.setdefault(integer_type, []).append(number)
        for integer_type, numbers in floats.items():  # refuses 0.89, takes 2.0
            pa.array(numbers, type=pa.float64()).cast(integer_type, safe=True)
    return pa.array(values, type=arrow_type)


def _holds_integers(arrow_type: pa.DataType) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(arrow_type) or any(
        _holds_integers(arrow_type.field(i).type) for i in range(arrow_type.num_fields)
    )


def _floats_in_integers(
    value: object, arrow_type: pa.DataType
) -> Iterator[tuple[float, pa.DataType]]:
    """The floats of ``value`` that Arrow would put in an integer slot of ``arrow_type``
    (an int column, or one inside an array, map or struct), with that slot's type."""
    import pyarrow as pa

    if pa.types.is_integer(arrow_type):
        if isinstance(value, float):
            yield value, arrow_type
    elif pa.types.is_map(arrow_type) and isinstance(value, dict):
        for key, item in value.items():
            yield from _floats_in_integers(key, arrow_type.key_type)
            yield from _floats_in_integers(item, arrow_type.item_type)
    elif pa.types.is_struct(arrow_type) and isinstance(value, dict):
        for field in arrow_type:
            yield from _floats_in_integers(value.get(field.name), field.type)
    elif pa.types.is_list(arrow_type) and isinstance(value, list | tuple):
        for item in value:
            yield from _floats_in_integers(item, arrow_type.value_type)
