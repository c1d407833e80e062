"""deploy/server.yaml, the shipped example of the server configuration: the real loader takes it, it states the
embedded defaults, it shows every key of the schema with a comment, and the systemd unit gives its SIGTERM
sequence (drain, grace, removal of the cancelled runs' sandboxes) the time it needs."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gateway.resources import load_schema
from gateway.service.config import ServerConfig, load_server_config, load_server_config_text

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
SHIPPED = DEPLOY / "server.yaml"
CANCELLED_RUNS_REMOVAL_S = 60  # Service.close: the wait for cancelled runs' sandboxes to be removed


def test_the_loader_takes_the_shipped_file_and_it_states_the_embedded_defaults() -> None:
    config = load_server_config(SHIPPED)
    assert config == ServerConfig()  # so the file changes nothing until edited, and its values are not stale
    assert config.source == str(SHIPPED)


def _keys(schema: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for name, sub in schema.get("properties", {}).items():
        yield prefix + name
        yield from _keys(sub, f"{prefix}{name}.")


def test_every_key_of_the_schema_is_in_the_file_with_a_comment_above_it() -> None:
    lines = SHIPPED.read_text().splitlines()
    found: dict[str, int] = {}
    parents: list[tuple[int, str]] = []
    for number, line in enumerate(lines):
        match = re.match(r"^(\s*)(?:# )?(\s*)([a-zA-Z_]+):(?: |$)", line)  # a key, or a key commented out
        if match is None:
            continue
        indent = len(match.group(1)) + len(match.group(2))
        while parents and parents[-1][0] >= indent:
            parents.pop()
        key = ".".join([*(name for _, name in parents), match.group(3)])
        parents.append((indent, match.group(3)))
        found.setdefault(key, number)
    schema_keys = set(_keys(load_schema("server")))
    assert schema_keys <= set(found), f"keys of the schema not shown in {SHIPPED}: {sorted(schema_keys - set(found))}"
    for key in schema_keys:
        number = found[key]
        assert lines[number - 1].lstrip().startswith("#"), f"{key} (line {number + 1}) has no comment above it"


def _unit_seconds(key: str) -> float:
    for line in (DEPLOY / "agent-gateway.service").read_text().splitlines():
        if line.startswith(f"{key}="):
            return float(line.split("=", 1)[1])
    raise AssertionError(f"{key}= is not in the unit")


def test_the_unit_waits_long_enough_for_the_drain_the_grace_and_the_removals() -> None:
    config = load_server_config(SHIPPED)
    assert _unit_seconds("TimeoutStopSec") >= config.drain_s + config.grace_s + CANCELLED_RUNS_REMOVAL_S


def test_the_readme_shows_an_excerpt_of_the_shipped_file() -> None:
    readme = (DEPLOY.parent / "README.md").read_text()
    (excerpt,) = (b for b in re.findall(r"```yaml\n(.*?)```", readme, re.DOTALL) if "kind: ServerConfig" in b)
    assert load_server_config_text(excerpt) == ServerConfig()
    shipped = SHIPPED.read_text().splitlines()
    settings = [line for line in excerpt.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert [line for line in settings if line not in shipped] == []
