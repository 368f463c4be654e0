"""The Kubernetes manifests of ``examples/kubernetes/`` say what pairlink does: every
``pairlink`` command in them parses with the real command line, the gateway's config loads with
the real reader, and the names, ports and grace periods agree with each other and with serve.
"""

from __future__ import annotations

import inspect
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import trustme
import yaml

from pairlink._cli import build_parser
from pairlink._gateway.config import load_config
from pairlink._server.serving import open_server
from pairlink._server.workers import STOP_MARGIN

HERE = Path(__file__).parent.parent / "examples" / "kubernetes"


def documents(name: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load_all((HERE / name).read_text()))


def of_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def commands(container: dict[str, Any]) -> Iterator[list[str]]:
    """The container's command and its exec probes' commands."""
    yield container["command"]
    for probe in ("readinessProbe", "livenessProbe"):
        if "exec" in container.get(probe, {}):
            yield container[probe]["exec"]["command"]


def option(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


@pytest.mark.parametrize("name", ["service.yaml", "gateway.yaml"])
def test_every_pairlink_command_in_the_manifests_parses(name: str) -> None:
    deployment = of_kind(documents(name), "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    for command in commands(container):
        assert command[0] == "pairlink"
        build_parser().parse_args(command[1:])  # exits (SystemExit) on anything it refuses


def test_the_service_manifest_agrees_with_serve() -> None:
    docs = documents("service.yaml")
    headless, deployment = of_kind(docs, "Service"), of_kind(docs, "Deployment")
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    serve = container["command"]
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"] == pod["metadata"]["labels"]
    port = urlsplit(option(serve, "--listen")).port
    service_ports = {p["port"] for p in headless["spec"]["ports"]}
    assert port in service_ports
    # worker i serves its metrics on PORT + i: each of them is exposed
    metrics = int(option(serve, "--metrics-listen").rsplit(":", 1)[1])
    workers = int(option(serve, "--workers"))
    assert {metrics + i for i in range(workers)} <= service_ports
    container_ports = {p["containerPort"] for p in container["ports"]}
    assert {port, *(metrics + i for i in range(workers))} <= container_ports
    for probe in ("readinessProbe", "livenessProbe"):
        url = container[probe]["exec"]["command"][-1]
        assert urlsplit(url).port == port
    # SIGTERM drains within serve's grace, the supervisor waits STOP_MARGIN more: Kubernetes
    # must not SIGKILL before that
    grace = inspect.signature(open_server).parameters["grace"].default
    assert pod["spec"]["terminationGracePeriodSeconds"] >= grace + STOP_MARGIN
    # the served module is a real one
    assert (Path(__file__).parent.parent / "services" / "enrich.py").exists()
    assert serve[-1] == "services.enrich"


def test_the_gateway_config_loads_and_routes_to_the_headless_service(tmp_path: Path) -> None:
    shutil.copy(HERE / "gateway.toml", tmp_path / "gateway.toml")
    cert = trustme.CA().issue_cert("enrich.partner.example")
    cert.private_key_and_cert_chain_pem.write_to_path(tmp_path / "tls.crt")
    cert.private_key_pem.write_to_path(tmp_path / "tls.key")
    config = load_config(tmp_path / "gateway.toml", environ={"PARTNER_PASSWORD": "secret"})
    (route,) = config.routes
    headless = of_kind(documents("service.yaml"), "Service")
    (upstream_url,) = route.upstream
    upstream = urlsplit(upstream_url)
    assert upstream.hostname == f"{headless['metadata']['name']}.default.svc.cluster.local"
    assert upstream.port in {p["port"] for p in headless["spec"]["ports"]}
    # the Deployment mounts the file where its command reads it, with the Secret's variable
    deployment = of_kind(documents("gateway.yaml"), "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    mount = container["volumeMounts"][0]["mountPath"]
    assert option(container["command"], "--config") == f"{mount}/gateway.toml"
    assert {e["name"] for e in container["env"]} == {"PARTNER_PASSWORD"}
    service = of_kind(documents("gateway.yaml"), "Service")
    listen = urlsplit(config.listen)
    assert [p["port"] for p in service["spec"]["ports"]] == [listen.port]
