"""pairlink's logs belong to the application that uses it.

A library must neither print nor configure logging for its process. pairlink's loggers are
structlog-style (events with bound fields) and decide at each line where it goes:

- the application configured structlog (``structlog.configure``, as ``pairlink`` the command
  does): the line goes through that configuration, its processors and its level;
- else it becomes a :mod:`logging` record of the logger of the same name (``pairlink.service``,
  ``pairlink.transport``...), so ``logging.basicConfig(level=...)`` or any handler applies. The
  message reads ``event key=value ...``, and each field is an attribute of the record too.

Nothing reaches the screen until the application asks: the ``pairlink`` logger has a
:class:`logging.NullHandler`, as the logging HOWTO asks of libraries, or Python's last-resort
handler would print our warnings, bare, on the stderr of an application that configured nothing.

Calling ``structlog.configure`` here instead would override (or be overridden by) the
application's own configuration, and ``structlog.get_logger`` alone prints everything to stdout
until someone configures it: hence this small proxy.
"""

from __future__ import annotations

import logging
import secrets
import sys
from typing import Any

import structlog

PACKAGE = "pairlink"
FORMATS = ("console", "json")

logging.getLogger(PACKAGE).addHandler(logging.NullHandler())

# a field named like a LogRecord attribute cannot be an ``extra``: logging raises KeyError
_RECORD_ATTRIBUTES = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class Logger:
    """A bound logger (``bind`` adds fields to every line) that follows the application's
    choice: its structlog configuration if it made one, else :mod:`logging`."""

    __slots__ = ("_context", "_stdlib", "_structlog")

    def __init__(self, name: str, context: dict[str, object]) -> None:
        self._context = context
        self._stdlib = logging.getLogger(name)
        # as structlog's own bind: resolved now if configured (a line then costs what structlog's
        # do), else a lazy proxy that reads the configuration the application makes later
        proxy = structlog.get_logger(name, **context)
        self._structlog = proxy.bind() if context and structlog.is_configured() else proxy

    def bind(self, **fields: object) -> Logger:
        return Logger(self._stdlib.name, {**self._context, **fields})

    def debug(self, event: str, **fields: object) -> None:
        self._log(logging.DEBUG, "debug", event, fields)

    def info(self, event: str, **fields: object) -> None:
        self._log(logging.INFO, "info", event, fields)

    def warning(self, event: str, **fields: object) -> None:
        self._log(logging.WARNING, "warning", event, fields)

    def error(self, event: str, **fields: object) -> None:
        self._log(logging.ERROR, "error", event, fields)

    def _log(self, level: int, method: str, event: str, fields: dict[str, object]) -> None:
        if structlog.is_configured():
            getattr(self._structlog, method)(event, **fields)
        elif self._stdlib.isEnabledFor(level):
            exc_info: Any = fields.pop("exc_info", None)  # as given: logging judges it
            fields = {**self._context, **fields}
            extra = {f"{k}_" if k in _RECORD_ATTRIBUTES else k: v for k, v in fields.items()}
            extra["event"] = event
            text = " ".join([event, *(f"{k}={_value(v)}" for k, v in fields.items())])
            # stacklevel 3: the record names the line that logged, not this module
            self._stdlib.log(level, "%s", text, exc_info=exc_info, extra=extra, stacklevel=3)


def get_logger(name: str) -> Logger:
    """The logger ``name`` (``pairlink.<area>``) for a module of pairlink."""
    return Logger(name, {})


def _value(value: object) -> str:
    """A field as ``key=value`` shows it (logfmt): in double quotes only when it would not
    read as one word."""
    text = str(value)
    if text and not any(c.isspace() or c in '"=' for c in text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def configure_stderr(level: str, style: str) -> None:
    """How the ``pairlink`` command logs (an application's choice, made once per process):
    lines from ``level`` on, on stderr, as ``console`` text (colours on a terminal) or one JSON
    object a line; :mod:`logging` records of other code (a served module's) look the same."""
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,  # what tag_process added (a worker's index)
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.typing.Processor
    if style == "json":
        shared.append(structlog.processors.format_exc_info)
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    threshold = logging.getLevelNamesMapping()[level.upper()]
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        # one write a line: workers share the supervisor's stderr, even unbuffered
        logger_factory=structlog.WriteLoggerFactory(sys.stderr),
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    # (no force: a process that set up logging already, as pytest does, keeps its handlers)
    logging.basicConfig(level=threshold, handlers=[handler])


def tag_process(**fields: object) -> None:
    """Add ``fields`` to every line this process logs from now on (under
    :func:`configure_stderr`): ``--workers`` tags each worker's lines with its index."""
    structlog.contextvars.bind_contextvars(**fields)


def new_ref() -> str:
    """A reference id for an unexpected failure: the peer is told it, the log has it beside the
    traceback, so whoever runs the service finds one from the other. 12 hex digits tell one
    failure from every other in years of logs and are short enough to quote."""
    return secrets.token_hex(6)
