"""The device-resident trainer: a thread with its own weights, handed to inference by copy.

Its logic runs on the CPU too (no streams, plain copies), so CI covers the hand-off; the
tests marked ``cuda`` add the streams, pinned staging and bf16 autocast on a GPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from support import (
    actor_args,
    learner_process,
    random_unrolls,
    running,
    small_learner,
    wait_until,
)

from learner.agents.models import resolve_precision
from learner.agents.policy import NumpyMLPPolicy, TorchPolicy, inference_policy
from learner.parts import Learner, make_trainer
from learner.run import choose_host, make_engine
from learner.state.trajectories import Unrolls
from learner.training.device_host import DeviceHost
from learner.training.hosts import trainer_mode
from learner.training.process_host import ProcessHost
from seedrl.config import LearnerConfig

T, B = 6, 3
CUDA = torch.cuda.is_available()
cuda_only = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


def _learner(tmp_path: Path, **overrides: object) -> Learner:
    return small_learner(tmp_path, T, B, **{"trainer": "device", **overrides})


def _device_trainer(learner: Learner) -> DeviceHost:
    trainer = choose_host(learner)
    assert isinstance(trainer, DeviceHost)
    return trainer


def _weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [t.detach().to("cpu", copy=True) for t in model.state_dict().values()]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_auto_picks_the_device_trainer_on_cuda_and_the_process_on_cpu(tmp_path):
    config = LearnerConfig(logdir=str(tmp_path))
    assert trainer_mode(config, torch.device("cuda"), ranked=False) == "device"
    assert trainer_mode(config, torch.device("cpu"), ranked=False) == "process"
    assert trainer_mode(config, torch.device("cuda:1"), ranked=True) == "thread"
    explicit = LearnerConfig(logdir=str(tmp_path), trainer="device")
    assert trainer_mode(explicit, torch.device("cpu"), ranked=False) == "device"
    with pytest.raises(ValueError, match="torchrun ranks train in a thread"):
        trainer_mode(explicit, torch.device("cpu"), ranked=True)
    # auto picks by the learner's device, even on a GPU host
    on_cpu = _learner(tmp_path, trainer="auto", device="cpu")
    assert isinstance(choose_host(on_cpu), ProcessHost)


def test_inference_runs_the_device_trainers_copy_without_the_trainers_lock(tmp_path):
    """The engine of a device trainer acts with the trainer's inference copy (its own
    storage, equal weights), refreshes through the trainer, and shares no lock with it."""
    learner = _learner(tmp_path, inference_backend="torch")
    trainer = _device_trainer(learner)
    assert trainer.inference_model is not learner.model
    assert _same(_weights(trainer.inference_model), _weights(learner.model))
    engine = make_engine(learner, trainer)
    assert isinstance(engine.policy, TorchPolicy)
    assert engine.policy.model is trainer.inference_model
    assert engine.refresh_weights == trainer.refresh_weights
    assert engine.weights_lock is not learner.weights_lock
    assert engine.weights_lock is trainer.inference_lock


def test_inference_sees_a_step_only_after_refresh_and_then_exactly(tmp_path):
    """The trainer steps its own weights; inference's copy changes at refresh, to equal them."""
    learner = _learner(tmp_path)
    trainer = _device_trainer(learner)
    inference = trainer.inference_model
    before = _weights(inference)
    assert _same(before, _weights(learner.model))

    scalars = trainer.train_step(random_unrolls(B, T, seed=0))
    assert scalars is not None
    assert trainer.step_counter.value == 1
    assert learner.step_counter.value == 0, "inference's step moves only with its weights"
    assert _same(before, _weights(inference)), "inference's weights changed before refresh"
    assert not _same(before, _weights(learner.model))

    trainer.refresh_weights()
    assert learner.step_counter.value == 1
    assert _same(_weights(inference), _weights(learner.model))
    # Inference's copy is its own storage: the next step leaves it alone until refreshed.
    trainer.train_step(random_unrolls(B, T, seed=1))
    assert not _same(_weights(inference), _weights(learner.model))


def test_device_trainer_steps_exactly_as_the_thread_trainer(tmp_path):
    """Staging through its own buffers changes nothing: the same batches, the same weights."""
    device_learner = _learner(tmp_path / "device")
    thread_learner = _learner(tmp_path / "thread", trainer="thread")
    device = _device_trainer(device_learner)
    thread = make_trainer(thread_learner)
    for seed in range(3):  # more batches than staging buffers: each is reused
        a = device.train_step(random_unrolls(B, T, seed))
        b = thread.train_step(random_unrolls(B, T, seed))
        assert a == b
    assert _same(_weights(device_learner.model), _weights(thread_learner.model))


def _frame_unrolls(learner: Learner, seed: int) -> Unrolls:
    """Unrolls as a frame-once Atari learner stores them: single frames, episodes starting
    inside the unroll (so some stacked planes are the zeros of a fresh stack)."""
    rng = np.random.default_rng(seed)
    unrolls = learner.builder.empty_unrolls(B)
    unrolls.obs[...] = rng.integers(0, 256, unrolls.obs.shape, dtype=np.uint8)
    unrolls.first[:, [2, T - 1]] = True
    unrolls.reward[...] = rng.normal(size=unrolls.reward.shape)
    unrolls.action[...] = rng.integers(0, 6, unrolls.action.shape)
    unrolls.policy_params[...] = rng.normal(size=unrolls.policy_params.shape)
    return unrolls


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda_only)])
def test_device_trainer_rebuilds_frame_stacks_as_the_thread_trainer(tmp_path, device):
    """A frame-once Atari learner stages single frames: the device trainer must train on
    the rebuilt stacks, as the thread trainer does (it once fed the frames to the CNN)."""
    pytest.importorskip("ale_py")
    atari = {"env": "ALE/Pong-v5", "model": "cnn", "device": device, "precision": "fp32"}
    device_learner = _learner(tmp_path / "device", **atari)
    thread_learner = _learner(tmp_path / "thread", trainer="thread", **atari)
    assert device_learner.builder.frame_stack == 4
    trainer, thread = _device_trainer(device_learner), make_trainer(thread_learner)
    for seed in range(3):  # more batches than staging buffers: each is reused
        a = trainer.train_step(_frame_unrolls(device_learner, seed))
        b = thread.train_step(_frame_unrolls(thread_learner, seed))
        assert a is not None and b is not None
        assert a.keys() == b.keys()
        np.testing.assert_allclose(list(a.values()), list(b.values()), rtol=1e-4, atol=1e-6)
    for x, y in zip(_weights(device_learner.model), _weights(thread_learner.model), strict=True):
        torch.testing.assert_close(x, y)


def test_running_device_trainer_trains_from_the_queue_and_checkpoints(tmp_path):
    learner = _learner(tmp_path)
    trainer = _device_trainer(learner)
    trainer.start()
    try:
        learner.queue.put(random_unrolls(B, T, seed=0))
        wait_until(lambda: learner.stats.learner_steps == 1, 60.0, interval=0.01)
        state = trainer.training_state()
        assert state.learner_steps == 1
        assert _same(list(state.model.values()), _weights(learner.model))
    finally:
        trainer.stop()
    assert not trainer.alive
    assert learner.step_counter.value == 1, "stop hands the last step to inference"
    assert _same(_weights(trainer.inference_model), _weights(learner.model))


def test_precision_auto_is_bf16_on_cuda_only():
    assert resolve_precision("auto", torch.device("cuda")) == "bf16"
    assert resolve_precision("auto", torch.device("cpu")) == "fp32"
    assert resolve_precision("bf16", torch.device("cpu")) == "bf16"
    assert resolve_precision("fp32", torch.device("cuda")) == "fp32"
    with pytest.raises(ValueError, match="precision must be"):
        LearnerConfig(precision="fp16")


def test_bf16_forward_differs_slightly_and_keeps_fp32_weights(tmp_path):
    """bf16 rounds the forward pass (close to fp32, not equal); weights and outputs stay fp32."""
    cpu = torch.device("cpu")
    learner = _learner(tmp_path, trainer="thread")
    model, head = learner.model, learner.head
    assert isinstance(inference_policy(model, head, cpu, "auto", 0), NumpyMLPPolicy)
    bf16 = inference_policy(model, head, cpu, "auto", 0, "bf16")
    fp32 = inference_policy(model, head, cpu, "torch", 0, "fp32")
    assert isinstance(bf16, TorchPolicy)
    obs = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    first = np.zeros(8, bool)
    _, params_bf16, _ = bf16(obs, first, ())
    _, params_fp32, _ = fp32(obs, first, ())
    assert params_bf16.dtype == np.float32
    assert not np.array_equal(params_bf16, params_fp32)
    np.testing.assert_allclose(params_bf16, params_fp32, atol=0.05)

    losses = {}
    for precision in ("fp32", "bf16"):
        twin = _learner(tmp_path / precision, trainer="thread", precision=precision)
        twin.model.load_state_dict(model.state_dict())
        trainer = make_trainer(twin)
        assert trainer.agent.precision == precision
        scalars = trainer.train_step(random_unrolls(B, T, seed=0))
        assert scalars is not None
        losses[precision] = scalars["loss_total"]
        assert all(p.dtype == torch.float32 for p in twin.model.parameters())
        assert all(
            v.dtype == torch.float32
            for v in twin.optimizer.state_dict()["state"][0].values()
            if v.dim()
        )
    assert losses["bf16"] != losses["fp32"]
    assert losses["bf16"] == pytest.approx(losses["fp32"], rel=0.05, abs=0.05)


def _train_cartpole(tmp_path: Path, *extra: str) -> tuple[str, dict[str, int]]:
    """A learner with ``extra`` flags and one actor, trained for 3000 frames: (output, result)."""
    flags = ["--total-frames", "3000", "--batch-size", "4", *extra]
    with learner_process(tmp_path, *flags) as (learner, port):
        with running(actor_args(port, 1, 4)) as actors:
            assert learner.wait(timeout=120) == 0, learner.output()
            assert actors.wait(timeout=30) == 0, actors.output()
    return learner.output(), json.loads((tmp_path / "result.json").read_text())


def test_cartpole_run_with_the_device_trainer(tmp_path):
    """End to end on this machine's device: a learner with --trainer device trains."""
    output, result = _train_cartpole(tmp_path, "--trainer", "device")
    assert "trainer device" in output
    assert result["frames"] >= 3000
    assert result["learner_steps"] > 0


# ---------------------------------------------------------------------- on a GPU


@cuda_only
def test_cuda_device_trainer_hands_weights_over_on_the_device(tmp_path):
    learner = _learner(tmp_path, device="cuda")
    trainer = _device_trainer(learner)
    assert trainer.stream is not None
    assert all(t.is_pinned() for t in trainer._staging[0].tensors.values())
    for seed in range(4):
        assert trainer.train_step(random_unrolls(B, T, seed)) is not None
        trainer.refresh_weights()
    torch.cuda.synchronize()
    assert learner.step_counter.value == 4
    assert all(t.is_cuda for t in trainer.inference_model.state_dict().values())
    assert _same(_weights(trainer.inference_model), _weights(learner.model))


@cuda_only
def test_cuda_device_trainer_matches_the_thread_trainer_in_fp32(tmp_path):
    device_learner = _learner(tmp_path / "d", device="cuda", precision="fp32")
    thread_learner = _learner(tmp_path / "t", device="cuda", precision="fp32", trainer="thread")
    device, thread = _device_trainer(device_learner), make_trainer(thread_learner)
    for seed in range(3):
        a = device.train_step(random_unrolls(B, T, seed))
        b = thread.train_step(random_unrolls(B, T, seed))
        assert a is not None and b is not None
        assert a.keys() == b.keys()
    for x, y in zip(_weights(device_learner.model), _weights(thread_learner.model), strict=True):
        torch.testing.assert_close(x, y)


@cuda_only
def test_cuda_bf16_policy_stages_through_pinned_memory(tmp_path):
    learner = _learner(tmp_path, device="cuda", precision="bf16")
    policy = inference_policy(learner.model, learner.head, torch.device("cuda"), "auto", 0, "bf16")
    assert isinstance(policy, TorchPolicy)
    obs = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    action, params, _ = policy(obs, np.zeros(8, bool), ())
    assert params.dtype == np.float32 and action.shape == (8,)
    assert policy._staging["obs"].is_pinned()
    _, again, _ = policy(obs[:5], np.zeros(5, bool), ())  # a smaller batch reuses the buffer
    np.testing.assert_array_equal(again, params[:5])


@cuda_only
def test_cuda_cartpole_run_auto_picks_the_device_trainer(tmp_path):
    output, result = _train_cartpole(tmp_path, "--device", "cuda")
    assert "trainer device, fp32" in output  # fp32 is the default precision on every device
    assert result["learner_steps"] > 0


def test_device_trainer_takes_updates_per_batch_steps_per_batch(tmp_path):
    """K steps per queued batch, each as the thread trainer takes it, counted K times."""
    k = 2
    learner = _learner(tmp_path / "device", updates_per_batch=k)
    thread = make_trainer(_learner(tmp_path / "thread", trainer="thread"))
    for _ in range(k):
        assert thread.train_step(random_unrolls(B, T, seed=0)) is not None
    trainer = _device_trainer(learner)
    trainer.start()
    try:
        learner.queue.put(random_unrolls(B, T, seed=0))
        wait_until(lambda: learner.stats.learner_steps == k, 60.0, interval=0.01)
    finally:
        trainer.stop()
    assert trainer.error is None
    assert trainer.step_counter.value == learner.step_counter.value == k
    assert _same(_weights(learner.model), _weights(thread.model))
