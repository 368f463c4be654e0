"""A call to an address no service holds: one line naming the address and the URL (its
password hidden), from the Python client and from ``pairlink call``, against a real server."""

from __future__ import annotations

import traceback
from collections.abc import Iterator

import pytest
import structlog
import trio

from pairlink import Client, connect, open_server
from pairlink._cli import main
from pairlink.errors import LinkDetachedError
from pairlink.spark import serve_in_thread
from services.echo import Echo

USERS = {"alice": "s3cret-pw"}


def with_password(url: str) -> str:
    return url.replace("amqp://", "amqp://alice:s3cret-pw@")


async def test_every_call_to_an_unknown_address_says_which_address_on_which_url() -> None:
    async with open_server(Echo, listen="amqp://127.0.0.1:0", users=USERS) as server:
        shown = server.url.replace("amqp://", "amqp://alice:***@")
        errors: list[LinkDetachedError] = []

        async def one(client: Client) -> None:
            with pytest.raises(LinkDetachedError) as exc:
                await client.call("scorre", "echo", 1)
            errors.append(exc.value)

        async with (
            connect(with_password(server.url), timeout=10) as client,
            trio.open_nursery() as nursery,
        ):
            for _ in range(20):  # pipelined on one pair: one refusal ends them all
                nursery.start_soon(one, client)
    why = f"amqp:not-found: no service at the address 'scorre' on {shown}"
    assert [str(error) for error in errors] == [why] * 20
    assert errors[0].condition == "amqp:not-found"
    # the calls share one error: its traceback is one caller's, not twenty stacked
    printed = "".join(traceback.format_exception(errors[-1]))
    assert printed.count("\n") < 40 and "s3cret-pw" not in printed


@pytest.fixture
def restore_logging() -> Iterator[None]:
    saved = structlog.get_config()  # ``main`` configures structlog for the whole process
    yield
    structlog.configure(**saved)


@pytest.mark.usefixtures("restore_logging")
def test_pairlink_call_to_an_unknown_address_prints_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with serve_in_thread(Echo(), listen="amqp://127.0.0.1:0", users=USERS) as server:
        assert main(["call", with_password(server.url), "scorre", "echo", "1"]) == 1
        shown = server.url.replace("amqp://", "amqp://alice:***@")
    out, err = capsys.readouterr()  # the server's logs too: it runs in this process
    said = [line for line in err.splitlines() if line.startswith("pairlink call")]
    assert said == [
        f"pairlink call: LinkDetachedError: amqp:not-found: no service at the address 'scorre' "
        f"on {shown}"
    ]
    assert "s3cret-pw" not in out + err
