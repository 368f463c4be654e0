"""``pairlink gateway --config FILE`` in a child process: a bad config is one line on stderr
and exit code 1; a good one listens, relays a call, and stops cleanly on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pairlink._cli import main
from tests.test_client_cli import Served, restore_logging  # noqa: F401 - autouse fixture


def gateway_config(upstream: str, *, password_env: str = "") -> str:
    return (
        'listen = "amqp://127.0.0.1:0"\n'
        'container_id = "gw-cli-test"\n'
        "[[route]]\n"
        'public = "billing"\n'
        f'upstream = "{upstream}"\n'
        'address = "echo"\n'
        + (f'user = "org-n"\npassword_env = "{password_env}"\n' if password_env else "")
    )


def run_gateway_command(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pairlink", "gateway", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (gateway_config("http://127.0.0.1:1"), "5: route[1].upstream: 'http://127.0.0.1:1' is not"),
        (
            gateway_config("amqp://127.0.0.1:1", password_env="GW_CLI_UNSET_PASSWORD"),
            "8: route[1].password_env: environment variable GW_CLI_UNSET_PASSWORD is not set",
        ),
        ('listen = "amqp://127.0.0.1:0"\nroute = [', "2: route: not valid TOML: "),
    ],
    ids=["bad-url", "unset-password", "toml-syntax"],
)
def test_a_bad_config_is_one_line_and_exit_code_1(tmp_path: Path, text: str, problem: str) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(text)
    done = run_gateway_command(config)
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.startswith(f"pairlink gateway: {config}:{problem}"), done.stderr
    assert done.stderr.count("\n") == 1  # one line, no traceback


def test_a_missing_config_file_exits_1(tmp_path: Path) -> None:
    done = run_gateway_command(tmp_path / "absent.toml")
    assert done.returncode == 1
    assert done.stderr.startswith(
        f"pairlink gateway: {tmp_path}/absent.toml: cannot read the config:"
    )
    assert done.stderr.count("\n") == 1


def test_config_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["gateway"])
    assert exc.value.code == 2
    assert "--config" in capsys.readouterr().err


@pytest.mark.timeout(90)
def test_gateway_relays_a_call_then_stops_on_sigterm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Served("services.echo", "--listen", "amqp://127.0.0.1:0") as service:
        config = tmp_path / "gw.toml"
        config.write_text(gateway_config(service.url()))
        with Served("--config", str(config), command="gateway") as gateway:
            url = gateway.url("gateway.listening")
            assert main(["call", url, "billing", "echo", '{"n": 1}']) == 0
            assert capsys.readouterr().out == '{"n": 1}\n'
            assert gateway.interrupt(signal.SIGTERM) == 0
        assert service.interrupt() == 0


@pytest.mark.timeout(90)
def test_the_two_orgs_example_runs() -> None:
    """examples/two_orgs/run.py, as its README runs it, from the checkout's root (fixed ports
    25671-25673)."""
    done = subprocess.run(
        [sys.executable, "-m", "examples.two_orgs.run"],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=80,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "billing.echo('hello') = hello" in lines
    assert "GN has no route 'billing.internal': amqp:not-found" in lines
    assert lines[-1] == "stopped"
