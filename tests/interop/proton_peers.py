"""Real Apache Qpid Proton peers for the interop tests, each running in a background thread.

Proton's reactor is blocking and single-threaded, so each peer owns a ``Container`` running in
its own thread; the test talks to it only through thread-safe calls (an ``EventInjector`` carries
requests into the reactor thread, a ``Condition`` carries results out). That is what lets a test
put one of these beside our Trio stack: ``await trio.to_thread.run_sync(run_client, ...)`` for a
Proton client, or a :class:`ProtonServer` started before the Trio client connects to it.

What is here:

* :class:`ProtonServer`: listens on 127.0.0.1 (a port the kernel picks: race-free, see
  :meth:`ProtonServer.start`), accepts every link a peer opens (echoing its terminus addresses and
  attach properties, so paired attaches come back paired), accepts (or settles as told) and
  records every message, sends messages to peer receivers on demand, optionally answers requests
  (``reply-to`` ``$me`` goes back on the paired link), with SASL ANONYMOUS / PLAIN, an idle
  timeout and TLS.
* :func:`run_client` / :class:`ProtonClient`: a ``MessagingHandler`` client that sends messages,
  collects their dispositions and receives messages.
* :func:`open_blocking`, :func:`blocking_send`, :func:`blocking_receive`: the
  ``BlockingConnection`` way.

SASL PLAIN as a *server* needs Proton built against Cyrus SASL: Proton's built-in SASL serves
only ANONYMOUS and EXTERNAL (PLAIN only as a client). The Makefile installs libsasl2-dev and
sasl2-bin so the build links Cyrus; the users live in a Cyrus ``sasldb`` created with
``saslpasswd2`` (:func:`sasl_plain_server_available` says whether that works here). Cyrus reads
its configuration once per process, so all servers of a test run share one user database.

Things a test against Proton should know: a Proton client checks a TLS server's *DNS* name only
(it verifies ``localhost``, see ``TLS_SERVER_NAME``, not the IP SAN ``127.0.0.1``); Proton
advertises half its idle timeout in ``open``; it hands a ``data`` body out as a ``memoryview``;
every TLS failure surfaces as ``amqp:connection:framing-error``.

This module is the import point; the code lives in ``proton_server.py``, ``proton_client.py``
and ``proton_common.py`` beside it.
"""

from tests.interop.proton_client import (
    ClientResult,
    ProtonClient,
    blocking_receive,
    blocking_send,
    open_blocking,
    run_client,
)
from tests.interop.proton_common import (
    DEFAULT_PREFETCH,
    LOOPBACK,
    TLS_SERVER_NAME,
    Disposition,
    Outcome,
    PeerError,
    client_ssl_domain,
    make_messages,
    outcome_of,
    server_ssl_domain,
)
from tests.interop.proton_server import (
    PeerConnection,
    PeerLink,
    ProtonServer,
    Received,
    Responder,
    sasl_plain_server_available,
)

__all__ = [
    "DEFAULT_PREFETCH",
    "LOOPBACK",
    "TLS_SERVER_NAME",
    "ClientResult",
    "Disposition",
    "Outcome",
    "PeerConnection",
    "PeerError",
    "PeerLink",
    "ProtonClient",
    "ProtonServer",
    "Received",
    "Responder",
    "blocking_receive",
    "blocking_send",
    "client_ssl_domain",
    "make_messages",
    "open_blocking",
    "outcome_of",
    "run_client",
    "sasl_plain_server_available",
    "server_ssl_domain",
]
