"""The message-level exchange: what ``Client.request`` sends and what it gives back.

``call`` speaks pairlink's conventions (operation, arguments, status-code) and returns a value;
``request`` is for services with conventions of their own (RabbitMQ's ``/management`` node,
Azure's ``$management``, any AMQP server): the caller chooses the message, and gets the whole
reply with the request's delivery outcome, nothing interpreted.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import attrs

from pairlink._amqp.messaging import BodyKind, DeliveryState, Message, MessageId, Properties
from pairlink._amqp.types import Decoded, Symbol
from pairlink._rpc import wire


@attrs.frozen
class Reply:
    """The answer to a request: the reply ``message`` and the request's delivery ``outcome``.

    ``outcome`` is what the service settled an unsettled request with (``Accepted``,
    ``Rejected`` with its error, ``Released``, ``Modified``; ``Received`` from a peer that
    reported only how far it got), or None when the request went pre-settled. A request the
    service did not accept gets no reply: ``message`` is then None, and so are the
    conveniences below.
    """

    message: Message | None
    outcome: DeliveryState | None = None

    @property
    def properties(self) -> Properties | None:
        return None if self.message is None else self.message.properties

    @property
    def application_properties(self) -> dict[Decoded, Decoded]:
        """The reply's application-properties ({} when it has none)."""
        if self.message is None or self.message.application_properties is None:
            return {}
        return self.message.application_properties

    @property
    def subject(self) -> str | None:
        props = self.properties
        return None if props is None else props.subject

    @property
    def body(self) -> Decoded:
        """The body as it came: an amqp-value's value, the bytes of a data section (a list of
        them for several), or a list of amqp-sequence sections (each a list)."""
        return None if self.message is None else self.message.body

    @property
    def status(self) -> int | None:
        """The status the reply carries, if any: ``application-properties["status-code"]``
        (the AMQP management convention) or else a numeric ``subject`` (HTTP over AMQP, as
        RabbitMQ's ``/management`` answers). Read only, never raised."""
        code = self.application_properties.get(wire.STATUS_CODE)
        if isinstance(code, int) and not isinstance(code, bool):
            return int(code)
        subject = self.subject
        if subject is not None and subject.isascii() and subject.isdigit():
            return int(subject)
        return None


def compose_request(
    body: object,
    *,
    body_kind: BodyKind,
    subject: str | None,
    to: str | None,
    application_properties: Mapping[str, object] | None,
    message_id: MessageId | None,
    correlation_id: MessageId | None,
    content_type: str | None,
) -> Message:
    """The request ``Client.request`` sends: ``body`` in a new message, or a copy of ``body``
    itself when it is a :class:`Message`; each keyword that is not None sets its field.
    ``message-id``, ``reply-to`` and the deadline are filled in when it is sent."""
    if isinstance(body, Message):  # a copy of what is set below: the caller's stays as it was
        message = attrs.evolve(body, properties=copy.copy(body.properties) or Properties())
    else:
        message = Message(body=body, body_kind=body_kind, properties=Properties())
    props = message.properties
    assert props is not None
    fields = {
        "subject": subject,
        "to": to,
        "message_id": message_id,
        "correlation_id": correlation_id,
        "content_type": None if content_type is None else Symbol(content_type),
    }
    for name, value in fields.items():
        if value is not None:
            setattr(props, name, value)
    if application_properties is not None:
        message.application_properties = {
            **(message.application_properties or {}),
            **application_properties,
        }
    return message
