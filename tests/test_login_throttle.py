"""Failed logins are logged and slowed per peer address (issue 9 §7), over real TCP."""

from __future__ import annotations

import pytest
import structlog
import trio

from pairlink._io.listener import listen
from pairlink._io.login_throttle import LOGIN_PENALTY, LoginThrottle
from pairlink._io.net import AmqpUrl, client_config, connect, open_connection
from pairlink.errors import AuthenticationError
from tests.listening import no_links

USERS = {"alice": "right"}


def test_a_hundred_wrong_guesses_from_one_address_take_ten_seconds_or_more() -> None:
    throttle = LoginThrottle()
    now, waited = 0.0, 0.0
    throttle.failed("10.0.0.9", now)  # the first guess failed at once
    for _ in range(99):  # the other 99 arrive all together, on parallel connections
        wait = throttle.admit("10.0.0.9", now)
        assert wait is not None
        waited = max(waited, wait)
    # each guess waits one penalty more than the one before it
    assert waited == pytest.approx(99 * LOGIN_PENALTY)
    assert waited >= 10.0
    assert throttle.admit("10.0.0.10", now) == 0.0  # another address is not slowed


def test_the_throttle_forgets_quiet_addresses_and_stays_bounded() -> None:
    throttle = LoginThrottle(forget_after=60.0, max_addresses=3)
    throttle.failed("a", 0.0)
    assert throttle.admit("a", 0.0) == pytest.approx(LOGIN_PENALTY)
    assert throttle.admit("a", 61.0) == 0.0  # quiet for a minute: forgiven
    assert throttle.admit("a", 61.0) == 0.0
    for address in ("b", "c", "d", "e"):
        throttle.failed(address, 100.0)
    assert len(throttle) == 3  # the oldest was dropped
    throttle.succeeded("e")
    assert throttle.admit("e", 100.0) == 0.0


def test_a_connection_that_would_wait_too_long_is_refused() -> None:
    throttle = LoginThrottle(penalty=1.0, max_wait=2.5)
    throttle.failed("x", 0.0)
    assert throttle.admit("x", 0.0) == 1.0
    assert throttle.admit("x", 0.0) == 2.0
    assert throttle.admit("x", 0.0) is None


async def _wrong_login(url: str) -> None:
    bad = url.replace("amqp://", "amqp://alice:wrong@")
    with pytest.raises(AuthenticationError):
        async with connect(bad) as conn:
            await conn.wait_opened()


async def test_wrong_passwords_are_logged_with_user_and_peer_and_slowed() -> None:
    penalty = 0.2
    throttle = LoginThrottle(penalty=penalty)
    with structlog.testing.capture_logs() as logs:
        async with listen(
            "amqp://127.0.0.1:0", accept=no_links, users=USERS, login_throttle=throttle
        ) as listener:
            await _wrong_login(listener.url)  # the first: refused at once, the address noted
            start = trio.current_time()
            async with trio.open_nursery() as nursery:
                for _ in range(4):  # four more in parallel: served one penalty apart
                    nursery.start_soon(_wrong_login, listener.url)
            assert trio.current_time() - start >= 4 * penalty * 0.99
            # another address of this machine is not slowed by the first one's guesses
            stream = await trio.open_tcp_stream(
                "127.0.0.1", listener.port, local_address="127.0.0.2"
            )
            url = AmqpUrl.parse(f"amqp://alice:right@127.0.0.1:{listener.port}")
            async with open_connection(stream, client_config(url), initiator=True) as conn:
                with trio.fail_after(penalty * 0.9):
                    await conn.wait_opened()
    refused = [e for e in logs if e["event"] == "sasl.refused"]
    assert len(refused) == 5
    assert all(e["user"] == "alice" and e["peer"].startswith("127.0.0.1:") for e in refused)
    assert not any("wrong" in repr(e) for e in logs)  # never the password
    assert any(e["event"] == "login.throttled" for e in logs)
