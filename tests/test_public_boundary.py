"""The public boundary, drawn as trio draws it: a few public modules re-export the API, every
other module sits under an underscored name, and the wheel installs ``pairlink`` alone.

``PUBLIC`` is the whole public API. A name that appears or disappears fails here until this
file changes with it: a change to the API is a decision, made in review, never a side effect.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import pkgutil
import subprocess
import sys
import tomllib
import types
import zipfile
from pathlib import Path

import pytest

import pairlink
from tests.test_readme import PYTHON

ROOT = Path(__file__).resolve().parents[1]

PUBLIC: dict[str, set[str]] = {
    "pairlink": {
        "AuthenticationError",
        "CallContext",
        "CallError",
        "Client",
        "ConfigError",
        "ConnectionLostError",
        "Limits",
        "LinkDetachedError",
        "MessageTooLargeError",
        "Middleware",
        "PairlinkError",
        "PayloadError",
        "Proceed",
        "RemoteError",
        "RemoteTimeoutError",
        "Reply",
        "Server",
        "ServiceProxy",
        "TraceContext",
        "__version__",
        "connect",
        "current_call",
        "current_trace",
        "handler",
        "hosted",
        "in_call",
        "open_server",
        "remote",
        "serve",
        "service",
        "use_trace",
    },
    "pairlink.client": {
        "DRAINING",
        "SERVING",
        "Client",
        "Header",
        "Message",
        "Properties",
        "Replica",
        "Reply",
        "ServiceProxy",
        "check_health",
        "connect",
    },
    "pairlink.blocking": {"Client", "ServiceProxy", "connect"},
    "pairlink.errors": {
        "AuthenticationError",
        "CallError",
        "ConfigError",
        "ConnectionLostError",
        "LinkDetachedError",
        "MessageTooLargeError",
        "MetricsUnavailable",
        "PairlinkError",
        "PayloadError",
        "RemoteError",
        "RemoteTimeoutError",
    },
    "pairlink.gateway": {
        "Gateway",
        "GatewayConfig",
        "Route",
        "load_config",
        "open_gateway",
        "parse_config",
        "run_gateway",
    },
    "pairlink.spark": {
        "ERROR_COLUMN",
        "Progress",
        "call_partitions",
        "call_service",
        "local_session",
        "register_function",
        "serve_in_thread",
    },
    "pairlink.testing": {"connect_in_memory", "serve_in_memory", "wall_clock"},
}
"""Every public module and the names it exports."""


def _all_modules() -> list[str]:
    found = ["pairlink"]
    for info in pkgutil.walk_packages(pairlink.__path__, "pairlink."):
        found.append(info.name)
    return found


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_a_public_module_exports_exactly_its_listed_names(name: str) -> None:
    module = importlib.import_module(name)
    assert set(module.__all__) == PUBLIC[name]
    for export in module.__all__:
        assert hasattr(module, export), f"{name}.{export} is in __all__ but not defined"
    # pairlink's own helpers, defined or imported here without an underscore, would be public
    # by accident (what the standard library or trio lends a module is theirs, not ours)
    stray = {
        attr
        for attr, value in vars(module).items()
        if not attr.startswith("_")
        and attr not in module.__all__
        and not isinstance(value, types.ModuleType)
        and getattr(value, "__module__", "").startswith("pairlink")
    }
    assert stray == set()


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_every_public_class_and_function_says_what_it_is_for(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__doc__
    undocumented = [
        export
        for export in module.__all__
        if (inspect.isclass(getattr(module, export)) or inspect.isroutine(getattr(module, export)))
        and not getattr(module, export).__doc__
    ]
    assert undocumented == []


def test_every_other_module_is_private() -> None:
    modules = _all_modules()
    public = [m for m in modules if not any(part.startswith("_") for part in m.split("."))]
    assert sorted(public) == sorted(PUBLIC)
    assert "pairlink._amqp.codec" in modules  # the walk reached the private layers


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_a_public_modules_docs_send_users_to_public_names_only(name: str) -> None:
    """What a user reads (a public module's docstring, and those of its exports) names no
    private module; ``pairlink``'s own docstring maps the private layers for engineers, after
    its "The private layers" line."""
    module = importlib.import_module(name)
    docs = [(module.__doc__ or "").split("The private layers")[0]]
    docs += [getattr(module, export).__doc__ or "" for export in module.__all__]
    assert [doc for doc in docs if "pairlink._" in doc] == []


def _imports(code: str) -> list[tuple[str, list[str]]]:
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
    return found


@pytest.mark.parametrize("block", PYTHON, ids=[block.name for block in PYTHON])
def test_a_readme_snippet_imports_only_public_names(block: object) -> None:
    code = block.code  # type: ignore[attr-defined]
    for module, names in _imports(code):
        if module.split(".")[0] != "pairlink":
            continue
        assert module in PUBLIC, f"{module} is not a public module"
        assert set(names) <= PUBLIC[module], f"{sorted(set(names) - PUBLIC[module])}"


@pytest.mark.timeout(180)
def test_the_wheel_installs_pairlink_alone_and_its_command_works(tmp_path: Path) -> None:
    """``pip install .`` puts one top-level package in site-packages, with its LICENSE and
    command; ``pairlink serve services.echo`` then imports the user's own ``services``."""
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(wheels), str(ROOT)],
        check=True, cwd=tmp_path,
    )  # fmt: skip
    (wheel,) = wheels.glob("*.whl")
    assert wheel.name.startswith("pairlink_amqp-")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        headers = archive.read(metadata).decode()
    top = {name.split("/")[0] for name in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"pairlink"}
    assert "pairlink/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "Name: pairlink-amqp\n" in headers
    assert "License-Expression: Apache-2.0\n" in headers
    assert "Classifier: Framework :: Trio\n" in headers
    assert any(n.endswith("entry_points.txt") for n in names)

    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site),
         str(wheel)],
        check=True,
    )  # fmt: skip
    # a user's project with its own services/ package, which an installed `services` shadowed
    project = tmp_path / "project"
    (project / "services").mkdir(parents=True)
    (project / "services" / "__init__.py").write_text("")
    (project / "services" / "mine.py").write_text(
        "from pairlink import handler, service\n\n\n"
        "@service('mine')\nclass Mine:\n"
        "    @handler\n    def hi(self) -> str:\n        return 'hi'\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    probe = subprocess.run(
        [sys.executable, "-c",
         "import pairlink, pairlink._cli as cli; print(pairlink.__file__); "
         "print([c.__name__ for c in cli._load('services.mine')])"],
        cwd=project, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    where, loaded = probe.stdout.splitlines()
    assert Path(where).is_relative_to(site)
    assert loaded == "['Mine']"
    command = subprocess.run(
        [str(site / "bin" / "pairlink"), "--help"],
        cwd=project, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "serve" in command.stdout
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    shown = subprocess.run(
        [str(site / "bin" / "pairlink"), "--version"],
        cwd=project, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert shown.stdout.strip() == f"pairlink {version}"
