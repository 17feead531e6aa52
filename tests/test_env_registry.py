"""The env-family registry is the one place that knows families: ids go to the family that
owns them, each entry's extra, preset and docs row exist, and nothing else tests prefixes."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
from support import ROOT, actor_args, running
from wire_clients import fake_learner

from seedrl import codec, envs
from seedrl.config import LearnerConfig
from seedrl.envs import custom, docs
from seedrl.envs.registry import FAMILIES
from seedrl.presets import load_preset, preset_names
from seedrl.proto import seedrl_pb2 as pb

CODE = ("seedrl", "learner", "actors", "benchmarks", "tests")
"""Where a test of an id's family could hide."""
BUILDS = {
    "one env": envs.make_env,
    "actors' vector env": lambda env_id: envs.make_vector_env(env_id, {}, 2),
    "learner's spaces": envs.describe_env,
}
"""Every way seedrl builds an env from an id alone."""


def _extras() -> dict[str, list[str]]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["optional-dependencies"]


def _distribution(requirement: str) -> str:
    """``ale-py>=0.11`` -> ``ale-py``."""
    name = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert name, requirement
    return name.group(0).lower().replace("_", "-")


@pytest.mark.parametrize(
    ("env_id", "family"),
    [
        ("ALE/Pong-v5", "atari"),
        ("MinAtar/Breakout-v1", "minatar"),
        ("mpe2.simple_spread_v3", "mpe"),
        ("MiniGrid-DoorKey-5x5-v0", "minigrid"),
        ("my_package.envs:make_env", "custom"),
        ("gymnasium.envs.classic_control:CartPole-v1", "custom"),  # gymnasium's module form
        ("HalfCheetah-v5", "mujoco"),
        ("Humanoid-v5", "mujoco"),
        ("Hopper-v4", "mujoco"),  # read off gymnasium's registration, not a list of names
        ("CartPole-v1", "gymnasium"),
        ("Pong-v5", "gymnasium"),  # no ALE/ namespace: not the preprocessed family
        (":no-module", "gymnasium"),
    ],
)
def test_an_id_goes_to_the_family_that_owns_it(env_id, family):
    assert envs.family_of(env_id).name == family


def test_the_table_is_well_formed():
    names = [f.name for f in FAMILIES]
    assert len(set(names)) == len(names)
    assert FAMILIES[-1].owns("anything at all"), "the last family is the catch-all"
    for i, family in enumerate(FAMILIES):
        assert envs.family_of(family.example) is family, f"{family.name}: example not its own"
        for earlier in FAMILIES[:i]:
            assert not earlier.owns(family.example), f"{earlier.name} shadows {family.name}"
        assert envs.family_named(family.name) is family
    with pytest.raises(ValueError, match="known: atari"):
        envs.family_named("nes")


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_every_extra_is_in_pyproject_and_installs_the_module_the_family_imports(family):
    if family.extra is None:
        return
    extras = _extras()
    assert family.extra in extras, f"pyproject.toml has no [{family.extra}] extra"
    provided = {_distribution(r) for r in extras[family.extra]}
    assert family.requires is not None
    top_level = family.requires.split(".")[0].replace("_", "-")
    assert top_level in provided, f"[{family.extra}] installs {provided}, not {top_level}"
    # CI tests every family, so the dev extra carries each family's packages too.
    assert provided <= {_distribution(r) for r in extras["dev"]}


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_every_preset_named_ships_and_trains_on_an_env_of_its_family(family):
    if family.preset is None:
        return
    assert family.preset in preset_names(), f"{family.name}: no preset {family.preset!r}"
    env = load_preset(family.preset).get("env", LearnerConfig.env)
    assert envs.family_of(env) is family, f"preset {family.preset} trains on {env}"


def _batched(space, obs):  # type: ignore[no-untyped-def]
    """Two envs' observations as one array: a dict/tuple's leaves packed (each leaf's
    shape checked by the packing), a leaf space's as they are."""
    if not codec.is_structured(space):
        return obs
    packing = codec.LeafPacking(codec.space_leaves(space))
    return packing.pack_values([np.asarray(v) for v in codec.flatten_values(space, obs)])


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_every_family_builds_its_example_alone_and_as_actors_step_it(family):
    if family.requires:
        pytest.importorskip(family.requires)
    spec = envs.describe_env(family.example)
    shape = tuple(spec.observation_space.shape)
    stack = envs.frame_stack(family.example, {})
    assert (stack > 1) == (family.frame_stack is not None)
    assert stack == 1 or shape[0] == stack
    vec = envs.make_vector_env(family.example, {}, 2)
    try:
        assert vec.metadata["autoreset_mode"] == envs.gym.vector.AutoresetMode.NEXT_STEP
        space = spec.observation_space
        if codec.is_structured(space):  # a dict family's leaves, packed as the learner does
            shape = (codec.LeafPacking(codec.space_leaves(space)).row_bytes,)
        rows = 2 * codec.rows_per_env(spec)  # a multi-agent env: a row per agent
        obs = _batched(space, vec.reset(seed=0)[0])
        assert obs.shape == (rows, *shape)
        # A family that declares stacking keeps the rule the learner rebuilds stacks by:
        # an episode starts as zeros but its newest frame, and each step shifts by one.
        assert stack == 1 or not obs[:, :-1].any()
        for _ in range(3):  # too few steps for any example's episode to end
            prev = obs.copy()
            actions = (  # all zeros is a valid action of a Discrete or a Box
                np.zeros((rows, *spec.action_space.shape), np.float32)
                if spec.action_space.kind == "box"
                else np.zeros(rows, np.int64)
            )
            raw, reward, terminated, truncated, _ = vec.step(actions)
            obs = _batched(space, raw)
            assert obs.shape == (rows, *shape) and reward.shape == (rows,)
            assert not (terminated | truncated).any()
            if stack > 1:
                np.testing.assert_array_equal(obs[:, :-1], prev[:, 1:])
    finally:
        vec.close()


def test_evaluation_forces_only_what_the_family_says():
    trained = {"episodic_life": True, "noop_max": 0}
    atari_eval = envs.evaluation_kwargs("ALE/Pong-v5", trained)
    assert atari_eval == {"episodic_life": False, "noop_max": 0}
    assert trained["episodic_life"] is True, "the run's own kwargs stay as they were"
    assert envs.evaluation_kwargs("CartPole-v1", {"sutton_barto_reward": True}) == {
        "sutton_barto_reward": True
    }


def test_a_missing_extra_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "ale_py", None)  # as if ale-py were not installed
    with pytest.raises(envs.EnvError, match=re.escape("pip install 'seedrl[atari]'")):
        envs.make_env("ALE/Pong-v5")
    with pytest.raises(envs.EnvError, match=re.escape("pip install 'seedrl[atari]'")):
        envs.frame_stack("ALE/Pong-v5", {})
    # gymnasium registers its MuJoCo ids without mujoco: the family still names the extra
    monkeypatch.setitem(sys.modules, "mujoco", None)
    for build in BUILDS.values():
        with pytest.raises(envs.EnvError, match=re.escape("pip install 'seedrl[mujoco]'")):
            build("Hopper-v5")


@pytest.mark.parametrize(
    ("env_id", "message"),
    [
        ("seedrl_no_such_module:make", "cannot import module 'seedrl_no_such_module'"),
        ("os:sep", "'sep' in module 'os' is not callable"),
        ("os:getcwd", "the factory returned str, not a gymnasium Env"),
        ("os:no_such_env", "module 'os' has no callable 'no_such_env' and registers no"),
        ("NoSuchEnv-v0", "NoSuchEnv-v0: Environment `NoSuchEnv` doesn't exist"),
    ],
)
def test_an_env_this_host_cannot_build_is_one_clear_error(env_id, message):
    for build in BUILDS.values():
        with pytest.raises(envs.EnvError, match=re.escape(message)) as caught:
            build(env_id)
        assert "\n" not in str(caught.value)


def test_the_learner_refuses_an_unknown_module_id_in_one_line(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "learner", "--env", "seedrl_no_such_module:make",
         "--logdir", str(tmp_path), "--progress", "off"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert run.stderr.splitlines() == [
        "python -m learner: error: --env seedrl_no_such_module:make: cannot import module "
        "'seedrl_no_such_module' (No module named 'seedrl_no_such_module')"
    ]


def test_an_actor_told_an_env_it_cannot_build_exits_2_in_one_line():
    """A host without the env's package (or a learner naming an unknown id): the stock
    actor says which env and why once, and the launcher does not restart it."""
    with fake_learner() as (fake, port):
        fake.env = pb.EnvSpec(env_id="NoSuchEnv-v0", env_kwargs_json="{}")
        with running(actor_args(port, 1, 1)) as actor:
            assert actor.wait(60) == 2, actor.output()
        said = [line for line in actor.lines if "NoSuchEnv-v0: Environment" in line]
        assert len(said) == 1 and "Traceback" not in actor.output(), actor.output()
        assert fake.hellos == []


def test_every_module_id_is_resolved_in_one_function(monkeypatch):
    """Whether a host may import the module an id names is decided in resolve_factory alone,
    so every way of building a ``module:`` env must pass through it."""

    def refuse(env_id):
        raise envs.EnvError(f"{env_id}: refused")

    monkeypatch.setattr(custom, "resolve_factory", refuse)
    for env_id in (custom.FAMILY.example, "gymnasium.envs.classic_control:CartPole-v1"):
        for way, build in BUILDS.items():
            with pytest.raises(envs.EnvError, match="refused"):
                build(env_id)
                pytest.fail(f"{way} built {env_id} without resolve_factory")


def test_gymnasiums_module_form_still_builds():
    spec = envs.describe_env("gymnasium.envs.classic_control:CartPole-v1")
    assert tuple(spec.observation_space.shape) == (4,)


def test_no_module_outside_a_family_tests_its_prefix():
    for family in FAMILIES:
        if not family.prefix:
            continue
        own = Path(sys.modules[family.make.__module__].__file__ or "")
        literal = re.compile(rf"""["']{re.escape(family.prefix)}["']""")
        for package in CODE:
            for path in sorted((ROOT / package).rglob("*.py")):
                if path == own:
                    continue
                for n, line in enumerate(path.read_text().splitlines(), 1):
                    assert not literal.search(line), (
                        f"{path.relative_to(ROOT)}:{n} tests the {family.prefix} prefix: "
                        f"ask seedrl.envs.family_of instead"
                    )


def test_the_docs_table_is_the_registry():
    page = (ROOT / "docs" / "usage.md").read_text()
    assert docs.update_page(page, docs.render()) == page, f"run `{docs.COMMAND}`"
    for family in FAMILIES:
        assert f"| {family.title} |" in page


def test_an_entry_states_how_it_matches_once():
    atari = envs.family_named("atari")
    with pytest.raises(ValueError, match="exactly one of prefix and matches"):
        dataclasses.replace(atari, matches=lambda env_id: True)
    with pytest.raises(ValueError, match="an extra and the module"):
        dataclasses.replace(atari, requires=None)
