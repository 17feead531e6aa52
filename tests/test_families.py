"""What RL users expect: env families, CNN/LSTM/continuous paths, watching a run, evaluate,
presets and the Python API — each through a real learner and real actor processes."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
import urllib.request

import numpy as np
import pytest
from support import (
    ROOT,
    actor_args,
    free_port,
    learner_process,
    read_records,
    running,
    wait_until,
)

from seedrl import codec, envs
from seedrl.cli import parse_config
from seedrl.config import LearnerConfig
from seedrl.envs import atari
from seedrl.metrics import read_episodes
from seedrl.presets import build_config, load_preset, preset_names


def train_briefly(tmp_path, learner_extra, actors=1, envs_per_actor=2, timeout=120):
    """A learner and an actor launcher until the learner's stop condition; the records."""
    with learner_process(tmp_path, *learner_extra) as (learner, port):
        with running(actor_args(port, actors, envs_per_actor)) as launcher:
            assert learner.wait(timeout=timeout) == 0, learner.output()
            assert launcher.wait(timeout=30) == 0, launcher.output()
    records = read_records(tmp_path)
    assert records and records[-1]["learner_steps"] > 0, learner.output()
    for key in ("loss_policy", "loss_baseline", "entropy"):
        values = [r[key] for r in records if key in r]
        assert values and all(math.isfinite(v) for v in values), key
    return records, learner


# ---------------------------------------------------------------- env families


def test_atari_spaces_are_the_deepmind_setting():
    pytest.importorskip("ale_py")
    spec = envs.describe_env("ALE/Pong-v5")
    assert list(spec.observation_space.shape) == [4, 84, 84]
    assert spec.observation_space.dtype == "uint8"
    assert spec.action_space.kind == "discrete" and spec.action_space.n == 6
    vec = envs.make_vector_env("ALE/Pong-v5", {"noop_max": 0}, 2)
    try:
        obs, _ = vec.reset(seed=0)
        assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
        assert vec.metadata["autoreset_mode"] == envs.gym.vector.AutoresetMode.NEXT_STEP
    finally:
        vec.close()
    kwargs = atari.atari_kwargs("ALE/Pong-v5", {"episodic_life": True})
    assert kwargs["repeat_action_probability"] == 0.25 and kwargs["frameskip"] == 4
    assert kwargs["episodic_life"] is True and kwargs["reward_clipping"] is False


def test_minatar_is_served_channels_first():
    pytest.importorskip("minatar")
    spec = envs.describe_env("MinAtar/Seaquest-v1")
    assert list(spec.observation_space.shape) == [10, 10, 10]
    vec = envs.make_vector_env("MinAtar/Breakout-v1", {}, 3)
    try:
        obs, _ = vec.reset(seed=0)
        assert obs.shape == (3, 4, 10, 10) and obs.dtype == np.bool_
        assert obs.any(), "Breakout's first frame shows the paddle and ball"
    finally:
        vec.close()


@pytest.mark.parametrize("k", [1, envs.NATIVE_VECTOR_MIN_ENVS])
def test_small_and_large_k_vector_envs_reset_the_same_way(k):
    """Few envs step as scalar envs, many as CartPole's native vector env: same contract."""
    vec = envs.make_vector_env("CartPole-v1", {}, k)
    native = k >= envs.NATIVE_VECTOR_MIN_ENVS
    try:
        assert isinstance(vec, envs.ScalarEnvs) is not native
        assert vec.metadata["autoreset_mode"] == envs.gym.vector.AutoresetMode.NEXT_STEP
        obs, _ = vec.reset(seed=0)
        assert obs.shape == (k, 4) and obs.dtype == np.float32
        pushes = np.ones(k, np.int64)  # always push right: the pole falls within ~30 steps
        for _ in range(100):
            obs, reward, terminated, truncated, _ = vec.step(pushes)
            if terminated[0]:
                break
        else:
            pytest.fail("env 0 never terminated")
        obs, reward, terminated, truncated, _ = vec.step(pushes)  # NEXT_STEP: the reset step
        assert reward[0] == 0.0 and not terminated[0] and not truncated[0]
        assert np.all(np.abs(obs[0]) <= 0.05), "a fresh episode starts near upright"
    finally:
        vec.close()


def test_scalar_envs_step_exactly_like_gymnasiums_sync_vector_env():
    """seedrl's lean loop over K scalar envs and gymnasium's SyncVectorEnv: same numbers."""
    k, steps = 3, 400
    make = [lambda: envs.gym.make("CartPole-v1", max_episode_steps=15) for _ in range(k)]
    ours = envs.ScalarEnvs(make)
    reference = envs.gym.vector.SyncVectorEnv(
        make, autoreset_mode=envs.gym.vector.AutoresetMode.NEXT_STEP
    )
    try:
        assert ours.observation_space == reference.observation_space
        assert ours.action_space == reference.action_space
        np.testing.assert_array_equal(ours.reset(seed=5)[0], reference.reset(seed=5)[0])
        actions = np.random.default_rng(0).integers(0, 2, size=(steps, k))
        ends = np.zeros(2, int)  # terminations and 15-step truncations both happen
        for actions_K in actions:
            got, want = ours.step(actions_K), reference.step(actions_K)
            names = ("obs", "reward", "terminated", "truncated")
            for name, a, b in zip(names, got[:4], want[:4], strict=True):
                np.testing.assert_array_equal(a, b, err_msg=name)
                assert np.asarray(a).dtype == np.asarray(b).dtype, name
            ends += got[2].sum(), got[3].sum()
        assert ends.min() > 10, ends
    finally:
        ours.close()
        reference.close()


def test_scalar_envs_take_discrete_and_tuple_observations_and_refuse_others():
    vec = envs.ScalarEnvs([lambda: envs.gym.make("FrozenLake-v1") for _ in range(2)])
    try:
        obs, _ = vec.reset(seed=0)
        assert obs.shape == (2,) and obs.dtype == np.int64
    finally:
        vec.close()
    vec = envs.ScalarEnvs([lambda: envs.gym.make("Blackjack-v1") for _ in range(3)])
    try:  # Tuple(Discrete(32), Discrete(11), Discrete(2)): one array per leaf
        obs, _ = vec.reset(seed=0)
        assert isinstance(obs, tuple) and [x.shape for x in obs] == [(3,)] * 3
        obs, *_ = vec.step(np.zeros(3, np.int64))
        assert all(x.dtype == np.int64 for x in obs)
    finally:
        vec.close()
    text = envs.gym.spaces.Text(4)
    with pytest.raises(ValueError, match="unsupported space"):
        envs.ScalarEnvs([lambda: _WithObservationSpace(envs.gym.make("CartPole-v1"), text)])


class _WithObservationSpace(envs.gym.ObservationWrapper):
    def __init__(self, env, space):
        super().__init__(env)
        self.observation_space = space

    def observation(self, observation):
        return observation


# MinAtar renders floats with no declared fps, which gymnasium's checker warns of: that
# float render is the case this test exists for.
@pytest.mark.filterwarnings("ignore:.*render fps:UserWarning")
@pytest.mark.filterwarnings("ignore:.*RGB-array rendering should return:UserWarning")
def test_renders_become_video_frames():
    """Atari renders what the agent sees; MinAtar's float 10x10 render becomes uint8, upscaled."""
    pytest.importorskip("ale_py")
    pytest.importorskip("minatar")
    from learner.tools.evaluate import MIN_VIDEO_SIDE, video_frame

    atari = envs.make_env("ALE/Pong-v5", {}, render_mode="rgb_array")
    try:
        obs, _ = atari.reset(seed=0)
        frame = atari.render()
        assert frame is not None and frame.shape == (252, 252, 3) and frame.dtype == np.uint8
        np.testing.assert_array_equal(frame[::3, ::3, 0], obs[-1])
    finally:
        atari.close()
    minatar = envs.make_env("MinAtar/Breakout-v1", render_mode="rgb_array")
    try:
        minatar.reset(seed=0)
        raw = np.asarray(minatar.render())
        frame = video_frame(raw)
        assert frame.dtype == np.uint8 and frame.shape[0] >= MIN_VIDEO_SIDE
        assert frame.max() > 0, "float colours in [0, 1] must not truncate to black"
    finally:
        minatar.close()


@pytest.mark.long
def test_atari_smallest_setting_trains_the_nature_cnn(tmp_path):
    pytest.importorskip("ale_py")
    extra = [
        "--env", "ALE/Pong-v5", "--total-frames", "300", "--unroll-length", "5",
        "--batch-size", "2", "--max-queue-unrolls", "4", "--reward-clip", "1",
        "--inference-batch-size", "2",
    ]  # fmt: skip
    records, _ = train_briefly(tmp_path, extra, actors=1, envs_per_actor=2)
    assert records[-1]["frames"] >= 300
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["env"] == "ALE/Pong-v5" and config["reward_clip"] == 1


@pytest.mark.long
def test_minatar_cnn_with_lstm_trains(tmp_path):
    pytest.importorskip("minatar")
    extra = [
        "--env", "MinAtar/Breakout-v1", "--lstm", "--lstm-size", "32", "--total-frames", "800",
        "--unroll-length", "5", "--batch-size", "4",
    ]  # fmt: skip
    records, _ = train_briefly(tmp_path, extra, actors=1, envs_per_actor=4)
    assert records[-1]["episodes"] > 0


@pytest.mark.long
def test_pendulum_continuous_actions_train_and_evaluate(tmp_path):
    """The Gaussian path end to end: trains, checkpoints, acts inside the Box bounds."""
    extra = ["--preset", "pendulum", "--total-frames", "3000", "--unroll-length", "10"]
    train_briefly(tmp_path, extra, actors=1, envs_per_actor=4)
    from learner.tools.trained_policy import Policy

    policy = Policy.load(tmp_path / "checkpoint.pt")
    env = policy.make_env()
    obs, _ = env.reset(seed=0)
    policy.reset()
    for _ in range(5):
        action = policy.act(obs)
        assert action.shape == (1,) and -2.0 <= float(action[0]) <= 2.0
        obs, *_ = env.step(action)
    env.close()


# ---------------------------------------------------------------- watching and using a run


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith("seedrl_"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


@pytest.mark.long
def test_lstm_run_is_watched_and_evaluated(tmp_path):
    """CartPole + LSTM: Prometheus scrapes, TensorBoard tags, plot PNG, evaluate + GIF."""
    metrics_port = free_port()
    extra = [
        "--lstm", "--lstm-size", "32", "--total-frames", "8000", "--tensorboard",
        "--metrics-port", str(metrics_port), "--unroll-length", "10", "--batch-size", "8",
    ]  # fmt: skip
    with learner_process(tmp_path, *extra) as (learner, port):
        learner.wait_for("/metrics", 10)
        with running(actor_args(port, 1, 8)) as launcher:
            scraped = wait_until(
                lambda: (lambda v: v if v.get("seedrl_frames", 0) > 0 else None)(
                    scrape(metrics_port)
                ),
                timeout=60,
                what="frames on /metrics",
            )
            assert learner.wait(timeout=120) == 0, learner.output()
            assert launcher.wait(timeout=30) == 0
    for name in ("seedrl_fps", "seedrl_episodes", "seedrl_actors_connected"):
        assert name in scraped, sorted(scraped)
    records = read_records(tmp_path)
    assert records[-1]["learner_steps"] > 0
    # The episode log holds every episode the metrics counted, and their mean is its mean.
    returns = [e["return"] for e in read_episodes(tmp_path)]
    assert len(returns) == records[-1]["episodes"] > 0
    assert np.mean(returns[-100:]) == pytest.approx(records[-1]["episode_return_mean"])

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in ("perf/fps", "episode/return_mean", "losses/policy", "learner/entropy"):
        assert tag in tags, sorted(tags)
    assert acc.Scalars("perf/fps")[-1].step == records[-1]["frames"]

    png = tmp_path / "curve.png"
    plot = subprocess.run(
        [sys.executable, "-m", "learner", "plot", str(tmp_path), "--out", str(png)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert plot.returncode == 0, plot.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000

    gif = tmp_path / "episode.gif"
    ev = subprocess.run(
        [sys.executable, "-m", "learner", "evaluate", "--checkpoint",
         str(tmp_path / "checkpoint.pt"), "--episodes", "3", "--sample", "--video", str(gif)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ev.returncode == 0, ev.stderr
    assert "+- " in ev.stdout and "over 3 full episodes (sampled" in ev.stdout, ev.stdout
    assert gif.read_bytes()[:6] in (b"GIF87a", b"GIF89a")
    from PIL import Image

    with Image.open(gif) as image:
        assert image.n_frames > 5 and image.size[0] >= 160


def test_evaluate_rejects_a_missing_checkpoint(tmp_path):
    ev = subprocess.run(
        [sys.executable, "-m", "learner", "evaluate", "--checkpoint", str(tmp_path / "x.pt")],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert ev.returncode == 2 and "no checkpoint file" in ev.stderr


def test_python_api_trains_and_returns_a_policy(tmp_path):
    import learner

    result = learner.train(
        "CartPole-v1", total_frames=3000, num_actors=1, envs_per_actor=4,
        logdir=tmp_path / "run", unroll_length=10, batch_size=8,
    )  # fmt: skip
    assert result.frames >= 3000 and result.learner_steps > 0
    assert result.checkpoint.exists() and result.metrics()
    env = result.policy.make_env()
    obs, _ = env.reset(seed=0)
    result.policy.reset()
    assert result.policy.act(obs) in (0, 1)
    env.close()


def test_python_api_keeps_a_presets_budget_unless_given(tmp_path):
    """The atari preset plans its entropy schedule to its own budget: ``learner.train``
    without ``total_frames`` must not replace that budget with 0 (no limit)."""
    from learner.api import train_config

    config = train_config("CartPole-v1", None, "atari", tmp_path, {"max_seconds": 5})
    assert config.env == "ALE/Pong-v5"
    assert config.total_frames == load_preset("atari")["total_frames"] > 0
    assert config.final_entropy_cost == load_preset("atari")["final_entropy_cost"]
    assert train_config("CartPole-v1", 5000, "atari", tmp_path, {}).total_frames == 5000
    assert train_config("CartPole-v1", None, None, tmp_path, {"max_seconds": 5}).total_frames == 0
    with pytest.raises(ValueError, match="training never stops"):
        train_config("CartPole-v1", None, None, tmp_path, {})


@pytest.mark.parametrize("uvloop", [True, False])
def test_python_api_from_a_running_event_loop(tmp_path, uvloop):
    """A notebook already runs a loop: the learner then serves from a thread of its own,
    where neither loop may install signal handlers."""
    import learner

    async def notebook_cell() -> learner.TrainResult:
        return learner.train(
            "CartPole-v1", total_frames=2000, num_actors=1, envs_per_actor=4,
            logdir=tmp_path / "run", unroll_length=10, batch_size=8, uvloop=uvloop,
        )  # fmt: skip

    result = asyncio.run(notebook_cell())
    assert result.frames >= 2000 and result.learner_steps > 0


@pytest.mark.long
def test_python_api_from_a_script_without_a_main_guard(tmp_path):
    """The trainer process is spawned; it must not re-run a script that trains at top level."""
    script = tmp_path / "train_cartpole.py"
    script.write_text(
        "import learner\n"
        "result = learner.train('CartPole-v1', total_frames=2000,"
        f" logdir={str(tmp_path / 'run')!r}, num_actors=1, envs_per_actor=4,"
        " unroll_length=10, batch_size=8)\n"
        "print('trained', result.learner_steps > 0)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("trained") == 1 and "trained True" in done.stdout, done.stdout


def test_importing_the_python_api_is_torch_free():
    code = "import sys, learner; assert callable(learner.train); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr


# ---------------------------------------------------------------- config and progress


@pytest.mark.parametrize(
    "name", ["cartpole", "pendulum", "atari", "minatar", "minigrid", "mujoco", "spread"]
)
def test_presets_build_valid_configs(name):
    assert name in preset_names()
    config = build_config(LearnerConfig, {}, load_preset(name))
    assert config.env


def test_preset_file_and_flags_layer_in_order(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text("batch_size = 8\nlearning_rate = 0.5\nmax_queue_unrolls = 64\n")
    config = parse_config(
        LearnerConfig,
        ["--preset", "atari", "--config", str(path), "--learning-rate", "0.25"],
        "test", "test", presets=True,
    )  # fmt: skip
    assert config.env == "ALE/Pong-v5" and config.reward_clip == 1.0  # preset
    assert config.batch_size == 8  # file over preset
    assert config.learning_rate == 0.25  # flag over file
    with pytest.raises(SystemExit):
        parse_config(LearnerConfig, ["--preset", "nope"], "test", "test", presets=True)


def test_progress_is_plain_lines_when_stdout_is_not_a_tty(capsys):
    from learner.progress import Progress

    progress = Progress("auto", total_frames=1000)
    assert progress.mode == "plain"
    record = {
        "frames": 500, "fps": 100.0, "episodes": 3, "episode_return_mean": 12.5,
        "actors_connected": 2, "inference_batch_mean": 4.0, "learner_steps": 7,
    }  # fmt: skip
    progress.update(record)
    progress.close()
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "frames        500" in out and "\x1b[" not in out


def test_minigrid_is_served_as_its_direction_and_view():
    pytest.importorskip("minigrid")
    spec = envs.describe_env("MiniGrid-DoorKey-5x5-v0")
    assert codec.spec_summary(spec.observation_space) == (
        "Dict(direction: Discrete(4), image: Box(shape=[3, 7, 7], dtype=float32))"
    )
    raw = envs.gym.make("MiniGrid-DoorKey-5x5-v0")
    env = envs.make_env("MiniGrid-DoorKey-5x5-v0")
    try:
        want, _ = raw.reset(seed=3)
        got, _ = env.reset(seed=3)
        assert got["direction"] == want["direction"]
        np.testing.assert_array_equal(got["image"], np.transpose(want["image"], (2, 0, 1)))
    finally:
        env.close()
        raw.close()


def _state(env) -> tuple:  # type: ignore[no-untyped-def]
    """What an action can change in a MiniGrid env."""
    grid_env = env.unwrapped
    carrying = grid_env.carrying
    held = None if carrying is None else (carrying.type, carrying.color)
    return (tuple(grid_env.agent_pos), grid_env.agent_dir, held,
            grid_env.grid.encode().tobytes())  # fmt: skip


def test_the_minigrid_mask_allows_exactly_the_actions_that_change_something():
    """Against stepping a copy of the env with each action: a useful action is allowed, a
    useless one masked; the env refuses a masked action."""
    pytest.importorskip("minigrid")
    import copy

    from seedrl.envs.minigrid import ACTIONS

    env = envs.make_env("MiniGrid-DoorKey-5x5-v0", {"action_mask": True})
    rng = np.random.default_rng(0)
    checked = {name: 0 for name in ACTIONS}
    obs, _ = env.reset(seed=1)
    for _ in range(80):
        mask = obs["action_mask"]
        for index, name in enumerate(ACTIONS):
            if name in ("drop", "done"):
                assert not mask[index]
                continue
            trial = copy.deepcopy(env)
            before = _state(trial)
            trial.unwrapped.step(index)
            assert bool(mask[index]) == (_state(trial) != before), (name, mask.tolist())
            checked[name] += int(mask[index])
        masked = np.flatnonzero(mask == 0)
        with pytest.raises(ValueError, match="masked action"):
            copy.deepcopy(env).step(int(masked[0]))
        obs, _, terminated, truncated, _ = env.step(int(rng.choice(np.flatnonzero(mask))))
        if terminated or truncated:
            obs, _ = env.reset()
    assert all(checked[name] for name in ("left", "right", "forward", "pickup", "toggle")), checked


def test_the_minigrid_mask_opens_a_locked_door_only_to_its_key():
    pytest.importorskip("minigrid")
    from minigrid.core.world_object import Key

    from seedrl.envs.minigrid import ACTIONS

    env = envs.make_env("MiniGrid-DoorKey-5x5-v0", {"action_mask": True})
    env.reset(seed=2)
    grid_env = env.unwrapped
    (x, y), door = next(((i % grid_env.width, i // grid_env.width), cell)
                        for i, cell in enumerate(grid_env.grid.grid)
                        if cell is not None and cell.type == "door")  # fmt: skip
    grid_env.agent_pos, grid_env.agent_dir = (x - 1, y), 0  # west of the door, facing it
    toggle = ACTIONS.index("toggle")
    for carrying, allowed in ((None, 0), (Key("purple" if door.color != "purple" else "red"), 0),
                              (Key(door.color), 1)):  # fmt: skip
        grid_env.carrying = carrying
        mask = env._observe(grid_env.gen_obs())["action_mask"]
        assert mask[toggle] == allowed and not mask[ACTIONS.index("forward")], (carrying, mask)
