"""Test TLS material from trustme: one CA, a server certificate, a client certificate.

Both stacks need it in different shapes: Python's ``ssl`` (ours, through ``trio.SSLStream``)
takes contexts, while Proton's ``SSLDomain`` only reads PEM *files*; so the material is written
to a folder once and offered both ways. The server certificate names ``127.0.0.1`` (an IP
subjectAltName) and ``localhost``, the addresses the tests use.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import attrs
import trustme

SERVER_NAMES = ("127.0.0.1", "localhost")
CLIENT_IDENTITY = "pairlink-test-client"


@attrs.frozen
class TlsFiles:
    """PEM files of one test PKI, and ``ssl`` contexts built from them."""

    ca: trustme.CA
    ca_cert: Path
    """The CA certificate: the trust anchor for both sides."""
    server_cert: Path
    """The server's certificate chain (leaf first)."""
    server_key: Path
    client_cert: Path
    """A client certificate (for mutual TLS / SASL EXTERNAL)."""
    client_key: Path

    def server_context(self, *, require_client_cert: bool = False) -> ssl.SSLContext:
        """A server-side context; with ``require_client_cert`` it demands a CA-signed client."""
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.server_cert, self.server_key)
        if require_client_cert:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(cafile=self.ca_cert)
        return ctx

    def client_context(self, *, with_client_cert: bool = False) -> ssl.SSLContext:
        """A client-side context that trusts the test CA and checks the server's name."""
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(self.ca_cert))
        if with_client_cert:
            ctx.load_cert_chain(self.client_cert, self.client_key)
        return ctx


def make_tls_files(directory: Path) -> TlsFiles:
    """Create a CA with a server and a client certificate, written as PEM files in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA(organization_name="pairlink tests")
    server = ca.issue_cert(*SERVER_NAMES)
    client = ca.issue_cert(CLIENT_IDENTITY)

    ca_cert = directory / "ca.pem"
    server_cert = directory / "server-chain.pem"
    server_key = directory / "server-key.pem"
    client_cert = directory / "client-chain.pem"
    client_key = directory / "client-key.pem"
    ca.cert_pem.write_to_path(str(ca_cert))
    server_cert.write_bytes(b"".join(blob.bytes() for blob in server.cert_chain_pems))
    server.private_key_pem.write_to_path(str(server_key))
    client_cert.write_bytes(b"".join(blob.bytes() for blob in client.cert_chain_pems))
    client.private_key_pem.write_to_path(str(client_key))
    return TlsFiles(
        ca=ca,
        ca_cert=ca_cert,
        server_cert=server_cert,
        server_key=server_key,
        client_cert=client_cert,
        client_key=client_key,
    )
