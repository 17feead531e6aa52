"""Every command a user types answers ``--help`` with text that names its flags."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support import ROOT

COMMANDS = {
    "learner": (["-m", "learner"], "--inference-batch-size"),
    "actor": (["-m", "actors.actor"], "--env-groups"),
    "launcher": (["-m", "actors"], "--num-actors"),
    "demo": (["-m", "learner", "demo"], "--envs-per-actor"),
    "evaluate": (["-m", "learner", "evaluate"], "--episodes"),
    "plot": (["-m", "learner", "plot"], "--out"),
    "healthcheck": (["-m", "learner", "healthcheck"], "--address"),
    "bench": (["-m", "learner.bench"], "--sweep"),
    "echo": (["-m", "learner.echo"], "--port"),
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_lists_the_flags(name):
    args, expected_flag = COMMANDS[name]
    done = subprocess.run(
        [sys.executable, *args, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert expected_flag in done.stdout
    assert "Traceback" not in done.stderr
