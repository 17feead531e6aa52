"""Learning claims that must not flake: the learner's own parts (inference engine,
trajectory builder, queue, V-trace trainer) stepping one vector env in one
process, so a seeded run is the same run every time.

The process-level tests (``test_system``, ``test_families``) show the parts work
together over gRPC; these show that what they compute learns.
"""

from __future__ import annotations

from learner.tools.synchronous import train_synchronously
from seedrl.config import LearnerConfig
from seedrl.presets import build_config, load_preset

PENDULUM_FRAMES = 300_000


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
