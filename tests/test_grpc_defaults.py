"""seedrl's gRPC core defaults are in the environment before any of our processes load grpc."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from seedrl.grpc_defaults import (
    DEFAULT_GRPC_EXPERIMENTS,
    GRPC_EXPERIMENTS_ENV,
    apply_grpc_core_defaults,
)

PROBE = (
    "import sys, os\n"
    "import {package}\n"
    "print('grpc_loaded_first', 'grpc' in sys.modules)\n"
    "print('experiments', repr(os.environ.get('GRPC_EXPERIMENTS')))\n"
)


def _probe(package: str, env_value: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != GRPC_EXPERIMENTS_ENV}
    if env_value is not None:
        env[GRPC_EXPERIMENTS_ENV] = env_value
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(package=package)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return dict(line.split(" ", 1) for line in out.splitlines())


@pytest.mark.parametrize("package", ["actors", "learner", "seedrl"])
def test_entry_packages_set_the_default_before_grpc_loads(package: str) -> None:
    found = _probe(package, None)
    assert found["grpc_loaded_first"] == "False"
    assert found["experiments"] == repr(DEFAULT_GRPC_EXPERIMENTS)


def test_a_users_setting_wins() -> None:
    assert _probe("actors", "")["experiments"] == repr("")
    assert _probe("learner", "-event_engine_listener")["experiments"] == repr(
        "-event_engine_listener"
    )


def test_apply_sets_only_when_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(GRPC_EXPERIMENTS_ENV, raising=False)
    apply_grpc_core_defaults()
    assert os.environ[GRPC_EXPERIMENTS_ENV] == DEFAULT_GRPC_EXPERIMENTS
    monkeypatch.setenv(GRPC_EXPERIMENTS_ENV, "-something_else")
    apply_grpc_core_defaults()
    assert os.environ[GRPC_EXPERIMENTS_ENV] == "-something_else"


def test_an_actor_on_the_default_streams_without_core_errors(tmp_path) -> None:
    """gRPC core logs unknown experiment names as errors; ours must be one it knows."""
    code = (
        "import actors.actor, grpc\n"
        "channel = grpc.insecure_channel('127.0.0.1:1')\n"
        "try:\n"
        "    grpc.channel_ready_future(channel).result(timeout=0.2)\n"
        "except grpc.FutureTimeoutError:\n"
        "    pass\n"
        "channel.close()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != GRPC_EXPERIMENTS_ENV}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "Unknown experiment" not in result.stderr
