"""Configuration ranges: a bad value stops the command with one line naming the flag.

Checked at parse time (the dataclasses' ``__post_init__``), so nothing has started: no
log directory, no socket, no trainer.
"""

from __future__ import annotations

import dataclasses
import math
import typing

import pytest

from learner.__main__ import main as learner_main
from seedrl.cli import parse_config
from seedrl.config import ActorConfig, LearnerConfig, agent_sections, knob_names

LEARNER_CASES = {
    # family: counts and sizes that must be >= 1
    "count": ("--unroll-length", "0", "--unroll-length must be >= 1"),
    "layer widths": ("--hidden-sizes", "64,0", "--hidden-sizes must be >= 1"),
    "updates per batch": ("--updates-per-batch", "0", "--updates-per-batch must be >= 1"),
    # ports
    "port": ("--port", "70000", "--port must be in [0, 65535]"),
    # non-negative amounts (costs, limits, seeds)
    "cost": ("--entropy-cost", "-0.1", "--entropy-cost must be >= 0"),
    "limit": ("--total-frames", "-5", "--total-frames must be >= 0"),
    "seed": ("--seed", "-1", "--seed must be >= 0"),
    # strictly positive scales and thresholds
    "reward clip": ("--reward-clip", "-1", "--reward-clip must be > 0"),
    "zero reward clip": ("--reward-clip", "0", "--reward-clip must be > 0"),
    "learning rate": ("--learning-rate", "0", "--learning-rate must be > 0"),
    "rho-bar": ("--clip-rho-threshold", "-1", "--clip-rho-threshold must be > 0"),
    "interval": ("--log-interval-s", "0", "--log-interval-s must be > 0"),
    "nan": ("--max-grad-norm", "nan", "--max-grad-norm must be > 0"),
    "update bound": ("--max-update-kl", "-0.5", "--max-update-kl must be >= 0"),
    "policy clip": ("--policy-clip", "-0.2", "--policy-clip must be >= 0"),
    "log-std": ("--log-std-init", "-7", "--log-std-init must be in [-5, 2]"),
    # probabilities and factors in [0, 1]
    "lambda": ("--lambda", "1.5", "--lambda must be in [0, 1]"),
    "discount": ("--discount", "-0.1", "--discount must be in [0, 1]"),
    "quorum": ("--inference-quorum", "0", "--inference-quorum must be in (0, 1]"),
    # choices and dependent fields
    "choice": (
        "--lr-schedule",
        "cosine",
        "--lr-schedule must be auto, constant, linear or inverse_sqrt",
    ),
    "model": ("--model", "vit", "--model must be auto, mlp, cnn or resnet"),
    "dependent": ("--lr-schedule", "linear", "--lr-schedule linear needs --total-frames"),
    "final cost": ("--final-entropy-cost", "-0.1", "--final-entropy-cost must be >= 0"),
    "final needs budget": ("--final-entropy-cost", "1e-3", "--final-entropy-cost needs --total"),
    "pair": ("--max-queue-unrolls", "8", "--max-queue-unrolls (8) must be >= --batch-size"),
}
ACTOR_CASES = {
    "count": ("--num-actors", "0", "--num-actors must be >= 1"),
    "non-negative": ("--max-frames", "-1", "--max-frames must be >= 0"),
    "seed": ("--seed", "-3", "--seed must be >= 0"),
    "index": ("--first-index", "-2", "--first-index must be >= -1"),
    "range": ("--nice", "20", "--nice must be in [0, 19]"),
    "positive": ("--max-backoff-s", "0", "--max-backoff-s must be > 0"),
    "divisor": ("--env-groups", "3", "--env-groups must be >= 1 and divide"),
    "choice": ("--pin-cpus", "maybe", "--pin-cpus must be auto, on or off"),
}


def _one_line_exit_2(cls: type, argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        parse_config(cls, argv, "prog", "test")
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("case", LEARNER_CASES.values(), ids=list(LEARNER_CASES))
def test_a_bad_learner_value_is_one_line_naming_the_flag(case, capsys):
    flag, value, message = case
    argv = [flag, value, "--batch-size", "16"] if flag == "--max-queue-unrolls" else [flag, value]
    assert message in _one_line_exit_2(LearnerConfig, argv, capsys)


def test_r2d2_batches_are_not_bound_by_the_unroll_queue_it_does_not_keep():
    """The replay, not the V-trace queue, feeds R2D2's trainer: a batch larger than the
    queue's bound is V-trace's error only."""
    argv = ["--batch-size", "64", "--max-queue-unrolls", "16"]
    config = parse_config(LearnerConfig, [*argv, "--agent", "r2d2"], "prog", "test")
    assert (config.batch_size, config.max_queue_unrolls) == (64, 16)
    with pytest.raises(SystemExit):
        parse_config(LearnerConfig, argv, "prog", "test")


@pytest.mark.parametrize("case", ACTOR_CASES.values(), ids=list(ACTOR_CASES))
def test_a_bad_actor_value_is_one_line_naming_the_flag(case, capsys):
    flag, value, message = case
    argv = [flag, value, "--envs-per-actor", "4"] if flag == "--env-groups" else [flag, value]
    assert message in _one_line_exit_2(ActorConfig, argv, capsys)


def test_a_bad_value_stops_the_learner_before_anything_starts(tmp_path, capsys, monkeypatch):
    def serve(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("the learner started serving")

    monkeypatch.setattr("learner.run.serve", serve)
    logdir = tmp_path / "run"
    with pytest.raises(SystemExit) as exc:
        learner_main(["--reward-clip", "-1", "--logdir", str(logdir), "--port", "0"])
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        "python -m learner: error: --reward-clip must be > 0, got -1.0"
    ]
    assert not logdir.exists()


UNBOUNDED = {"target_return"}
"""Numeric fields where any value means something."""


@pytest.mark.parametrize("cls", [LearnerConfig, ActorConfig])
def test_every_numeric_field_has_a_range(cls):
    """A field added later without a check fails here: each numeric field refuses a huge
    negative value (and floats NaN), unless it is listed as unbounded."""
    hints = typing.get_type_hints(cls)
    checked = 0
    for field in dataclasses.fields(cls):
        tp = hints[field.name]
        inner = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
        if field.name in UNBOUNDED or inner[0] not in (int, float):
            continue
        bad_values: list[float] = [-(10**9)] + ([math.nan] if inner[0] is float else [])
        for bad in bad_values:
            with pytest.raises(ValueError, match="--" + field.name.rstrip("_").replace("_", "-")):
                cls(**{field.name: bad})
        checked += 1
    assert checked >= (25 if cls is LearnerConfig else 8)


@pytest.mark.parametrize("agent", sorted(agent_sections()))
def test_every_numeric_knob_of_an_agent_has_a_range(agent):
    """The agents' own knobs are checked as the fields are: a knob added without a check
    in its options' ``check`` fails here."""
    options = agent_sections()[agent]
    hints = typing.get_type_hints(options)
    checked = 0
    for name in sorted(knob_names(options)):
        inner = [a for a in typing.get_args(hints[name]) if a is not type(None)] or [hints[name]]
        if inner[0] not in (int, float):
            continue
        for bad in [-(10**9)] + ([math.nan] if inner[0] is float else []):
            with pytest.raises(ValueError, match="--" + name.rstrip("_").replace("_", "-")):
                LearnerConfig(agent=agent, **{name: bad})
        checked += 1
    assert checked >= 5


def test_a_knob_of_another_agent_is_refused_naming_its_agent():
    """--max-update-kl and --policy-clip bound a V-trace policy; R2D2 has none to bound."""
    with pytest.raises(ValueError, match="--max-update-kl is a knob of --agent vtrace, not of"):
        LearnerConfig(agent="r2d2", max_update_kl=1e-3)
    assert LearnerConfig(max_update_kl=1e-3).effective_max_update_kl == 1e-3
    with pytest.raises(ValueError, match="--policy-clip is a knob of --agent vtrace, not of"):
        LearnerConfig(agent="r2d2", policy_clip=0.2)
    with pytest.raises(ValueError, match="--epsilon is a knob of --agent r2d2, not of"):
        LearnerConfig(epsilon=0.2)


def test_the_update_bound_is_on_for_v_trace_unless_turned_off_and_off_for_r2d2():
    """Unset, V-trace steps are bounded at the rate's measured 1e-4; 0 turns the bound off
    (what every V-trace preset does, each tuned without it); R2D2, which has no policy to
    bound, is left alone."""
    assert LearnerConfig().effective_max_update_kl == 1e-4
    assert LearnerConfig(max_update_kl=0).effective_max_update_kl is None
    assert LearnerConfig(agent="r2d2").effective_max_update_kl is None
