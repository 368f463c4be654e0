"""A served instance as an actor: one bounded mailbox whose free slots *are* the link credit.

Every call the actor holds takes one mailbox slot from the moment it arrives until its reply has
left (or could not be delivered): queued, running, or waiting for the caller's reply credit.
Credit is granted only from free slots, so however many callers and links there are, nothing
buffers beyond the mailbox bound. A slow handler therefore pushes back on every caller through
AMQP flow control itself, not through a queue that grows. How the slots are shared between
callers (per connection, then per link), and taken back, is :mod:`pairlink._server.mailbox`'s.

Calls are decoded and checked on arrival, in the connection's reader task: anything that can be
answered without the handler (undecodable 400, unknown operation 404, arguments that do not
bind 400, deadline passed 408, shutting down 503) is answered at once, so a bad call never
waits behind good ones. Only calls that will run enter the queue, and leave it, callers in
turn, while fewer than ``max_concurrency`` run: whenever a call is queued or one ends. A plain
``def`` goes to a thread of the actor's own pool (:mod:`pairlink._server.threads`), answered
from the event loop when it ends; an ``inline=True`` one runs where it is. Neither needs a
task: the reader task starts them when they can start at once, and the end of a call starts
the next one queued. An ``async def`` is handed to one of ``max_concurrency`` worker tasks,
which runs the calls handed to it one after another while they do not wait.

Middleware (the server's, then the service's) runs in the worker task around the handler, for
every kind; a service with middleware never takes the fast paths, and one without pays nothing
for it. A call whose request carries a trace (:mod:`pairlink._rpc.tracing`), or every
call when OpenTelemetry is set up, runs in its span, finished with the reply's status.

A batch (:mod:`pairlink._rpc.batch`) is one call whose rows run in its running slot
(:mod:`pairlink._server.batches`), each answered on its own in the batch's one reply; a
vectorised handler (``@handler(batch=True)``) takes a single call as a batch of one.

Duplicates (``@service(dedup_window=...)``): a call with a string message-id that was answered
within the window gets that answer again without running; one whose first copy is still held
waits for it (holding its own mailbox slot) and gets the same answer
(:mod:`pairlink._server.dedup`).
Such a call runs even if its caller went away while it was queued: the repeat that a retrying
caller is about to send will want its outcome.
"""

from __future__ import annotations

import functools
import math
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

import attrs
import outcome
import trio

from pairlink._amqp.errors import INVALID_FIELD, NOT_FOUND, ProtocolError
from pairlink._amqp.link import Delivery
from pairlink._amqp.messaging import (
    Accepted,
    Error,
    Message,
    Properties,
    Rejected,
    decode_head,
)
from pairlink._config.limits import DRAIN_TIMEOUT
from pairlink._rpc import batch, deadline, spans, wire
from pairlink._rpc.payload import Encoding
from pairlink._rpc.tracing import TRACEPARENT
from pairlink._rpc.wire import (
    BAD_REQUEST,
    CONFLICT,
    INTERNAL_ERROR,
    OK,
    OPERATION,
    TIMEOUT,
    UNAVAILABLE,
    Request,
    encode_reply,
    error_message,
    parse_request,
)
from pairlink._server import batches
from pairlink._server.calls import (
    Answer,
    Arrival,
    Call,
    CallObserver,
    DedupKey,
    Origin,
    Route,
    bare_request,
    log_ids,
)
from pairlink._server.context import Middleware, handling, through
from pairlink._server.dedup import MAX_ID_LENGTH, DedupStore, ReusedId, digest
from pairlink._server.disclosure import Disclosure
from pairlink._server.mailbox import RESERVE_DIVISOR, Caller, CreditedLink, Mailbox
from pairlink._server.service import Hosted, Operation
from pairlink._server.threads import Result, ThreadPool
from pairlink._telemetry.logs import get_logger
from pairlink.errors import CallError, PayloadError

log = get_logger("pairlink.service")


def _runs_nothing(caller: Caller[Call]) -> bool:
    return caller.running == 0


class Actor:
    """One served instance: its mailbox, its workers, and the credit of its request links."""

    def __init__(
        self,
        hosted: Hosted,
        middleware: Sequence[Middleware] = (),
        drain_timeout: float = DRAIN_TIMEOUT,
        max_batch_rows: int = batch.MAX_BATCH_ROWS,
    ) -> None:
        """``middleware``: the server's, run outside the service's own; ``drain_timeout``: how
        long a caller's link may ignore a drain before its credit is revoked;
        ``max_batch_rows``: the rows a batch may carry."""
        spec = hosted.spec
        self.instance = hosted.instance
        self.address = spec.address
        self.operations = spec.operations
        self.pairing = spec.pairing
        self.max_concurrency = spec.max_concurrency
        self.bound = spec.mailbox
        self.max_batch_rows = max_batch_rows
        self.log = log.bind(service=spec.address)
        self.disclosure = Disclosure(self.log, spec.debug_errors)
        self.mailbox: Mailbox[Call] = Mailbox(spec.mailbox, drain_timeout)
        self.running = 0
        # running slots kept for callers that run nothing (2 of 64), as the mailbox keeps
        # slots for callers that hold nothing: one caller's backlog of slow calls never takes
        # them all, and a quick call of another starts at once (none below RESERVE_DIVISOR)
        self._shared = spec.max_concurrency - spec.max_concurrency // RESERVE_DIVISOR
        # its own pool, not trio's process-wide one (40): no service waits on another's threads
        self._threads = ThreadPool(spec.max_concurrency, spec.address)
        self._handed: deque[Call] = deque()  # taken from the mailbox for a worker task to run
        self._idle = trio.lowlevel.ParkingLot()  # workers with no call handed to them
        self._waking = False  # a worker was unparked and has not run yet
        self.stopping = False  # no more credit; new arrivals get 503
        self.aborting = False  # the grace period is over: running calls are cancelled
        self._scopes: set[trio.CancelScope] = set()
        self.finished = trio.Event()  # the workers are done (after begin_stop)
        self.observer: CallObserver | None = None  # set when the server keeps metrics
        self.middleware = (*middleware, *spec.middleware)
        # chosen once: without middleware, a call costs what it did before there was any
        self._invoke: Callable[[Operation, Call], Awaitable[object]] = (
            self._through_middleware if self.middleware else self._handle
        )
        self.tracer = spans.opentelemetry_tracer()  # None: no spans (plain W3C propagation)
        self.dedup: DedupStore[Call] | None = None
        if spec.dedup_window is not None:
            self.dedup = DedupStore(spec.dedup_window, spec.dedup_size)

    @property
    def held(self) -> int:
        """Calls in the mailbox: queued + running + replies waiting for credit."""
        return self.mailbox.held

    @property
    def outstanding(self) -> int:
        """Credit granted and not yet used, over all links."""
        return self.mailbox.outstanding

    @property
    def queued(self) -> int:
        """Calls waiting for a worker."""
        return self.mailbox.queued

    @property
    def peak(self) -> int:
        """The most calls ever held at once."""
        return self.mailbox.peak

    @property
    def links(self) -> dict[CreditedLink, None]:
        """The attached request links."""
        return self.mailbox.links

    # -- credit ----------------------------------------------------------------------------

    def attach_link(self, origin: Origin) -> None:
        """A new request link: its credit, if any is free, goes out at once (LP-10)."""
        self.mailbox.attach(origin)

    def link_gone(self, origin: Origin) -> None:
        """The link detached or its connection ended: its unused credit is free again."""
        self.mailbox.detach(origin)

    # -- arrival (the connection's reader task) --------------------------------------------

    def arrive(self, origin: Origin, delivery: Delivery, payload: bytes) -> None:
        """A request arrived on one of our links: answer it now, or queue it for a worker."""
        self.mailbox.arrived(origin)
        if self.observer is not None:
            self.observer.arrived(delivery)
        now = deadline.wall_time()
        request = wire.REQUEST.read(payload)  # the usual request, read without its message
        if request is not None:
            route = origin.route_for(request.reply_to)
            if route is None:
                unroutable = origin.why_unroutable(request.reply_to)
                self._refuse(origin, delivery, request.message, *unroutable)
                return
        else:
            parsed = self._parse(origin, delivery, payload, now)
            if parsed is None:
                return
            route, request = parsed
        operation = self.operations.get(request.operation)
        if operation is None:
            # not the address: a gateway may have given this service another name (LP-11)
            why = f"the service has no operation {request.operation!r}"
            self.respond(Arrival(request, route, origin, delivery), Answer(wire.NOT_FOUND, why))
        elif request.deadline is not None and request.deadline <= now:
            answer = Answer(TIMEOUT, "the deadline had passed")
            self.respond(Arrival(request, route, origin, delivery), answer)
        elif self.stopping:
            answer = Answer(UNAVAILABLE, wire.SHUTTING_DOWN)
            self.respond(Arrival(request, route, origin, delivery), answer)
        elif request.encoding is Encoding.BATCH and len(request.args) > self.max_batch_rows:
            why = (
                f"a batch of {len(request.args)} rows exceeds the service's limit of "
                f"{self.max_batch_rows} (max_batch_rows)"
            )
            self.respond(Arrival(request, route, origin, delivery), Answer(BAD_REQUEST, why))
        else:
            try:  # (a batch's rows are checked as they run: a bad row fails alone)
                if request.encoding is not Encoding.BATCH:
                    operation.check_arguments(request.args, request.kwargs)
            except TypeError as exc:
                answer = Answer(BAD_REQUEST, f"{request.operation}: {exc}")
                self.respond(Arrival(request, route, origin, delivery), answer)
                return
            args, kwargs = request.args, request.kwargs
            call = Call(request, route, origin, delivery, operation, args, kwargs, self.address)
            if request.encoding is Encoding.BATCH:
                call.batched = True
                call.weight = self.mailbox.weigh(len(args))
            app = request.application_properties
            if self.tracer is not None or TRACEPARENT in app:
                call.trace_scope = spans.server_scope(
                    self.tracer, self.address, operation.name, app
                )
            mid = request.message_id
            if self.dedup is not None and isinstance(mid, str) and len(mid) <= MAX_ID_LENGTH:
                key = (origin.caller, mid)
                if self._repeat(self.dedup, call, key):
                    return
                call.key = key
            if (
                operation.mode != "async"
                and not self.middleware  # middleware is async: it runs in a worker task
                and self.mailbox.queued == 0
                and self._may_start(origin.ledger.caller)
            ):
                # it can start at once, and needs no task (an inline one holds the event loop
                # wherever it runs): starting it here saves the mailbox hop and a task switch
                self._start(call)
            else:
                self.mailbox.enqueue(origin, call)
                self._take_queued()

    def _parse(
        self, origin: Origin, delivery: Delivery, payload: bytes, now: float
    ) -> tuple[Route, Request] | None:
        """Any other request, by the general path: its route and what it asks; None when it
        has been answered already (undecodable, unroutable, malformed)."""
        try:
            message = Message.decode(payload)
        except ProtocolError as exc:
            self._undecodable(origin, delivery, payload, exc)
            return None
        reply_to = message.properties.reply_to if message.properties else None
        route = origin.route_for(reply_to)
        if route is None:
            self._refuse(origin, delivery, message, *origin.why_unroutable(reply_to))
            return None
        try:
            return route, parse_request(message, now=now)
        except CallError as exc:
            status, why = exc.status, exc.description
        except Exception as exc:  # a field of a type the conventions do not foresee
            status, why = BAD_REQUEST, f"malformed request: {exc!r}"
        self.respond(Arrival(bare_request(message), route, origin, delivery), Answer(status, why))
        return None

    def _repeat(self, dedup: DedupStore[Call], call: Call, key: DedupKey) -> bool:
        """True if ``call`` repeats a tracked id of its caller: answered from the store, or
        parked behind the copy that is running; refused (409) if the id was first used for a
        different call. False: it is the first, and runs."""
        fingerprint = digest(call.operation.name, call.args, call.kwargs)
        try:
            stored = dedup.stored(key, fingerprint, trio.current_time())
            if stored is None:
                return not dedup.claim(key, fingerprint, call)
        except ReusedId:
            why = f"the message-id {key[1]!r} was used for a different call"
            self._answer(call, Answer(CONFLICT, why))
            return True
        request = call.request
        ids = log_ids(call.origin, request.message_id)
        self.log.debug("call.repeat_answered", **ids, operation=request.operation)
        if self.middleware:  # it judges the repeat as it judged the call: in a worker
            call.replay = stored
            self.mailbox.enqueue(call.origin, call)
            self._take_queued()
        else:
            self._answer(call, stored)
        return True

    def _undecodable(
        self, origin: Origin, delivery: Delivery, payload: bytes, exc: ProtocolError
    ) -> None:
        """A request that does not decode (a bad field, a body past the decode bounds): a 400
        on its reply path when its head still names one; else ``Rejected`` with the condition,
        or, pre-settled, the link detached with it, so the caller learns now, not at its
        deadline."""
        why = f"undecodable message: {exc.description}"
        try:
            head = decode_head(payload)
        except ProtocolError:
            head = None
        route = None
        if head is not None:
            route = origin.route_for(head.properties.reply_to if head.properties else None)
        if head is not None and route is not None:
            arrival = Arrival(bare_request(head), route, origin, delivery)
            self.respond(arrival, Answer(BAD_REQUEST, why))
        elif delivery.remote_settled:
            self.log.warning(
                "call.undecodable", **log_ids(origin, None), condition=exc.condition, why=why
            )
            origin.end.detach(Error(exc.condition, why))
            origin.release()
        else:
            self._refuse(origin, delivery, None, exc.condition, why)

    def _refuse(
        self,
        origin: Origin,
        delivery: Delivery,
        message: Message | None,
        condition: str,
        description: str,
    ) -> None:
        """A request that cannot be answered at all: ``Rejected`` if the caller waits for an
        outcome; a pre-settled one can only be logged (the caller learns by its timeout)."""
        if delivery.remote_settled:
            props = message.properties if message and message.properties else Properties()
            app = message.application_properties if message else None
            self.log.warning(
                "call.undeliverable",
                **log_ids(origin, props.message_id),
                operation=(app or {}).get(OPERATION, props.subject),
                reply_to=props.reply_to,
                condition=condition,
                why=description,
            )
        else:
            origin.set_outcome(delivery, Rejected(error=Error(condition, description)))
        origin.release()

    # -- replies ---------------------------------------------------------------------------

    def respond(self, arrival: Arrival, answer: Answer, *, through: bool = False) -> int:
        """Send ``answer`` (a value for 200, else the status) as the reply to ``arrival``,
        settle the request, and free its slot once the reply has left; the reply's size in
        bytes (0: none could be made). ``through``: a lone reply, written at once if the
        connection's writer is idle."""
        origin, delivery, request = arrival.origin, arrival.delivery, arrival.request
        try:
            status, payload = self._reply_payload(arrival, answer)
        except Exception as exc:  # the request's own fields cannot go into any reply
            self._refuse(origin, delivery, request.message, INVALID_FIELD, f"no reply: {exc!r}")
            return 0
        if self.observer is not None:
            self.observer.answered(delivery, request.operation, status)
        route = arrival.route
        if route.usable:
            # settled first: its disposition leaves before the reply, or in the same write
            # (azure-uamqp discards a reply to a request it has no disposition for)
            if not delivery.remote_settled:
                origin.set_outcome(delivery, Accepted())
            route.deliver(payload, origin, delivery.remote_settled, through)
            return len(payload)
        self.log.warning(
            "reply.undeliverable",
            **log_ids(origin, request.message_id),
            operation=request.operation,
            reply_to=request.reply_to,
        )
        if not delivery.remote_settled:
            origin.set_outcome(delivery, Rejected(error=Error(NOT_FOUND, "the reply link is gone")))
        origin.release()
        return len(payload)

    def _reply_payload(self, arrival: Arrival, answer: Answer) -> tuple[int, bytes]:
        """The status-code and encoded reply: the value for 200 (an undisclosed 500 if it or
        its reply-properties cannot be encoded: the failure describes the result, which is the
        service's business), else the status; a 500 as well if it would exceed the caller's
        limit."""
        route, request = arrival.route, arrival.request
        to = route.to
        if answer.status == OK:
            try:
                reply = encode_reply(request, answer.value, to=to, extra=answer.reply_properties)
                return self._fit(route, request, OK, reply)
            except (PayloadError, TypeError, ValueError, OverflowError) as exc:
                detail = f"cannot encode the result: {exc}"
                description, error_type, ref = self.disclosure.undisclosed(
                    "reply.unencodable", arrival.origin, request, exc, detail
                )
                answer = Answer(INTERNAL_ERROR, description, None, error_type, ref)
        status = answer.status
        if status >= INTERNAL_ERROR or status == TIMEOUT:
            self.log.info(
                "call.answered",
                **log_ids(arrival.origin, request.message_id),
                operation=request.operation,
                status=status,
                why=answer.description,
            )
        message = error_message(
            request,
            status,
            answer.description,
            to=to,
            error_type=answer.error_type,
            ref=answer.ref,
            extra=answer.reply_properties,
        )
        return self._fit(route, request, status, message.encode())

    @staticmethod
    def _fit(route: Route, request: Request, status: int, payload: bytes) -> tuple[int, bytes]:
        limit = route.link.remote_max_message_size
        if limit is None or len(payload) <= limit:
            return status, payload
        why = f"the reply of {len(payload)} bytes exceeds the caller's limit of {limit}"
        message = error_message(
            request, INTERNAL_ERROR, why, to=route.to, error_type="MessageSizeExceeded"
        )
        return INTERNAL_ERROR, message.encode()

    # -- workers ---------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The workers (``max_concurrency`` tasks running the calls that need a task), the
        granter and the thread pool, until stopped; the pool ends last, once its running calls
        are answered."""
        try:
            async with trio.open_nursery() as pool:
                await pool.start(self._threads.run)
                try:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self.mailbox.granter)
                        for _ in range(self.max_concurrency):
                            nursery.start_soon(self._worker)
                        task_status.started()
                finally:
                    self._threads.stop()
        finally:
            self.finished.set()

    def _take_queued(self) -> None:
        """Start queued calls, callers in turn, while fewer than ``max_concurrency`` run (all of
        them, answered 503, once aborting): a plain ``def`` here and now, like a call that
        could start on arrival; one that needs a task (``async def``, middleware) is handed to
        an idle worker, its room taken at once. Called whenever a call is queued or ends: a
        thread's call ending starts the next one without a worker's task switch."""
        mailbox = self.mailbox
        while mailbox.queued and (self.running < self.max_concurrency or self.aborting):
            if self.running < self._shared or self.aborting:
                call = mailbox.dequeue()
            else:  # only the reserve is left: for a caller running nothing
                found = mailbox.dequeue_first(_runs_nothing)
                if found is None:
                    break
                call = found
            if not self._startable(call):
                continue
            if call.operation.mode != "async" and not self.middleware:
                self._start(call)
            else:
                self.running += 1
                call.origin.ledger.caller.running += 1
                self._handed.append(call)
                self._wake_worker()
        if self.stopping and not mailbox.queued:
            self._idle.unpark_all()  # the workers end once nothing is left to hand them

    def _startable(self, call: Call) -> bool:
        """Whether a call taken from the queue is to run; else it is answered (or dropped,
        when its caller went away) here."""
        request = call.request
        if not call.route.usable and call.key is None:  # the caller went away meanwhile
            ids = log_ids(call.origin, request.message_id)
            self.log.info("call.abandoned", **ids, operation=request.operation)
            if call.trace_scope is not None:
                call.trace_scope.finish(None)
            self.mailbox.unweigh(call.weight)
            call.origin.release()
            return False
        if request.deadline is not None and request.deadline <= deadline.wall_time():
            self._answer(call, Answer(TIMEOUT, "the deadline passed while the call was queued"))
            return False
        if self.aborting:
            self._answer(call, Answer(UNAVAILABLE, wire.SHUTTING_DOWN))
            return False
        return True

    def _wake_worker(self) -> None:
        """Make sure a worker will look at the handed calls: one is on its way already, or
        wake an idle one (none idle: each is busy, and takes the next when done)."""
        if not self._waking and self._idle.unpark():
            self._waking = True

    async def _worker(self) -> None:
        """Run the calls handed over (their room already taken), until stopped. One worker
        runs handed calls one after another while they do not block (an ``async def`` that
        never waits costs no task switch of its own); taking one while others wait, it wakes
        another worker, which takes the next if this call blocks."""
        while True:
            while not self._handed:
                if self.stopping and not self.mailbox.queued:
                    return
                await self._idle.park()
                self._waking = False
            call = self._handed.popleft()
            if self._handed:
                self._wake_worker()
            await self._execute(call)

    async def _execute(self, call: Call) -> None:
        """A call that needs a task (``async def``, or middleware): in this worker's, under its
        deadline; its room was taken when it was handed over."""
        if self.aborting:  # handed over just before the grace period ran out
            self._ended(call)
            self._answer(call, Answer(UNAVAILABLE, wire.SHUTTING_DOWN))
            return
        request = call.request
        operation = call.operation
        limit = math.inf
        # a batch's rows run each under the deadline (batches.run_rows_async): one cut short
        # fails alone, the rows answered before it keep their results
        if request.deadline is not None and not (call.batched and operation.batch == "rows"):
            limit = trio.current_time() + (request.deadline - deadline.wall_time())
        try:
            with (
                deadline.serving(request.deadline),
                handling(call),
                trio.CancelScope(deadline=limit) as scope,
            ):
                self._scopes.add(scope)
                try:
                    value = await self._invoke(operation, call)
                finally:
                    self._scopes.discard(scope)
        except Exception as exc:
            self._failed(call, exc)
            return
        finally:
            self._ended(call)
        if scope.cancelled_caught:
            self._answer(call, self._cut_short())
        elif call.replay is not None:  # a repeat its middleware let through: the kept answer
            self._answer(call, call.replay)
        else:
            self._answer(call, Answer(OK, "OK", value))

    def _start(self, call: Call) -> None:
        """Start a plain ``def``'s call (no middleware): inline, run now; else in a thread."""
        self.running += 1
        caller = call.origin.ledger.caller
        caller.running += 1
        if call.operation.mode == "thread":
            self._threads.submit(self._serve, call, self._ran)
            return
        try:
            value = self._serve(call)
        except Exception as exc:
            self._failed(call, exc)
            return
        finally:
            self.running -= 1
            caller.running -= 1
        self._answer(call, Answer(OK, "OK", value))

    def _serve(self, call: Call) -> object:
        """The handler, under the call's deadline and context (in a pool thread, or inline)."""
        operation = call.operation
        with deadline.serving(call.request.deadline), handling(call):
            if call.batched or operation.batch != "rows":
                return batches.run(call, self.instance, self.disclosure.row_failure(call))
            return operation.function(self.instance, *call.args, **call.kwargs)

    def _ran(self, call: Call, result: Result[object]) -> None:
        """A thread's call ended (nothing cuts a thread short): its outcome is the answer,
        written at once when it is the last one out (a lone call: no writer wake-up)."""
        self._ended(call)
        if isinstance(result, outcome.Error):
            self._failed(call, result.error)
        else:
            answer = Answer(OK, "OK", result.value)
            self._answer(call, answer, through=not self._threads.outstanding)

    def _ended(self, call: Call) -> None:
        """A running call ended: its room goes to the next queued call."""
        self.running -= 1
        call.origin.ledger.caller.running -= 1
        if self.mailbox.queued:
            self._take_queued()

    def _may_start(self, caller: Caller[Call]) -> bool:
        """Whether a call of ``caller`` may start now: in a shared slot, or, for a caller that
        runs nothing, in the reserve (so no caller's backlog takes every running slot)."""
        running = self.running
        return running < self._shared or (running < self.max_concurrency and caller.running == 0)

    def _failed(self, call: Call, exc: BaseException) -> None:
        """A handler raised: the call is answered as :mod:`pairlink._server.disclosure` says."""
        self._answer(call, self.disclosure.failure(call, exc))

    def _cut_short(self) -> Answer:
        """Why a running call was cancelled: the shutdown's grace ran out, or its deadline."""
        if self.aborting:
            return Answer(UNAVAILABLE, "shut down before the call finished")
        return Answer(TIMEOUT, "the deadline passed while it ran")

    async def _through_middleware(self, operation: Operation, call: Call) -> object:
        """The handler inside the middleware (``self._invoke`` when there is some)."""
        handler = functools.partial(self._handle, operation, call)
        return await through(self.middleware, call.call_context(), handler)

    async def _handle(self, operation: Operation, call: Call) -> object:
        """Run the handler (``self._invoke`` when there is no middleware); not for a repeat,
        whose answer is kept (``proceed()`` gives its middleware nothing)."""
        if call.replay is not None:
            return None
        if operation.batch != "rows" or call.batched:
            if operation.mode == "async":
                return await batches.run_async(
                    call, self.instance, self.disclosure.row_failure(call)
                )
            if operation.mode == "inline":  # only here within middleware: it holds the loop
                return self._serve(call)
            return await self._threads.run_sync(functools.partial(self._serve, call))
        if operation.mode == "async":
            return await operation.function(self.instance, *call.args, **call.kwargs)
        if operation.mode == "inline":  # only here within middleware: it holds the loop
            return operation.function(self.instance, *call.args, **call.kwargs)
        # a thread cannot be cancelled, so the scope cannot end it early either; the thread
        # runs in a copy of this task's context, so it sees the call's deadline
        job = functools.partial(operation.function, self.instance, *call.args, **call.kwargs)
        return await self._threads.run_sync(job)

    def _answer(self, call: Call, answer: Answer, *, through: bool = False) -> None:
        """Answer ``call``, and the repeats of its id waiting for it, alike. The reply's
        application-properties are the answer's, else those its handler set; ``through``: see
        :meth:`respond`."""
        context = call.context
        if answer.reply_properties is None and context is not None and context.reply_properties:
            answer = attrs.evolve(answer, reply_properties=dict(context.reply_properties))
        if call.weight:
            self.mailbox.unweigh(call.weight)
            call.weight = 0
        rows: list[list[object]] = []
        if call.batched and answer.status == OK:
            rows = answer.value  # type: ignore[assignment]
            if self.observer is not None:
                self.observer.rows(call.operation.name, rows)
        if call.trace_scope is not None:
            call.trace_scope.finish(answer.status, [row[0] for row in rows])  # type: ignore[misc]
        size = self.respond(call, answer, through=through)
        if call.key is not None and self.dedup is not None:
            for repeat in self.dedup.finish(call.key, answer, trio.current_time(), size):
                self._answer(repeat, answer)

    # -- shutdown --------------------------------------------------------------------------

    def begin_stop(self) -> None:
        """Stop granting credit and take back what callers have not used (a drain); queued
        calls still run, new arrivals (sent before the caller saw the drain) get 503."""
        if self.stopping:
            return
        self.stopping = True
        self._take_queued()  # the workers end once the queue is empty
        self.mailbox.stop()  # and so does the granter

    async def drained(self) -> None:
        """Wait until every call held has been answered."""
        await self.mailbox.drained.wait()

    def abort(self) -> None:
        """The grace period is over: cancel running calls (answered 503), and answer what is
        still queued with 503 without running it."""
        self.aborting = True
        self._take_queued()  # answered 503, not run
        for scope in self._scopes:
            scope.cancel()
