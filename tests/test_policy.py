"""Inference's forward pass: the numpy twin of a feed-forward MLP must be the torch model.

Inference runs :class:`~learner.agents.policy.NumpyMLPPolicy` for feed-forward MLPs on the CPU
and training runs the torch model, so the policy parameters they compute for the same
observations must agree, also after the weights change in place. Sampling uses numpy's
random stream, so it is checked as a distribution.
"""

from __future__ import annotations

import asyncio
import threading
import warnings

import numpy as np
import pytest
import torch
from support import engine_for

from learner.agents.models import ActorCritic, CategoricalHead, action_head, build_model
from learner.agents.policy import NumpyMLPPolicy, TorchPolicy, _sampler, inference_policy
from learner.serving.batcher import PendingRequest
from learner.serving.inference import Connection, FramePayload, InferenceEngine, StepCounter
from learner.state.stats import LearnerStats
from learner.state.trajectories import TrajectoryBuilder, UnrollQueue
from seedrl import codec
from seedrl.config import LearnerConfig
from seedrl.proto import seedrl_pb2 as pb

CPU = torch.device("cpu")


def space(kind: str, shape: tuple[int, ...] = (), dtype: str = "float32", **extra) -> pb.SpaceSpec:
    return pb.SpaceSpec(kind=kind, shape=list(shape), dtype=dtype, **extra)


def bounded_box(low: float, high: float, size: int) -> pb.SpaceSpec:
    return space(
        "box",
        (size,),
        low=codec.encode_tensor(np.full(size, low, np.float32)),
        high=codec.encode_tensor(np.full(size, high, np.float32)),
    )


ACTIONS = {
    "discrete": space("discrete", n=3),
    "bounded box": bounded_box(-2.0, 2.0, 2),
    "unbounded box": space("box", (2, 1)),
}
OBSERVATIONS = {
    "float32": ((4,), "float32"),
    "float64 2-d": ((2, 3), "float64"),
    "uint8": ((6,), "uint8"),
    "bool": ((5,), "bool"),
}


def observations(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, b: int):
    if dtype == "uint8":
        return rng.integers(0, 256, (b, *shape), dtype=np.uint8)
    if dtype == "bool":
        return rng.random((b, *shape)) < 0.5
    return rng.normal(size=(b, *shape)).astype(dtype)


def mlp_model(obs: tuple[tuple[int, ...], str], action: pb.SpaceSpec, lstm_size: int = 0):
    torch.manual_seed(0)
    head = action_head(action)
    shape, dtype = obs
    model = build_model(space("box", shape, dtype), head, "mlp", (32, 16), lstm_size)
    with torch.no_grad():  # a policy layer far from its near-zero init, so errors would show
        model.policy.weight.normal_()
    return model, head


@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize("obs", OBSERVATIONS)
def test_numpy_policy_computes_the_torch_models_params(obs, action):
    model, head = mlp_model(OBSERVATIONS[obs], ACTIONS[action])
    fast = NumpyMLPPolicy.of(model, head, np.random.default_rng(0))
    assert fast is not None
    reference = TorchPolicy(model, head, CPU)
    obs_BO = observations(np.random.default_rng(1), *OBSERVATIONS[obs], b=7)
    first_B = np.zeros(7, np.bool_)

    action_BA, params_BP, state = fast(obs_BO, first_B, ())
    torch_action_BA, torch_params_BP, torch_state = reference(obs_BO, first_B, ())

    np.testing.assert_allclose(params_BP, torch_params_BP, rtol=1e-5, atol=1e-6)
    assert params_BP.dtype == torch_params_BP.dtype == np.float32
    assert action_BA.dtype == torch_action_BA.dtype
    assert action_BA.shape == torch_action_BA.shape
    assert state == torch_state == ()


def test_numpy_policy_reads_the_weights_as_they_change_in_place():
    """Optimizer steps and weights loaded from the trainer process write into the same
    storage, so the twin needs no refresh of its own."""
    model, head = mlp_model(OBSERVATIONS["float32"], ACTIONS["bounded box"])
    fast = NumpyMLPPolicy.of(model, head, np.random.default_rng(0))
    assert fast is not None
    reference = TorchPolicy(model, head, CPU)
    obs_BO = observations(np.random.default_rng(2), (4,), "float32", b=5)
    first_B = np.zeros(5, np.bool_)
    before = fast(obs_BO, first_B, ())[1]

    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    params, _, _ = model(torch.from_numpy(obs_BO)[None], torch.from_numpy(first_B)[None])
    params.square().sum().backward()
    optimizer.step()
    after_step = fast(obs_BO, first_B, ())[1]
    assert not np.allclose(before, after_step)
    np.testing.assert_allclose(after_step, reference(obs_BO, first_B, ())[1], rtol=1e-5, atol=1e-6)

    other, _ = mlp_model(OBSERVATIONS["float32"], ACTIONS["bounded box"])
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.5)
    model.load_state_dict(other.state_dict())
    np.testing.assert_allclose(
        fast(obs_BO, first_B, ())[1], reference(obs_BO, first_B, ())[1], rtol=1e-5, atol=1e-6
    )


def constant_policy(action: pb.SpaceSpec, bias: list[float], log_std: float | None = None):
    """A model whose policy parameters are ``bias`` (and ``log_std``) for every observation."""
    model, head = mlp_model(OBSERVATIONS["float32"], action)
    with torch.no_grad():
        model.policy.weight.zero_()
        model.policy.bias.copy_(torch.tensor(bias))
        if log_std is not None:
            assert model.log_std is not None
            model.log_std.fill_(log_std)
    fast = NumpyMLPPolicy.of(model, head, np.random.default_rng(3))
    assert fast is not None
    return fast


def test_categorical_samples_follow_the_softmax_of_the_logits():
    logits = [1.0, 0.0, -1.0]
    fast = constant_policy(ACTIONS["discrete"], logits)
    n = 40_000
    action_B, _, _ = fast(np.zeros((n, 4), np.float32), np.zeros(n, np.bool_), ())
    frequencies = np.bincount(action_B, minlength=3) / n
    expected = np.exp(logits) / np.exp(logits).sum()
    np.testing.assert_allclose(frequencies, expected, atol=0.01)


class ZeroDrawRng:
    """A generator whose exponential draws are 1, except an exact 0 at row 1, action 2."""

    def standard_exponential(self, shape, dtype):
        noise = np.ones(shape, dtype)
        noise[1, 2] = 0.0
        return noise


def test_a_zero_exponential_draw_wins_the_race_without_a_warning():
    """float32 draws hit exactly 0 (~14 in 1e8): that action is the sample, and no
    divide-by-zero warning reaches the learner's log."""
    sample = _sampler(CategoricalHead(3), ZeroDrawRng())  # type: ignore[arg-type]
    logits_BA = np.array([[5.0, 0.0, -5.0], [5.0, 0.0, -5.0]], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        action_B = sample(logits_BA)
    assert action_B.tolist() == [0, 2]


def test_gaussian_samples_have_the_mean_and_std_of_the_params():
    fast = constant_policy(ACTIONS["unbounded box"], [0.7, -1.5], log_std=np.log(0.5))
    n = 40_000
    action_BA, params_BP, _ = fast(np.zeros((n, 4), np.float32), np.zeros(n, np.bool_), ())
    assert action_BA.shape == (n, 2, 1)
    np.testing.assert_allclose(params_BP[0], [0.7, -1.5, np.log(0.5), np.log(0.5)], rtol=1e-6)
    samples = action_BA.reshape(n, 2)
    np.testing.assert_allclose(samples.mean(axis=0), [0.7, -1.5], atol=0.02)
    np.testing.assert_allclose(samples.std(axis=0), [0.5, 0.5], atol=0.02)


def test_models_the_twin_cannot_run_fall_back_to_torch():
    lstm, head = mlp_model(OBSERVATIONS["float32"], ACTIONS["discrete"], lstm_size=8)
    assert NumpyMLPPolicy.of(lstm, head, np.random.default_rng(0)) is None
    assert isinstance(inference_policy(lstm, head, CPU, "auto", 0), TorchPolicy)
    with pytest.raises(ValueError, match="feed-forward MLP"):
        inference_policy(lstm, head, CPU, "numpy", 0)

    cnn_head = action_head(ACTIONS["discrete"])
    cnn = build_model(space("box", (4, 10, 10), "uint8"), cnn_head, "cnn", (16,), 0)
    assert NumpyMLPPolicy.of(cnn, cnn_head, np.random.default_rng(0)) is None

    model, head = mlp_model(OBSERVATIONS["float32"], ACTIONS["discrete"])
    assert isinstance(inference_policy(model, head, CPU, "auto", 0), NumpyMLPPolicy)
    assert isinstance(inference_policy(model, head, CPU, "torch", 0), TorchPolicy)
    with pytest.raises(ValueError, match="inference backend"):
        inference_policy(model, head, CPU, "jax", 0)


def test_config_refuses_an_unknown_backend():
    with pytest.raises(ValueError, match="--inference-backend"):
        LearnerConfig(inference_backend="jax")


def test_the_engine_runs_the_backend_it_is_given():
    model, head = mlp_model(OBSERVATIONS["float32"], ACTIONS["discrete"])
    builder = TrajectoryBuilder(
        unroll_length=4, obs_shape=(4,), obs_dtype="float32", action_shape=(),
        action_dtype="int64", param_size=3, core_state_sizes=(),
    )  # fmt: skip

    def engine(backend: str) -> InferenceEngine:
        return engine_for(
            model, head, CPU, builder, UnrollQueue(16), LearnerStats(), threading.Lock(),
            StepCounter(), backend,
        )  # fmt: skip

    assert isinstance(engine("auto").policy, NumpyMLPPolicy)
    assert isinstance(engine("torch").policy, TorchPolicy)


def test_the_twin_is_built_from_the_models_own_layers():
    """A torso that is not Linear/Tanh pairs (here an extra ReLU) is not reproduced."""
    model, head = mlp_model(OBSERVATIONS["float32"], ACTIONS["discrete"])
    assert isinstance(model, ActorCritic)
    model.torso.append(torch.nn.ReLU())
    assert NumpyMLPPolicy.of(model, head, np.random.default_rng(0)) is None


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_the_stored_action_is_the_unclipped_sample_the_actor_receives(backend):
    """Actors clip a Box action into its bounds for the env only: the unroll keeps the
    sample itself (what the actor received), whose log-probability V-trace needs."""
    model, head = mlp_model(OBSERVATIONS["float32"], ACTIONS["bounded box"])
    assert model.log_std is not None
    with torch.no_grad():
        model.log_std.fill_(np.log(2.0))  # wide: many samples fall outside [-2, 2]
    builder = TrajectoryBuilder(
        unroll_length=2, obs_shape=(4,), obs_dtype="float32", action_shape=(2,),
        action_dtype="float32", param_size=4, core_state_sizes=(),
    )  # fmt: skip
    queue = UnrollQueue(64)
    engine = engine_for(
        model, head, CPU, builder, queue, LearnerStats(), threading.Lock(), StepCounter(),
        backend,
    )  # fmt: skip
    k = 32
    conn = Connection("a", "r", "peer", k, builder.allocate(k))
    rng = np.random.default_rng(4)
    sent = []

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        for _ in range(3):
            payload = FramePayload(
                conn, observations(rng, (4,), "float32", k).tobytes(),
                np.zeros(k, np.float32).tobytes(), np.zeros(k, np.bool_).tobytes(),
                np.zeros(k, np.bool_).tobytes(),
            )  # fmt: skip
            request = PendingRequest(payload, k, loop.create_future())
            await engine.process([request])
            sent.append(request.future.result())

    asyncio.run(serve())
    unrolls = queue.get(k, timeout=1)
    assert unrolls is not None
    np.testing.assert_array_equal(unrolls.action, np.stack(sent, axis=1))
    assert (np.abs(unrolls.action) > 2.0).mean() > 0.1
