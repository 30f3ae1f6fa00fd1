"""docker-compose.yml (for users with Docker) only runs commands that exist in the CLI."""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from duetime.cli import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[2]


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
