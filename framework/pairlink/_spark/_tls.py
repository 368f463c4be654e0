"""How a ``call_service`` task secures its connections: TLS trust, a client certificate and the
SASL mechanism, held as file paths and names so the plan pickles to the executors (an
``ssl.SSLContext`` does not pickle); each task builds its context from them."""

from __future__ import annotations

import os
import ssl

import attrs


@attrs.frozen
class Security:
    """``ca``: a PEM file of the CAs to trust (default: the system's store); ``client_cert``
    and ``client_key``: PEM files of a client certificate (and its key, if not in the same
    file), for mutual TLS and SASL EXTERNAL; ``sasl`` as ``connect`` takes it (True: PLAIN
    with the URL's user and password, else ANONYMOUS; ``"EXTERNAL"``: the certificate)."""

    ca: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    sasl: bool | str = True

    def ssl_context(self) -> ssl.SSLContext | None:
        """The task's TLS context; None for ``connect``'s default (the system's CAs)."""
        if self.ca is None and self.client_cert is None:
            return None
        context = ssl.create_default_context(cafile=self.ca)
        if self.client_cert is not None:
            context.load_cert_chain(self.client_cert, self.client_key)
        return context


def security(
    ca: str | os.PathLike[str] | None,
    client_cert: str | os.PathLike[str] | None,
    client_key: str | os.PathLike[str] | None,
    sasl: bool | str,
) -> Security:
    """The options checked, paths as strings (read on the executors, not here: a cluster's
    driver need not have them)."""
    if client_key is not None and client_cert is None:
        raise ValueError("client_key needs client_cert")
    if sasl == "EXTERNAL" and client_cert is None:
        raise ValueError('sasl="EXTERNAL" needs client_cert: the certificate is the identity')

    def path(value: str | os.PathLike[str] | None) -> str | None:
        return None if value is None else os.fspath(value)

    return Security(path(ca), path(client_cert), path(client_key), sasl)
