"""``pairlink serve --config FILE``: mistakes named as ``file:line: key: problem``, a config
with TLS and users that serves over amqps, several listeners (amqp:// and mutual-TLS amqps://
at once, certificate users), per-service dedup, and flags that override the file."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest
import trio

from pairlink import current_call, handler, hosted, open_server, remote, service
from pairlink._client import blocking
from pairlink._client.client import connect
from pairlink._config.limits import Limits
from pairlink._config.toml_config import TlsFiles as ConfigTlsFiles
from pairlink._server.config import ServiceEntry, parse_serve_config
from pairlink.errors import ConfigError, ConnectionLostError, PairlinkError
from tests.test_cli_serve import PAIRLINK, workdir  # noqa: F401 - fixture
from tests.test_client_cli import Served, restore_logging  # noqa: F401 - autouse fixture
from tests.tls import CLIENT_IDENTITY, TlsFiles, make_tls_files


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('listen = "amqp://127.0.0.1:0"\nport = 1\n', r"^<config>:2: port: unknown key"),
        ("listen = []\n", r"^<config>:1: listen: an empty array: give a URL, or leave listen out$"),
        (
            'listen = [\n  "amqp://127.0.0.1:1",\n  "amqps://127.0.0.1:2",\n]\n',
            r"^<config>:3: listen\[2\]: an amqps:// listen needs a \[tls\] table",
        ),
        (
            'listen = [\n  "amqp://127.0.0.1:1",\n  "http://127.0.0.1:2",\n]\n',
            r"^<config>:3: listen\[2\]: 'http://127.0.0.1:2' is not an amqp:// or amqps:// URL$",
        ),
        (
            'listen = ["amqp://127.0.0.1:1", "amqp://127.0.0.1:1"]\n',
            r"^<config>:1: listen\[2\]: 'amqp://127.0.0.1:1' is listed twice$",
        ),
        (
            'listen = ["amqp://127.0.0.1:1", 5]\n',
            r"^<config>:1: listen\[2\]: expected a URL \(a string\), got an integer$",
        ),
        (
            '\nmetrics_listen = "9464"\n',
            r"^<config>:2: metrics_listen: '9464' is not HOST:PORT",
        ),
        ("metrics_listen = 9464\n", r"^<config>:1: metrics_listen: expected a string"),
        (
            'metrics_listen = "127.0.0.1:70000"\n',
            r"^<config>:1: metrics_listen: '127.0.0.1:70000' is not HOST:PORT",
        ),
        ("\nworkers = 0\n", r"^<config>:2: workers: 0 is not a positive number of processes$"),
        ("workers = 1.5\n", r"^<config>:1: workers: expected a number of processes \(an integer\)"),
        (
            '[[service]]\nmodule = "m"\ndedup_window = 0\n',
            r"^<config>:3: service\[1\]\.dedup_window: 0 is not a positive number of seconds$",
        ),
        (
            '[[service]]\nmodule = "m"\ndedup_window = "1m"\n',
            r"^<config>:3: service\[1\]\.dedup_window: expected seconds \(a number\)",
        ),
        (
            '[[service]]\nmodule = "m"\n\ndedup_size = -3\n',
            r"^<config>:4: service\[1\]\.dedup_size: -3 is not a positive number of replies$",
        ),
        (
            "[users.robot]\ncertificate = true\n",
            r"^<config>:2: users\.robot\.certificate: needs \[tls\] client_ca to verify it$",
        ),
        (
            '[users.robot]\ncertificate = "yes"\n',
            r"^<config>:2: users\.robot\.certificate: certificate = true",
        ),
        (
            '[users]\nrobot = { certificate = true, password_env = "X" }\n',
            r"^<config>:2: users\.robot\.certificate: certificate = true",
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


def test_every_key_is_read(tls_files: TlsFiles) -> None:
    """A config with every key (the README's example, with this test's files)."""
    text = textwrap.dedent(f"""\
        listen = ["amqp://127.0.0.1:5672", "amqps://0.0.0.0:5671"]
        metrics_listen = "127.0.0.1:9464"
        workers = 1

        [tls]
        cert = "{tls_files.server_cert}"
        key = "{tls_files.server_key}"
        client_ca = "{tls_files.ca_cert}"

        [users.alice]
        password_env = "ALICE_PASSWORD"

        [users.{CLIENT_IDENTITY}]
        certificate = true

        [users.gateway-o]
        password_env = "GATEWAY_O_PASSWORD"
        vouches = true

        [[service]]
        module = "billing:Invoices"
        address = "invoices"
        max_concurrency = 8
        mailbox = 64
        dedup_window = 300
        dedup_size = 50000

        [[service]]
        module = "billing"

        [limits]
        handshake_timeout = 5
        max_connections = 1000

        [log]
        level = "warning"
        format = "json"
    """)
    config = parse_serve_config(
        text, environ={"ALICE_PASSWORD": "s3cret", "GATEWAY_O_PASSWORD": "g4te"}
    )
    assert config.listen == ("amqp://127.0.0.1:5672", "amqps://0.0.0.0:5671")
    assert config.metrics_listen == "127.0.0.1:9464"
    assert config.workers == 1
    assert config.tls == ConfigTlsFiles(
        str(tls_files.server_cert), str(tls_files.server_key), str(tls_files.ca_cert)
    )
    assert config.users == {"alice": "s3cret", "gateway-o": "g4te"}
    assert config.certificate_users == {CLIENT_IDENTITY}
    assert config.vouching_users == {"gateway-o"}
    assert config.services == (
        ServiceEntry("billing:Invoices", "invoices", 8, 64, 300.0, 50000),
        ServiceEntry("billing"),
    )
    assert config.limits == Limits(handshake_timeout=5.0, max_connections=1000)
    assert (config.log_level, config.log_format) == ("warning", "json")


def test_vouches_is_true_or_absent() -> None:
    text = '[users.gw]\npassword_env = "GW"\nvouches = 1\n'
    with pytest.raises(ConfigError, match=r"^<config>:3: users\.gw\.vouches: vouches = true"):
        parse_serve_config(text, environ={"GW": "g4te"})


def test_a_tls_table_without_listen_is_for_the_command_line(tls_files: TlsFiles) -> None:
    """``--listen amqps://...`` on the command line may take its certificate from the file."""
    text = f'[tls]\ncert = "{tls_files.server_cert}"\nkey = "{tls_files.server_key}"\n'
    config = parse_serve_config(text, environ={})
    assert config.listen == ()
    assert config.tls is not None


@service("ledger", dedup_window=10)
class Ledger:
    @handler
    async def ping(self) -> str:
        return "pong"


def test_hosted_overrides_dedup() -> None:
    spec = hosted(Ledger, dedup_window=2.5, dedup_size=7).spec
    assert (spec.dedup_window, spec.dedup_size) == (2.5, 7)
    assert hosted(Ledger, dedup_size=3).spec.dedup_window == 10  # the class's, kept
    with pytest.raises(ValueError, match=r"@service\('ledger'\): dedup_window must be > 0"):
        hosted(Ledger, dedup_window=0)
    with pytest.raises(ValueError, match=r"@service\('other'\): dedup_size must be an int"):
        hosted(Ledger, address="other", dedup_size=0)


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


WHO = """
from pairlink import current_call, handler, service


@service("who")
class Who:
    @handler
    async def whoami(self):
        return current_call().user


@service("counter")
class Counter:
    def __init__(self):
        self.runs = 0

    @handler
    async def bump(self):
        self.runs += 1
        return self.runs
"""


def test_two_listeners_mutual_tls_and_users_from_one_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """amqp:// and amqps:// (mutual TLS) at once; a password user on both, a certificate user
    by SASL EXTERNAL; no anonymous peer, no TLS peer without a certificate; and the file's
    dedup reaches the service."""
    (tmp_path / "who.py").write_text(WHO)
    tls = make_tls_files(tmp_path / "pki")
    monkeypatch.setenv("PAIRLINK_TEST_ALICE", "s3cret")
    config = tmp_path / "serve.toml"
    config.write_text(
        textwrap.dedent(f"""\
            listen = [
                "amqp://127.0.0.1:0",
                "amqps://127.0.0.1:0",
            ]

            [tls]
            cert = "{tls.server_cert}"
            key = "{tls.server_key}"
            client_ca = "{tls.ca_cert}"

            [users.alice]
            password_env = "PAIRLINK_TEST_ALICE"

            [users.{CLIENT_IDENTITY}]
            certificate = true

            [[service]]
            module = "who:Who"

            [[service]]
            module = "who:Counter"
            dedup_window = 60
        """)
    )
    with Served("--config", str(config), program=PAIRLINK, cwd=tmp_path) as served:
        plain, secure = served.url(), served.url()  # one line per listener, in file order
        assert plain.startswith("amqp://127.0.0.1:")
        assert secure.startswith("amqps://127.0.0.1:")
        plain_at, secure_at = plain.removeprefix("amqp://"), secure.removeprefix("amqps://")
        with blocking.connect(f"amqp://alice:s3cret@{plain_at}", timeout=10) as client:
            assert client.call("who", "whoami") == "alice"
            assert client.call("counter", "bump", message_id="job-1") == 1
            assert client.call("counter", "bump", message_id="job-1") == 1  # the kept reply
            assert client.call("counter", "bump", message_id="job-2") == 2
        with_cert = tls.client_context(with_client_cert=True)
        with blocking.connect(
            f"amqps://{secure_at}", ssl_context=with_cert, sasl="EXTERNAL", timeout=10
        ) as client:
            assert client.call("who", "whoami") == CLIENT_IDENTITY
        with blocking.connect(
            f"amqps://alice:s3cret@{secure_at}", ssl_context=with_cert, timeout=10
        ) as client:
            assert client.call("who", "whoami") == "alice"
        with pytest.raises(ConnectionLostError):  # mutual TLS: no certificate, no connection
            blocking.connect(
                f"amqps://alice:s3cret@{secure_at}",
                ssl_context=tls.client_context(),
                timeout=10,
                reconnect=False,
            ).close()
        with pytest.raises(PairlinkError, match=r"(?i)anonymous|sasl|auth"):  # users required
            blocking.connect(plain, timeout=10, reconnect=False).close()


def test_listen_flags_replace_the_files_list(workdir: Path) -> None:  # noqa: F811 - the fixture
    config = workdir / "serve.toml"
    config.write_text('listen = ["amqp://127.0.0.1:1", "amqp://127.0.0.1:2"]\n')
    args = ("mymodule", "--config", str(config))
    listen = ("--listen", "amqp://127.0.0.1:0", "--listen", "amqp://localhost:0")
    with Served(*args, *listen, program=PAIRLINK, cwd=workdir) as served:
        first, second = served.url(), served.url()
        assert first.startswith("amqp://127.0.0.1:")
        assert second.startswith("amqp://localhost:")
        assert {first[-2:], second[-2:]}.isdisjoint({":1", ":2"})
        for url in (first, second):
            with blocking.connect(url, timeout=10) as client:
                assert client.call("stuck", "echo", url) == url


@service("relay", max_concurrency=2)  # ask() calls whoami() on itself
class Relay:
    @handler
    async def whoami(self) -> str | None:
        return current_call().user

    @handler
    async def ask(self) -> str | None:
        """Through ``remote()``: the server's own connection, to its first listener."""
        return await (await remote("relay")).whoami()  # type: ignore[no-any-return]


async def test_open_server_listens_on_each_url_with_tls_on_the_amqps_ones_only(
    tls_files: TlsFiles,
) -> None:
    async with open_server(
        Relay,
        listen=["amqp://127.0.0.1:0", "amqps://127.0.0.1:0"],
        ssl_context=tls_files.server_context(require_client_cert=True),
        certificate_users={CLIENT_IDENTITY},
    ) as server:
        assert len(server.urls) == 2
        assert server.url == server.urls[0] == f"amqp://127.0.0.1:{server.port}"
        assert server.urls[1].startswith("amqps://127.0.0.1:")
        with trio.fail_after(10):
            async with connect(
                server.urls[1],
                ssl_context=tls_files.client_context(with_client_cert=True),
                sasl="EXTERNAL",
            ) as client:
                assert await client.call("relay", "whoami") == CLIENT_IDENTITY
                # certificate users only: the plain listener lets no anonymous peer in, and
                # remote() (anonymous, to the first listener) is refused too
                with pytest.raises(PairlinkError):
                    await client.call("relay", "ask")
            with pytest.raises(PairlinkError):
                async with connect(server.url, reconnect=False) as plain:
                    await plain.call("relay", "whoami")


async def test_open_server_remote_uses_the_first_listener(tls_files: TlsFiles) -> None:
    async with open_server(
        Relay,
        listen=["amqp://127.0.0.1:0", "amqps://127.0.0.1:0"],
        ssl_context=tls_files.server_context(),
    ) as server:
        with trio.fail_after(10):
            async with connect(server.urls[1], ssl_context=tls_files.client_context()) as client:
                # remote() has no TLS context: it reached the first, amqp:// listener
                assert await client.call("relay", "ask") == "anonymous"
            async with connect(server.url) as client:  # plain: no TLS on the amqp:// one
                assert await client.call("relay", "whoami") == "anonymous"


async def test_open_server_needs_a_url_or_none() -> None:
    with pytest.raises(ValueError, match="no URLs"):
        async with open_server(Relay, listen=[]):
            pass  # pragma: no cover
