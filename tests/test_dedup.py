"""Duplicate detection: the pure store, then a deduplicating service over real TCP."""

from __future__ import annotations

import functools

import pytest
import trio

from pairlink import (
    CallContext,
    Client,
    Proceed,
    RemoteError,
    connect,
    handler,
    open_server,
    service,
)
from pairlink._client import blocking
from pairlink._rpc.caller import Identity
from pairlink._server.calls import Answer, DedupKey
from pairlink._server.dedup import MAX_ID_LENGTH, DedupStore, ReusedId
from pairlink.errors import CallError
from pairlink.spark import serve_in_thread
from tests.hostile_services import Bank
from tests.scraping import scrape

OK = Answer(200, "OK", {"score": 1.0})

# -- the store ---------------------------------------------------------------------------------


F = b"fingerprint"  # what the calls ask (operation and arguments, digested)


def key(mid: str, user: str | None = "alice") -> DedupKey:
    return (Identity(user), mid)


def test_a_finished_call_is_answered_from_the_store_until_its_window_ends() -> None:
    store: DedupStore[str] = DedupStore(window=10.0, size=100)
    assert store.stored(key("k"), F, now=0.0) is None
    assert store.claim(key("k"), F, "first")
    assert store.finish(key("k"), OK, now=1.0, size=10) == []
    assert store.stored(key("k"), F, now=10.9) == OK
    assert store.hits == 1
    assert store.stored(key("k"), F, now=11.0) is None  # kept 10 s from when it finished
    store.claim(key("other"), F, "x")
    store.finish(key("other"), OK, now=11.0, size=10)  # finishing drops what has expired
    assert len(store) == 1


def test_repeats_arriving_while_the_call_runs_wait_for_its_outcome() -> None:
    store: DedupStore[str] = DedupStore(window=10.0, size=100)
    assert store.claim(key("k"), F, "first")
    assert not store.claim(key("k"), F, "second")
    assert not store.claim(key("k"), F, "third")
    assert store.finish(key("k"), OK, now=0.0, size=10) == ["second", "third"]
    assert store.hits == 2
    assert store.claim(key("other"), F, "x")  # another id is independent


def test_callers_are_kept_apart_and_an_id_reused_for_another_call_is_refused() -> None:
    store: DedupStore[str] = DedupStore(window=10.0, size=100)
    assert store.claim(key("k"), F, "alice's")
    assert store.claim(key("k", user="bob"), b"other", "bob's")  # bob's own "k": a new call
    with pytest.raises(ReusedId):
        store.claim(key("k"), b"other", "alice's other call")  # running: not a repeat
    store.finish(key("k"), OK, now=0.0, size=10)
    assert store.stored(key("k", user="bob"), b"other", now=0.0) is None  # bob's still runs
    with pytest.raises(ReusedId):
        store.stored(key("k"), b"other", now=0.0)  # kept: still not alice's answer to give
    assert store.stored(key("k"), F, now=0.0) == OK


def test_the_size_bound_drops_the_oldest_outcomes_first() -> None:
    store: DedupStore[str] = DedupStore(window=100.0, size=3)
    for n, mid in enumerate("abcde"):
        store.claim(key(mid), F, mid)
        store.finish(key(mid), Answer(200, "OK", n), now=float(n), size=10)
    assert len(store) == 3
    assert store.stored(key("a"), F, now=5.0) is None
    assert store.stored(key("b"), F, now=5.0) is None
    kept = [store.stored(key(mid), F, now=5.0) for mid in "cde"]
    assert kept == [Answer(200, "OK", n) for n in (2, 3, 4)]


def test_the_byte_bound_drops_the_oldest_replies_first_and_keeps_none_larger_than_itself() -> None:
    store: DedupStore[str] = DedupStore(window=100.0, size=100, max_bytes=1000)
    for n, mid in enumerate("abc"):
        store.claim(key(mid), F, mid)
        store.finish(key(mid), Answer(200, "OK", n), now=float(n), size=400)
    assert (len(store), store.bytes) == (2, 800)  # a went, to make room for c
    assert store.stored(key("a"), F, now=5.0) is None
    store.claim(key("huge"), F, "huge")
    store.finish(key("huge"), OK, now=5.0, size=1001)  # more than the whole store: not kept
    assert store.stored(key("huge"), F, now=5.0) is None
    assert (len(store), store.bytes) == (2, 800)


def test_expiry_follows_completion_order_and_a_rerun_refreshes_its_entry() -> None:
    store: DedupStore[str] = DedupStore(window=10.0, size=100)
    for mid, at in (("a", 0.0), ("b", 5.0)):
        store.claim(key(mid), F, mid)
        store.finish(key(mid), OK, now=at, size=10)
    store.claim(key("a"), F, "a")
    store.finish(key("a"), OK, now=8.0, size=10)  # a ran again after expiring: kept from 8 s
    assert store.stored(key("b"), F, now=15.0) is None
    assert store.stored(key("a"), F, now=15.0) == OK
    assert store.bytes == 20  # a counted once; b until a finish drops what has expired


@pytest.mark.parametrize("status", [408, 503])
def test_outcomes_of_calls_that_did_not_complete_are_not_kept(status: int) -> None:
    store: DedupStore[str] = DedupStore(window=10.0, size=100)
    store.claim(key("k"), F, "first")
    store.claim(key("k"), F, "second")
    assert store.finish(key("k"), Answer(status, "no"), now=0.0, size=10) == ["second"]
    assert store.stored(key("k"), F, now=0.0) is None
    assert store.claim(key("k"), F, "retry")  # a retry runs it


def test_the_store_refuses_settings_that_bound_nothing() -> None:
    with pytest.raises(ValueError, match="window"):
        DedupStore(window=0.0, size=1)
    with pytest.raises(ValueError, match="size"):
        DedupStore(window=1.0, size=0)


# -- a deduplicating service -------------------------------------------------------------------


@service("ledger", max_concurrency=16, dedup_window=60)
class Ledger:
    """Counts how often each handler body ran: the side effect dedup must not repeat."""

    def __init__(self) -> None:
        self.runs: dict[str, int] = {}
        self.started = trio.Event()
        self.release = trio.Event()

    @handler
    def add(self, account: str, amount: int) -> int:
        self.runs[account] = self.runs.get(account, 0) + 1
        return amount * 2

    @handler
    async def slow_add(self, account: str, amount: int) -> int:
        self.runs[account] = self.runs.get(account, 0) + 1
        self.started.set()
        await self.release.wait()
        return amount * 3

    @handler
    def fail(self, account: str) -> None:
        self.runs[account] = self.runs.get(account, 0) + 1
        raise ValueError(f"no account {account}")

    @handler
    def busy(self, account: str) -> None:
        self.runs[account] = self.runs.get(account, 0) + 1
        raise CallError(503, "try again")


async def test_a_repeated_string_message_id_gets_the_stored_reply_without_running() -> None:
    ledger = Ledger()
    async with open_server(ledger, listen="amqp://127.0.0.1:0") as server:
        async with connect(server.url) as first:
            assert await first.call("ledger", "add", "a", 5, message_id="job1:a") == 10
        async with connect(server.url) as again:  # a retried task: a new connection
            assert await again.call("ledger", "add", "a", 5, message_id="job1:a") == 10
            assert await again.call("ledger", "add", "a", 5, message_id="job2:a") == 10
            assert await again.call("ledger", "add", "b", 1) == 2  # counter ids: not tracked
            assert await again.call("ledger", "add", "b", 1) == 2
    assert ledger.runs == {"a": 2, "b": 2}


async def test_a_repeat_arriving_while_the_first_runs_waits_and_gets_the_same_reply() -> None:
    ledger = Ledger()
    results: list[int] = []
    async with (
        open_server(ledger, listen="amqp://127.0.0.1:0") as server,
        connect(server.url) as one,
        connect(server.url) as two,
    ):

        async def call(client: Client) -> None:
            results.append(await client.call("ledger", "slow_add", "x", 1, message_id="k"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call, one)
            nursery.start_soon(call, two)
            dedup = server.actors["ledger"].dedup
            assert dedup is not None
            while dedup.hits == 0:  # noqa: ASYNC110 - until the repeat is parked
                await trio.sleep(0.01)
            ledger.release.set()
    assert results == [3, 3]
    assert ledger.runs == {"x": 1}


async def test_a_handler_failure_is_kept_and_repeated_but_a_503_is_run_again() -> None:
    ledger = Ledger()
    async with (
        open_server(ledger, listen="amqp://127.0.0.1:0") as server,
        connect(server.url) as client,
    ):
        refs = []
        for _ in range(2):
            with pytest.raises(RemoteError) as failed:
                await client.call("ledger", "fail", "f", message_id="f")
            assert failed.value.status == 500 and failed.value.ref is not None
            refs.append(failed.value.ref)
            with pytest.raises(RemoteError) as busy:
                await client.call("ledger", "busy", "b", message_id="b")
            assert busy.value.status == 503
    assert ledger.runs == {"f": 1, "b": 2}
    assert refs[0] == refs[1]  # the repeat names the one log entry of the one failure


async def test_a_message_id_already_in_flight_on_the_connection_is_refused() -> None:
    ledger = Ledger()
    async with (
        open_server(ledger, listen="amqp://127.0.0.1:0") as server,
        connect(server.url) as client,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(
            functools.partial(client.call, "ledger", "slow_add", "d", 1, message_id="dup")
        )
        await ledger.started.wait()
        with pytest.raises(ValueError, match="already in flight"):
            await client.call("ledger", "slow_add", "d", 1, message_id="dup")
        ledger.release.set()
    assert ledger.runs == {"d": 1}


def test_service_checks_its_dedup_settings() -> None:
    with pytest.raises(ValueError, match="dedup_window"):
        service("x", dedup_window=0)
    with pytest.raises(ValueError, match="dedup_size"):
        service("x", dedup_window=1, dedup_size=0)


def test_the_blocking_client_and_proxies_pass_the_message_id_on() -> None:
    ledger = Ledger()
    with (
        serve_in_thread(ledger, listen="amqp://127.0.0.1:0") as server,
        blocking.connect(server.url, timeout=5) as client,
    ):
        assert client.call("ledger", "add", "a", 1, message_id="m") == 2
        assert client.service("ledger").options(message_id="m").call("add", "a", 1) == 2
    assert ledger.runs == {"a": 1}


async def test_the_async_proxy_passes_the_message_id_on() -> None:
    ledger = Ledger()
    async with (
        open_server(ledger, listen="amqp://127.0.0.1:0") as server,
        connect(server.url) as client,
    ):
        proxy = await client.service("ledger")
        proxy = proxy.options(message_id="p")
        assert [await proxy.call("add", "p", 4) for _ in range(2)] == [8, 8]
    assert ledger.runs == {"p": 1}


# -- callers kept apart (issue 22) -------------------------------------------------------------

USERS = {"alice": "a-secret", "bob": "b-secret"}


def _as(url: str, user: str) -> str:
    return url.replace("amqp://", f"amqp://{user}:{USERS[user]}@")


async def test_another_user_with_the_same_message_id_never_gets_the_kept_reply() -> None:
    bank = Bank()
    async with (
        open_server(bank, listen="amqp://127.0.0.1:0", users=USERS) as server,
        connect(_as(server.url, "alice")) as alice,
        connect(_as(server.url, "bob")) as bob,
    ):
        sent = await alice.call("bank", "transfer", "carol", 10, message_id="m-1")
        assert sent == "sent 10 to carol"
        with pytest.raises(RemoteError) as refused:  # bob's own call, refused as his
            await bob.call("bank", "transfer", "carol", 10, message_id="m-1")
        assert (refused.value.status, refused.value.message) == (403, "bob may not")
        # bob first, then alice with his id: her transfer runs, she gets her own answer
        with pytest.raises(RemoteError):
            await bob.call("bank", "transfer", "dave", 5, message_id="m-2")
        assert await alice.call("bank", "transfer", "dave", 5, message_id="m-2") == (
            "sent 5 to dave"
        )
    assert bank.transfers == [("carol", 10), ("dave", 5)]


async def test_a_message_id_reused_for_a_different_call_is_refused_with_409() -> None:
    bank = Bank()
    async with (
        open_server(
            bank, listen="amqp://127.0.0.1:0", users=USERS, metrics_listen="127.0.0.1:0"
        ) as server,
        connect(_as(server.url, "alice")) as alice,
    ):
        assert await alice.call("bank", "transfer", "carol", 10, message_id="m-1") == (
            "sent 10 to carol"
        )
        assert await alice.call("bank", "transfer", "carol", 10, message_id="m-1") == (
            "sent 10 to carol"
        )  # a true repeat: the kept answer, counted
        with pytest.raises(RemoteError) as reused:
            await alice.call("bank", "transfer", "mallory", 10_000, message_id="m-1")
        assert server.metrics_url is not None
        metrics = await scrape(server.metrics_url)
        assert metrics.value("pairlink_dedup_repeats_total", service="bank") == 1
        assert metrics.value("pairlink_credit_revoked_total", service="bank") == 0
    assert reused.value.status == 409
    assert reused.value.message == "the message-id 'm-1' was used for a different call"
    assert bank.transfers == [("carol", 10)]


async def test_a_message_id_past_the_bound_is_not_kept() -> None:
    bank = Bank()
    long_id = "m" * (MAX_ID_LENGTH + 1)
    async with (
        open_server(bank, listen="amqp://127.0.0.1:0", users=USERS) as server,
        connect(_as(server.url, "alice")) as alice,
    ):
        for _ in range(2):
            await alice.call("bank", "transfer", "carol", 1, message_id=long_id)
        assert len(server.actors["bank"].dedup or ()) == 0
    assert bank.transfers == [("carol", 1), ("carol", 1)]  # untracked: it ran twice


async def test_middleware_judges_a_repeat_before_the_kept_reply_is_given() -> None:
    """A repeat passes the service's middleware as its first copy did: refused once its
    caller may no longer call, given the kept reply (without running again) while it may."""
    bank = Bank()
    seen: list[str | None] = []
    banned: set[str] = set()

    async def gate(call: CallContext, proceed: Proceed) -> object:
        seen.append(call.user)
        if call.user in banned:
            raise CallError(403, f"{call.user} may no longer call")
        return await proceed()

    async with (
        open_server(bank, listen="amqp://127.0.0.1:0", users=USERS, middleware=[gate]) as server,
        connect(_as(server.url, "alice")) as alice,
    ):
        for _ in range(2):  # the call, then its repeat: the kept reply, judged first
            sent = await alice.call("bank", "transfer", "carol", 10, message_id="m-1")
            assert sent == "sent 10 to carol"
        banned.add("alice")
        with pytest.raises(RemoteError) as refused:
            await alice.call("bank", "transfer", "carol", 10, message_id="m-1")
    assert (refused.value.status, refused.value.message) == (403, "alice may no longer call")
    assert seen == ["alice", "alice", "alice"]
    assert bank.transfers == [("carol", 10)]  # it ran once
