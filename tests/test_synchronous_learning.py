"""Learning claims that must not flake: the learner's own parts (inference engine,
trajectory builder, queue, V-trace trainer) stepping one vector env in one
process, so a seeded run is the same run every time.

The process-level tests (``test_system``, ``test_families``) show the parts work
together over gRPC; these show that what they compute learns.
"""

from __future__ import annotations

import pytest

from benchmarks.learning.runner import random_return
from benchmarks.learning.suites import SUITES
from learner.tools.synchronous import train_synchronously
from seedrl.config import LearnerConfig
from seedrl.presets import build_config, load_preset

PENDULUM_FRAMES = 300_000


@pytest.mark.slow  # test_families checks the Gaussian path trains and evaluates in CI
def test_pendulum_preset_learns_from_the_random_level(tmp_path):
    """The Gaussian head, the preset's discount and reward scale: 300 k frames of 32 envs
    take the mean-100 return from random swinging (about -1200) past -800.

    Seeds 0 to 10 end between -340 and -660, so the bar holds on a machine whose floating
    point takes a slightly different path.
    """
    overrides = {"logdir": str(tmp_path), "seed": 3, "target_return": None}
    config = build_config(LearnerConfig, overrides, load_preset("pendulum"))
    curve = train_synchronously(config, num_envs=32, frames=PENDULUM_FRAMES)
    (_, start), (frames, end) = curve[0], curve[-1]
    assert frames >= PENDULUM_FRAMES - 32 * config.unroll_length
    assert start < -1000, f"a fresh policy should swing at random, got {start:.0f}"
    assert end > -800 and end > start + 400, f"no learning: {start:.0f} -> {end:.0f}"


def test_a_seeded_synchronous_run_is_the_same_run_every_time(tmp_path):
    """What makes the claim above deterministic: the same seed gives the same curve."""
    overrides = {"logdir": str(tmp_path), "seed": 1, "target_return": None}
    config = build_config(LearnerConfig, overrides, load_preset("pendulum"))
    first = train_synchronously(config, num_envs=8, frames=20_000)
    assert first and first == train_synchronously(config, num_envs=8, frames=20_000)


R2D2_FRAMES = 12_000


def test_r2d2_learns_cartpole_well_above_random(tmp_path):
    """R2D2's learning rule (prioritized sequence replay, per-slot epsilon, n-step double
    Q on rescaled values) with the classic-r2d2 preset's settings, its LSTM core and
    burn-in off to fit CI: 12 k frames of 8 envs take CartPole's mean-100 return from a
    near-constant greedy policy (about 12) well past a uniformly random one (about 22)."""
    overrides = {
        "logdir": str(tmp_path), "seed": 0, "target_return": None, "lstm": False,
        "burn_in": 0, "sequence_overlap": 0,
    }  # fmt: skip
    config = build_config(LearnerConfig, overrides, load_preset("classic-r2d2"))
    curve = train_synchronously(config, num_envs=8, frames=R2D2_FRAMES)
    (_, start), (frames, end) = curve[0], curve[-1]
    assert frames >= R2D2_FRAMES - 8 * config.unroll_length
    assert start < 25, f"a fresh Q-network should act about constantly, got {start:.1f}"
    assert end > 45, f"no learning: {start:.1f} -> {end:.1f}"


R2D2_MINATAR_FRAMES = 80_000


@pytest.mark.long
def test_r2d2_learns_minatar_breakout_well_above_random(tmp_path):
    """R2D2 on pixels: the minatar-r2d2 preset's CNN, n-step double Q and prioritized
    replay, without its LSTM core and burn-in and at four times its replay ratio (and a
    target copy twice as often) to learn within CI's budget. 80 k frames of 16 envs on
    the Ape-X ladder take Breakout's mean-100 training return from about a random
    policy's to 2.2-2.6 (seeds 0 to 2) against a random policy's 0.4 measured here; the
    bar is four times random. With the targets' rewards zeroed it ends at 0.05."""
    pytest.importorskip("minatar")
    overrides = {
        "logdir": str(tmp_path), "seed": 0, "target_return": None, "tensorboard": False,
        "lstm": False, "burn_in": 0, "sequence_overlap": 0, "replay_ratio": 8.0,
        "target_update_interval": 200, "replay_min_frames": 5000,
    }  # fmt: skip
    config = build_config(LearnerConfig, overrides, load_preset("minatar-r2d2"))
    curve = train_synchronously(config, num_envs=16, frames=R2D2_MINATAR_FRAMES)
    (_, start), (frames, end) = curve[0], curve[-1]
    breakout = SUITES["minatar"].envs[1]
    assert breakout.env == "MinAtar/Breakout-v1"
    random_mean = random_return(breakout, episodes=100)["mean"]
    assert 0.1 < random_mean < 1.0, f"random Breakout scores under 1, got {random_mean:.2f}"
    assert frames >= R2D2_MINATAR_FRAMES - 16 * config.unroll_length
    assert start < 2 * random_mean, f"a fresh Q-network plays about at random, got {start}"
    assert end > 4 * random_mean, f"no learning: {start:.2f} -> {end:.2f}, random {random_mean:.2f}"


CARTPOLE_LONG_FRAMES = 2_300_000
"""Well past solving, covering the stretch where the rate without the bound loses seed 15's
policy (figures in docs/stability.md); the long-run suite (``make bench-learning
SUITE=classic-long``) goes further."""
CARTPOLE_FLOOR = 248.5
"""Half way from a random policy's mean return to solved (475)."""


@pytest.mark.long
@pytest.mark.timeout(600)  # a minute on an idle 2-core machine; more when shared
def test_cartpole_defaults_keep_a_solved_policy(tmp_path):
    """The defaults with no preset (docs/stability.md) solve CartPole and then never fall
    below half way from random to solved over the next ~1.5 M frames (64 envs, seed 15).

    Seed 15 is one the default rate loses soon after solving when nothing bounds each step
    (solved at 0.24 M frames, down to ~100 after), and that the bound keeps above 475
    (docs/stability.md): a wide margin, so the bar holds on a machine whose floating point
    takes a slightly different path.
    """
    overrides = {"logdir": str(tmp_path), "seed": 15, "tensorboard": False}
    config = build_config(LearnerConfig, overrides)
    curve = train_synchronously(config, num_envs=64, frames=CARTPOLE_LONG_FRAMES)
    solved_at = next((frames for frames, mean in curve if mean >= 475.0), None)
    assert solved_at is not None and solved_at < 1_000_000, f"not solved early: {curve[-1]}"
    after = [(frames, mean) for frames, mean in curve if frames >= solved_at]
    assert after[-1][0] - solved_at >= 1_500_000
    lowest = min(after, key=lambda point: point[1])
    assert lowest[1] >= CARTPOLE_FLOOR, f"solved at {solved_at}, fell to {lowest}"


ACROBOT_FRAMES = 600_000
"""Four times what the defaults take to first reach -100, enough for a scale gone wrong
to show (docs/stability.md)."""
ACROBOT_FLOOR = -293.25
"""Half way from a random policy's mean return (-486.5) to solved (-100)."""


@pytest.mark.long
@pytest.mark.timeout(600)  # half a minute on an idle 2-core machine; more when shared
def test_acrobot_defaults_keep_their_return_scale_and_a_solved_policy(tmp_path):
    """The defaults solve Acrobot (64 envs, seed 3) and stay above half way from random
    to solved, with the return scale where the rewards put it.

    When the return scale was measured on the value targets, this seed's fed on itself
    down to 1e-4 and the policy fell to -360 by 0.6 M frames (docs/stability.md); measured
    on the rewards it settles at about 0.035 on every seed tried.
    """
    overrides = {"env": "Acrobot-v1", "logdir": str(tmp_path), "seed": 3, "tensorboard": False}
    config = build_config(LearnerConfig, overrides)
    scales: list[float] = []

    def watch(trainer, stats, results) -> bool:  # type: ignore[no-untyped-def]
        scales.extend(r["reward_norm_scale"] for r in results if r is not None)
        return False

    curve = train_synchronously(config, num_envs=64, frames=ACROBOT_FRAMES, on_batch=watch)
    solved_at = next((frames for frames, mean in curve if mean >= -100.0), None)
    assert solved_at is not None and solved_at < 300_000, f"not solved early: {curve[-1]}"
    lowest = min((point for point in curve if point[0] >= solved_at), key=lambda p: p[1])
    assert lowest[1] >= ACROBOT_FLOOR, f"solved at {solved_at}, fell to {lowest}"
    settled = scales[len(scales) // 4 :]  # past the first batches' fast-moving estimate
    assert min(settled) > 0.01, f"the return scale fell to {min(settled):.2e}"
