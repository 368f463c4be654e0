"""The Proton peers work with each other (Proton to Proton over 127.0.0.1).

These prove the harness, so that an interop test can later put our stack on one side and
trust that a failure is ours: SASL ANONYMOUS and PLAIN (right and wrong password), TLS with
trustme certificates, a 1 MiB multi-frame message, heartbeats, server-initiated sends,
request/reply on a link pair, and a clean stop.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from proton import Message

from tests.interop.proton_peers import (
    Disposition,
    ProtonServer,
    blocking_receive,
    blocking_send,
    make_messages,
    open_blocking,
    run_client,
    sasl_plain_server_available,
)
from tests.tls import TlsFiles

MiB = 1 << 20
_no_plain = sasl_plain_server_available()
needs_plain_server = pytest.mark.skipif(_no_plain is not None, reason=_no_plain or "")


def _assert_same_bodies(sent: list[Message], got: list[Message]) -> None:
    assert [m.id for m in got] == [m.id for m in sent]
    assert [m.body for m in got] == [m.body for m in sent]


def test_anonymous_messaging_handler_client_with_1mib_message() -> None:
    messages = make_messages(200, big_index=100)
    with ProtonServer() as server:
        result = run_client(server.url(), send_to="inbox", messages=messages)
        received = server.wait_for_messages(200)
    assert result.error is None
    assert result.outcomes == ["accepted"] * 200
    assert result.remote_container == "proton-server"
    _assert_same_bodies(messages, [r.message for r in received])
    big = received[100].message.body
    # Proton hands a data section's body out as a memoryview (bytes going in).
    assert isinstance(big, bytes | memoryview) and len(big) == MiB
    assert {r.address for r in received} == {"inbox"}
    (conn,) = server.connections
    assert conn.container_id == "proton-client"
    assert conn.sasl_mechanism == "ANONYMOUS"
    assert server.errors == []


def test_blocking_client_sends_and_receives() -> None:
    outgoing = make_messages(20, big_index=3)
    with ProtonServer() as server:
        outcomes = blocking_send(server.url(), "inbox", make_messages(5))
        assert outcomes == ["accepted"] * 5
        with ThreadPoolExecutor(1) as pool:
            receiving = pool.submit(blocking_receive, server.url(), "outbox", 20, timeout=20)
            sent = server.send("outbox", outgoing, timeout=20)
            got = receiving.result(timeout=30)
    assert sent == ["accepted"] * 20
    _assert_same_bodies(outgoing, got)


def test_server_settles_as_told() -> None:
    decisions: dict[object, Disposition] = {
        "m-0": "accept",
        "m-1": "reject",
        "m-2": "release",
        "m-3": "modify",
    }
    with ProtonServer(disposition=lambda m: decisions[m.id]) as server:
        result = run_client(server.url(), send_to="inbox", messages=make_messages(4))
    assert result.outcomes == ["accepted", "rejected", "released", "modified"]


@needs_plain_server
def test_sasl_plain_accepts_the_right_password() -> None:
    with ProtonServer(mechanisms=["PLAIN"], users={"alice": "s3cret"}) as server:
        result = run_client(
            server.url(),
            send_to="inbox",
            messages=make_messages(3),
            user="alice",
            password="s3cret",
            mechanisms="PLAIN",
        )
    assert result.error is None, result.error
    assert result.outcomes == ["accepted"] * 3
    (conn,) = server.connections
    assert conn.sasl_mechanism == "PLAIN"
    assert conn.sasl_user is not None and conn.sasl_user.split("@")[0] == "alice"


@needs_plain_server
def test_sasl_plain_refuses_a_wrong_password() -> None:
    with ProtonServer(mechanisms=["PLAIN"], users={"alice": "s3cret"}) as server:
        result = run_client(
            server.url(),
            send_to="inbox",
            messages=make_messages(1),
            user="alice",
            password="wrong",
            mechanisms="PLAIN",
            timeout=10,
        )
    assert result.error is not None and result.error.startswith("amqp:unauthorized-access")
    assert result.outcomes == [None]
    assert server.connections == []
    assert server.received == []


@needs_plain_server
def test_sasl_plain_with_blocking_connection() -> None:
    with ProtonServer(mechanisms=["PLAIN", "ANONYMOUS"], users={"bob": "pw"}) as server:
        outcomes = blocking_send(
            server.url(), "inbox", make_messages(2), user="bob", password="pw", mechanisms="PLAIN"
        )
    assert outcomes == ["accepted", "accepted"]
    assert server.connections[0].sasl_mechanism == "PLAIN"


def test_tls_with_trustme_certificates(tls_files: TlsFiles) -> None:
    messages = make_messages(10, big_index=9)
    with ProtonServer(tls=tls_files) as server:
        assert server.url().startswith("amqps://127.0.0.1:")
        result = run_client(server.url(), send_to="inbox", messages=messages, tls=tls_files)
        received = server.wait_for_messages(10)
    assert result.error is None, result.error
    assert result.outcomes == ["accepted"] * 10
    _assert_same_bodies(messages, [r.message for r in received])


@needs_plain_server
def test_tls_and_sasl_plain_together(tls_files: TlsFiles) -> None:
    with ProtonServer(tls=tls_files, mechanisms=["PLAIN"], users={"carol": "pw2"}) as server:
        result = run_client(
            server.url(),
            send_to="inbox",
            messages=make_messages(2),
            tls=tls_files,
            user="carol",
            password="pw2",
            mechanisms="PLAIN",
        )
    assert result.error is None, result.error
    assert result.outcomes == ["accepted", "accepted"]


def test_tls_client_certificate_with_sasl_external(tls_files: TlsFiles) -> None:
    with ProtonServer(tls=tls_files, require_client_cert=True, mechanisms=["EXTERNAL"]) as server:
        result = run_client(
            server.url(),
            send_to="inbox",
            messages=make_messages(1),
            tls=tls_files,
            client_cert=True,
            mechanisms="EXTERNAL",
        )
    assert result.error is None, result.error
    assert result.outcomes == ["accepted"]
    (conn,) = server.connections
    assert conn.sasl_mechanism == "EXTERNAL"
    assert conn.sasl_user is not None and "trustme" in conn.sasl_user  # the certificate subject


def test_tls_client_refuses_an_untrusted_server(tls_files: TlsFiles, tmp_path) -> None:
    from tests.tls import make_tls_files

    other_pki = make_tls_files(tmp_path / "other")
    with ProtonServer(tls=other_pki) as server:
        result = run_client(
            server.url(), send_to="inbox", messages=make_messages(1), tls=tls_files, timeout=10
        )
    # Proton reports every TLS failure as a framing error with OpenSSL's reason.
    assert result.error is not None and "certificate verify failed" in result.error
    assert result.outcomes == [None]


def test_heartbeats_keep_an_idle_connection_alive() -> None:
    # Both ends ask for a 0.4 s idle timeout; the link then stays idle for 1.5 s.
    with ProtonServer(idle_timeout=0.4) as server, ThreadPoolExecutor(1) as pool:
        receiving = pool.submit(
            run_client, server.url(), receive_from="outbox", expect=1, idle_timeout=0.4, timeout=15
        )
        server.wait_for_connections(1)
        time.sleep(1.5)
        assert server.send("outbox", make_messages(1)) == ["accepted"]
        result = receiving.result(timeout=20)
    assert result.error is None, result.error
    assert len(result.received) == 1
    # Proton advertises half its idle timeout in open (as the spec recommends, so the peer's
    # heartbeats arrive well within the real limit).
    assert server.connections[0].remote_idle_timeout == pytest.approx(0.2)
    assert server.errors == []


def test_responder_answers_on_the_paired_link() -> None:
    def responder(request: Message) -> Message:
        return Message(body={"echo": request.body}, properties={"status-code": 200})

    request = Message(id="req-1", reply_to="$me", body="hello")
    with ProtonServer(responder=responder, offered_capabilities=["LINK_PAIR_V1_0"]) as server:
        result = run_client(
            server.url(),
            send_to="service",
            receive_from="service",
            link_name="pair-1",
            link_properties={"paired": True},
            messages=[request],
            expect=1,
            desired_capabilities=["LINK_PAIR_V1_0"],
        )
    assert result.error is None, result.error
    assert result.remote_offered_capabilities == ["LINK_PAIR_V1_0"]
    (reply,) = result.received
    assert reply.correlation_id == "req-1"
    assert reply.address == "$me"
    assert reply.body == {"echo": "hello"}
    links = server.links
    assert {(link.name, link.role) for link in links} == {
        ("pair-1", "sender"),
        ("pair-1", "receiver"),
    }
    assert all(link.properties == {"paired": True} for link in links)


def test_stop_does_not_wait_for_a_silent_peer() -> None:
    # Nothing pumps the blocking client's reactor while the server stops, so our close goes
    # unanswered: the server gives up after its 2 s grace.
    server = ProtonServer().start()
    conn = open_blocking(server.url(), timeout=10)
    conn.create_sender("inbox")
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 5
    conn.close()  # the server closed first: this returns at once
    assert time.monotonic() - started < 5
