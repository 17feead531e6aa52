"""--normalize-observations: running statistics on the learner, applied to what the policy
acts on and stored as acted on, kept by checkpoints and used by ``evaluate``."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import numpy as np
import pytest
import torch
from support import engine_for

from learner.agents.models import action_head, build_model
from learner.parts import build_learner, save_checkpoint
from learner.serving.batcher import PendingRequest
from learner.serving.inference import Connection, FramePayload, StepCounter
from learner.state import checkpoint
from learner.state.normalize import CLIP, EPSILON, ObservationNormalizer
from learner.state.stats import LearnerStats
from learner.state.trajectories import TrajectoryBuilder, UnrollQueue
from learner.tools.trained_policy import Policy
from learner.training.trainer import to_time_major
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

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        for frame in raw:
            payload = FramePayload(
                conn, frame.tobytes(), np.zeros(k, np.float32).tobytes(),
                np.zeros(k, np.bool_).tobytes(), np.zeros(k, np.bool_).tobytes(),
            )  # fmt: skip
            await engine.process([PendingRequest(payload, k, loop.create_future())])

    asyncio.run(serve())
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
