"""``pairlink serve --config FILE``: mistakes named as ``file:line: key: problem``, a config
with TLS and users that serves over amqps, and flags that override the file."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from framework.client import blocking
from framework.errors import PairlinkError
from framework.server.config import ConfigError, parse_serve_config
from tests.test_cli_serve import PAIRLINK, workdir  # noqa: F401 - fixture
from tests.test_client_cli import Served, restore_logging  # noqa: F401 - autouse fixture
from tests.tls import make_tls_files


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('listen = "amqp://127.0.0.1:0"\nport = 1\n', r"^<config>:2: port: unknown key"),
        (
            'listen = ["amqp://127.0.0.1:1", "amqp://127.0.0.1:2"]\n',
            r"^<config>:1: listen: 2 URLs: serve listens on exactly one today$",
        ),
        (
            '[[service]]\nmodule = "m"\n\n[[service]]\nmodule = "n"\nmailbox = "big"\n',
            r"^<config>:6: service\[2\]\.mailbox: expected a number of calls \(an integer\)",
        ),
        ("[[service]]\naddress = 'a'\n", r"^<config>:1: service\[1\]\.module: missing"),
        (
            '[users.alice]\npassword_env = "NO_SUCH_VARIABLE_HERE"\n',
            r"^<config>:2: users\.alice\.password_env: environment variable .* is not set$",
        ),
        (
            'listen = "amqps://127.0.0.1:0"\n',
            r"^<config>:1: listen: an amqps:// listen needs a \[tls\] table",
        ),
        ('[log]\nlevel = "loud"\n', r"^<config>:2: log\.level: 'loud' is not one of"),
        ("[limits]\nmax_connections = 0\n", r"^<config>:2: limits\.max_connections: 0 is not"),
        ("listen = \n", r"^<config>:1: listen: not valid TOML"),
    ],
)
def test_each_mistake_names_its_line_and_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_serve_config(text, environ={})


def test_the_command_exits_1_with_the_file_line_and_key(tmp_path: Path) -> None:
    config = tmp_path / "serve.toml"
    config.write_text('[[service]]\nmodule = "m"\nmax_concurrency = -1\n')
    done = subprocess.run(
        [*PAIRLINK, "serve", "--config", str(config)], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"pairlink serve: {config}:3: service[1].max_concurrency: "
        "-1 is not a positive number of calls"
    )


def test_a_config_with_tls_and_users_serves_over_amqps(
    workdir: Path,  # noqa: F811 - the fixture
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tls = make_tls_files(workdir / "pki")
    monkeypatch.setenv("PAIRLINK_TEST_ALICE", "s3cret")
    config = workdir / "serve.toml"
    config.write_text(
        textwrap.dedent(f"""\
            listen = ["amqps://127.0.0.1:0"]

            [tls]
            cert = "{tls.server_cert}"
            key = "{tls.server_key}"

            [users.alice]
            password_env = "PAIRLINK_TEST_ALICE"

            [[service]]
            module = "mymodule:Stuck"
            address = "secured"
            max_concurrency = 2

            [limits]
            max_connections = 10
        """)
    )
    with Served("--config", str(config), program=PAIRLINK, cwd=workdir) as served:
        url = served.url()
        assert url.startswith("amqps://127.0.0.1:")
        host_port = url.removeprefix("amqps://")
        good = f"amqps://alice:s3cret@{host_port}"
        with blocking.connect(good, ssl_context=tls.client_context(), timeout=10) as client:
            assert client.call("secured", "echo", "over tls") == "over tls"
        wrong = f"amqps://alice:wrong@{host_port}"
        with (
            pytest.raises(PairlinkError, match=r"(?i)auth|sasl|login|password"),
            blocking.connect(
                wrong, ssl_context=tls.client_context(), timeout=10, reconnect=False
            ) as client,
        ):
            client.call("secured", "echo", "refused")


def test_flags_override_the_file(workdir: Path) -> None:  # noqa: F811 - the fixture
    config = workdir / "serve.toml"
    config.write_text(
        'listen = "amqp://127.0.0.1:1"\n\n[[service]]\nmodule = "mymodule"\naddress = "filed"\n'
    )
    args = ("--config", str(config), "--listen", "amqp://127.0.0.1:0", "--address", "flagged")
    with Served(*args, program=PAIRLINK, cwd=workdir) as served:
        url = served.url()
        assert not url.endswith(":1")
        with blocking.connect(url, timeout=10) as client:
            assert client.call("flagged", "echo", "flag") == "flag"


def test_serve_listen_amqps_with_cert_and_key_flags(workdir: Path) -> None:  # noqa: F811
    tls = make_tls_files(workdir / "pki")
    args = ("mymodule", "--listen", "amqps://127.0.0.1:0")
    with Served(
        *args,
        "--cert",
        str(tls.server_cert),
        "--key",
        str(tls.server_key),
        program=PAIRLINK,
        cwd=workdir,
    ) as served:
        url = served.url()
        with blocking.connect(url, ssl_context=tls.client_context(), timeout=10) as client:
            assert client.call("stuck", "echo", "tls") == "tls"
