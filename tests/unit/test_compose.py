"""docker-compose.yml (for users with Docker, which this machine has not: the file is checked
by reading it) only runs commands that exist in the CLI, every role serves metrics where the
compose Prometheus scrapes it, and Grafana is provisioned with the dashboard."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import yaml

from duetime.cli import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "infra" / "prometheus"
# the long-running roles: each exports metrics and must be scraped
ROLES = {"scheduler", "worker", "resolver", "projector", "api"}


def _compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return loaded


def _mounts(service: dict[str, Any]) -> dict[str, Path]:
    """container path -> host path (relative to the repository) of a service's bind mounts."""
    out = {}
    for volume in service.get("volumes", []):
        host, container, *_ = str(volume).split(":")
        out[container] = (ROOT / host).resolve()
    return out


def _host_file(service: dict[str, Any], container_path: str) -> Path:
    """The repository file a container sees at ``container_path`` (through a file or folder
    mount); fails the test when nothing is mounted there."""
    for container, host in _mounts(service).items():
        if container_path == container:
            return host
        if container_path.startswith(container.rstrip("/") + "/"):
            return host / container_path[len(container.rstrip("/")) + 1 :]
    raise AssertionError(f"nothing is mounted at {container_path}")


def _duetime_commands(command: object) -> list[list[str]]:
    if isinstance(command, list):
        if command[:2] == ["sh", "-c"]:
            return _duetime_commands(command[2])
        return [command] if command and command[0] == "duetime" else []
    if isinstance(command, str):
        found = []
        for part in command.split("&&"):
            words = shlex.split(part)
            if words and words[0] == "duetime":
                found.append(words)
        return found
    return []


def test_every_compose_command_exists_in_the_cli() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    parser = build_parser()
    seen = 0
    for name, service in compose["services"].items():
        for words in _duetime_commands(service.get("command")):
            seen += 1
            assert words[1] in COMMANDS, f"service {name}: unknown command {words[1]!r}"
            parser.parse_args(words[1:])  # exits (fails the test) on unknown arguments
    assert seen >= 1


def test_every_service_binds_loopback_only() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"


def test_every_role_runs_and_serves_metrics_beyond_loopback() -> None:
    services = _compose()["services"]
    running = {
        words[1]
        for service in services.values()
        for words in _duetime_commands(service.get("command"))
    }
    assert running >= ROLES
    for name in ROLES:
        env = services[name]["environment"]
        assert int(env["DUETIME_METRICS_PORT"]) > 0, name
        # the default (127.0.0.1) would be unreachable from the prometheus container
        assert env["DUETIME_METRICS_HOST"] == "0.0.0.0", name


def test_prometheus_scrapes_every_role_on_its_metrics_port() -> None:
    services = _compose()["services"]
    prometheus = services["prometheus"]
    flags = [w for w in prometheus["command"] if w.startswith("--config.file=")]
    config_file = _host_file(prometheus, flags[0].split("=", 1)[1])
    config = yaml.safe_load(config_file.read_text())
    for rules in config["rule_files"]:
        assert (config_file.parent / rules).is_file(), rules
    scraped: dict[str, int] = {}
    for job in config["scrape_configs"]:
        for sd in job.get("dns_sd_configs", []):
            assert sd["type"] == "A"  # one record per replica: every replica is scraped
            scraped |= dict.fromkeys(sd["names"], int(sd["port"]))
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                host, port = target.rsplit(":", 1)
                scraped[host] = int(port)
    for name in ROLES:
        assert scraped.get(name) == int(services[name]["environment"]["DUETIME_METRICS_PORT"]), (
            f"{name} is not scraped on the port it serves"
        )


def test_grafana_is_provisioned_with_the_dashboard_and_the_compose_prometheus() -> None:
    services = _compose()["services"]
    grafana = services["grafana"]
    sources = yaml.safe_load(
        _host_file(grafana, "/etc/grafana/provisioning/datasources/duetime.yml").read_text()
    )["datasources"]
    (default,) = [d for d in sources if d.get("isDefault")]
    assert default["type"] == "prometheus"
    host_port = default["url"].removeprefix("http://")
    host, port = host_port.split(":")
    assert host == "prometheus" and host in services
    assert any(str(p).endswith(f":{port}") for p in services["prometheus"]["ports"])
    providers = yaml.safe_load(
        _host_file(grafana, "/etc/grafana/provisioning/dashboards/duetime.yml").read_text()
    )["providers"]
    folder = providers[0]["options"]["path"]
    dashboard = _host_file(grafana, f"{folder}/grafana-dashboard.json")
    assert dashboard == (PROM / "grafana-dashboard.json").resolve()
    loaded = json.loads(dashboard.read_text())
    # the dashboard's data-source variable resolves to the provisioned Prometheus
    (variable,) = [v for v in loaded["templating"]["list"] if v["type"] == "datasource"]
    assert variable["query"] == default["type"]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert _host_file(grafana, home) == dashboard
