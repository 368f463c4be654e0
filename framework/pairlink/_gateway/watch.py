"""A next hop's ``$health``, asked by the gateway on its main connection to it, so that a
replica that drains gets no new pairs before its links go (the client watches its replicas the
same way: :mod:`pairlink._client.replicas`, whose intervals apply here too).

One pair to ``$health`` lives as long as the connection; a check goes every
``HEALTH_INTERVAL``, and one unanswered within ``HEALTH_TIMEOUT`` makes the replica ``lost``
to new pairs until it answers again. A next hop without a health node (it refuses the pair)
is ``ready`` while connected.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import trio

from pairlink._amqp.errors import DETACH_FORCED
from pairlink._amqp.messaging import Accepted
from pairlink._client.placement import CONNECTING, DRAINING, LOST, READY, ReplicaState
from pairlink._client.replicas import HEALTH_INTERVAL, HEALTH_TIMEOUT
from pairlink._client.status import CHECK, HEALTH
from pairlink._client.status import DRAINING as HEALTH_DRAINING
from pairlink._io.connection import AmqpConnection
from pairlink._io.links import open_receiver, open_sender
from pairlink._rpc import wire
from pairlink._rpc.deadline import wall_time
from pairlink._rpc.linkpair import paired_properties
from pairlink.errors import ConnectionLostError, LinkDetachedError, PairlinkError


def stopped(condition: object, description: object) -> bool:
    """Whether a next hop detached a link with this error because it stops (after answering
    every call it held): that replica takes no new pair."""
    return condition == DETACH_FORCED and description == wire.SERVER_SHUTTING_DOWN


async def watch_health(
    conn: AmqpConnection, state: Callable[[], ReplicaState], report: Callable[[ReplicaState], None]
) -> None:
    """Ask ``$health`` on ``conn`` now and every ``HEALTH_INTERVAL``, telling ``report`` what
    the replica is (``state`` says what it was); returns when the pair or ``conn`` ends."""
    name = conn.link_name("health")
    properties = paired_properties()
    sender = open_sender(conn, HEALTH, name=name, source_address=name, properties=properties)
    receiver = open_receiver(
        conn, HEALTH, name=name, target_address=name, properties=properties, credit=1
    )
    ids = itertools.count(1)
    while True:
        check = f"{name}-{next(ids)}"
        request = wire.request_message(
            CHECK, [""], {}, message_id=check, now=wall_time(), timeout=HEALTH_TIMEOUT
        )
        answer: object = None
        try:
            with trio.move_on_after(HEALTH_TIMEOUT) as scope:
                await sender.send(request, settled=True)
                while True:  # an answer that came after its time is passed over
                    received = await receiver.receive()
                    if not received.delivery.remote_settled:
                        receiver.settle(received, Accepted())
                    properties_ = received.message.properties
                    if properties_ is not None and properties_.correlation_id == check:
                        answer = wire.parse_reply(received.message)
                        break
        except ConnectionLostError:
            return  # the upstream's own task sees it
        except LinkDetachedError as exc:
            if stopped(exc.condition, exc.description):
                report(DRAINING)
            elif state() == CONNECTING:  # refused: nothing to watch there
                report(READY)
            return
        except PairlinkError:  # refused the check (404...): no health to go by
            report(READY)
            return
        if scope.cancelled_caught:  # silent: no verdict when just connected, else lost
            report(READY if state() == CONNECTING else LOST)
        else:
            status = answer.get("status") if isinstance(answer, dict) else None
            report(DRAINING if status == HEALTH_DRAINING else READY)
        await trio.sleep(HEALTH_INTERVAL)
