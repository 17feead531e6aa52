"""A plain env id that a plugin package registers on import (highway-env's
``highway-fast-v0``) says how to load it: ``PKG:EnvId`` on the learner, ``--allow-env-module
PKG`` on the actors. The plugin here is a tiny package the test writes to disk."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import gymnasium as gym
import pytest

from seedrl import envs
from seedrl.envs import plugins
from tests.support import ROOT

ENV_ID = "TinyPlug-v0"
PACKAGE = "tinyplug"
REGISTERS = f"""
import gymnasium

gymnasium.register(id="{ENV_ID}", entry_point="gymnasium.envs.classic_control:CartPoleEnv")
"""


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    """A folder on sys.path holding the package; it registers ENV_ID only when imported."""
    (tmp_path / PACKAGE).mkdir()
    (tmp_path / PACKAGE / "__init__.py").write_text(REGISTERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield tmp_path
    gym.registry.pop(ENV_ID, None)
    sys.modules.pop(PACKAGE, None)


def _install_metadata(folder):
    """What pip leaves beside an installed package: its name, what it requires, its files."""
    info = folder / f"{PACKAGE}-0.1.dist-info"
    info.mkdir()
    info.joinpath("METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: 0.1\nRequires-Dist: gymnasium\n"
    )
    info.joinpath("top_level.txt").write_text(f"{PACKAGE}\n")
    info.joinpath("RECORD").write_text(f"{PACKAGE}/__init__.py,,\n")


def test_an_installed_plugins_id_names_its_package_and_the_actors_flag(plugin_dir):
    _install_metadata(plugin_dir)
    with pytest.raises(envs.EnvError) as exc:
        envs.make_env(ENV_ID)
    message = str(exc.value)
    assert len(message.splitlines()) == 1, message
    assert f"--env {PACKAGE}:{ENV_ID}" in message
    assert f"--allow-env-module {PACKAGE}" in message
    assert PACKAGE not in sys.modules  # found without running the plugin's code
    # The form the message names builds the env.
    env = envs.make_env(f"{PACKAGE}:{ENV_ID}")
    env.close()


def test_an_unknown_id_of_no_installed_plugin_names_the_form(plugin_dir):
    """Without package metadata the plugin is not found: the hint names the form."""
    assert plugins.registering_package(ENV_ID) is None
    with pytest.raises(envs.EnvError) as exc:
        envs.make_vector_env(ENV_ID, {}, 2)  # the actors' path says the same
    assert f"--env PKG:{ENV_ID}" in str(exc.value)
    assert "--allow-env-module PKG" in str(exc.value)


def test_the_learner_refuses_a_plugins_plain_id_in_one_line(plugin_dir):
    _install_metadata(plugin_dir)
    path = os.pathsep.join([str(plugin_dir), str(ROOT)])
    done = subprocess.run(
        [sys.executable, "-m", "learner", "--env", ENV_ID, "--port", "0",
         "--logdir", str(plugin_dir / "run")],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"--env {PACKAGE}:{ENV_ID}" in lines[0]
    assert f"--allow-env-module {PACKAGE}" in lines[0]
    assert not (plugin_dir / "run").exists()
