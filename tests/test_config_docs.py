"""docs/configuration.md is what ``python -m learner.tools.config_docs`` writes from the
dataclasses and the registered agents' options."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

from learner.agents.registry import agent_sections
from seedrl.config import OPTIONS, ActorConfig, LearnerConfig
from seedrl.config_docs import COMMAND, render
from seedrl.conformance.config import ActorSuiteConfig, LearnerSuiteConfig

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "configuration.md"


def test_configuration_page_is_current() -> None:
    assert PAGE.read_text() == render(), f"docs/configuration.md is stale: run `{COMMAND}`"


def test_the_command_in_the_header_writes_the_page() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "learner.tools.config_docs"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert out == render()
    assert COMMAND in out.splitlines()[2]


def test_every_field_has_a_row_with_its_docstring() -> None:
    page = render()
    configs = (LearnerConfig, ActorConfig, ActorSuiteConfig, LearnerSuiteConfig)
    for cls in (*configs, *agent_sections().values()):
        for field in dataclasses.fields(cls):
            if field.metadata.get(OPTIONS):
                continue
            flag = "--" + field.name.rstrip("_").replace("_", "-")
            rows = [line for line in page.splitlines() if line.startswith(f"| `{flag}")]
            assert rows, f"no row for {flag}"
            assert len(rows[0].split(" | ")[-1]) > len(" |"), f"{flag} has no meaning"
    assert "| `--lstm` / `--no-lstm` | off |" in page
    assert "| `--hidden-sizes HIDDEN_SIZES` | `64,64` |" in page
    assert "### Serving" in page
    assert "### Agent: r2d2 (`--agent r2d2`)" in page
    model, vtrace, training = (
        page.index(t) for t in ("### Model", "### Agent: vtrace", "### Training")
    )
    assert model < vtrace < training, "an agent's knobs follow --agent's section"
