"""The learner's config by sections: each agent's own knobs come from its package's
options class, through the registry, to the flags, ``--help``, config files and saved
configs, while ``config.<knob>`` and ``dataclasses.replace`` read and set them as fields."""

from __future__ import annotations

import dataclasses
import json
import pickle
import subprocess
import sys
from typing import ClassVar

import pytest
from support import ROOT

from learner.agents import registry
from seedrl.cli import parse_config
from seedrl.config import AgentOptions, LearnerConfig, require_range, to_json_dict
from seedrl.presets import build_config, load_preset, preset_names


def _exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        parse_config(LearnerConfig, argv, "prog", "test", presets=True)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    return err


def test_an_agents_knobs_read_and_replace_as_fields():
    config = LearnerConfig(agent="r2d2", epsilon=0.3, burn_in=10, sequence_overlap=10)
    assert (config.epsilon, config.burn_in, config.n_step) == (0.3, 10, 5)
    changed = config.with_changes(epsilon=0.2, seed=4)
    assert (changed.epsilon, changed.burn_in, changed.seed) == (0.2, 10, 4)
    assert dataclasses.replace(config, seed=4).epsilon == 0.3, "replace keeps the knobs"
    assert dataclasses.replace(config, epsilon=0.1).epsilon == 0.1  # type: ignore[call-arg]
    assert pickle.loads(pickle.dumps(config)) == config
    assert LearnerConfig().lambda_ == 1.0
    with pytest.raises(AttributeError, match="epsilon is a knob of --agent r2d2"):
        _ = LearnerConfig().epsilon
    assert not hasattr(LearnerConfig(), "burn_in")


def test_a_saved_config_is_flat_and_loads_back():
    config = LearnerConfig(agent="r2d2", epsilon=0.3, hidden_sizes=(32,))
    saved = to_json_dict(config)
    assert saved["epsilon"] == 0.3 and "agent_options" not in saved and "lambda_" not in saved
    assert build_config(LearnerConfig, {}, json.loads(json.dumps(saved))) == config


def test_an_old_flat_config_file_with_every_agents_knobs_still_loads(tmp_path):
    """Before the sections a config.json listed every knob of every agent; those of other
    agents at their defaults are dropped, any other value of theirs is refused."""
    old = {**to_json_dict(LearnerConfig(agent="r2d2")), **to_json_dict(LearnerConfig())}
    old.update(agent="r2d2", epsilon=0.25)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(old))
    config = parse_config(LearnerConfig, ["--config", str(path)], "prog", "test")
    assert (config.agent, config.epsilon) == ("r2d2", 0.25)
    path.write_text(json.dumps({**old, "lambda_": 0.5}))
    with pytest.raises(SystemExit):
        parse_config(LearnerConfig, ["--config", str(path)], "prog", "test")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--epsilon", "0.3"], "--epsilon is a knob of --agent r2d2, not of --agent vtrace"),
        (["--agent", "r2d2", "--mirror"], "--mirror is a knob of --agent vtrace, not of --agent"),
        (["--preset", "atari-r2d2", "--no-normalize-advantages"], "--normalize-advantages is"),
        (["--agent", "sarsa"], "--agent must be vtrace, r2d2 or sac, got 'sarsa'"),
    ],
)
def test_another_agents_knob_on_the_command_line_exits_2_naming_its_agent(argv, message, capsys):
    assert message in _exit_2(argv, capsys)


def test_another_agents_knob_in_a_config_file_exits_2_naming_its_agent(tmp_path, capsys):
    path = tmp_path / "run.toml"
    path.write_text('agent = "r2d2"\npolicy_clip = 0.2\n')
    assert "--policy-clip is a knob of --agent vtrace" in _exit_2(["--config", str(path)], capsys)


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_keeps_its_agents_knobs(name):
    values = load_preset(name)
    config = build_config(LearnerConfig, {}, values)
    for key, value in values.items():
        got = getattr(config, key)
        assert got == (tuple(value) if isinstance(value, list) else value), key


def test_help_shows_the_chosen_agents_knobs_only():
    def help_of(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "learner", *args, "--help"],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    vtrace, r2d2 = help_of(), help_of("--agent", "r2d2")
    assert "agent: vtrace (--agent vtrace):" in vtrace and "--burn-in" not in vtrace
    assert "agent: r2d2 (--agent r2d2):" in r2d2 and "--burn-in" in r2d2
    assert "--max-update-kl MAX" in vtrace and "--max-update-kl MAX" not in r2d2
    for section in ("run:", "model:", "training:", "serving:", "league (self-play"):
        assert f"\n{section}" in vtrace, section
    assert "--burn-in" in help_of("--preset", "classic-r2d2"), "a preset's agent counts"


@dataclasses.dataclass(frozen=True)
class ToyOptions(AgentOptions):
    """A toy agent: one knob."""

    replay: ClassVar[bool] = True
    toy_rate: float = 0.5
    """How fast the toy learns."""

    def check(self, config: LearnerConfig) -> None:
        require_range(self, ("toy_rate",), low=0, high=1)


def test_a_registry_entry_is_all_a_new_agent_needs(monkeypatch, capsys):
    """Its knobs become flags, checked by its options; its capabilities are asked."""
    toy = registry.Registered(registry.AGENTS["vtrace"].factory, ToyOptions)
    monkeypatch.setitem(registry.AGENTS, "toy", toy)
    argv = ["--agent", "toy", "--toy-rate", "0.25", "--batch-size", "64"]
    config = parse_config(LearnerConfig, [*argv, "--max-queue-unrolls", "8"], "prog", "test")
    assert config.toy_rate == 0.25, "a replay, so the unroll queue does not bound the batch"
    assert "--toy-rate must be in [0, 1]" in _exit_2(["--agent", "toy", "--toy-rate", "2"], capsys)
    assert "--toy-rate is a knob of --agent toy" in _exit_2(["--toy-rate", "0.1"], capsys)


def test_an_agent_without_continuous_actions_is_refused_a_box_by_its_capability(monkeypatch):
    """The registry asks the agent's options, not its name: a toy agent that says it
    takes no continuous actions is refused a Box before its factory runs."""
    import gymnasium as gym
    import torch

    from learner.common.spaces import UnsupportedSetup
    from seedrl import codec

    def factory(*args: object) -> None:
        raise AssertionError("the factory ran")

    class Discrete(ToyOptions):
        continuous_actions: ClassVar[bool] = False

    monkeypatch.setitem(registry.AGENTS, "toy", registry.Registered(factory, Discrete))  # type: ignore[arg-type]
    box = codec.space_to_spec(gym.spaces.Box(-1.0, 1.0, (2,)))
    with pytest.raises(UnsupportedSetup, match="--agent toy acts in discrete action spaces"):
        registry.make_agent(LearnerConfig(agent="toy"), box, torch.device("cpu"))
    with pytest.raises(UnsupportedSetup, match="use --agent sac or vtrace"):
        registry.make_agent(LearnerConfig(agent="r2d2"), box, torch.device("cpu"))


REPLAY_DEFAULTS = {
    # replay_min_frames, replay_ratio, priority_exponent, importance_exponent
    "r2d2": (20_000, 1.0, 0.9, 0.6),  # Ape-X's prioritized replay
    "sac": (5_000, 32.0, 0.0, 0.0),  # CleanRL's uniform replay at its update ratio
}


@pytest.mark.parametrize("agent", sorted(REPLAY_DEFAULTS))
def test_the_replay_knobs_are_one_section_each_agent_setting_its_defaults(agent):
    """R2D2 and SAC build on one declaration of the replay's knobs (their docstrings, their
    range checks) and keep their own defaults by redeclaring the values alone."""
    from learner.agents.config import ReplayOptions
    from seedrl.cli import field_docs, field_sections

    options = registry.AGENTS[agent].options
    assert issubclass(options, ReplayOptions) and options.replay
    config = LearnerConfig(agent=agent)
    differing = ("replay_min_frames", "replay_ratio", "priority_exponent", "importance_exponent")
    assert tuple(getattr(config, k) for k in differing) == REPLAY_DEFAULTS[agent]
    assert (config.replay_frames, config.replay_bytes, config.priority_eta) == (
        1_000_000, 8 * 1024**3, 0.9,
    )  # fmt: skip
    shared_docs, shared_sections = field_docs(ReplayOptions), field_sections(ReplayOptions)
    for f in dataclasses.fields(ReplayOptions):
        assert field_docs(options)[f.name] == shared_docs[f.name], f.name
        assert field_sections(options)[f.name] == shared_sections[f.name] != "", f.name
    with pytest.raises(ValueError, match="--priority-eta must be in"):
        LearnerConfig(agent=agent, priority_eta=1.5)


def test_help_and_docs_show_the_replay_section_after_the_agents_own_knobs():
    done = subprocess.run(
        [sys.executable, "-m", "learner", "--agent", "sac", "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout
    agent, own, replay, knob = (
        out.index(t)
        for t in (
            "\nagent: sac (--agent sac):",
            "  --target-smoothing",
            "\nreplay",
            "  --replay-ratio",
        )
    )
    assert agent < own < replay < knob < out.index("\ntraining:"), "replay follows the agent"
    page = (ROOT / "docs" / "configuration.md").read_text()
    r2d2 = page[page.index("### Agent: r2d2") : page.index("### Agent: sac")]
    assert (
        r2d2.index("`--epsilon-slots") < r2d2.index("#### Replay") < r2d2.index("`--replay-ratio")
    )


def test_the_shared_replay_section_imports_no_torch():
    code = "import sys, learner.agents.config; assert 'torch' not in sys.modules"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
