"""A Proton server in a thread (see :mod:`tests.interop.proton_peers`)."""

from __future__ import annotations

import atexit
import collections
import itertools
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
from proton import (
    SASL,
    Connection,
    Delivery,
    Endpoint,
    Link,
    Message,
    Transport,
    symbol,
)
from proton.handlers import MessagingHandler
from proton.reactor import ApplicationEvent, Container, EventInjector

from tests.interop.proton_common import (
    DEFAULT_PREFETCH,
    LOOPBACK,
    Disposition,
    Outcome,
    PeerError,
    StopReactor,
    outcome_of,
    run_reactor,
    server_ssl_domain,
    symbol_names,
)
from tests.tls import TlsFiles

# ---------------------------------------------------------------------------------------------
# Cyrus SASL (PLAIN server)


class _CyrusUsers:
    """The process-wide Cyrus configuration folder and its sasldb of test users.

    Cyrus is initialised once per process, by the first Proton *server* transport that does SASL,
    whichever test makes it (a sans-IO test with a bare ``proton.Transport`` counts), and keeps
    the configuration it found then. So the folder is also published in ``PN_SASL_CONFIG_PATH``
    (where Proton looks when no transport names a folder) and the file has Proton's default name:
    ``tests/conftest.py`` calls :func:`prepare_cyrus` before any test runs.
    """

    CONFIG_NAME = "proton-server"  # Proton's default: a transport that names none finds it too
    MECHANISMS = "PLAIN ANONYMOUS EXTERNAL"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._dir: Path | None = None
        self._users: dict[str, str] = {}

    def directory(self) -> Path:
        with self._lock:
            if self._dir is None:
                folder = Path(tempfile.mkdtemp(prefix="pairlink-sasl-"))
                atexit.register(shutil.rmtree, folder, True)
                (folder / f"{self.CONFIG_NAME}.conf").write_text(
                    "pwcheck_method: auxprop\n"
                    "auxprop_plugin: sasldb\n"
                    f"sasldb_path: {folder / 'users.sasldb'}\n"
                    f"mech_list: {self.MECHANISMS}\n"
                )
                os.environ.setdefault("PN_SASL_CONFIG_PATH", str(folder))
                self._dir = folder
            return self._dir

    def add(self, user: str, password: str) -> None:
        saslpasswd2 = shutil.which("saslpasswd2") or "/usr/sbin/saslpasswd2"
        folder = self.directory()
        with self._lock:
            if self._users.get(user) == password:
                return
            # The realm defaults to the host's name on both sides (saslpasswd2 and Proton's
            # sasl_server_new), so a plain "user" authenticates without a realm suffix.
            subprocess.run(
                [saslpasswd2, "-c", "-p", "-f", str(folder / "users.sasldb"), user],
                input=password.encode(),
                check=True,
                capture_output=True,
            )
            self._users[user] = password


_cyrus = _CyrusUsers()


def prepare_cyrus() -> Path | None:
    """Make (once) the Cyrus configuration every Proton server of this process will use; None
    where Proton has no Cyrus. Call before the first Proton server transport exists."""
    return _cyrus.directory() if SASL.extended() else None


def sasl_plain_server_available() -> str | None:
    """None if a Proton server can check SASL PLAIN here, else the reason it cannot."""
    if not SASL.extended():
        return (
            "python-qpid-proton was built without Cyrus SASL (install libsasl2-dev and "
            "rebuild it: `make venv` does both), so a Proton server cannot serve PLAIN"
        )
    if not (shutil.which("saslpasswd2") or Path("/usr/sbin/saslpasswd2").exists()):
        return "saslpasswd2 (Debian package sasl2-bin) is needed to create the test sasldb"
    return None


# ---------------------------------------------------------------------------------------------
# Server


@attrs.define
class Received:
    """A message the server received."""

    message: Message
    address: str | None
    """The target address of the link it arrived on."""
    link_name: str
    container_id: str | None
    """The sending peer's container id."""


@attrs.define
class PeerConnection:
    """What the server saw of one accepted connection."""

    container_id: str | None
    hostname: str | None
    sasl_mechanism: str | None
    sasl_user: str | None
    offered_capabilities: list[str]
    desired_capabilities: list[str]
    properties: dict[Any, Any] | None
    remote_idle_timeout: float


@attrs.define
class PeerLink:
    """A link a peer attached to the server; ``role`` is the *server's* role on it."""

    name: str
    role: Literal["sender", "receiver"]
    source: str | None
    target: str | None
    dynamic: bool
    properties: dict[Any, Any] | None


@attrs.define
class _SendJob:
    address: str
    messages: list[Message]
    presettled: bool
    outcomes: list[Outcome | None]
    remaining: int
    done: threading.Event = attrs.field(factory=threading.Event)
    error: str | None = None


@attrs.define
class _Outgoing:
    message: Message
    job: _SendJob | None
    index: int


Responder = Callable[[Message], Message | None]
"""Called in the reactor thread with each request; the reply it returns (if any) is sent to the
request's ``reply-to``: ``$me`` means the sender link paired with the request's link (same name,
same connection), anything else a peer receiver link whose source is that address."""


class ProtonServer:
    """A Proton container listening on 127.0.0.1, driven from a background thread.

    Use as a context manager (``with ProtonServer(...) as server: ... server.url``) or call
    :meth:`start` / :meth:`stop`. ``mechanisms`` are the SASL mechanisms offered ("ANONYMOUS",
    "PLAIN", "EXTERNAL"); ``users`` the PLAIN accounts (PLAIN needs
    :func:`sasl_plain_server_available`). ``disposition`` decides each message's outcome
    (default: accept); ``responder`` answers requests. Lists of what happened
    (:attr:`received`, :attr:`connections`, :attr:`links`, :attr:`errors`) are snapshots that
    are safe to read from any thread; the ``wait_for_*`` methods block until enough arrived.
    """

    def __init__(
        self,
        *,
        mechanisms: Sequence[str] = ("ANONYMOUS",),
        users: Mapping[str, str] | None = None,
        tls: TlsFiles | None = None,
        require_client_cert: bool = False,
        idle_timeout: float | None = None,
        max_frame_size: int | None = None,
        prefetch: int = DEFAULT_PREFETCH,
        container_id: str = "proton-server",
        offered_capabilities: Sequence[str] = (),
        properties: Mapping[str, Any] | None = None,
        disposition: Callable[[Message], Disposition] | None = None,
        responder: Responder | None = None,
        host: str = LOOPBACK,
    ) -> None:
        self.mechanisms = " ".join(mechanisms)
        self.tls = tls
        self.host = host
        self.port = 0
        self.idle_timeout = idle_timeout
        self.max_frame_size = max_frame_size
        self.container_id = container_id
        self.offered_capabilities = list(offered_capabilities)
        self.properties = dict(properties) if properties else None
        self.disposition = disposition
        self.responder = responder
        self._sasl_dir: Path | None = None
        if "PLAIN" in mechanisms:
            reason = sasl_plain_server_available()
            if reason:
                raise PeerError(reason)
        if SASL.extended():
            # Cyrus decides everything (ANONYMOUS too) from its configuration folder.
            self._sasl_dir = _cyrus.directory()
            for user, password in (users or {}).items():
                _cyrus.add(user, password)
        elif users:
            raise PeerError("users given but this Proton has no Cyrus SASL to check them")
        self._ssl_domain = (
            server_ssl_domain(tls, require_client_cert=require_client_cert) if tls else None
        )

        self._cond = threading.Condition()
        self._received: list[Received] = []
        self._connections: list[PeerConnection] = []
        self._links: list[PeerLink] = []
        self._errors: list[str] = []

        self._handler = _ServerHandler(self, prefetch)
        self._container = Container(self._handler)
        self._container.container_id = container_id
        self._injector = EventInjector()
        self._container.selectable(self._injector)
        self._thread: threading.Thread | None = None
        self._thread_error: BaseException | None = None

    # -- life cycle (test thread)

    def start(self) -> ProtonServer:
        """Bind, then run the reactor in a thread.

        The listening socket is bound to port 0 *before* the thread starts, and the port the
        kernel chose is read back from it: no window in which another process could take a port
        we picked, and nobody ever connects to a port that is not listening (which, in the
        ephemeral range, can connect a socket to itself).
        """
        if self._thread is not None:
            raise PeerError("server already started")
        acceptor = self._container.acceptor(self.host, "0")
        if self._ssl_domain is not None:
            acceptor.set_ssl_domain(self._ssl_domain)
        self._acceptor = acceptor
        self.port = _bound_port(acceptor)
        self._thread = threading.Thread(
            target=self._run, name=f"proton-server:{self.port}", daemon=True
        )
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            run_reactor(self._container)
        except BaseException as exc:  # reported by stop()
            self._thread_error = exc
            with self._cond:
                self._errors.append(f"reactor crashed: {exc!r}")
                self._cond.notify_all()

    def stop(self, timeout: float = 10.0) -> None:
        """Close every connection politely, then end the reactor thread (abruptly if it lingers)."""
        thread = self._thread
        if thread is None:
            return
        if thread.is_alive():
            self._injector.trigger(ApplicationEvent("pairlink_stop"))
            thread.join(timeout)
        if thread.is_alive():
            raise PeerError(f"Proton server thread did not stop within {timeout} s")
        self._thread = None
        if self._thread_error is not None:
            raise PeerError("the Proton server's reactor failed") from self._thread_error

    def __enter__(self) -> ProtonServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def url(self, user: str | None = None, password: str | None = None) -> str:
        """``amqp[s]://[user:password@]127.0.0.1:port`` for this server."""
        scheme = "amqps" if self.tls else "amqp"
        auth = f"{user}:{password}@" if user is not None else ""
        return f"{scheme}://{auth}{self.host}:{self.port}"

    # -- observations (any thread)

    @property
    def received(self) -> list[Received]:
        with self._cond:
            return list(self._received)

    @property
    def connections(self) -> list[PeerConnection]:
        with self._cond:
            return list(self._connections)

    @property
    def links(self) -> list[PeerLink]:
        with self._cond:
            return list(self._links)

    @property
    def errors(self) -> list[str]:
        """Transport errors and the conditions of peer closes/detaches, ``"name: description"``."""
        with self._cond:
            return list(self._errors)

    def wait_for_messages(self, count: int, timeout: float = 30.0) -> list[Received]:
        """Block until ``count`` messages have arrived in all; return them all."""
        return self._wait(lambda: self._received, count, timeout, "messages")

    def wait_for_connections(self, count: int = 1, timeout: float = 30.0) -> list[PeerConnection]:
        return self._wait(lambda: self._connections, count, timeout, "connections")

    def wait_for_errors(self, count: int = 1, timeout: float = 30.0) -> list[str]:
        return self._wait(lambda: self._errors, count, timeout, "errors")

    def _wait(
        self, get: Callable[[], list[Any]], count: int, timeout: float, what: str
    ) -> list[Any]:
        with self._cond:
            if not self._cond.wait_for(lambda: len(get()) >= count or self._thread_error, timeout):
                raise PeerError(
                    f"{len(get())} of {count} {what} after {timeout} s; errors: {self._errors}"
                )
            if self._thread_error is not None:
                raise PeerError("the Proton server's reactor failed") from self._thread_error
            return list(get())

    # -- actions (any thread)

    def send(
        self,
        address: str,
        messages: Iterable[Message],
        *,
        presettled: bool = False,
        timeout: float = 30.0,
    ) -> list[Outcome | None]:
        """Send messages to the peer receiver attached with source ``address``; return outcomes.

        Waits (up to ``timeout``) for such a link and for credit. Outcomes are in send order;
        pre-settled messages report None.
        """
        msgs = list(messages)
        job = _SendJob(
            address, msgs, presettled, [None] * len(msgs), 0 if presettled else len(msgs)
        )
        self._injector.trigger(ApplicationEvent("pairlink_send", subject=job))
        if not job.done.wait(timeout):
            raise PeerError(f"sending {len(msgs)} message(s) to {address!r} took over {timeout} s")
        if job.error:
            raise PeerError(job.error)
        return job.outcomes

    # -- reactor thread bookkeeping (called by _ServerHandler)

    def _record(
        self, kind: Literal["received", "connections", "links", "errors"], item: Any
    ) -> None:
        with self._cond:
            getattr(self, f"_{kind}").append(item)
            self._cond.notify_all()


def _bound_port(acceptor: Any) -> int:
    # Proton has no public accessor for the bound address; the acceptor's selectable wraps the
    # listening socket (proton 0.3x-0.40). Fail loudly if that ever changes.
    try:
        sock = acceptor._selectable._delegate
        port = sock.getsockname()[1]
    except AttributeError as exc:  # pragma: no cover - depends on Proton internals
        raise PeerError(
            "cannot read the port Proton bound; update tests/interop/proton_server.py"
        ) from exc
    return int(port)


class _ServerHandler(MessagingHandler):
    """Everything here runs in the reactor thread."""

    def __init__(self, server: ProtonServer, prefetch: int) -> None:
        super().__init__(prefetch=prefetch, auto_accept=False, auto_settle=True)
        self.server = server
        self.open_connections: set[Connection] = set()
        self.queues: dict[Link, collections.deque[_Outgoing]] = {}
        self.pending: list[_SendJob] = []
        self.by_delivery: dict[Delivery, tuple[_SendJob, int]] = {}
        self.dynamic_ids = itertools.count(1)
        self.stop_timer: Any = None

    # connection set-up

    def on_connection_bound(self, event: Any) -> None:
        server = self.server
        transport: Transport = event.transport
        if server.idle_timeout is not None:
            transport.idle_timeout = server.idle_timeout
        if server.max_frame_size is not None:
            transport.max_frame_size = server.max_frame_size
        sasl = transport.sasl()
        if server._sasl_dir is not None:
            sasl.config_path(str(server._sasl_dir))
            sasl.config_name(_CyrusUsers.CONFIG_NAME)
        sasl.allow_insecure_mechs = True  # PLAIN over plain TCP: this is a test on loopback
        sasl.allowed_mechs(server.mechanisms)

    def on_connection_opening(self, event: Any) -> None:
        conn: Connection = event.connection
        server = self.server
        conn.container = server.container_id
        if server.offered_capabilities:
            conn.offered_capabilities = [symbol(c) for c in server.offered_capabilities]
        if server.properties:
            conn.properties = {symbol(k): v for k, v in server.properties.items()}
        sasl = event.transport.sasl() if event.transport else None
        self.open_connections.add(conn)
        server._record(
            "connections",
            PeerConnection(
                container_id=conn.remote_container,
                hostname=conn.remote_hostname,
                sasl_mechanism=sasl.mech if sasl else None,
                sasl_user=event.transport.user if event.transport else None,
                offered_capabilities=symbol_names(conn.remote_offered_capabilities),
                desired_capabilities=symbol_names(conn.remote_desired_capabilities),
                properties=dict(conn.remote_properties) if conn.remote_properties else None,
                remote_idle_timeout=event.transport.remote_idle_timeout if event.transport else 0.0,
            ),
        )

    def on_link_opening(self, event: Any) -> None:
        link: Link = event.link
        remote_source = link.remote_source
        # Copy first, then fill in a dynamic address: the other order wipes the address.
        link.source.copy(remote_source)
        link.target.copy(link.remote_target)
        if link.is_sender and remote_source.dynamic:
            link.source.address = f"dynamic-{next(self.dynamic_ids)}"
        if link.remote_properties:
            link.properties = dict(link.remote_properties)
        self.server._record(
            "links",
            PeerLink(
                name=link.name,
                role="sender" if link.is_sender else "receiver",
                source=link.source.address,
                target=link.target.address,
                dynamic=bool(remote_source.dynamic),
                properties=dict(link.remote_properties) if link.remote_properties else None,
            ),
        )
        if link.is_sender:
            self.queues.setdefault(link, collections.deque())

    def on_link_opened(self, event: Any) -> None:
        self._retry_pending()

    # receiving

    def on_message(self, event: Any) -> None:
        server = self.server
        message: Message = event.message
        link: Link = event.link
        server._record(
            "received",
            Received(message, link.target.address, link.name, event.connection.remote_container),
        )
        decision: Disposition = "accept"
        if server.disposition is not None:
            decision = server.disposition(message)
        if decision == "accept":
            self.accept(event.delivery)
        elif decision == "reject":
            self.reject(event.delivery)
        elif decision == "release":
            self.release(event.delivery, delivered=False)
        else:
            self.release(event.delivery, delivered=True)  # Proton's "modified"
        if server.responder is not None:
            reply = server.responder(message)
            if reply is not None:
                self._reply(event.connection, link, message, reply)

    def _reply(self, conn: Connection, link: Link, request: Message, reply: Message) -> None:
        if reply.correlation_id is None:
            reply.correlation_id = request.id
        reply_to = request.reply_to
        target: Link | None = None
        for candidate in self.queues:
            if candidate.connection != conn or not candidate.state & Endpoint.LOCAL_ACTIVE:
                continue
            if reply_to == "$me" and candidate.name == link.name:
                target = candidate
                break
            if reply_to != "$me" and candidate.source.address == reply_to:
                target = candidate
                break
        if target is None:
            self.server._record("errors", f"no link to reply to {reply_to!r} on {link.name!r}")
            return
        if reply_to == "$me" and reply.address is None:
            reply.address = "$me"
        self.queues[target].append(_Outgoing(reply, None, 0))
        self._pump(target)

    # sending

    def on_pairlink_send(self, event: Any) -> None:
        self.pending.append(event.subject)
        self._retry_pending()

    def _retry_pending(self) -> None:
        still: list[_SendJob] = []
        for job in self.pending:
            link = next(
                (
                    candidate
                    for candidate in self.queues
                    if candidate.source.address == job.address
                    and candidate.state & Endpoint.LOCAL_ACTIVE
                    and candidate.state & Endpoint.REMOTE_ACTIVE
                ),
                None,
            )
            if link is None:
                still.append(job)
                continue
            self.queues[link].extend(_Outgoing(m, job, i) for i, m in enumerate(job.messages))
            if job.presettled and not job.messages:
                job.done.set()
            self._pump(link)
        self.pending = still

    def on_sendable(self, event: Any) -> None:
        if event.link in self.queues:
            self._pump(event.link)

    def _pump(self, link: Link) -> None:
        queue = self.queues[link]
        while queue and link.credit > 0:
            item = queue.popleft()
            job = item.job
            if job is not None and job.presettled:
                delivery = link.send(item.message)
                delivery.settle()
                if not queue or queue[0].job is not job:
                    job.done.set()
                continue
            delivery = link.send(item.message)
            if job is not None:
                self.by_delivery[delivery] = (job, item.index)

    def _outcome(self, event: Any) -> None:
        entry = self.by_delivery.pop(event.delivery, None)
        if entry is None:
            return
        job, index = entry
        job.outcomes[index] = outcome_of(event.delivery)
        job.remaining -= 1
        if job.remaining == 0:
            job.done.set()

    on_accepted = on_rejected = on_released = on_settled = _outcome

    # errors and closing

    def on_transport_error(self, event: Any) -> None:
        cond = event.transport.condition
        if cond is not None:
            self.server._record("errors", f"{cond.name}: {cond.description}")
        super().on_transport_error(event)

    def on_connection_closing(self, event: Any) -> None:
        self._note_remote_error(event.connection)

    def on_session_closing(self, event: Any) -> None:
        self._note_remote_error(event.session)

    def on_link_closing(self, event: Any) -> None:
        self._note_remote_error(event.link)
        self._drop_link(event.link)

    def on_link_closed(self, event: Any) -> None:
        self._drop_link(event.link)

    def _note_remote_error(self, endpoint: Any) -> None:
        cond = endpoint.remote_condition
        if cond is not None:
            self.server._record("errors", f"{cond.name}: {cond.description}")

    # The wrappers held in these tables keep Proton's objects alive (no *_final events), so
    # links and connections leave them when they close.

    def _drop_link(self, link: Link) -> None:
        for item in self.queues.pop(link, ()):
            if item.job is not None and not item.job.done.is_set():
                item.job.error = f"link {link.name!r} closed before message {item.index} was sent"
                item.job.done.set()
        for delivery in [d for d in self.by_delivery if d.link == link]:
            job, index = self.by_delivery.pop(delivery)
            if not job.done.is_set():
                job.error = f"link {link.name!r} closed before message {index} was settled"
                job.done.set()

    def on_transport_closed(self, event: Any) -> None:
        conn = event.connection
        if conn is None:
            return
        for link in [link for link in self.queues if link.connection == conn]:
            self._drop_link(link)
        self.open_connections.discard(conn)
        if self.stop_timer is not None and not self.open_connections:
            self.stop_timer.cancel()  # every close was answered: the reactor ends by itself

    def on_pairlink_stop(self, event: Any) -> None:
        self.server._acceptor.close()
        for job in self.pending:
            job.error = "server stopped"
            job.done.set()
        self.pending = []
        self.server._injector.close()
        if self.open_connections:
            # A peer that never answers our close must not keep the thread alive.
            self.stop_timer = self.server._container.schedule(2.0, StopReactor())
            for conn in list(self.open_connections):
                if not conn.state & Endpoint.LOCAL_CLOSED:
                    conn.close()
