"""docs/flags.md is what `python -m gateway.reference` generates from the parsers, and lists
every flag of the gateway and the agent with its default and its variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway import reference
from gateway.agent.config import AgentConfig
from gateway.hub.config import GatewayConfig
from gateway.ops.settings import flags_of

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "flags.md"


def test_the_flag_reference_is_current() -> None:
    assert DOC.read_text(encoding="utf-8") == reference.render(), (
        "docs/flags.md is stale: run python -m gateway.reference --write docs/flags.md")


@pytest.mark.parametrize(("command", "config"), [("gateway", GatewayConfig),
                                                 ("agent", AgentConfig)])
def test_each_flag_has_a_row_with_its_default_and_variable(command: str, config: type) -> None:
    text = DOC.read_text(encoding="utf-8")
    section = text.split(f"## `hubproxy {command}`\n", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("`")[1].split()[0].rstrip(","): line
            for line in section.splitlines() if line.startswith("| `--")}
    for setting in flags_of(config):
        row = rows[setting.option]
        assert f"`{setting.env}`" in row
        shown = setting.shown_default
        default = "required" if setting.flag.required else f"`{shown}`" if shown else ""
        assert f"| {default} |" in row, row


def test_the_readme_points_at_the_reference() -> None:
    assert "docs/flags.md" in (ROOT / "README.md").read_text(encoding="utf-8")
