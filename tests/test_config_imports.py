"""Parsing the learner's config, ``python -m learner --help`` and the serving tier's
frontend module import no torch: the frontend processes and every command line parse the
config, and torch costs them seconds and a couple of hundred MB. The agent packages keep
their torch classes in ``<name>/agent.py`` and the registry names them lazily. Each check
runs in a fresh interpreter, since this one has torch loaded already."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support import ROOT

import learner  # noqa: F401  (registers the agents)
from learner.agents.registry import AGENTS, Lazy

TIMEOUT_S = 120.0


def run_python(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S
    )


PARSE = """
import sys
import learner
from seedrl.cli import parse_config
from seedrl.config import LearnerConfig
config = parse_config(LearnerConfig, sys.argv[1:], "python -m learner", "", True)
assert config.agent == sys.argv[2], config.agent
print("torch" in sys.modules, sorted(m for m in sys.modules if m.startswith("learner.agents")))
"""


@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_parsing_a_config_of_each_agent_imports_no_torch(agent) -> None:
    done = run_python("-c", PARSE, "--agent", agent, "--env", "Pendulum-v1")
    assert done.returncode == 0, done.stderr
    loaded, agent_modules = done.stdout.split(" ", 1)
    assert loaded == "False", f"--agent {agent}: torch loaded with {agent_modules}"


def test_learner_help_imports_no_torch() -> None:
    """``-X importtime`` names every module imported, one per line, on stderr."""
    done = run_python("-X", "importtime", "-m", "learner", "--agent", "sac", "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--policy-frequency" in done.stdout  # the agent's section was asked for
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
    assert "learner.agents.registry" in imported
    assert "torch" not in imported, sorted(m for m in imported if m.startswith("learner"))


def test_the_serving_tiers_frontend_imports_no_torch() -> None:
    """Each ``--serving-processes`` frontend imports this module and nothing of torch: only
    the model process runs the policy."""
    done = run_python("-c", "import sys, learner.serving.frontend; print('torch' in sys.modules)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False", "torch loaded (-X importtime names the chain)"


def test_each_lazy_factory_names_the_agent_registered_under_its_name() -> None:
    """The table's keys are written out (the classes are not imported to read them): each
    must be the ``name`` of the agent its factory builds."""
    for name, entry in AGENTS.items():
        factory = entry.factory
        assert isinstance(factory, Lazy), name
        assert factory.resolve().name == name
