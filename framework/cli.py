"""The ``pairlink`` command line (also ``python -m framework``).

``pairlink call URL ADDRESS OPERATION [JSON_ARGS...]`` calls a service once and prints the
reply as JSON; ``pairlink serve MODULE[:Class] ... --listen URL`` serves the ``@service``
classes of those modules until Ctrl-C (or SIGTERM), then shuts them down gracefully;
``pairlink gateway --config FILE`` runs the gateway that TOML file configures, until Ctrl-C.

Logs are structlog lines on stderr, so that stdout carries nothing but the reply of ``call``.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import json
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from importlib import metadata
from typing import Any, cast

import attrs
import structlog
import trio

from framework.client.reply import Reply
from framework.errors import PairlinkError, RemoteError
from framework.rpc import wire
from framework.rpc.deadline import wall_time
from framework.rpc.payload import Encoding

log = structlog.get_logger("pairlink.cli")

EXIT_FAILED = 1
"""The call failed (an error reply, a timeout, no connection) or the server could not start."""

ENCODINGS = {
    "envelope": Encoding.ENVELOPE,
    "msgpack": Encoding.MSGPACK,
    "json": Encoding.JSON,
    "raw": Encoding.RAW,
    "amqp-value": Encoding.AMQP_VALUE,
}


def _version() -> str:
    # The installed distribution is the one source of the version (pyproject.toml).
    try:
        return metadata.version("pairlink")
    except metadata.PackageNotFoundError:  # running from a source tree that is not installed
        return "0+unknown"


def _json_argument(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not JSON (a string needs its quotes: '\"hi\"')"
        ) from None


def _property(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pairlink",
        description="Request-response services over AMQP 1.0 paired links.",
    )
    parser.add_argument("--version", action="version", version=f"pairlink {_version()}")
    parser.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="log lines on stderr from this level on (default: warning for call, info otherwise)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    call = commands.add_parser(
        "call",
        help="call one operation of a service and print the reply as JSON",
        description="Call OPERATION of the service at ADDRESS; arguments are JSON values.",
    )
    call.add_argument("url", metavar="URL", help="amqp[s]://[user:password@]host[:port]")
    call.add_argument("address", metavar="ADDRESS", help="the service's address, e.g. echo")
    call.add_argument("operation", metavar="OPERATION")
    call.add_argument(
        "args", metavar="JSON_ARGS", nargs="*", type=_json_argument, help="positional arguments"
    )
    call.add_argument("--timeout", type=float, default=30.0, metavar="S", help="default 30")
    call.add_argument(
        "--encoding",
        choices=list(ENCODINGS),
        help="the request body (default: the envelope for a pairlink peer, else amqp-value); "
        "raw sends one JSON string argument as its UTF-8 bytes",
    )
    call.add_argument("--subject", help="the request's subject")
    call.add_argument(
        "--property",
        dest="properties",
        action="append",
        default=[],
        type=_property,
        metavar="KEY=VALUE",
        help="an application-property of the request (repeatable); VALUE is read as JSON "
        "when it parses, else as a string",
    )
    call.add_argument(
        "--unsettled",
        action="store_true",
        help="send the request unsettled: the service's outcome is checked (and shown by -v)",
    )
    call.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="print the reply's properties, application-properties and the request's "
        "outcome (one JSON line each) before the value",
    )

    serve = commands.add_parser(
        "serve",
        help="serve @service classes until Ctrl-C",
        description="Serve the @service classes of MODULE (or only MODULE:Class).",
    )
    serve.add_argument("services", metavar="MODULE[:Class]", nargs="+")
    serve.add_argument(
        "--listen",
        default="amqp://127.0.0.1:5672",
        metavar="URL",
        help="where to listen (default %(default)s; port 0 picks a free port, logged)",
    )
    serve.add_argument(
        "--address", metavar="NAME", help="serve the (single) service under this address"
    )

    gateway = commands.add_parser(
        "gateway",
        help="run a gateway (routes between organisations) until Ctrl-C",
        description="Run the gateway that FILE configures (listen, [users], [[route]] tables).",
    )
    gateway.add_argument(
        "--config",
        required=True,
        metavar="FILE",
        help="the gateway's TOML config; passwords come from the variables it names",
    )
    return parser


def _configure_logging(level: str) -> None:
    """Human-readable lines on stderr (colours only on a terminal), from ``level`` on."""
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level]),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pairlink`` console script; returns the process exit code."""
    parser = build_parser()
    options = parser.parse_args(argv)
    if options.command is None:
        parser.print_help()
        return 0
    default_level = "warning" if options.command == "call" else "info"
    _configure_logging((options.log_level or default_level).upper())
    if options.command == "call":
        return _call(options)
    if options.command == "gateway":
        return _gateway(options)
    return _serve(options, parser)


# -- call ------------------------------------------------------------------------------------


def _call(options: argparse.Namespace) -> int:
    from framework.client.client import connect

    async def run() -> Reply:
        settled = not options.unsettled
        async with connect(options.url, timeout=options.timeout, settled=settled) as client:
            encoding = ENCODINGS[options.encoding] if options.encoding else client.call_encoding
            assert encoding is not None  # connected
            args = options.args
            if encoding is Encoding.RAW:  # JSON has no bytes: a string stands for its UTF-8
                args = [a.encode() if isinstance(a, str) else a for a in args]
            message = wire.request_message(
                options.operation, args, {}, message_id=None, now=wall_time(), encoding=encoding
            )
            return await client.request(
                options.address,
                message,
                subject=options.subject,
                application_properties=dict(options.properties) or None,
            )

    try:
        reply = trio.run(run)
        if options.verbose:
            _print_reply_head(reply)
        wire.raise_for_outcome(reply.outcome)
        assert reply.message is not None  # accepted (or pre-settled), so it was answered
        result = wire.parse_reply(reply.message)
    except RemoteError as exc:
        print(f"pairlink call: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except (PairlinkError, TimeoutError, OSError, ValueError) as exc:
        print(f"pairlink call: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(_json(result))
    return 0


def _print_reply_head(reply: Reply) -> None:
    """``-v``: what came with the value, a JSON line each, under AMQP's names."""
    if reply.message is not None:  # (none for a request the service did not accept)
        print("properties:", _json(_fields(reply.properties)))
        print("application-properties:", _json(reply.application_properties))
    if reply.outcome is not None:
        name = type(reply.outcome).__name__.lower()
        print("outcome:", _json({name: _fields(reply.outcome)}))


def _fields(value: Any) -> dict[str, Any]:
    """The fields of an AMQP composite (properties, an outcome) that are set."""
    if value is None:
        return {}
    fields = attrs.asdict(cast(attrs.AttrsInstance, value), filter=lambda _f, v: v is not None)
    return {name.replace("_", "-"): v for name, v in fields.items()}


def _json(value: Any) -> str:
    return json.dumps(value, default=_jsonable, ensure_ascii=False)


def _jsonable(value: Any) -> Any:
    """What JSON has no type for: bytes as text (undecodable bytes escaped), the rest as
    their string form (timestamps, UUIDs, AMQP symbols and described values)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", errors="backslashreplace")
    return str(value)


# -- serve -----------------------------------------------------------------------------------


def _serve(options: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from framework.server.service import hosted
    from framework.server.serving import serve

    try:
        services: list[Any] = [found for spec in options.services for found in _load(spec)]
        if options.address is not None:
            if len(services) != 1:
                parser.error(f"--address needs exactly one service, found {len(services)}")
            services = [hosted(services[0], address=options.address)]
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        parser.error(str(exc))
    run = functools.partial(serve, *services, listen=options.listen)
    try:
        trio.run(_until_signal, run)
    except (OSError, PairlinkError, ValueError) as exc:
        print(f"pairlink serve: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return 0


def _load(spec: str) -> list[type]:
    """The services ``MODULE[:Class]`` names: that class, or every @service class defined in
    the module (in definition order; not the ones it merely imports)."""
    module_name, _, class_name = spec.partition(":")
    module = importlib.import_module(module_name)
    if class_name:
        cls = getattr(module, class_name)
        if not _is_service(cls):
            raise TypeError(f"{spec} is not a @service class")
        return [cls]
    found = [
        value
        for value in vars(module).values()
        if _is_service(value) and value.__module__ == module.__name__
    ]
    if not found:
        raise TypeError(f"module {module_name} defines no @service class")
    return found


def _is_service(value: Any) -> bool:
    from framework.server.service import spec_of

    if not inspect.isclass(value):
        return False
    try:
        spec_of(value)
    except TypeError:
        return False
    return True


async def _until_signal(run: Callable[[], Awaitable[None]]) -> None:
    """Run ``run()`` until it returns or SIGINT/SIGTERM arrives, then cancel it, which is the
    services' graceful shutdown (in-flight calls are answered first)."""
    failure: list[Exception] = []
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def serve_then_stop() -> None:
                try:
                    await run()
                except Exception as exc:  # re-raised bare below, not in an exception group
                    failure.append(exc)
                nursery.cancel_scope.cancel()

            nursery.start_soon(serve_then_stop)
            async for signum in signals:
                log.info("serve.stopping", signal=signal.Signals(signum).name)
                nursery.cancel_scope.cancel()
    if failure:
        raise failure[0]


# -- gateway ---------------------------------------------------------------------------------


def _gateway(options: argparse.Namespace) -> int:
    from framework.gateway import ConfigError, load_config, run_gateway

    try:
        config = load_config(options.config)
        trio.run(_until_signal, functools.partial(run_gateway, config))
    except ConfigError as exc:  # it names the file, line and key: no more is needed
        print(f"pairlink gateway: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except (OSError, PairlinkError, ValueError) as exc:
        print(f"pairlink gateway: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return 0
