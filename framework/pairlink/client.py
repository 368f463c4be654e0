"""Calling services from Trio: :func:`connect` gives a :class:`Client`, whose proxies call
operations and whose ``request`` sends any AMQP message and returns the :class:`Reply` whole.

:class:`Message` (with its :class:`Header` and :class:`Properties`) is the body to pass to
``request`` when a call needs sections the keywords do not set; a reply's ``message`` is one.
:func:`check_health` asks a server or gateway for its health (``"serving"`` or ``"draining"``).
A client of several replicas reports each as a :class:`Replica` (``Client.replicas``).
"""

from pairlink._amqp.messaging import Header, Message, Properties
from pairlink._client.client import Client, connect
from pairlink._client.health import DRAINING, SERVING, check_health
from pairlink._client.proxy import ServiceProxy
from pairlink._client.replicas import Replica
from pairlink._client.reply import Reply

__all__ = [
    "DRAINING",
    "SERVING",
    "Client",
    "Header",
    "Message",
    "Properties",
    "Replica",
    "Reply",
    "ServiceProxy",
    "check_health",
    "connect",
]
