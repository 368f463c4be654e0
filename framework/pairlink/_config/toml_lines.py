"""Where each key of a TOML document is written: ``tomllib`` returns values without positions,
and a config error must name its line.

This is a locator, not a parser: it reads the subset pairlink's configs use (top-level keys,
``[table]`` and ``[[array-of-tables]]`` headers, ``key = value`` lines with bare, quoted or
dotted keys) and skips over values, including arrays and multi-line strings that span lines.
Keys inside an inline table or array (``{ password_env = "X" }``) are not recorded: they are on
their parent key's line in TOML 1.0 anyway (or near it, for an array spanning lines), and
:meth:`KeyLines.line` falls back to the nearest recorded ancestor.

A path is a tuple of keys and array indexes, as the parsed document is nested: the ``upstream``
of the second ``[[route]]`` is ``("route", 1, "upstream")``.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Sequence

KeyPath = tuple[str | int, ...]

_BARE = r"[A-Za-z0-9_-]+"
_PART = rf"""(?:{_BARE}|"(?:[^"\\]|\\.)*"|'[^']*')"""
_KEY = rf"{_PART}(?:[ \t]*\.[ \t]*{_PART})*"
_ARRAY_HEADER = re.compile(rf"[ \t]*\[\[[ \t]*({_KEY})[ \t]*\]\]")
_TABLE_HEADER = re.compile(rf"[ \t]*\[[ \t]*({_KEY})[ \t]*\]")
_KEY_VALUE = re.compile(rf"[ \t]*({_KEY})[ \t]*=")
_PARTS = re.compile(_PART)


def _split_key(key: str) -> tuple[str, ...]:
    parts = []
    for part in _PARTS.findall(key):
        if part.startswith('"'):  # a basic string: let TOML itself undo its escapes
            part = tomllib.loads(f"k = {part}")["k"]
        elif part.startswith("'"):
            part = part[1:-1]
        parts.append(part)
    return tuple(parts)


class _ValueScanner:
    """Follows strings, brackets and comments of values across lines, so that a line inside a
    multi-line array or string is not mistaken for a key."""

    def __init__(self) -> None:
        self.depth = 0  # open [ and {
        self.multiline: str | None = None  # the delimiter of an open multi-line string

    @property
    def idle(self) -> bool:
        return self.depth == 0 and self.multiline is None

    def scan(self, text: str) -> None:
        i = 0
        while i < len(text):
            if self.multiline is not None:
                end = self._find_closing(text, i, self.multiline)
                if end < 0:
                    return
                self.multiline, i = None, end
                continue
            char = text[i]
            if char == "#":
                return
            if text.startswith(('"""', "'''"), i):
                self.multiline, i = text[i : i + 3], i + 3
            elif char in "\"'":
                end = self._find_closing(text, i + 1, char)
                i = len(text) if end < 0 else end
            else:
                if char in "[{":
                    self.depth += 1
                elif char in "]}" and self.depth:
                    self.depth -= 1
                i += 1

    @staticmethod
    def _find_closing(text: str, start: int, delimiter: str) -> int:
        """The index after ``delimiter`` closing a string opened before ``start``, or -1."""
        i = start
        while i < len(text):
            if text[i] == "\\" and delimiter[0] == '"':
                i += 2
            elif text.startswith(delimiter, i):
                return i + len(delimiter)
            else:
                i += 1
        return -1


class KeyLines:
    """The 1-based line of each table header and ``key = value`` line of ``text``.

    Lenient by design: it also reads a document that ``tomllib`` refused, to name the key on
    the line of a syntax error.
    """

    def __init__(self, text: str) -> None:
        self.lines: dict[KeyPath, int] = {}
        self._context: dict[int, KeyPath] = {}  # line -> the key (or table) it belongs to
        arrays: dict[tuple[str, ...], int] = {}  # array-of-tables name -> its last index
        table: KeyPath = ()
        key: KeyPath = ()  # the key whose value is being scanned
        scanner = _ValueScanner()
        for number, line in enumerate(text.splitlines(), start=1):
            if not scanner.idle:  # inside a value that spans lines
                scanner.scan(line)
                self._context[number] = key
                continue
            key = table
            if match := _ARRAY_HEADER.match(line):
                name = _split_key(match.group(1))
                arrays[name] = arrays.get(name, -1) + 1
                key = table = self._indexed(name, arrays)
            elif match := _TABLE_HEADER.match(line):
                key = table = self._indexed(_split_key(match.group(1)), arrays)
            elif match := _KEY_VALUE.match(line):
                key = table + _split_key(match.group(1))
            self._context[number] = key
            if match:
                self.lines.setdefault(key, number)
                scanner.scan(line[match.end() :])

    @staticmethod
    def _indexed(name: tuple[str, ...], arrays: dict[tuple[str, ...], int]) -> KeyPath:
        """``name`` with the current index after each array of tables along it
        (``[route.tls]`` after the second ``[[route]]`` is ``("route", 1, "tls")``)."""
        path: list[str | int] = []
        for depth, part in enumerate(name, start=1):
            path.append(part)
            if name[:depth] in arrays:
                path.append(arrays[name[:depth]])
        return tuple(path)

    def line(self, path: Sequence[str | int]) -> int:
        """The line of ``path``, else of its nearest recorded ancestor (the table header of a
        missing key), else 1."""
        path = tuple(path)
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return 1

    def key_at(self, number: int) -> KeyPath:
        """The key written on line ``number`` (or whose value spans it), else its table."""
        return self._context.get(number, ())


def dotted(path: Sequence[str | int]) -> str:
    """``path`` the way a message names it: ``route[2].upstream``, ``users."org n".x``
    (array indexes 1-based, as one counts ``[[route]]`` tables in the file)."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part + 1}]"
        else:
            name = part if re.fullmatch(_BARE, part) else json.dumps(part, ensure_ascii=False)
            text += f".{name}" if text else name
    return text or "(document)"
