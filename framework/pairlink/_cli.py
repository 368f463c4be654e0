"""The ``pairlink`` command line (also ``python -m pairlink``).

``pairlink call URL ADDRESS OPERATION [JSON_ARGS...]`` calls a service once and prints the
reply as JSON; ``pairlink serve MODULE[:Class] ... --listen URL`` serves the ``@service``
classes of those modules until Ctrl-C (or SIGTERM), then shuts them down gracefully;
``pairlink gateway --config FILE`` runs the gateway that TOML file configures, until Ctrl-C;
``pairlink health URL`` exits 0 if the server there is serving, else 1 (for orchestrators).

Logs are structlog lines on stderr (``--log-format console|json``), so that stdout carries
nothing but the reply of ``call``.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import NoReturn, cast

import attrs
import trio

from pairlink._client.reply import Reply
from pairlink._rpc import wire
from pairlink._rpc.deadline import wall_time
from pairlink._rpc.payload import Encoding
from pairlink._telemetry.logs import FORMATS, configure_stderr, get_logger, tag_process
from pairlink._version import VERSION
from pairlink.errors import PairlinkError, RemoteError

log = get_logger("pairlink.cli")

EXIT_FAILED = 1
"""The call failed (an error reply, a timeout, no connection) or the server could not start."""

ENCODINGS = {
    "envelope": Encoding.ENVELOPE,
    "msgpack": Encoding.MSGPACK,
    "json": Encoding.JSON,
    "raw": Encoding.RAW,
    "amqp-value": Encoding.AMQP_VALUE,
}


def _json_argument(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not JSON (a string needs its quotes: '\"hi\"')"
        ) from None


def _property(text: str) -> tuple[str, object]:
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
    parser.add_argument("--version", action="version", version=f"pairlink {VERSION}")
    _add_log_options(parser, default=None)
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
    serve.add_argument("services", metavar="MODULE[:Class]", nargs="*")
    serve.add_argument(
        "--config",
        metavar="FILE",
        help="a TOML file: listen, [tls], [users], [[service]], [limits], [log] (flags win)",
    )
    serve.add_argument(
        "--listen",
        metavar="URL",
        action="append",
        help=f"where to listen, amqp:// or amqps://; repeat it for several listeners (default "
        f"{_SERVE_URL}; port 0 picks a free port, logged)",
    )
    serve.add_argument("--cert", metavar="PEM", help="certificate chain for an amqps:// listen")
    serve.add_argument("--key", metavar="PEM", help="private key for an amqps:// listen")
    serve.add_argument("--client-ca", metavar="PEM", help="CAs a client certificate must match")
    serve.add_argument(
        "--address", metavar="NAME", help="serve the (single) service under this address"
    )
    _add_metrics_option(serve)
    serve.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="serve in N processes sharing the port (Linux SO_REUSEPORT), each restarted if "
        "it dies (default 1: this process alone)",
    )

    health = commands.add_parser(
        "health",
        help="ask a server for its health: exit 0 if serving, else 1 (for orchestrators)",
        description="Print the status of the server at URL (serving, draining, or why it "
        "could not be asked) on one line; exit 0 only if it is serving.",
    )
    health.add_argument("url", metavar="URL", help="amqp://[user:password@]host[:port]")
    health.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        metavar="S",
        help="bounds everything, connecting included (default %(default)s)",
    )
    health.add_argument(
        "--service", default="", metavar="ADDRESS", help="the health of this service only"
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
    _add_metrics_option(gateway)
    for subcommand in commands.choices.values():
        _add_log_options(subcommand, default=argparse.SUPPRESS)
    return parser


def _add_metrics_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="serve Prometheus metrics over HTTP there (port 0 picks a free port, logged); "
        "needs the metrics extra (prometheus_client)",
    )


def _add_log_options(parser: argparse.ArgumentParser, default: str | None) -> None:
    """The log options, on the command and on each subcommand (``pairlink serve ...
    --log-level debug``); a subcommand's default must be SUPPRESS, or it would erase a value
    given before the subcommand."""
    parser.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default=default,
        help="log lines on stderr from this level on (default: warning for call and health, "
        "info otherwise)",
    )
    parser.add_argument(
        "--log-format",
        choices=FORMATS,
        default=default,
        help="console: lines for people (the default); json: one JSON object a line",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pairlink`` console script; returns the process exit code."""
    parser = build_parser()
    options = parser.parse_args(argv)
    if options.command is None:
        parser.print_help()
        return 0
    default_level = "warning" if options.command in ("call", "health") else "info"
    configure_stderr(options.log_level or default_level, options.log_format or "console")
    if options.command == "call":
        return _call(options)
    if options.command == "health":
        return _health(options)
    if options.command == "gateway":
        return _gateway(options)
    return _serve(options, parser, sys.argv[1:] if argv is None else list(argv))


# -- call ------------------------------------------------------------------------------------


def _call(options: argparse.Namespace) -> int:
    from pairlink._client.client import connect

    async def run() -> Reply:
        # --timeout bounds the whole command: a peer that accepts and stays silent included
        with trio.move_on_after(options.timeout):
            return await exchange()
        raise TimeoutError(f"no reply within {options.timeout} s, connecting included")

    async def exchange() -> Reply:
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


def _fields(value: object) -> dict[str, object]:
    """The fields of an AMQP composite (properties, an outcome) that are set."""
    if value is None:
        return {}
    fields = attrs.asdict(cast(attrs.AttrsInstance, value), filter=lambda _f, v: v is not None)
    return {name.replace("_", "-"): v for name, v in fields.items()}


def _json(value: object) -> str:
    return json.dumps(value, default=_jsonable, ensure_ascii=False)


def _jsonable(value: object) -> str:
    """What JSON has no type for: bytes as text (undecodable bytes escaped), the rest as
    their string form (timestamps, UUIDs, AMQP symbols and described values)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", errors="backslashreplace")
    return str(value)


# -- serve -----------------------------------------------------------------------------------

_SERVE_URL = "amqp://127.0.0.1:5672"


def _serve(options: argparse.Namespace, parser: argparse.ArgumentParser, argv: list[str]) -> int:
    from pairlink._config.toml_config import TlsFiles, server_tls_context
    from pairlink._server.config import ServeConfig, ServiceEntry, load_serve_config
    from pairlink._server.service import hosted
    from pairlink._server.serving import serve
    from pairlink._server.workers import serve_worker, supervise, worker_settings
    from pairlink.errors import ConfigError

    worker = worker_settings()  # set in the processes of --workers only
    sys.path.insert(0, os.getcwd())  # `serve mymodule` finds ./mymodule.py, as uvicorn does
    try:
        config = ServeConfig() if options.config is None else load_serve_config(options.config)
    except ConfigError as exc:  # it names the file, line and key: no more is needed
        print(f"pairlink serve: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if config.log_level is not None or config.log_format is not None:  # flags still win
        level = options.log_level or config.log_level or "info"
        configure_stderr(level, options.log_format or config.log_format or "console")
    entries = [ServiceEntry(spec) for spec in options.services] or list(config.services)
    if not entries:
        parser.error("no services: give MODULE[:Class], or [[service]] tables in --config")
    try:
        services = [(cls, entry) for entry in entries for cls in _load(entry.module)]
        if options.address is not None and len(services) != 1:
            parser.error(f"--address needs exactly one service, found {len(services)}")
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        parser.error(str(exc))
    try:  # created now: a constructor that needs arguments is one line, not a traceback
        served = [
            hosted(
                cls,
                address=options.address or entry.address,
                max_concurrency=entry.max_concurrency,
                mailbox=entry.mailbox,
                dedup_window=entry.dedup_window,
                dedup_size=entry.dedup_size,
            )
            for cls, entry in services
        ]
    except (TypeError, ValueError) as exc:
        print(f"pairlink serve: {exc}", file=sys.stderr)
        return EXIT_FAILED
    listen = options.listen or list(config.listen) or [_SERVE_URL]  # --listen replaces the file's
    if worker is not None:  # the same URLs, with the ports its supervisor holds for all workers
        listen = list(worker.listen)
    workers = options.workers or config.workers or 1
    if workers < 1:
        parser.error(f"--workers must be at least 1, not {workers}")
    metrics_listen = options.metrics_listen or config.metrics_listen
    if worker is not None:
        tag_process(worker=worker.index)
        if metrics_listen is not None:  # each worker has an endpoint of its own
            metrics_listen = worker.metrics_listen(metrics_listen)
    tls = config.tls or TlsFiles("", "")
    cert, key = options.cert or tls.cert, options.key or tls.key
    ssl_context = None
    if any(url.startswith("amqps:") for url in listen):
        if not cert or not key:
            parser.error("an amqps:// listen needs --cert and --key (or [tls] in --config)")
        ssl_context = server_tls_context(cert, key, options.client_ca or tls.client_ca)
    run = functools.partial(
        serve,
        *served,
        listen=listen,
        users=config.users,
        # with [users], only its certificate users; without, any certificate client_ca verified
        certificate_users=None if config.users is None else config.certificate_users,
        vouching_users=config.vouching_users,
        ssl_context=ssl_context,
        limits=config.limits,
        reuse_port=worker is not None,
        metrics_listen=metrics_listen,
    )
    if worker is not None:
        run = functools.partial(serve_worker, run, worker)
    try:
        if worker is None and workers > 1:  # its workers serve; it takes the signals itself
            command = [sys.executable, "-m", "pairlink", *argv]
            return trio.run(supervise, command, listen, workers)
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


def _is_service(value: object) -> bool:
    from pairlink._server.service import spec_of

    if not inspect.isclass(value):
        return False
    try:
        spec_of(value)
    except TypeError:
        return False
    return True


async def _until_signal(run: Callable[[], Awaitable[None]]) -> None:
    """Run ``run()`` until it returns or SIGINT/SIGTERM arrives, then cancel it, which is the
    services' graceful shutdown (in-flight calls are answered first). A second signal during
    that shutdown exits at once (:func:`_exit_now`)."""
    failure: list[Exception] = []
    serving = trio.CancelScope()
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def serve_then_stop() -> None:
                with serving:
                    try:
                        await run()
                    except Exception as exc:  # re-raised bare below, not in an exception group
                        failure.append(exc)
                nursery.cancel_scope.cancel()  # ends the wait for signals

            nursery.start_soon(serve_then_stop)
            async for signum in signals:
                if serving.cancel_called:
                    _exit_now(signum)
                log.info("serve.stopping", signal=signal.Signals(signum).name)
                serving.cancel()
    if failure:
        raise failure[0]


def _exit_now(signum: int) -> NoReturn:
    """The second Ctrl-C: the user will not wait for the graceful shutdown, which may be stuck
    in an ``on_stop`` or a handler (a thread cannot be cancelled): exit without unwinding,
    with the shell's code for death by that signal."""
    log.warning("serve.exit_now", signal=signal.Signals(signum).name)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(128 + signum)


# -- health ----------------------------------------------------------------------------------


def _health(options: argparse.Namespace) -> int:
    """One line, like grpc_health_probe: the status on stdout, or why there is none on stderr;
    0 only for a server that is serving (draining is as good as gone to an orchestrator)."""
    from pairlink._client.health import SERVING, check_health

    run = functools.partial(check_health, options.url, options.service, timeout=options.timeout)
    try:
        status = trio.run(run)
    except (PairlinkError, TimeoutError, OSError, ValueError) as exc:
        print(f"pairlink health: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(status)
    return 0 if status == SERVING else EXIT_FAILED


# -- gateway ---------------------------------------------------------------------------------


def _gateway(options: argparse.Namespace) -> int:
    from pairlink._gateway.config import load_config
    from pairlink._gateway.node import run_gateway
    from pairlink.errors import ConfigError

    try:
        config = load_config(options.config)
        if options.metrics_listen is not None:  # the flag wins over the file
            config = attrs.evolve(config, metrics_listen=options.metrics_listen)
        trio.run(_until_signal, functools.partial(run_gateway, config))
    except ConfigError as exc:  # it names the file, line and key: no more is needed
        print(f"pairlink gateway: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except (OSError, PairlinkError, ValueError) as exc:
        print(f"pairlink gateway: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return 0
