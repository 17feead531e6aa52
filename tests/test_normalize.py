"""--normalize-observations: running statistics on the learner, applied to what the policy
acts on and stored as acted on, kept by checkpoints and used by ``evaluate``."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from support import engine_for

from learner.agents.models import UnsupportedSetup, action_head, build_model
from learner.parts import build_learner, save_checkpoint
from learner.serving.batcher import PendingRequest
from learner.serving.inference import Connection, FramePayload, StepCounter
from learner.state import checkpoint
from learner.state.normalize import (
    CLIP,
    EPSILON,
    UPDATE_SIGMAS,
    WARMUP_CAP,
    WARMUP_FRAMES,
    LeafNormalizer,
    ObservationNormalizer,
    ReturnNormalizer,
    make_normalizer,
    normalized_space,
)
from learner.state.stats import LearnerStats
from learner.state.trajectories import TrajectoryBuilder, UnrollQueue
from learner.tools.trained_policy import Policy
from learner.training.trainer import to_time_major
from seedrl import codec
from seedrl.config import LearnerConfig
from seedrl.proto import seedrl_pb2 as pb


def expected(raw: np.ndarray, seen: np.ndarray) -> np.ndarray:
    """Normalisation by numpy's own mean and (population) variance of ``seen``."""
    z = (raw.astype(np.float64) - seen.mean(axis=0)) / np.sqrt(seen.var(axis=0) + EPSILON)
    return np.clip(z, -CLIP, CLIP).astype(np.float32)


def test_statistics_match_numpy_over_a_stream_in_uneven_batches():
    """Chan's merge is exact for any split; far from zero the float64 state keeps it so."""
    rng = np.random.default_rng(0)
    stream = rng.normal(1e4, [[0.5, 3.0], [20.0, 1e-3], [1.0, 1.0]], size=(1000, 3, 2))
    stream[:, 2, 1] = 7.0  # a constant element: variance 0, normalizes to 0
    normalizer = ObservationNormalizer((3, 2), "float32")
    start = 0
    for size in (1, 7, 0, 100, 392, 1, 499):
        normalizer.update(stream[start : start + size])
        start += size
    assert normalizer.count == 1000
    np.testing.assert_allclose(normalizer.mean, stream.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(normalizer.var, stream.var(axis=0), rtol=1e-9, atol=1e-12)
    probe = stream[:5] + np.array([[0, 0], [0, 0], [0, 1]])
    np.testing.assert_allclose(normalizer.normalize(probe), expected(probe, stream), rtol=1e-5)
    assert normalizer.normalize(probe).dtype == np.float32
    assert normalizer.normalize(probe)[:, 2, 1].tolist() == [CLIP] * 5  # clipped


HUGE = 1e36
"""A finite frame the wire lets through; unbounded, it took the variance to ~1e72."""


def test_one_extreme_frame_moves_the_statistics_by_at_most_the_bound():
    """After 1000 honest frames one value of 1e36 enters the statistics as mean + 10 std
    (numpy, on the stream with that value in its place, gives the expected state); the mean
    moves by at most 10 std / (count + 1), the variance grows by at most a factor of
    1 + 10**2 / (count + 1), and honest frames after it still normalize to O(1)."""
    rng = np.random.default_rng(3)
    honest = rng.normal([5.0, -2.0, 0.0], [2.0, 0.1, 30.0], size=(1000, 3))
    normalizer = ObservationNormalizer((3,), "float32")
    for batch in np.split(honest, 100):
        normalizer.update(batch)
    assert normalizer.clipped_values == 0
    mean0, var0, count0 = normalizer.mean.copy(), normalizer.var.copy(), normalizer.count

    poisoned = rng.normal([5.0, -2.0, 0.0], [2.0, 0.1, 30.0], size=(10, 3))
    poisoned[4, 0] = HUGE
    normalizer.update(poisoned)
    assert normalizer.clipped_values == 1
    clipped = poisoned.copy()
    clipped[4, 0] = mean0[0] + UPDATE_SIGMAS * np.sqrt(var0[0] + EPSILON)
    seen = np.concatenate([honest, clipped])
    np.testing.assert_allclose(normalizer.mean, seen.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(normalizer.var, seen.var(axis=0), rtol=1e-9)
    std0 = np.sqrt(var0[0])
    assert abs(normalizer.mean[0] - mean0[0]) <= UPDATE_SIGMAS * std0 / (count0 + 1) + 0.1
    assert normalizer.var[0] <= var0[0] * (1 + UPDATE_SIGMAS**2 / (count0 + 1)) * 1.05

    after = rng.normal([5.0, -2.0, 0.0], [2.0, 0.1, 30.0], size=(5000, 3))
    for batch in np.split(after, 50):
        normalizer.update(batch)
    z = normalizer.normalize(after[-1000:])
    assert np.all(np.abs(z.mean(axis=0)) < 0.2), z.mean(axis=0)
    assert np.all((z.std(axis=0) > 0.8) & (z.std(axis=0) < 1.2)), z.std(axis=0)


def test_the_first_frames_are_bounded_by_the_warmup_cap():
    """Before WARMUP_FRAMES there is no std to bound by: values are clipped to the cap."""
    normalizer = ObservationNormalizer((2,), "float32")
    normalizer.update(np.array([[HUGE, -HUGE]]))
    np.testing.assert_array_equal(normalizer.mean, [WARMUP_CAP, -WARMUP_CAP])
    assert normalizer.clipped_values == 2
    honest = np.arange(2 * WARMUP_FRAMES, dtype=np.float64).reshape(-1, 2)
    normalizer.update(honest)  # fewer than WARMUP_FRAMES before: only the cap applies
    seen = np.concatenate([[[WARMUP_CAP, -WARMUP_CAP]], honest])
    np.testing.assert_allclose(normalizer.mean, seen.mean(axis=0), rtol=1e-12)


@pytest.mark.parametrize(
    "before, after",
    [((0.0, 1.0), (100.0, 1.0)), ((0.0, 0.0), (5.0, 1.0))],
    ids=["a 100-std step", "a constant element that starts to move"],
)
def test_honest_drift_beyond_the_bound_is_still_followed(before, after):
    """10240 frames of one regime, then another far outside the bound: values at the bound
    widen it batch by batch, so within a few thousand frames the new regime normalizes
    inside the clip again (without the bound it takes a few hundred)."""
    rng = np.random.default_rng(4)
    normalizer = ObservationNormalizer((1,), "float32")
    for _ in range(160):
        normalizer.update(rng.normal(*before, size=(64, 1)))
    probe = rng.normal(*after, size=(256, 1))
    assert np.abs(normalizer.normalize(probe)).min() == CLIP
    for _ in range(64):  # 4096 frames
        normalizer.update(rng.normal(*after, size=(64, 1)))
    z = normalizer.normalize(probe)
    assert np.abs(z).max() < CLIP, np.abs(z).max()


def test_one_extreme_return_moves_the_return_scale_by_at_most_the_bound():
    """The return statistics take a 1e36 return as mean + 10 std: the scale rewards are
    divided by stays that of the honest returns, within the documented bound."""
    generator = torch.Generator().manual_seed(5)
    norm = ReturnNormalizer()
    ones = torch.ones(20, 32)
    honest_returns = [torch.randn(20, 32, generator=generator) * 3 + 10 for _ in range(20)]
    for returns in honest_returns:
        norm.update(returns, ones)
    assert norm.clipped_values == 0
    mean0, var0, count0 = norm.mean, norm.var, norm.count
    poisoned = torch.randn(20, 32, generator=generator) * 3 + 10
    poisoned[7, 3] = HUGE
    norm.update(poisoned, ones)
    assert norm.clipped_values == 1
    clipped = poisoned.double().clone()
    clipped[7, 3] = mean0 + UPDATE_SIGMAS * (var0 + EPSILON) ** 0.5
    seen = torch.cat([r.double().flatten() for r in [*honest_returns, clipped]])
    assert norm.count == count0 + 640
    assert norm.mean == pytest.approx(float(seen.mean()), rel=1e-6)
    assert norm.var == pytest.approx(float(seen.var(unbiased=False)), rel=1e-5)
    assert norm.var <= var0 * (1 + UPDATE_SIGMAS**2 / (count0 + 1)) * 1.05
    assert 0.25 < norm.scale < 0.4  # 1 / std of the honest returns (3)


def test_training_sees_the_frames_as_the_policy_acted_on_them():
    """Each batch updates the statistics, then is normalized by them; the unroll keeps that
    normalized frame, so replaying it gives the behaviour parameters even though the
    statistics moved after every batch."""
    torch.manual_seed(0)
    head = action_head(pb.SpaceSpec(kind="discrete", n=3))
    model = build_model(pb.SpaceSpec(kind="box", shape=[4], dtype="float32"), head, "mlp", (16,))
    with torch.no_grad():
        model.policy.weight.normal_()
    t = 4
    builder = TrajectoryBuilder(
        unroll_length=t, obs_shape=(4,), obs_dtype="float32", action_shape=(),
        action_dtype="int64", param_size=3, core_state_sizes=(),
    )  # fmt: skip
    queue = UnrollQueue(64)
    normalizer = ObservationNormalizer((4,), "float64")  # the wire dtype stays the env's
    engine = engine_for(
        model, head, torch.device("cpu"), builder, queue, LearnerStats(), threading.Lock(),
        StepCounter(), normalizer=normalizer,
    )  # fmt: skip
    k = 8
    conn = Connection("a", "r", "peer", k, builder.allocate(k))
    rng = np.random.default_rng(1)
    raw = [rng.normal(loc=i, scale=1 + i, size=(k, 4)) for i in range(t + 1)]  # drifting

    serve_frames(engine, conn, raw)
    unrolls = queue.get(k, timeout=1)
    assert unrolls is not None and unrolls.obs.dtype == np.float32
    for row in range(t + 1):
        seen = np.concatenate(raw[: row + 1])
        np.testing.assert_allclose(unrolls.obs[:, row], expected(raw[row], seen), rtol=1e-5)
    batch = to_time_major(unrolls, torch.device("cpu"))
    with torch.no_grad():
        params, _, _ = model(batch["obs"], batch["first"])
    torch.testing.assert_close(params, batch["behaviour_params"], rtol=1e-5, atol=1e-5)


def _config(tmp_path, **overrides) -> LearnerConfig:
    return LearnerConfig(
        logdir=str(tmp_path), normalize_observations=True, unroll_length=4, batch_size=2,
        max_queue_unrolls=2, **overrides,
    )  # fmt: skip


def test_a_checkpoint_keeps_the_statistics_and_evaluate_applies_them(tmp_path):
    learner = build_learner(_config(tmp_path))
    assert learner.normalizer is not None and learner.model.spec.obs_dtype == "float32"
    stream = np.random.default_rng(2).normal([0.0, 1.0, -2.0, 5.0], [1, 2, 0.1, 3], (300, 4))
    learner.normalizer.update(stream)
    save_checkpoint(learner)

    resumed = build_learner(_config(tmp_path, resume=True))
    assert resumed.normalizer is not None and resumed.normalizer.count == 300
    np.testing.assert_array_equal(resumed.normalizer.mean, learner.normalizer.mean)
    np.testing.assert_array_equal(resumed.normalizer.var, learner.normalizer.var)

    policy = Policy.load(tmp_path / "checkpoint.pt")
    assert policy.normalizer is not None
    np.testing.assert_array_equal(policy.normalizer.mean, stream.mean(axis=0))
    obs = np.array([0.5, 3.0, -2.1, 9.0], np.float32)
    seen: list[torch.Tensor] = []
    real_act = policy.model.act

    def spy(obs_11O, first_11, state):  # type: ignore[no-untyped-def]
        seen.append(obs_11O)
        return real_act(obs_11O, first_11, state)

    policy.model.act = spy  # type: ignore[method-assign]
    policy.reset()
    policy.act(obs)
    np.testing.assert_allclose(seen[0][0, 0].numpy(), expected(obs[None], stream)[0], rtol=1e-5)


def test_resuming_with_the_other_setting_is_refused(tmp_path):
    save_checkpoint(build_learner(_config(tmp_path)))
    plain = dataclasses.replace(_config(tmp_path, resume=True), normalize_observations=False)
    with pytest.raises(checkpoint.CheckpointError, match="--normalize-observations"):
        build_learner(plain)


LEAVES = gym.spaces.Dict(
    {
        "action_mask": gym.spaces.Box(0.0, 1.0, (3,), np.float32),  # float, yet never scaled
        "direction": gym.spaces.Discrete(4),
        "image": gym.spaces.Box(0, 255, (5, 5, 2), np.uint8),
        "joints": gym.spaces.Box(-np.inf, np.inf, (3,), np.float64),
        "plane": gym.spaces.Box(-1.0, 1.0, (2, 3, 4), np.float32),  # rank 3: image-like
        "speed": gym.spaces.Tuple((gym.spaces.Box(-5.0, 5.0, (2, 1), np.float32),)),
    }
)
NORMALIZED = ("joints", "speed.0")


def _leaf_stream(space: gym.spaces.Dict, n: int, seed: int) -> list[np.ndarray]:
    """``n`` observations of ``space`` as one array per leaf, far from zero mean and unit
    scale where the leaf is a float vector."""
    spec = codec.space_to_spec(space)
    space.seed(seed)
    leaves = codec.space_leaves(spec)
    samples = [codec.flatten_values(spec, space.sample()) for _ in range(n)]
    values = [np.stack(v) for v in zip(*samples, strict=True)]
    rng = np.random.default_rng(seed)
    for index, leaf in enumerate(leaves):
        if leaf.name in NORMALIZED:
            scale = rng.uniform(0.01, 100.0, leaf.shape)
            values[index] = rng.normal(size=values[index].shape) * scale + 50.0
    return [
        v.astype(leaf.dtype).reshape(n, *leaf.shape) for v, leaf in zip(values, leaves, strict=True)
    ]


def test_each_float_leaf_keeps_its_own_statistics_and_the_rest_passes_unchanged():
    """Against numpy over the whole stream, leaf by leaf: the float vector leaves are
    normalized by their own mean and variance (float64 ones become float32 in the rows),
    images, discrete leaves and the action mask keep their bytes."""
    spec = codec.space_to_spec(LEAVES)
    leaves = codec.space_leaves(spec)
    raw = codec.LeafPacking(leaves)
    normalizer = make_normalizer(spec, "action_mask")
    assert isinstance(normalizer, LeafNormalizer)
    assert normalizer.obs_shape == (raw.row_bytes,)
    stream = _leaf_stream(LEAVES, 600, seed=3)
    rows = raw.pack_values(stream)
    start = 0
    for size in (1, 9, 0, 250, 340):
        normalizer.update(rows[start : start + size])
        start += size
    out_leaves = codec.space_leaves(normalized_space(spec, "action_mask"))
    assert [x.dtype.name for x in out_leaves] == [
        "float32", "int64", "uint8", "float32", "float32", "float32"
    ]  # fmt: skip
    probe = rows[:7]
    got = codec.LeafPacking(out_leaves).unpack(normalizer.normalize(probe))
    for index, leaf in enumerate(leaves):
        if leaf.name in NORMALIZED:
            seen = stream[index].astype(np.float64)
            stats = normalizer.stats_of(leaf.name)
            assert stats.count == 600
            np.testing.assert_allclose(stats.mean, seen.mean(axis=0), rtol=1e-12)
            np.testing.assert_allclose(stats.var, seen.var(axis=0), rtol=1e-9)
            np.testing.assert_allclose(got[index], expected(seen[:7], seen), rtol=1e-5, atol=1e-6)
            assert abs(float(np.mean(got[index]))) < 1.0  # really moved off the raw values
        else:
            np.testing.assert_array_equal(got[index], stream[index][:7])


def test_a_structured_observation_without_a_float_vector_leaf_is_refused():
    space = gym.spaces.Dict(
        {"direction": gym.spaces.Discrete(4), "image": gym.spaces.Box(0, 255, (7, 7, 3), np.uint8)}
    )
    with pytest.raises(UnsupportedSetup, match="no float vector leaf to normalize"):
        make_normalizer(codec.space_to_spec(space))


def test_leaf_statistics_feed_the_policy_and_the_unrolls_alike():
    """Served frames carry the raw rows (a float64 leaf at its own width); the policy and
    the stored unrolls see the normalized rows, so replaying them gives the behaviour
    parameters."""
    torch.manual_seed(0)
    spec = codec.space_to_spec(LEAVES)
    head = action_head(pb.SpaceSpec(kind="discrete", n=3), masked=True)
    seen_space = normalized_space(spec, "action_mask")
    model = build_model(seen_space, head, "auto", (16,), mask_leaf="action_mask")
    with torch.no_grad():
        model.policy.weight.normal_()
    out = codec.LeafPacking(codec.space_leaves(seen_space))
    t, k = 3, 4
    builder = TrajectoryBuilder(
        unroll_length=t, obs_shape=(out.row_bytes,), obs_dtype="uint8", action_shape=(),
        action_dtype="int64", param_size=head.param_size, core_state_sizes=(),
    )  # fmt: skip
    queue = UnrollQueue(64)
    normalizer = make_normalizer(spec, "action_mask")
    engine = engine_for(
        model, head, torch.device("cpu"), builder, queue, LearnerStats(), threading.Lock(),
        StepCounter(), normalizer=normalizer,
    )  # fmt: skip
    conn = Connection("a", "r", "peer", k, builder.allocate(k))
    raw = codec.LeafPacking(codec.space_leaves(spec))
    stream = _leaf_stream(LEAVES, k * (t + 1), seed=4)
    stream[0][:] = 1.0  # every action allowed
    frames = raw.pack_values(stream).reshape(t + 1, k, raw.row_bytes)

    serve_frames(engine, conn, frames)
    unrolls = queue.get(k, timeout=1)
    assert unrolls is not None and unrolls.obs.shape[-1] == out.row_bytes < raw.row_bytes
    joints = codec.space_leaves(spec).index(next(x for x in raw.leaves if x.name == "joints"))
    for row in range(t + 1):
        seen = np.concatenate([raw.unpack(frames[r])[joints] for r in range(row + 1)])
        got = out.unpack(unrolls.obs[:, row])[joints]
        np.testing.assert_allclose(got, expected(raw.unpack(frames[row])[joints], seen), rtol=1e-5)
    batch = to_time_major(unrolls, torch.device("cpu"))
    with torch.no_grad():
        params, _, _ = model(batch["obs"], batch["first"])
    torch.testing.assert_close(params, batch["behaviour_params"], rtol=1e-5, atol=1e-5)


def test_a_dict_observation_checkpoint_keeps_each_leafs_statistics(tmp_path, monkeypatch):
    """Saved per leaf, restored on --resume, applied by evaluate's Policy."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent))
    config = _config(tmp_path, env="spaces_envs:dict_observation")
    learner = build_learner(config)
    assert isinstance(learner.normalizer, LeafNormalizer)
    spec = learner.env_spec.observation_space
    space = gym.spaces.Dict(
        {
            "direction": gym.spaces.Discrete(4),
            "image": gym.spaces.Box(0, 255, (1, 6, 6), np.uint8),
            "position": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
        }
    )
    stream = codec.space_leaves(spec)
    values = [np.zeros((200, *x.shape), x.dtype) for x in stream]
    values[2] = (
        np.random.default_rng(5).normal([3.0, -7.0], [0.5, 2.0], (200, 2)).astype(np.float32)
    )
    learner.normalizer.update(codec.LeafPacking(stream).pack_values(values))
    save_checkpoint(learner)

    resumed = build_learner(dataclasses.replace(config, resume=True))
    assert isinstance(resumed.normalizer, LeafNormalizer)
    for stats in ("mean", "var"):
        np.testing.assert_array_equal(
            getattr(resumed.normalizer.stats_of("position"), stats),
            getattr(learner.normalizer.stats_of("position"), stats),
        )

    policy = Policy.load(tmp_path / "checkpoint.pt")
    assert isinstance(policy.normalizer, LeafNormalizer)
    seen: list[torch.Tensor] = []
    real_act = policy.model.act

    def spy(obs_11O, first_11, state):  # type: ignore[no-untyped-def]
        seen.append(obs_11O)
        return real_act(obs_11O, first_11, state)

    policy.model.act = spy  # type: ignore[method-assign]
    policy.reset()
    obs = space.sample()
    obs["position"] = np.array([3.5, -6.0], np.float32)
    policy.act(obs)
    out = codec.LeafPacking(codec.space_leaves(normalized_space(spec)))
    got = out.unpack(seen[0][0].numpy())
    np.testing.assert_allclose(got[2][0], expected(obs["position"][None], values[2])[0], rtol=1e-5)
    np.testing.assert_array_equal(got[1][0], obs["image"])
    assert int(got[0][0]) == obs["direction"]


def serve_frames(engine: Any, conn: Any, frames: Any) -> None:
    """Send each ``[k, ...]`` frame of ``frames`` through the engine as one stream's Frame
    (zero rewards, no episode ends)."""
    k = conn.num_envs

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        for frame in frames:
            payload = FramePayload(
                conn, frame.tobytes(), np.zeros(k, np.float32).tobytes(),
                np.zeros(k, np.bool_).tobytes(), np.zeros(k, np.bool_).tobytes(),
            )  # fmt: skip
            await engine.process([PendingRequest(payload, k, loop.create_future())])

    asyncio.run(serve())
