"""Training in a child process: the thread's step exactly, weights reach inference, errors show."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from support import random_unrolls, small_learner, wait_until

from learner.parts import Learner, make_checkpointer, make_trainer
from learner.run import choose_host
from learner.state import checkpoint
from learner.state.trajectories import Unrolls
from learner.training.process_host import ProcessHost
from seedrl.config import LearnerConfig

T, B = 6, 3


def _learner(tmp_path: Path, **overrides: object) -> Learner:
    return small_learner(tmp_path, T, B, **{"trainer": "process", **overrides})


def _process_trainer(learner: Learner) -> ProcessHost:
    trainer = choose_host(learner)
    assert isinstance(trainer, ProcessHost)
    return trainer


@contextlib.contextmanager
def _running(learner: Learner, stop_timeout: float = 30.0) -> Iterator[ProcessHost]:
    """A started trainer process, stopped (and so ended) on the way out."""
    trainer = _process_trainer(learner)
    trainer.start()
    try:
        yield trainer
    finally:
        trainer.stop(stop_timeout)
    assert not trainer.alive


def _train(learner: Learner, unrolls: Unrolls, steps_after: int) -> None:
    learner.queue.put(unrolls)
    wait_until(lambda: learner.stats.learner_steps == steps_after, 60.0, interval=0.01)


def _unrolls(seed: int, reward: float | None = None) -> Unrolls:
    unrolls = random_unrolls(B, T, seed)
    if reward is not None:
        unrolls.reward[:] = reward
    return unrolls


def _weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [t.detach().clone() for t in model.state_dict().values()]


def test_empty_unrolls_match_what_the_builder_records(tmp_path):
    """The shared slots are sized from empty_unrolls; a recorded unroll must fit them exactly."""
    learner = _learner(tmp_path)
    builder = learner.builder
    empty = builder.empty_unrolls(1)
    slots = builder.allocate(1)
    unrolls = None
    for step in range(T + 1):
        unrolls, _ = builder.record(
            slots, np.zeros((1, 4), np.float32), np.zeros(1, np.float32), np.zeros(1, bool),
            np.zeros(1, bool), builder.first_flags(slots), np.zeros((1,), np.int64),
            np.zeros((1, 2), np.float32), (), (), step,
        )  # fmt: skip
    assert unrolls is not None
    for name in ("obs", "first", "reward", "terminated", "truncated", "action", "policy_params"):
        got, want = getattr(unrolls, name), getattr(empty, name)
        assert (got.shape, got.dtype) == (want.shape, want.dtype), name
    assert (unrolls.acted_step.shape, unrolls.acted_step.dtype) == (
        empty.acted_step.shape,
        empty.acted_step.dtype,
    )


def test_child_step_is_the_thread_step_and_reaches_inference(tmp_path):
    """Same batches, same start: the child's weights and Adam state equal the thread's exactly."""
    thread_learner, process_learner = _learner(tmp_path / "t"), _learner(tmp_path / "p")
    for a, b in zip(_weights(thread_learner.model), _weights(process_learner.model), strict=True):
        assert torch.equal(a, b)
    batches = [_unrolls(0), _unrolls(1)]
    thread = make_trainer(thread_learner)
    for batch in batches:
        assert thread.train_step(batch) is not None

    before = _weights(process_learner.model)
    with _running(process_learner) as trainer:
        for batch in batches:
            process_learner.queue.put(batch)
        wait_until(lambda: process_learner.stats.learner_steps == 2, 60.0, interval=0.01)
        trainer.refresh_weights()
        assert process_learner.step_counter.value == 2
        after = _weights(process_learner.model)
        assert any(not torch.equal(x, y) for x, y in zip(before, after, strict=True))
        for got, want in zip(after, _weights(thread_learner.model), strict=True):
            assert torch.equal(got, want)
        live = trainer.training_state()
        assert live is not None and live.learner_steps == 2
        record = process_learner.stats.snapshot()
        assert record["learner_steps"] == 2 and np.isfinite(record["loss_total"])
        assert record["trainer_wait_share"] > 0.0
    assert trainer.error is None
    final = trainer.training_state()
    assert final is not None and final.learner_steps == 2
    want_state = thread.training_state()
    for name, tensor in want_state.model.items():
        assert torch.equal(final.model[name], tensor), name
    for index, moments in want_state.optimizer["state"].items():
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(final.optimizer["state"][index][key], moments[key])


def test_inference_never_waits_for_the_child_publishing_weights(tmp_path):
    """While the child holds the weights lock (publishing a step), a refresh returns at once
    on the old weights, and the next one after the lock is free loads the new step."""
    import threading

    learner = _learner(tmp_path)
    before = _weights(learner.model)
    with _running(learner) as trainer:
        _train(learner, _unrolls(0), steps_after=1)
        assert trainer._shared_lock.acquire(timeout=10)  # as the child does to publish
        try:
            refresh = threading.Thread(target=trainer.refresh_weights, daemon=True)
            refresh.start()
            refresh.join(timeout=5)
            assert not refresh.is_alive(), "inference waited for the child's lock"
            assert learner.step_counter.value == 0
            for got, want in zip(_weights(learner.model), before, strict=True):
                assert torch.equal(got, want)
        finally:
            trainer._shared_lock.release()
        trainer.refresh_weights()
        assert learner.step_counter.value == 1
        assert any(
            not torch.equal(got, want)
            for got, want in zip(_weights(learner.model), before, strict=True)
        )
    assert trainer.error is None


def test_non_finite_batch_is_skipped_in_the_child(tmp_path):
    learner = _learner(tmp_path)
    before = _weights(learner.model)
    with _running(learner) as trainer:
        learner.queue.put(_unrolls(0, reward=float("nan")))
        wait_until(lambda: learner.stats.nonfinite_skipped == 1, 60.0, interval=0.01)
        trainer.refresh_weights()
        assert learner.stats.learner_steps == 0 and learner.step_counter.value == 0
        for got, want in zip(_weights(learner.model), before, strict=True):
            assert torch.equal(got, want)
        _train(learner, _unrolls(1), steps_after=1)
    assert trainer.error is None


def test_waiting_for_data_is_reported_while_it_lasts(tmp_path):
    """Metrics intervals see the trainer's waiting as it happens, before any batch arrives."""
    learner = _learner(tmp_path)
    with _running(learner):
        wait_until(
            lambda: learner.stats.timer.drain().get("trainer_wait_data", 0.0) > 0.0,
            60.0,
            interval=0.01,
        )
        assert learner.stats.learner_steps == 0


def test_a_killed_child_is_an_error_and_keeps_the_last_checkpoint(tmp_path):
    learner = _learner(tmp_path)
    with _running(learner, stop_timeout=10.0) as trainer:
        _train(learner, _unrolls(0), steps_after=1)
        make_checkpointer(learner, trainer.training_state).save()
        written = learner.config.checkpoint_path.read_bytes()
        assert trainer.pid is not None
        os.kill(trainer.pid, signal.SIGKILL)
        wait_until(lambda: trainer.error is not None, 60.0, interval=0.01)
        assert "exited with code -9" in str(trainer.error)
        assert trainer.training_state() is None
        make_checkpointer(learner, trainer.training_state).save()  # logs, writes nothing
        assert learner.config.checkpoint_path.read_bytes() == written


def test_resume_starts_the_child_from_the_checkpoint(tmp_path):
    learner = _learner(tmp_path)
    with _running(learner) as trainer:
        _train(learner, _unrolls(0), steps_after=1)
    make_checkpointer(learner, trainer.training_state).save()

    resumed = _learner(tmp_path, resume=True)
    assert resumed.step_counter.value == 1
    with _running(resumed) as again:
        _train(resumed, _unrolls(1), steps_after=2)
        state = again.training_state()
        assert state is not None and state.learner_steps == 2


def test_the_childs_return_statistics_are_checkpointed_and_resumed(tmp_path):
    """The child keeps the running return scale: a checkpoint takes the child's, and a
    resumed child goes on from it rather than from nothing."""
    learner = _learner(tmp_path, normalize_returns=True)
    with _running(learner) as trainer:
        _train(learner, _unrolls(0), steps_after=1)
    make_checkpointer(learner, trainer.training_state).save()
    saved = checkpoint.load(learner.config.checkpoint_path)["return_normalizer"]
    assert float(saved["count"]) == B * T and float(saved["var"]) > 0

    resumed = _learner(tmp_path, normalize_returns=True, resume=True)
    assert resumed.state.extras["return_normalizer"] is not None
    assert resumed.state.extras["return_normalizer"].count == B * T
    with _running(resumed) as again:
        _train(resumed, _unrolls(1), steps_after=2)
        state = again.training_state()
    assert state is not None and "return_normalizer" in state.agent_state
    assert float(state.agent_state["return_normalizer"]["count"]) == 2 * B * T


def test_trainer_mode_is_checked(tmp_path):
    with pytest.raises(ValueError, match="trainer must be"):
        LearnerConfig(logdir=str(tmp_path), trainer="gpu")
    thread = choose_host(_learner(tmp_path, trainer="thread"))
    assert thread.mode == "thread"


def test_the_child_takes_updates_per_batch_steps_on_each_batch(tmp_path):
    """K steps per batch in the child: K steps counted, published and equal to K thread
    steps on the same batch (a child taking one step, or K on stale weights, differs)."""
    k = 3
    thread = make_trainer(_learner(tmp_path / "t"))
    for _ in range(k):
        assert thread.train_step(_unrolls(0)) is not None
    learner = _learner(tmp_path / "p", updates_per_batch=k)
    with _running(learner) as trainer:
        _train(learner, _unrolls(0), steps_after=k)
        trainer.refresh_weights()
        assert learner.step_counter.value == k
        for got, want in zip(_weights(learner.model), _weights(thread.model), strict=True):
            assert torch.equal(got, want)
    assert trainer.error is None
    final = trainer.training_state()
    assert final is not None and final.learner_steps == k
