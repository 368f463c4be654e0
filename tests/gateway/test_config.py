"""Gateway config: a valid file read in full, and every kind of mistake refused with the file,
line and key in the message (pairlink._gateway.config, pairlink._config.toml_lines)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pairlink._config.limits import Limits
from pairlink._config.toml_lines import KeyLines, dotted
from pairlink._gateway.config import MAX_PAIRS, GatewayConfig, Route, load_config, parse_config
from pairlink.errors import ConfigError
from tests.tls import TlsFiles

ENV = {"GN_APPS_PASSWORD": "apps-secret", "GN_OPS_PASSWORD": "ops-secret", "GN_UP": "up-secret"}

# Line numbers matter: the refusals below name them.
VALID = """\
listen = "amqp://127.0.0.1:0"
container_id = "gn"
idle_timeout = 20
attach_timeout = 2.5

[users]
"org-n-apps" = { password_env = "GN_APPS_PASSWORD" }
ops = { password_env = "GN_OPS_PASSWORD" }

[[route]]
public = "billing"
upstream = "amqp://127.0.0.1:25672"
address = "billing"
user = "org-n"
password_env = "GN_UP"
allow = ["org-n-apps"]

[[route]]
public = "audit"      # a comment
upstream = "amqps://gw.org-o.example"
address = "audit.internal"
allow = [
    "org-n-apps",
    "ops",
]
"""
"""Lines: 1 listen, 2 container_id, 3 idle_timeout, 4 attach_timeout, 6 [users],
7 "org-n-apps", 8 ops, 10 [[route]] 1, 11 public, 12 upstream, 13 address, 14 user,
15 password_env, 16 allow, 18 [[route]] 2, 19 public, 20 upstream, 21 address, 22 allow."""

MINIMAL = 'listen = "amqp://h"\n[[route]]\npublic = "a"\nupstream = "amqp://h"\naddress = "b"\n'


def parse(text: str, environ: dict[str, str] | None = None) -> GatewayConfig:
    return parse_config(text, source="gn.toml", environ=ENV if environ is None else environ)


def refusal(text: str, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        parse(text, environ)
    return str(caught.value)


def test_a_valid_config_is_read_in_full() -> None:
    assert parse(VALID) == GatewayConfig(
        listen="amqp://127.0.0.1:0",
        routes=(
            Route(
                public="billing",
                upstream="amqp://127.0.0.1:25672",
                address="billing",
                user="org-n",
                password="up-secret",
                allow=frozenset({"org-n-apps"}),
            ),
            Route(
                public="audit",
                upstream="amqps://gw.org-o.example",
                address="audit.internal",
                allow=frozenset({"org-n-apps", "ops"}),
            ),
        ),
        users={"org-n-apps": "apps-secret", "ops": "ops-secret"},
        container_id="gn",
        idle_timeout=20.0,
        attach_timeout=2.5,
    )


def test_the_smallest_config_takes_the_defaults() -> None:
    assert parse(MINIMAL, {}) == GatewayConfig(
        listen="amqp://h", routes=(Route("a", "amqp://h", "b"),)
    )


def test_max_pairs_is_read_and_defaults_to_max_pairs() -> None:
    assert parse("max_pairs = 25_000\n" + MINIMAL, {}).max_pairs == 25_000
    assert parse("max_pairs = 1\n" + MINIMAL, {}).max_pairs == 1
    assert parse(MINIMAL, {}).max_pairs == MAX_PAIRS == 10_000


SHARES = """\
listen = "amqp://127.0.0.1:0"
max_pairs_per_user = 100

[users]
apps = { password_env = "GN_APPS_PASSWORD", max_pairs = 2000 }

[users.ops]
password_env = "GN_OPS_PASSWORD"
max_pairs = 3
{extra}
[[route]]
public = "billing"
upstream = "amqp://127.0.0.1:25672"
address = "billing"
"""
"""Lines: 5 apps, 7 [users.ops], 9 its max_pairs, 10 {extra}."""


def test_a_users_own_max_pairs_is_its_share() -> None:
    config = parse(SHARES.replace("{extra}", ""))
    assert config.max_pairs_by_user == {"apps": 2000, "ops": 3}
    assert config.pairs_per_user() == 100  # every other user's
    assert parse(MINIMAL, {}).max_pairs_by_user == {}


@pytest.mark.parametrize(
    ("text", "line", "key", "problem"),
    [
        (SHARES.replace("max_pairs = 3", "max_pairs = 0"), 9, "users.ops.max_pairs", "0 is not"),
        (
            SHARES.replace("max_pairs = 3", 'max_pairs = "3"'),
            9,
            "users.ops.max_pairs",
            "expected a number of pairs (an integer), got a string",
        ),
        (
            SHARES.replace("2000 }", "2000.5 }"),
            5,
            "users.apps.max_pairs",
            "expected a number of pairs (an integer), got a number",
        ),
        (
            SHARES.replace("{extra}", "max_pair = 4"),
            10,
            "users.ops.max_pair",
            "unknown key (known here: password_env, certificate, vouches, max_pairs)",
        ),
    ],
)
def test_a_users_max_pairs_mistakes_are_refused_with_their_line_and_key(
    text: str, line: int, key: str, problem: str
) -> None:
    message = refusal(text.replace("{extra}", ""))
    assert message.startswith(f"gn.toml:{line}: {key}: {problem}"), message


def test_limits_are_read_and_default_to_the_documented_constants() -> None:
    text = (
        "[limits]\nhandshake_timeout = 2\nmax_connections = 50\nmax_outgoing_bytes = 1_048_576\n"
        "login_penalty = 0.5\nmax_message_size = 65536\nmax_incomplete_bytes = 131072\n"
        "max_unsettled = 64\nmax_decoded_elements = 1000\nhandle_max = 31\n"
    )
    limits = parse(MINIMAL + text, {}).limits
    assert limits == Limits(
        handshake_timeout=2.0,
        max_connections=50,
        max_outgoing_bytes=1 << 20,
        login_penalty=0.5,
        max_message_size=65536,
        max_incomplete_bytes=131072,
        max_unsettled=64,
        max_decoded_elements=1000,
        handle_max=31,
    )
    assert parse(MINIMAL, {}).limits == Limits()
    options = limits.listen_options()
    assert options["max_connections"] == 50 and options["handle_max"] == 31
    throttle = options["login_throttle"]
    assert throttle is not None and throttle.penalty == 0.5


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("max_conections = 5", "unknown key (known here: handshake_timeout"),
        ("max_connections = 0", "0 is not a positive number of connections"),
        ('max_outgoing_bytes = "16M"', "expected a number of bytes (an integer), got a string"),
        ("handshake_timeout = -1", "-1 is not a positive number of seconds"),
    ],
)
def test_limit_mistakes_are_refused_with_their_line_and_key(line: str, problem: str) -> None:
    key = line.split(" = ")[0]
    message = refusal(MINIMAL + "[limits]\n" + line + "\n", {})
    assert message.startswith(f"gn.toml:7: limits.{key}: {problem}"), message


def replace(old: str, new: str) -> str:
    assert VALID.count(old) == 1, old
    return VALID.replace(old, new)


# Each refusal: the config text, then the line, key and problem its message names.
REFUSALS = [
    pytest.param(
        replace('address = "billing"', "address = billing"),
        13,
        "route[1].address",
        "not valid TOML: Invalid value at column 11",
        id="toml-syntax",
    ),
    pytest.param(
        VALID.removesuffix("]\n"), 24, "route[2].allow", "not valid TOML", id="toml-unclosed-array"
    ),
    pytest.param(
        replace("idle_timeout = 20", "idle_timout = 20"),
        3,
        "idle_timout",
        "unknown key (known here: listen, container_id, idle_timeout,",
        id="unknown-top-level-key",
    ),
    pytest.param(
        'listen = "amqps://127.0.0.1:0"\n[tls]\ncert = "c.pem"\nchain = "x"\n',
        4,
        "tls.chain",
        "unknown key (known here: cert, key, client_ca)",
        id="unknown-tls-key",
    ),
    pytest.param(
        replace("ops = { password_env", 'ops = { password = "x", password_env'),
        8,
        "users.ops.password",
        "unknown key (known here: password_env, certificate, vouches, max_pairs)",
        id="unknown-user-key",
    ),
    pytest.param(
        replace('address = "audit.internal"', 'adress = "audit.internal"'),
        21,
        "route[2].adress",
        "unknown key (known here: public, upstream, address,",
        id="unknown-route-key",
    ),
    pytest.param(
        VALID.replace('listen = "amqp://127.0.0.1:0"\n', ""),
        1,
        "listen",
        "missing",
        id="missing-listen",
    ),
    pytest.param(
        replace('public = "audit"      # a comment\n', ""),
        18,
        "route[2].public",
        "missing",
        id="missing-public",
    ),
    pytest.param(
        replace('upstream = "amqp://127.0.0.1:25672"\n', ""),
        10,
        "route[1].upstream",
        "missing",
        id="missing-upstream",
    ),
    pytest.param(
        replace('address = "billing"\n', ""),
        10,
        "route[1].address",
        "missing",
        id="missing-address",
    ),
    pytest.param(
        VALID[: VALID.index("[[route]]")],
        1,
        "route",
        "missing: a gateway needs at least one [[route]] table",
        id="missing-route",
    ),
    pytest.param(
        replace('"amqp://127.0.0.1:0"', '"amqps://127.0.0.1:0"'),
        1,
        "listen",
        "an amqps:// listen needs a [tls] table with cert and key",
        id="missing-tls-for-amqps",
    ),
    pytest.param(
        'listen = "amqps://127.0.0.1:0"\n\n[tls]\ncert = "/dev/null"\n',
        3,
        "tls.key",
        "missing",
        id="missing-tls-key",
    ),
    pytest.param(
        VALID.replace("[users]", '[tls]\ncert = "c"\nkey = "k"\n\n[users]'),
        6,
        "tls",
        "[tls] is for an amqps:// listen, and listen is amqp://",
        id="tls-with-amqp-listen",
    ),
    pytest.param(
        replace('address = "billing"', "address = 7"),
        13,
        "route[1].address",
        "expected a string, got an integer",
        id="wrong-type-string",
    ),
    pytest.param(
        replace("idle_timeout = 20", 'idle_timeout = "20s"'),
        3,
        "idle_timeout",
        "expected seconds (a number), got a string",
        id="wrong-type-seconds",
    ),
    pytest.param(
        replace("idle_timeout = 20", "idle_timeout = true"),
        3,
        "idle_timeout",
        "got a boolean",
        id="wrong-type-boolean-seconds",
    ),
    pytest.param(
        replace("attach_timeout = 2.5", "attach_timeout = 0"),
        4,
        "attach_timeout",
        "0 is not a positive number of seconds",
        id="seconds-not-positive",
    ),
    pytest.param(
        replace("attach_timeout = 2.5", "attach_timeout = inf"),
        4,
        "attach_timeout",
        "inf is not a positive",
        id="seconds-infinite",
    ),
    pytest.param(
        replace("attach_timeout = 2.5", 'attach_timeout = 2.5\nmax_pairs = "10k"'),
        5,
        "max_pairs",
        "expected a number of pairs (an integer), got a string",
        id="wrong-type-max-pairs",
    ),
    pytest.param(
        replace("attach_timeout = 2.5", "attach_timeout = 2.5\nmax_pairs = 2500.0"),
        5,
        "max_pairs",
        "expected a number of pairs (an integer), got a number",
        id="max-pairs-not-whole",
    ),
    pytest.param(
        replace("attach_timeout = 2.5", "attach_timeout = 2.5\nmax_pairs = true"),
        5,
        "max_pairs",
        "got a boolean",
        id="wrong-type-boolean-max-pairs",
    ),
    pytest.param(
        replace("attach_timeout = 2.5", "attach_timeout = 2.5\nmax_pairs = 0"),
        5,
        "max_pairs",
        "0 is not a positive number of pairs",
        id="max-pairs-zero",
    ),
    pytest.param(
        replace("attach_timeout = 2.5", "attach_timeout = 2.5\nmax_pairs = -3"),
        5,
        "max_pairs",
        "-3 is not a positive number of pairs",
        id="max-pairs-negative",
    ),
    pytest.param(
        'listen = "amqp://h"\nroute = "billing"\n',
        2,
        "route",
        "a string, not [[route]] tables",
        id="wrong-type-route",
    ),
    pytest.param(
        'listen = "amqp://h"\nusers = 1\n',
        2,
        "users",
        "expected a table, got an integer",
        id="wrong-type-users",
    ),
    pytest.param(
        replace('ops = { password_env = "GN_OPS_PASSWORD" }', 'ops = "GN_OPS_PASSWORD"'),
        8,
        "users.ops",
        "expected a table, got a string",
        id="wrong-type-user-entry",
    ),
    pytest.param(
        replace('allow = ["org-n-apps"]', 'allow = "org-n-apps"'),
        16,
        "route[1].allow",
        "expected a non-empty array of [users] names, got a string",
        id="wrong-type-allow",
    ),
    pytest.param(
        replace('allow = ["org-n-apps"]', "allow = [1]"),
        16,
        "route[1].allow",
        "expected names (strings), got an integer 1",
        id="wrong-type-allow-item",
    ),
    pytest.param(
        replace('allow = ["org-n-apps"]', "allow = []"),
        16,
        "route[1].allow",
        "got an empty array",
        id="empty-allow",
    ),
    pytest.param(
        replace('container_id = "gn"', 'container_id = ""'),
        2,
        "container_id",
        "empty",
        id="empty-string",
    ),
    pytest.param(
        MINIMAL + "[users]\n",
        6,
        "users",
        "no users: remove [users] to let anonymous peers in",
        id="empty-users",
    ),
    pytest.param(
        replace('"amqps://gw.org-o.example"', '"http://x"'),
        20,
        "route[2].upstream",
        "'http://x' is not an amqp:// or amqps:// URL",
        id="bad-url-scheme",
    ),
    pytest.param(
        replace('"amqp://127.0.0.1:0"', '"amqp://:5672"'),
        1,
        "listen",
        "'amqp://:5672' is not an amqp:// or amqps:// URL",
        id="bad-url-no-host",
    ),
    pytest.param(
        replace('"amqp://127.0.0.1:0"', '"amqp://127.0.0.1:99999"'),
        1,
        "listen",
        "is not an amqp:// or amqps:// URL",
        id="bad-url-port",
    ),
    pytest.param(
        replace('"amqps://gw.org-o.example"', '"amqps://u:p@gw.org-o.example"'),
        20,
        "route[2].upstream",
        "no credentials in the URL: use user and password_env",
        id="bad-url-credentials",
    ),
    pytest.param(
        replace('"amqps://gw.org-o.example"', '"amqps://gw.org-o.example/billing"'),
        20,
        "route[2].upstream",
        "only amqp[s]://host[:port], no path or query",
        id="bad-url-path",
    ),
    pytest.param(
        replace('public = "audit"', 'public = "billing"'),
        19,
        "route[2].public",
        "'billing' is already the public of route[1]",
        id="duplicate-public",
    ),
    pytest.param(
        replace('    "ops",\n', '    "opps",\n'),
        22,
        "route[2].allow",
        "'opps' is not a user of the [users] table",
        id="allow-unknown-user",
    ),
    pytest.param(
        MINIMAL + 'allow = ["x"]\n',
        6,
        "route[1].allow",
        "'x' is not a user of the [users] table",
        id="allow-without-users",
    ),
    pytest.param(
        replace(
            'ops = { password_env = "GN_OPS_PASSWORD" }', 'ops = { password_env = "GN_NOT_SET" }'
        ),
        8,
        "users.ops.password_env",
        "environment variable GN_NOT_SET is not set",
        id="user-password-env-unset",
    ),
    pytest.param(
        replace('password_env = "GN_UP"', 'password_env = "GN_UP_2"'),
        15,
        "route[1].password_env",
        "environment variable GN_UP_2 is not set",
        id="route-password-env-unset",
    ),
    pytest.param(
        replace('password_env = "GN_UP"\n', ""),
        14,
        "route[1].user",
        "needs password_env (the variable holding its password)",
        id="user-without-password-env",
    ),
    pytest.param(
        replace('user = "org-n"\n', ""),
        14,
        "route[1].password_env",
        "given without user",
        id="password-env-without-user",
    ),
    pytest.param(
        replace('address = "billing"', 'address = "billing"\nca = "ca.pem"'),
        14,
        "route[1].ca",
        "only for an amqps:// upstream",
        id="ca-for-amqp-upstream",
    ),
    pytest.param(
        replace('upstream = "amqp://127.0.0.1:25672"', "upstream = []"),
        12,
        "route[1].upstream",
        "an empty array: name at least one next hop",
        id="upstream-empty-array",
    ),
    pytest.param(
        replace('upstream = "amqp://127.0.0.1:25672"', 'upstream = ["amqp://a", 5672]'),
        12,
        "route[1].upstream",
        "expected URLs (strings), got an integer 5672",
        id="upstream-array-not-urls",
    ),
    pytest.param(
        replace('upstream = "amqp://127.0.0.1:25672"', 'upstream = ["amqp://a", "amqp://a"]'),
        12,
        "route[1].upstream",
        "'amqp://a' is named twice",
        id="upstream-named-twice",
    ),
    pytest.param(
        replace(
            'upstream = "amqp://127.0.0.1:25672"',
            'upstream = [\n    "amqp://a",\n    "http://b",\n]',
        ),
        12,  # an array's items are on their key's line (or near it)
        "route[1].upstream[2]",
        "'http://b' is not an amqp:// or amqps:// URL",
        id="upstream-replica-not-amqp",
    ),
    pytest.param(
        replace(
            'upstream = "amqps://gw.org-o.example"',
            'upstream = ["amqps://gw.org-o.example", "amqp://b"]\nca = "ca.pem"',
        ),
        21,
        "route[2].ca",
        "only for an amqps:// upstream",
        id="ca-for-an-amqp-replica",
    ),
    pytest.param(
        replace('address = "audit.internal"', 'address = "audit.internal"\nca = "no-such-ca.pem"'),
        22,
        "route[2].ca",
        "no such file: ",
        id="ca-file-missing",
    ),
]


@pytest.mark.parametrize(("text", "line", "key", "problem"), REFUSALS)
def test_refusal_names_file_line_and_key(text: str, line: int, key: str, problem: str) -> None:
    message = refusal(text)
    assert message.startswith(f"gn.toml:{line}: {key}: "), message
    assert problem in message


def test_upstream_may_name_several_replicas() -> None:
    text = MINIMAL.replace('upstream = "amqp://h"', 'upstream = ["amqp://h:1", "amqp://h:2"]')
    (route,) = parse(text).routes
    assert route.upstream == ("amqp://h:1", "amqp://h:2")
    (one,) = parse(MINIMAL).routes
    assert one.upstream == ("amqp://h",)
    assert Route("a", "amqp://h", "b") == one  # one URL is a tuple of one in code too


def test_an_empty_password_is_refused() -> None:
    message = refusal(VALID, {**ENV, "GN_UP": ""})
    assert message == "gn.toml:15: route[1].password_env: environment variable GN_UP is empty"


def test_environ_defaults_to_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    config = parse_config(VALID)
    assert config.users == {"org-n-apps": "apps-secret", "ops": "ops-secret"}
    monkeypatch.delenv("GN_OPS_PASSWORD")
    with pytest.raises(ConfigError, match=r"^<config>:8: users\.ops\.password_env: .* not set$"):
        parse_config(VALID)


# -- files ---------------------------------------------------------------------------------------

TLS_CONFIG = """\
listen = "amqps://127.0.0.1:0"
[tls]
cert = "pki/server-chain.pem"
key = "pki/server-key.pem"
[[route]]
public = "billing"
upstream = "amqps://127.0.0.1:25672"
address = "billing"
ca = "pki/ca.pem"
"""


@pytest.fixture
def conf_dir(tmp_path: Path, tls_files: TlsFiles) -> Path:
    """A folder with ``gn.toml`` (TLS_CONFIG) and its PEM files under ``pki/``."""
    (tmp_path / "pki").mkdir()
    for pem in (tls_files.server_cert, tls_files.server_key, tls_files.ca_cert):
        shutil.copy(pem, tmp_path / "pki" / pem.name)
    (tmp_path / "gn.toml").write_text(TLS_CONFIG)
    return tmp_path


def test_relative_files_resolve_against_the_config_folder(
    conf_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir("/")
    config = load_config(conf_dir / "gn.toml", environ={})
    assert (config.tls_cert, config.tls_key) == (
        str(conf_dir / "pki/server-chain.pem"),
        str(conf_dir / "pki/server-key.pem"),
    )
    assert config.routes[0].ca == str(conf_dir / "pki/ca.pem")
    # parse_config resolves against `base`, else the current directory
    assert parse_config(TLS_CONFIG, base=conf_dir).tls_key == config.tls_key
    monkeypatch.chdir(conf_dir)
    assert parse_config(TLS_CONFIG).tls_key == config.tls_key


@pytest.mark.parametrize(
    ("swap", "line", "key", "problem"),
    [
        ("pki/server-key.pem", 4, "tls.key", "no such file: {dir}/pki/gone.pem"),
        ("pki/server-chain.pem", 3, "tls.cert", "no such file: {dir}/pki/gone.pem"),
        ("pki/ca.pem", 9, "route[1].ca", "no such file: {dir}/pki/gone.pem"),
    ],
)
def test_a_missing_file_is_refused(
    conf_dir: Path, swap: str, line: int, key: str, problem: str
) -> None:
    path = conf_dir / "gn.toml"
    path.write_text(TLS_CONFIG.replace(swap, "pki/gone.pem"))
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    assert str(caught.value) == f"{path}:{line}: {key}: {problem.format(dir=conf_dir)}"


def test_pem_files_that_do_not_load_are_refused(conf_dir: Path) -> None:
    path = conf_dir / "gn.toml"
    path.write_text(TLS_CONFIG.replace("pki/server-key.pem", "pki/ca.pem"))
    with pytest.raises(ConfigError, match=r":3: tls\.cert: cert and key do not load as a PEM pair"):
        load_config(path, environ={})
    path.write_text(TLS_CONFIG.replace('ca = "pki/ca.pem"', 'ca = "gn.toml"'))
    with pytest.raises(ConfigError, match=r":9: route\[1\]\.ca: no PEM CA certificates in "):
        load_config(path, environ={})


MTLS_USERS = """
[users]
"apps.org-n.example" = { certificate = true }
ops = { password_env = "GN_OPS_PASSWORD" }
"""


def test_certificate_users_and_the_client_ca_are_read(conf_dir: Path) -> None:
    text = TLS_CONFIG.replace(
        'address = "billing"\n', 'address = "billing"\nallow = ["apps.org-n.example"]\n'
    )
    text = text.replace(
        'key = "pki/server-key.pem"\n', 'key = "pki/server-key.pem"\nclient_ca = "pki/ca.pem"\n'
    )
    config = parse_config(text + MTLS_USERS, base=conf_dir, environ=ENV)
    assert config.tls_client_ca == str(conf_dir / "pki/ca.pem")
    assert config.certificate_users == {"apps.org-n.example"}
    assert config.users == {"ops": "ops-secret"}
    assert config.routes[0].allow == frozenset({"apps.org-n.example"})


@pytest.mark.parametrize(
    ("users", "key", "problem"),
    [
        (MTLS_USERS, 'users."apps.org-n.example".certificate', "needs [tls] client_ca"),
        (
            '[users]\nx = { certificate = "yes" }\n',
            "users.x.certificate",
            "certificate = true (a client certificate's user), or password_env",
        ),
    ],
)
def test_certificate_user_mistakes_are_refused(
    conf_dir: Path, users: str, key: str, problem: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(TLS_CONFIG + users, source="gn.toml", base=conf_dir, environ=ENV)
    assert f": {key}: {problem}" in str(caught.value)


def test_users_trusted_to_vouch_for_their_callers_are_read() -> None:
    text = replace("ops = { password_env", "ops = { vouches = true, password_env")
    assert parse(text).vouching_users == {"ops"}
    assert parse(VALID).vouching_users == frozenset()
    problem = refusal(replace("ops = { password_env", 'ops = { vouches = "yes", password_env'))
    assert problem.startswith("gn.toml:8: users.ops.vouches: vouches = true"), problem


def test_an_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path / "absent.toml")
    assert str(caught.value).startswith(f"{tmp_path}/absent.toml: cannot read the config: ")


# -- the line locator ------------------------------------------------------------------------


def test_key_lines_follow_tables_arrays_of_tables_and_multiline_values() -> None:
    text = '''\
top = 1
multi = """
fake = 1
"""
[a . "b.c"]
'x y' = [
  1, [2],
  "]",
]
after = 2
[[r]]
k = 1
[[r]]
k = 2
[r.sub]
k = 3
'''
    lines = KeyLines(text)
    assert lines.lines == {
        ("top",): 1,
        ("multi",): 2,
        ("a", "b.c"): 5,
        ("a", "b.c", "x y"): 6,
        ("a", "b.c", "after"): 10,
        ("r", 0): 11,
        ("r", 0, "k"): 12,
        ("r", 1): 13,
        ("r", 1, "k"): 14,
        ("r", 1, "sub"): 15,
        ("r", 1, "sub", "k"): 16,
    }
    assert lines.line(("r", 1, "missing")) == 13  # the table header
    assert lines.line(("nowhere",)) == 1
    array = ("a", "b.c", "x y")
    assert [lines.key_at(n) for n in (3, 8, 9, 17)] == [("multi",), array, array, ()]


def test_dotted_names_paths_as_messages_do() -> None:
    assert dotted(("route", 1, "upstream")) == "route[2].upstream"
    assert dotted(("users", "org n", "password_env")) == 'users."org n".password_env'
    assert dotted(()) == "(document)"


def test_the_example_configs_load() -> None:
    """examples/two_orgs: GN logs in to GO as org-n; GO routes to CO's internal address."""
    folder = Path(__file__).resolve().parents[2] / "examples" / "two_orgs"
    environ = {"GN_APPS_PASSWORD": "a", "GN_UPSTREAM_PASSWORD": "n", "GO_ORG_N_PASSWORD": "n"}
    gn = load_config(folder / "gn.toml", environ=environ)
    go = load_config(folder / "go.toml", environ=environ)
    assert gn == GatewayConfig(
        listen="amqp://127.0.0.1:25673",
        container_id="gn",
        users={"org-n-apps": "a"},
        routes=(
            Route(
                public="billing",
                upstream="amqp://127.0.0.1:25672",
                address="billing",
                user="org-n",
                password="n",
                allow=frozenset({"org-n-apps"}),
            ),
        ),
    )
    assert go == GatewayConfig(
        listen="amqp://127.0.0.1:25672",
        container_id="go",
        users={"org-n": "n"},
        routes=(
            Route(
                public="billing",
                upstream="amqp://127.0.0.1:25671",
                address="billing.internal",
                allow=frozenset({"org-n"}),
            ),
        ),
    )
