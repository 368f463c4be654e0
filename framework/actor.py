"""A served instance as an actor: one bounded mailbox whose free slots *are* the link credit.

Every call the actor holds takes one mailbox slot from the moment it arrives until its reply has
left (or could not be delivered): queued, running, or waiting for the caller's reply credit.
Credit is granted only from free slots, so however many callers and links there are, nothing
buffers beyond the mailbox bound (plus the one credit every new link gets at once, which LP-10
pipelining needs). A slow handler therefore pushes back on every caller through AMQP flow
control itself, not through a queue that grows.

Credit policy. With ``n`` request links the fair share of a link is ``max(1, mailbox // n)``.
A link gets its share (or what is free) when it attaches, and is topped up again only when its
credit has fallen to half its share, from free slots, in batches: after a quarter of the
mailbox has freed up, or at once when nothing is queued. So a steady caller costs one flow frame
per half share of calls, never one per call, and a link never gets more than the mailbox holds.

Calls are decoded and checked on arrival, in the connection's reader task: anything that can be
answered without the handler (undecodable 400, unknown operation 404, arguments that do not
bind 400, deadline passed 408, shutting down 503) is answered at once, so a bad call never
waits behind good ones. Only calls that will run enter the queue; ``max_concurrency`` worker
tasks take them in order.

Duplicates (``@service(dedup_window=...)``): a call with a string message-id that was answered
within the window gets that answer again without running; one whose first copy is still held
waits for it (holding its own mailbox slot) and gets the same answer (:mod:`framework.dedup`).
Such a call runs even if its caller went away while it was queued: the repeat that a retrying
caller is about to send will want its outcome.
"""

from __future__ import annotations

import functools
import math
import time
from typing import TYPE_CHECKING, Any

import attrs
import structlog
import trio

from framework import deadline, wire
from framework.amqp.errors import DECODE_ERROR, INVALID_FIELD, NOT_FOUND, ProtocolError
from framework.amqp.link import Delivery
from framework.amqp.messaging import Accepted, Error, Message, Properties, Rejected
from framework.dedup import DedupStore, Outcome
from framework.payload import Encoding, PayloadError
from framework.wire import (
    BAD_REQUEST,
    INTERNAL_ERROR,
    OK,
    OPERATION,
    TIMEOUT,
    UNAVAILABLE,
    CallError,
    Request,
    encode_reply,
    error_message,
    parse_request,
)

if TYPE_CHECKING:
    from framework.container import ReplyLink, RequestLink
    from framework.service import Hosted, Operation

log = structlog.get_logger("pairlink.service")


@attrs.define(slots=True, eq=False)
class Call:
    """A checked call waiting in the mailbox (or running)."""

    operation: Operation
    args: list[Any]
    kwargs: dict[str, Any]
    request: Request
    route: ReplyLink
    origin: RequestLink
    delivery: Delivery
    key: str | None = None  # its message-id, while it is the running copy of a tracked id


class Actor:
    """One served instance: its mailbox, its workers, and the credit of its request links."""

    def __init__(self, hosted: Hosted) -> None:
        spec = hosted.spec
        self.instance = hosted.instance
        self.address = spec.address
        self.operations = spec.operations
        self.pairing = spec.pairing
        self.max_concurrency = spec.max_concurrency
        self.bound = spec.mailbox
        self.log = log.bind(service=spec.address)
        self.links: dict[RequestLink, None] = {}  # insertion-ordered set
        self._hungry: dict[RequestLink, None] = {}  # links at or below half their share
        self._batch = max(1, self.bound // 4)
        self._freed = 0  # slots freed since credit was last handed out
        self.outstanding = 0  # credit granted and not yet used, over all links
        self.held = 0  # calls in the mailbox: queued + running + replies waiting for credit
        self.queued = 0
        self.running = 0
        self.peak = 0  # the most calls ever held at once
        self._send, self._recv = trio.open_memory_channel[Call](math.inf)
        self.stopping = False  # no more credit; new arrivals get 503
        self.aborting = False  # the grace period is over: running calls are cancelled
        self._scopes: set[trio.CancelScope] = set()
        self._drained = trio.Event()
        self._grant_soon = trio.Event()
        self.finished = trio.Event()  # the workers are done (after begin_stop)
        self.dedup: DedupStore[Call] | None = None
        if spec.dedup_window is not None:
            self.dedup = DedupStore(spec.dedup_window, spec.dedup_size)

    @property
    def free(self) -> int:
        """Mailbox slots neither held by a call nor promised to a caller as credit."""
        return self.bound - self.held - self.outstanding

    @property
    def share(self) -> int:
        return max(1, self.bound // max(1, len(self.links)))

    # -- credit ----------------------------------------------------------------------------

    def attach_link(self, origin: RequestLink) -> None:
        """A new request link: grant its share at once, and at least one credit even when
        the mailbox is full, so that a pipelined first request (LP-10) is never refused."""
        self.links[origin] = None
        credit = max(1, min(self.share, self.free))
        if self.stopping:
            credit = 1
        self.outstanding += credit
        origin.set_credit(credit)

    def link_gone(self, origin: RequestLink) -> None:
        """The link detached or its connection ended: its unused credit is free again."""
        if origin in self.links:
            del self.links[origin]
            self._hungry.pop(origin, None)
            self.outstanding = max(0, self.outstanding - origin.link.link_credit)
            self._replenish()

    def _replenish(self) -> None:
        if self._freed >= self._batch or self.queued == 0:
            self._grant_soon.set()

    async def _granter(self) -> None:
        """Hands out credit once per scheduler batch: every slot freed in one burst (a run of
        replies flushed by one flow frame, several workers finishing) makes one flow per link."""
        while not self.stopping:
            await self._grant_soon.wait()
            self._grant_soon = trio.Event()
            self.distribute()

    def distribute(self) -> None:
        """Top up the hungry links from the free slots; one flow frame per link at most."""
        self._freed = 0
        if not self._hungry or self.stopping:
            return
        outstanding = 0  # recounted: credit can also vanish without a message (drain)
        for origin in list(self.links):
            if origin.usable:
                outstanding += origin.link.link_credit
            else:
                self.links.pop(origin)
                self._hungry.pop(origin, None)
        self.outstanding = outstanding
        free = self.bound - self.held - outstanding
        if free <= 0:
            return
        share = self.share
        low = share // 2
        touched = set()
        for origin in list(self._hungry):
            credit = origin.link.link_credit
            give = min(share - credit, free)
            if give > 0:
                origin.set_credit(credit + give)
                touched.add(origin.conn)
                free -= give
                self.outstanding += give
                credit += give
            if credit > low:
                del self._hungry[origin]
            if free <= 0:
                break
        for conn in touched:
            conn.kick()

    def release(self) -> None:
        """A call's slot is free again (its reply left, or it could not be delivered)."""
        self.held -= 1
        self._freed += 1
        if self.stopping:
            if self.held <= 0:
                self._drained.set()
            return
        if self._hungry:
            self._replenish()

    # -- arrival (the connection's reader task) --------------------------------------------

    def arrive(self, origin: RequestLink, delivery: Delivery, payload: bytes) -> None:
        """A request arrived on one of our links: answer it now, or queue it for a worker."""
        self.held += 1
        self.outstanding -= 1
        if self.held > self.peak:
            self.peak = self.held
        if origin.link.link_credit <= self.share // 2:
            self._hungry[origin] = None
        try:
            message = Message.decode(payload)
        except ProtocolError as exc:
            self._refuse(origin, delivery, None, DECODE_ERROR, f"undecodable message: {exc}")
            return
        route = origin.route_for(message)
        if route is None:
            self._refuse(origin, delivery, message, *origin.why_unroutable(message))
            return
        now = time.time()
        try:
            request = parse_request(message, now=now)
        except CallError as exc:
            request = _bare_request(message)
            self.respond(route, origin, delivery, request, exc.status, exc.description)
            return
        except Exception as exc:  # a field of a type the conventions do not foresee
            request = _bare_request(message)
            why = f"malformed request: {exc!r}"
            self.respond(route, origin, delivery, request, BAD_REQUEST, why)
            return
        operation = self.operations.get(request.operation)
        if operation is None:
            # not the address: a gateway may have given this service another name (LP-11)
            why = f"the service has no operation {request.operation!r}"
            self.respond(route, origin, delivery, request, wire.NOT_FOUND, why)
        elif request.deadline is not None and request.deadline <= now:
            self.respond(route, origin, delivery, request, TIMEOUT, "the deadline had passed")
        elif self.stopping:
            self.respond(route, origin, delivery, request, UNAVAILABLE, "shutting down")
        else:
            try:
                operation.check_arguments(request.args, request.kwargs)
            except TypeError as exc:
                why = f"{request.operation}: {exc}"
                self.respond(route, origin, delivery, request, BAD_REQUEST, why)
                return
            call = Call(operation, request.args, request.kwargs, request, route, origin, delivery)
            if self.dedup is not None and isinstance(request.message_id, str):
                if self._repeat(self.dedup, call, request.message_id):
                    return
                call.key = request.message_id
            if (
                operation.mode == "sync"
                and self.queued == 0
                and self.running < self.max_concurrency
            ):
                # it could start at once, and a sync handler holds the event loop wherever it
                # runs: running it here saves the mailbox hop and a task switch per call
                self._run_sync(call)
            else:
                self.queued += 1
                self._send.send_nowait(call)

    def _repeat(self, dedup: DedupStore[Call], call: Call, key: str) -> bool:
        """True if ``call`` repeats a tracked id: answered from the store, or parked behind
        the copy that is running. False: it is the first, and runs."""
        stored = dedup.stored(key, trio.current_time())
        if stored is not None:
            self._answer(call, stored.status, stored.description, stored.value, stored.error_type)
            return True
        return not dedup.claim(key, call)

    def _refuse(
        self,
        origin: RequestLink,
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
                operation=(app or {}).get(OPERATION, props.subject),
                call=props.message_id,
                reply_to=props.reply_to,
                condition=condition,
                why=description,
            )
        else:
            origin.set_outcome(delivery, Rejected(error=Error(condition, description)))
        self.release()

    # -- replies ---------------------------------------------------------------------------

    def respond(
        self,
        route: ReplyLink,
        origin: RequestLink,
        delivery: Delivery,
        request: Request,
        status: int,
        description: str,
        value: Any = None,
        error_type: str | None = None,
    ) -> None:
        """Send the reply to ``request`` (a value for 200, else the status), settle the
        request, and free the call's slot once the reply has left."""
        try:
            payload = self._reply_payload(route, request, status, description, value, error_type)
        except Exception as exc:  # the request's own fields cannot go into any reply
            self._refuse(origin, delivery, request.message, INVALID_FIELD, f"no reply: {exc!r}")
            return
        if route.deliver(payload, self):
            if not delivery.remote_settled:
                origin.set_outcome(delivery, Accepted())
            return
        self.log.warning(
            "reply.undeliverable",
            operation=request.operation,
            call=request.message_id,
            reply_to=request.reply_to,
        )
        if not delivery.remote_settled:
            origin.set_outcome(delivery, Rejected(error=Error(NOT_FOUND, "the reply link is gone")))
        self.release()

    def _reply_payload(
        self,
        route: ReplyLink,
        request: Request,
        status: int,
        description: str,
        value: Any,
        error_type: str | None,
    ) -> bytes:
        """The encoded reply: the value for 200 (a 500 if it cannot be encoded), else the
        status; a 500 as well if it would exceed what the caller's link accepts."""
        to = route.to
        if status == OK:
            try:
                return self._fit(route, request, encode_reply(request, value, to=to))
            except (PayloadError, TypeError, ValueError, OverflowError) as exc:
                status, description = INTERNAL_ERROR, f"cannot encode the result: {exc}"
                error_type = _type_name(exc)
        if status >= INTERNAL_ERROR or status == TIMEOUT:
            self.log.info(
                "call.answered",
                operation=request.operation,
                call=request.message_id,
                status=status,
                why=description,
            )
        message = error_message(request, status, description, to=to, error_type=error_type)
        return self._fit(route, request, message.encode())

    @staticmethod
    def _fit(route: ReplyLink, request: Request, payload: bytes) -> bytes:
        limit = route.link.remote_max_message_size
        if limit is None or len(payload) <= limit:
            return payload
        why = f"the reply of {len(payload)} bytes exceeds the caller's limit of {limit}"
        message = error_message(
            request, INTERNAL_ERROR, why, to=route.to, error_type="MessageSizeExceeded"
        )
        return message.encode()

    # -- workers ---------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The workers (``max_concurrency`` tasks taking calls in order) and the granter,
        until stopped."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._granter)
                for _ in range(self.max_concurrency):
                    nursery.start_soon(self._worker)
                task_status.started()
        finally:
            self.finished.set()

    async def _worker(self) -> None:
        async for call in self._recv:
            self.queued -= 1
            await self._execute(call)

    async def _execute(self, call: Call) -> None:
        request = call.request
        if not call.route.usable and call.key is None:  # the caller went away meanwhile
            self.log.info("call.abandoned", operation=request.operation, call=request.message_id)
            self.release()
            return
        now = time.time()
        if request.deadline is not None and request.deadline <= now:
            why = "the deadline passed while the call was queued"
            self._answer(call, TIMEOUT, why)
            return
        if self.aborting:
            self._answer(call, UNAVAILABLE, "shutting down")
            return
        operation = call.operation
        if operation.mode == "sync":
            self._run_sync(call)
            return
        limit = math.inf
        if request.deadline is not None:
            limit = trio.current_time() + (request.deadline - now)
        self.running += 1
        try:
            with deadline.serving(request.deadline), trio.CancelScope(deadline=limit) as scope:
                self._scopes.add(scope)
                try:
                    value = await self._invoke(operation, call)
                finally:
                    self._scopes.discard(scope)
        except Exception as exc:
            self._failed(call, exc)
            return
        finally:
            self.running -= 1
        if scope.cancelled_caught:
            self._answer(call, *self._cut_short())
        else:
            self._answer(call, OK, "OK", value)

    def _run_sync(self, call: Call) -> None:
        self.running += 1
        try:
            with deadline.serving(call.request.deadline):
                value = call.operation.function(self.instance, *call.args, **call.kwargs)
        except Exception as exc:
            self._failed(call, exc)
            return
        finally:
            self.running -= 1
        self._answer(call, OK, "OK", value)

    def _failed(self, call: Call, exc: Exception) -> None:
        """A handler raised: ``CallError`` says its own status, anything else is a 500."""
        if isinstance(exc, CallError):
            self._answer(call, exc.status, exc.description, error_type=exc.error_type)
            return
        self.log.warning(
            "call.failed",
            operation=call.operation.name,
            call=call.request.message_id,
            error=repr(exc),
            exc_info=exc,
        )
        self._answer(call, INTERNAL_ERROR, str(exc), error_type=_type_name(exc))

    def _cut_short(self) -> tuple[int, str]:
        """Why a running call was cancelled: the shutdown's grace ran out, or its deadline."""
        if self.aborting:
            return UNAVAILABLE, "shut down before the call finished"
        return TIMEOUT, "the deadline passed while it ran"

    async def _invoke(self, operation: Operation, call: Call) -> Any:
        if operation.mode == "async":
            return await operation.function(self.instance, *call.args, **call.kwargs)
        # blocking: a thread cannot be cancelled, so the scope cannot end it early either
        job = functools.partial(operation.function, self.instance, *call.args, **call.kwargs)
        return await trio.to_thread.run_sync(job)

    def _answer(
        self,
        call: Call,
        status: int,
        description: str,
        value: Any = None,
        error_type: str | None = None,
    ) -> None:
        self.respond(
            call.route,
            call.origin,
            call.delivery,
            call.request,
            status,
            description,
            value,
            error_type,
        )
        if call.key is not None and self.dedup is not None:
            outcome = Outcome(status, description, value, error_type)
            for repeat in self.dedup.finish(call.key, outcome, trio.current_time()):
                self._answer(repeat, status, description, value, error_type)

    # -- shutdown --------------------------------------------------------------------------

    def begin_stop(self) -> None:
        """Stop granting credit and take back what callers have not used; queued calls
        still run, new arrivals (sent before the caller saw the revocation) get 503."""
        if self.stopping:
            return
        self.stopping = True
        self._send.close()  # the workers end once the queue is empty
        self._grant_soon.set()  # and so does the granter
        conns = set()
        for origin in self.links:
            if origin.usable:
                origin.set_credit(0)
                conns.add(origin.conn)
        self.outstanding = 0
        for conn in conns:
            conn.kick()
        if self.held <= 0:
            self._drained.set()

    async def drained(self) -> None:
        """Wait until every call held has been answered."""
        await self._drained.wait()

    def abort(self) -> None:
        """The grace period is over: cancel running calls (answered 503), and answer what is
        still queued with 503 without running it."""
        self.aborting = True
        for scope in self._scopes:
            scope.cancel()


def _bare_request(message: Message) -> Request:
    """Just enough of an unparseable request to address an error reply to it."""
    props = message.properties or Properties()
    reply_to = None if props.reply_to is None else str(props.reply_to)
    return Request("", [], {}, props.message_id, reply_to, Encoding.AMQP_VALUE, None, message)


def _type_name(exc: BaseException) -> str:
    cls = type(exc)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"
