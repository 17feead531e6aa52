"""The V-trace actor-critic loss (masking, termination vs truncation, advantage scaling)
and the step around it (flat gradients, clipping)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import threading

import gymnasium as gym
import numpy as np
import pytest
import torch
from support import engine_for, random_unrolls, wait_until

from learner.agents.base import UPDATE_LOGP
from learner.agents.models import LOG_STD_MAX, LOG_STD_MIN, action_head, build_model
from learner.agents.vtrace import targets as vtrace
from learner.agents.vtrace.agent import RETURN_NORMALIZER_KEY, VTraceAgent
from learner.common.schedules import entropy_cost_schedule, learning_rate_schedule
from learner.parts import build_learner, make_trainer, save_checkpoint
from learner.serving.batcher import PendingRequest
from learner.serving.inference import Connection, FramePayload, StepCounter
from learner.state import checkpoint
from learner.state.normalize import ReturnNormalizer
from learner.state.stats import LearnerStats
from learner.state.trajectories import TrajectoryBuilder, UnrollQueue, Unrolls
from learner.training.hosts import ThreadHost
from learner.training.trainer import (
    GradientBuffer,
    Trainer,
    TrainerParts,
    UpdateBound,
    to_time_major,
)
from seedrl import codec
from seedrl.config import LearnerConfig
from seedrl.proto import seedrl_pb2 as pb

T, B = 6, 3


def _trainer(tmp_path, **overrides) -> Trainer:
    """A small trainer on raw rewards (the loss tests pin raw-reward arithmetic; return
    normalisation, on by default, has its own tests)."""
    fields = {"normalize_returns": False, **overrides}
    config = LearnerConfig(
        logdir=str(tmp_path), unroll_length=T, batch_size=B, max_queue_unrolls=B, **fields
    )
    return make_trainer(build_learner(config))


def _unrolls(seed: int = 0) -> Unrolls:
    return random_unrolls(B, T, seed)


def _loss(trainer: Trainer, unrolls: Unrolls) -> dict[str, float]:
    _, parts = trainer.loss(to_time_major(unrolls, torch.device("cpu")), ())
    return {k: float(v) for k, v in parts.items() if k != UPDATE_LOGP}  # per frame, for the bound


def test_the_fake_transition_after_a_done_frame_does_not_count(tmp_path):
    """What is stored on a done frame's action and on the reset frame's reward is ignored."""
    trainer = _trainer(tmp_path)
    base = _unrolls()
    base.terminated[:, 2] = True  # frame 2 ends the episode; frame 3 is the reset frame
    base.reward[:, 3] = 0.0
    before = _loss(trainer, base)
    changed = dataclasses.replace(
        base,
        action=base.action.copy(),
        policy_params=base.policy_params.copy(),
        reward=base.reward.copy(),
    )
    changed.action[:, 2] = 1 - changed.action[:, 2]
    changed.policy_params[:, 2] += 5.0
    after = _loss(trainer, changed)
    assert before == after


def test_rewards_after_an_episode_end_never_flow_back(tmp_path, monkeypatch):
    """Value targets before a terminated or truncated frame ignore the next episode's rewards."""
    trainer = _trainer(tmp_path)
    captured: list[torch.Tensor] = []
    real = vtrace.from_importance_weights

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        result = real(*args, **kwargs)
        captured.append(result.vs)
        return result

    monkeypatch.setattr(vtrace, "from_importance_weights", spy)
    for flag in ("terminated", "truncated"):
        targets = []
        for late_reward in (0.0, 100.0):
            unrolls = _unrolls(seed=1)
            getattr(unrolls, flag)[:, 3] = True  # frame 3 ends the episode
            unrolls.reward[:, 4] = 0.0  # frame 4 is the reset frame
            unrolls.reward[:, 5:] = late_reward  # the next episode's rewards
            _loss(trainer, unrolls)
            targets.append(captured.pop())
        assert torch.equal(targets[0][:3], targets[1][:3]), flag
        assert not torch.equal(targets[0][4:], targets[1][4:]), flag


def test_discount_is_zero_only_into_a_terminated_frame(tmp_path):
    """The last real transition into a terminated frame has no bootstrap; truncated has one."""
    trainer = _trainer(tmp_path)
    with torch.no_grad():  # a constant value of 10 everywhere makes the bootstrap visible
        trainer.model.baseline.weight.zero_()
        trainer.model.baseline.bias.fill_(10.0)
    results = {}
    for flag in ("terminated", "truncated"):
        unrolls = _unrolls(seed=2)
        unrolls.reward[:] = 0.0
        getattr(unrolls, flag)[:, T - 1] = True
        results[flag] = _loss(trainer, unrolls)["loss_baseline"]
    # terminated: the target into frame T-1 is 0 (value 10 -> error 10); truncated: the
    # target is 0.99 * 10 (error 0.1), so the baseline loss is far smaller.
    assert results["terminated"] > 10 * results["truncated"]


def test_normalized_advantages_make_the_policy_loss_scale_free(tmp_path):
    """With --normalize-advantages, scaling rewards leaves the policy-gradient term unchanged."""
    losses = {}
    for normalize in (False, True):
        trainer = _trainer(tmp_path / str(normalize), normalize_advantages=normalize)
        with torch.no_grad():  # V = 0, so advantages scale exactly with the rewards
            trainer.model.baseline.weight.zero_()
            trainer.model.baseline.bias.zero_()
        small = _unrolls(seed=3)
        large = dataclasses.replace(small, reward=small.reward * 10.0)
        losses[normalize] = (
            _loss(trainer, small)["loss_policy"],
            _loss(trainer, large)["loss_policy"],
        )
    raw_small, raw_large = losses[False]
    assert abs(raw_large - 10 * raw_small) < 1e-3 * max(1.0, abs(raw_large))
    norm_small, norm_large = losses[True]
    assert abs(norm_small - norm_large) < 1e-5


def test_normalized_returns_make_the_loss_free_of_the_reward_scale(tmp_path):
    """With --normalize-returns an env paying 1000x the rewards trains on the same numbers
    once the return statistics have seen it; raw rewards give a 1000x policy loss."""
    small = _unrolls(seed=5)
    assert small.running_return is not None
    large = dataclasses.replace(
        small, reward=small.reward * 1000.0, running_return=small.running_return * 1000.0
    )
    losses = {}
    for normalize in (False, True):
        for name, unrolls in (("small", small), ("large", large)):
            trainer = _trainer(tmp_path / f"{normalize}{name}", normalize_returns=normalize)
            with torch.no_grad():  # V = 0: the V-trace targets are the discounted returns
                trainer.model.baseline.weight.zero_()
                trainer.model.baseline.bias.zero_()
            for _ in range(2):  # the return statistics see the batch twice
                _loss(trainer, unrolls)
            losses[normalize, name] = _loss(trainer, unrolls)
    raw_small, raw_large = losses[False, "small"], losses[False, "large"]
    assert abs(raw_large["loss_policy"]) > 100 * abs(raw_small["loss_policy"])
    norm_small, norm_large = losses[True, "small"], losses[True, "large"]
    for key in ("loss_policy", "loss_baseline"):
        assert abs(norm_small[key] - norm_large[key]) <= 1e-4 * max(1.0, abs(norm_small[key]))
    assert abs(norm_large["reward_norm_scale"] * 1000 - norm_small["reward_norm_scale"]) < (
        1e-3 * norm_small["reward_norm_scale"]
    )


def test_the_return_scale_is_measured_on_the_rewards_and_never_on_the_value_head(tmp_path):
    """--normalize-returns divides rewards by the std of each episode's discounted reward
    sum so far (numpy's std over the batches seen), whatever the value head predicts: a
    scale fed by the head's own outputs could fall without end (an Acrobot run's did)."""
    unrolls = _unrolls(seed=6)
    assert unrolls.running_return is not None
    expected = 1.0 / np.std(unrolls.running_return[:, 1:].astype(np.float64))
    scales = []
    for value in (0.0, 1000.0):
        trainer = _trainer(tmp_path / str(value), normalize_returns=True)
        with torch.no_grad():  # the value head predicts `value` everywhere
            trainer.model.baseline.weight.zero_()
            trainer.model.baseline.bias.fill_(value)
        for _ in range(3):
            _loss(trainer, unrolls)
        scales.append(_loss(trainer, unrolls)["reward_norm_scale"])
    assert scales[0] == scales[1]
    assert abs(scales[0] - expected) <= 1e-5 * expected


# ---------------------------------------------------------------------- the step


def _twin_models(seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(seed)
    ours = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    theirs = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def _grads_are_views_of(grads: GradientBuffer, model: torch.nn.Module) -> bool:
    flat = grads.flat.untyped_storage().data_ptr()
    return all(
        p.grad is not None and p.grad.untyped_storage().data_ptr() == flat
        for p in model.parameters()
    )


def _backward(model: torch.nn.Module, scale: float) -> None:
    x = torch.linspace(-1, 1, 12).reshape(4, 3)
    (model(x).pow(2).sum() * scale).backward()


def test_gradient_buffer_clips_as_torch_does_and_its_views_survive_backward():
    """Gradients accumulate into the flat buffer's views (two backwards add up), and the
    clipped result and the norm are torch's ``clip_grad_norm_``'s."""
    ours, theirs = _twin_models()
    grads = GradientBuffer(ours.parameters(), torch.device("cpu"))
    for scale in (50.0, 30.0):
        _backward(ours, scale)
        _backward(theirs, scale)
    assert _grads_are_views_of(grads, ours)
    norm = grads.clip_norm(1.0)
    reference = torch.nn.utils.clip_grad_norm_(theirs.parameters(), 1.0)
    torch.testing.assert_close(norm, reference)
    assert float(norm) > 1.0  # the case where clipping changes the gradients
    for mine, their in zip(ours.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(mine.grad, their.grad)

    grads.zero()
    assert all(p.grad is not None and not p.grad.any() for p in ours.parameters())
    _backward(ours, 1e-3)  # small: no clipping
    before = grads.flat.clone()
    grads.clip_norm(1.0)
    torch.testing.assert_close(grads.flat, before)


def test_a_skipped_gradient_leaves_the_buffer_zeroed_and_attached(tmp_path, monkeypatch):
    """A non-finite gradient skips the step; the next step trains on fresh gradients."""
    trainer = _trainer(tmp_path)
    weights = [p.detach().clone() for p in trainer.model.parameters()]
    monkeypatch.setattr(trainer.grads, "clip_norm", lambda max_norm: torch.tensor(float("nan")))
    assert trainer.train_step(_unrolls()) is None
    assert trainer.stats.nonfinite_skipped == 1
    assert not trainer.grads.flat.any()
    for before, p in zip(weights, trainer.model.parameters(), strict=True):
        torch.testing.assert_close(p.detach(), before)
    monkeypatch.undo()
    assert trainer.train_step(_unrolls()) is not None
    assert trainer.grads.flat.abs().sum() > 0
    assert _grads_are_views_of(trainer.grads, trainer.model)


# ---------------------------------------------------------------------- policy lag


def test_policy_lag_is_the_mean_lag_of_the_trained_actions(tmp_path):
    """policy_lag = mean over rows 0..T-1 of every unroll of (steps applied before this one)
    - (step of the weights that chose the action); row T is only the bootstrap frame."""
    trainer = _trainer(tmp_path)
    unrolls = _unrolls()
    unrolls.acted_step[0] = [3, 3, 4, 4, 5, 5, 0]  # T = 6: row T (0 here) is not trained
    unrolls.acted_step[1] = [6, 6, 6, 6, 6, 6, 6]
    unrolls.acted_step[2] = [1, 2, 3, 4, 5, 6, 6]
    trainer.step_counter.value = 6  # six steps applied: this gradient uses step-6 weights
    lags = [6 - s for row in unrolls.acted_step for s in row[:T]]
    scalars = trainer.train_step(unrolls)
    assert scalars is not None
    assert scalars["policy_lag"] == pytest.approx(sum(lags) / len(lags))
    assert trainer.step_counter.value == 7


class _StepOnRelease:
    """A weights lock that a trainer thread grabs the moment inference lets go of it, and
    takes one optimizer step under (the race that made --trainer thread's lag one low)."""

    def __init__(self, counter: StepCounter) -> None:
        self._lock = threading.Lock()
        self.counter = counter

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()
        with self._lock:
            self.counter.value += 1


def test_frames_are_labelled_with_the_step_of_the_weights_that_acted_on_them():
    head = action_head(pb.SpaceSpec(kind="discrete", n=2))
    model = build_model(pb.SpaceSpec(kind="box", shape=[4], dtype="float32"), head, "mlp", (8,))
    builder = TrajectoryBuilder(
        unroll_length=3, obs_shape=(4,), obs_dtype="float32", action_shape=(),
        action_dtype="int64", param_size=2, core_state_sizes=(),
    )  # fmt: skip
    counter = StepCounter()
    queue = UnrollQueue(8)
    engine = engine_for(
        model, head, torch.device("cpu"), builder, queue, LearnerStats(),
        _StepOnRelease(counter), counter,  # type: ignore[arg-type]
    )  # fmt: skip
    conn = Connection("a", "r", "peer", 1, builder.allocate(1))

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        for _ in range(4):
            payload = FramePayload(
                conn, np.zeros(4, np.float32).tobytes(), np.zeros(1, np.float32).tobytes(),
                np.zeros(1, np.bool_).tobytes(), np.zeros(1, np.bool_).tobytes(),
            )  # fmt: skip
            await engine.process([PendingRequest(payload, 1, loop.create_future())])

    asyncio.run(serve())
    unrolls = queue.get(1, timeout=1)
    assert unrolls is not None
    # forward pass i ran under step i; the trainer stepped after each one
    assert unrolls.acted_step[0].tolist() == [0, 1, 2, 3]
    assert counter.value == 4


# ---------------------------------------------------------------------- Gaussian log-std


def _gaussian_trainer(log_std: float) -> Trainer:
    torch.manual_seed(0)
    head = action_head(pb.SpaceSpec(kind="box", shape=[1], dtype="float32"))
    model = build_model(pb.SpaceSpec(kind="box", shape=[3], dtype="float32"), head, "mlp", (8,))
    assert model.log_std is not None
    with torch.no_grad():
        model.log_std.fill_(log_std)
    config = LearnerConfig(
        unroll_length=T, batch_size=B, max_queue_unrolls=B, entropy_cost=0.0,
        learning_rate=0.05, normalize_returns=False,
    )  # fmt: skip
    cpu = torch.device("cpu")
    agent = VTraceAgent(config, pb.SpaceSpec(kind="box", shape=[1], dtype="float32"), cpu)
    return Trainer(TrainerParts.unshared(config, agent, agent.state_for(model), cpu))


def _gaussian_unrolls(behaviour_log_std: float) -> Unrolls:
    rng = np.random.default_rng(6)
    rows = T + 1
    params = np.zeros((B, rows, 2), np.float32)
    params[..., 1] = behaviour_log_std
    return Unrolls(
        obs=rng.normal(size=(B, rows, 3)).astype(np.float32),
        first=np.zeros((B, rows), bool),
        reward=rng.normal(size=(B, rows)).astype(np.float32),
        terminated=np.zeros((B, rows), bool),
        truncated=np.zeros((B, rows), bool),
        action=(rng.normal(size=(B, rows, 1)) * np.exp(behaviour_log_std)).astype(np.float32),
        policy_params=params,
        core_state=(),
        acted_step=np.zeros((B, rows), np.int64),
    )


@pytest.mark.parametrize("beyond", [LOG_STD_MAX + 1.0, LOG_STD_MIN - 1.0])
def test_a_log_std_beyond_its_bound_still_gets_a_gradient_and_returns(beyond):
    """With entropy_cost 0 nothing else holds a log-std in: past a bound it must still
    feel the loss (no clamp with a zero gradient) and be brought back by the step."""
    trainer = _gaussian_trainer(beyond)
    unrolls = _gaussian_unrolls(behaviour_log_std=beyond)  # acted with it: rho near 1
    total, _ = trainer.loss(to_time_major(unrolls, torch.device("cpu")), ())
    total.backward()
    log_std = trainer.model.log_std
    assert log_std is not None and log_std.grad is not None
    assert float(log_std.grad.abs().sum()) > 0
    assert trainer.train_step(unrolls) is not None
    assert LOG_STD_MIN <= float(log_std.detach().min()) <= LOG_STD_MAX


# ---------------------------------------------------------------------- learning rate


def test_linear_schedule_reaches_zero_at_total_frames():
    config = LearnerConfig(learning_rate=4e-3, lr_schedule="linear", total_frames=1000)
    lrs = [learning_rate_schedule(config)(step * 100) for step in (0, 5, 9, 10, 12)]
    assert lrs == pytest.approx([4e-3, 2e-3, 4e-4, 0.0, 0.0])
    constant = LearnerConfig(learning_rate=4e-3, lr_schedule="constant", total_frames=1000)
    assert learning_rate_schedule(constant)(12 * 100) == 4e-3


def test_linear_schedule_can_hold_the_rate_before_it_falls():
    """From --lr-decay-start of the budget on, the rate falls on a line to 0 at the budget."""
    config = LearnerConfig(
        learning_rate=4e-3, lr_schedule="linear", total_frames=1000, lr_decay_start=0.6
    )
    lrs = [learning_rate_schedule(config)(step * 100) for step in (0, 6, 8, 10)]
    assert lrs == pytest.approx([4e-3, 4e-3, 2e-3, 0.0])
    with pytest.raises(ValueError, match="--lr-decay-start must be in"):
        LearnerConfig(lr_schedule="linear", total_frames=1000, lr_decay_start=1.0)
    with pytest.raises(ValueError, match="linear schedule; this run's is constant"):
        LearnerConfig(lr_schedule="constant", lr_decay_start=0.5)


def test_inverse_sqrt_schedule_holds_the_rate_then_falls_with_no_end():
    """--lr-hold-frames at the full rate, then rate x sqrt(hold / frames): a quarter at 16x."""
    config = LearnerConfig(learning_rate=4e-3, lr_schedule="inverse_sqrt", lr_hold_frames=1000)
    schedule = learning_rate_schedule(config)
    lrs = [schedule(100 * step) for step in (0, 5, 10, 40, 160, 10_000)]
    assert lrs == pytest.approx([4e-3, 4e-3, 4e-3, 2e-3, 1e-3, 4e-3 / math.sqrt(1000)])
    with pytest.raises(ValueError, match="--lr-hold-frames must be >= 1"):
        LearnerConfig(lr_hold_frames=0)
    with pytest.raises(ValueError, match="linear schedule; this run's is inverse_sqrt"):
        LearnerConfig(lr_decay_start=0.5)


@pytest.mark.parametrize(
    ("total_frames", "target_return", "expected"),
    [(1000, None, 8e-4), (0, None, 1e-3), (1000, 475.0, 1e-3)],
)
def test_auto_schedule_anneals_to_a_budget_or_else_with_no_end(
    total_frames, target_return, expected
):
    """auto: a budget without a target decays linearly to it; an open-ended run, or one that
    stops at a target return (the budget is then only a cap), falls as the inverse square
    root once past --lr-hold-frames, here at 16x them."""
    config = LearnerConfig(
        learning_rate=4e-3, total_frames=total_frames, target_return=target_return,
        lr_hold_frames=50,
    )  # fmt: skip
    assert config.lr_schedule == "auto"
    assert learning_rate_schedule(config)(8 * 100) == pytest.approx(expected)


@pytest.mark.parametrize("normalize_returns", [False, True])
def test_a_resumed_run_continues_the_linear_schedule_exactly(tmp_path, normalize_returns):
    """Three steps, a checkpoint, a fourth step; then resume from the checkpoint and take
    the fourth step again: the same learning rate and bit-identical weights (with
    normalised returns only if the return statistics came back with the weights)."""
    config = LearnerConfig(
        logdir=str(tmp_path), unroll_length=T, batch_size=B, max_queue_unrolls=B,
        lr_schedule="linear", total_frames=10 * B * T, learning_rate=1e-2,
        normalize_returns=normalize_returns,
    )  # fmt: skip
    first = build_learner(config)
    trainer = make_trainer(first)
    lrs = []
    for seed in range(3):
        scalars = trainer.train_step(_unrolls(seed))
        assert scalars is not None
        lrs.append(scalars["learning_rate"])
        assert first.optimizer.param_groups[0]["lr"] == lrs[-1]  # the rate Adam stepped with
    assert lrs == pytest.approx([1e-2, 9e-3, 8e-3])
    save_checkpoint(first)
    assert checkpoint.load(config.checkpoint_path)["lr_schedule"] == {
        "schedule": "linear", "learning_rate": 1e-2, "total_frames": 10 * B * T,
        "decay_start": 0.0, "hold_frames": 1_000_000,
    }  # fmt: skip
    uninterrupted = trainer.train_step(_unrolls(3))

    resumed = make_trainer(build_learner(dataclasses.replace(config, resume=True)))
    if normalize_returns:
        assert trainer.state.extras[RETURN_NORMALIZER_KEY] is not None
        assert resumed.state.extras[RETURN_NORMALIZER_KEY] is not None
        assert (
            resumed.state.extras[RETURN_NORMALIZER_KEY].count == 3 * B * T
        )  # every row of three batches
    again = resumed.train_step(_unrolls(3))
    assert uninterrupted is not None and again is not None
    assert again["learning_rate"] == uninterrupted["learning_rate"] == pytest.approx(7e-3)
    for a, b in zip(trainer.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_checkpoint_from_before_a_schedule_setting_existed_reads_it_as_its_default(
    tmp_path, caplog
):
    """A checkpoint saved before --lr-decay-start existed has no ``decay_start``: it was
    trained as the default (decay from the start), so resuming with the default is the same
    plan and warns of nothing, while a new decay start is named as a change."""
    config = LearnerConfig(
        logdir=str(tmp_path), unroll_length=T, batch_size=B, max_queue_unrolls=B,
        lr_schedule="linear", total_frames=10 * B * T, normalize_returns=False,
    )  # fmt: skip
    learner = build_learner(config)
    make_trainer(learner).train_step(_unrolls(0))
    save_checkpoint(learner)
    state = checkpoint.load(config.checkpoint_path)
    del state["lr_schedule"]["decay_start"]
    checkpoint.save(config.checkpoint_path, state)
    with caplog.at_level(logging.WARNING):
        build_learner(dataclasses.replace(config, resume=True))
    assert "schedule" not in caplog.text
    with caplog.at_level(logging.WARNING):
        build_learner(dataclasses.replace(config, resume=True, lr_decay_start=0.5))
    assert "the checkpoint's lr schedule was" in caplog.text


def test_a_linear_schedule_counts_a_reused_batch_once(tmp_path):
    """K updates per batch: the schedule's clock advances by the batch's frames per batch,
    so the rate still reaches 0 at --total-frames of new frames, not at 1/K of them."""
    config = dict(lr_schedule="linear", total_frames=10 * B * T, learning_rate=1e-2)
    trainer = _trainer(tmp_path, updates_per_batch=4, **config)
    lrs = [s["learning_rate"] for s in trainer.train_batch(_unrolls()) if s is not None]
    assert lrs == pytest.approx([1e-2, 9.75e-3, 9.5e-3, 9.25e-3])


# ---------------------------------------------------------------------- entropy bonus


def test_the_entropy_cost_moves_linearly_to_its_final_value_at_total_frames():
    config = LearnerConfig(entropy_cost=0.01, final_entropy_cost=0.001, total_frames=1000)
    costs = [entropy_cost_schedule(config)(step * 100) for step in (0, 5, 10, 12)]
    assert costs == pytest.approx([0.01, 0.0055, 0.001, 0.001])
    constant = LearnerConfig(entropy_cost=0.01, total_frames=1000)
    assert entropy_cost_schedule(constant)(12 * 100) == 0.01


def test_each_step_weighs_the_entropy_with_its_scheduled_cost(tmp_path):
    """The loss of step s subtracts the step's scheduled cost times the entropy: halfway
    through the budget, halfway from --entropy-cost to --final-entropy-cost."""
    trainer = _trainer(tmp_path, entropy_cost=0.5, final_entropy_cost=0.1, total_frames=4 * B * T)
    batch = to_time_major(_unrolls(), torch.device("cpu"))
    for step, cost in ((0, 0.5), (2, 0.3), (4, 0.1), (9, 0.1)):
        total, parts = trainer.loss(batch, (), step)
        assert float(parts["entropy_cost"]) == pytest.approx(cost)
        expected = parts["loss_policy"] + 0.5 * parts["loss_baseline"] - cost * parts["entropy"]
        assert float(total.detach()) == pytest.approx(float(expected), rel=1e-6)
    reports = [trainer.train_step(_unrolls(seed)) for seed in range(3)]
    assert [r["entropy_cost"] for r in reports if r] == pytest.approx([0.5, 0.4, 0.3])


def test_a_resumed_run_continues_the_entropy_schedule(tmp_path, caplog):
    config = LearnerConfig(
        logdir=str(tmp_path), unroll_length=T, batch_size=B, max_queue_unrolls=B,
        entropy_cost=0.5, final_entropy_cost=0.1, total_frames=4 * B * T,
        normalize_returns=False,
    )  # fmt: skip
    first = build_learner(config)
    trainer = make_trainer(first)
    for seed in range(2):
        trainer.train_step(_unrolls(seed))
    save_checkpoint(first)
    assert checkpoint.load(config.checkpoint_path)["entropy_schedule"] == {
        "entropy_cost": 0.5, "final_entropy_cost": 0.1, "total_frames": 4 * B * T,
    }  # fmt: skip
    with caplog.at_level(logging.WARNING):
        resumed = make_trainer(build_learner(dataclasses.replace(config, resume=True)))
    assert "schedule" not in caplog.text  # the same flags: nothing to warn about
    again = resumed.train_step(_unrolls(2))
    assert again is not None and again["entropy_cost"] == pytest.approx(0.3)
    with caplog.at_level(logging.WARNING):
        build_learner(dataclasses.replace(config, resume=True, final_entropy_cost=0.2))
    assert "the checkpoint's entropy schedule was" in caplog.text  # a changed plan is named


# ---------------------------------------------------------------------- updates per batch


def _weights_of(model: torch.nn.Module) -> list[torch.Tensor]:
    return [t.detach().clone() for t in model.state_dict().values()]


def test_each_batch_is_trained_updates_per_batch_times_from_the_current_weights(tmp_path):
    """The running thread trainer takes K optimizer steps per batch from the queue, each
    with the loss recomputed on the weights the previous step left: the same weights as K
    single steps on that batch, and K steps counted everywhere (steps, Adam, stats)."""
    k = 3
    reference = _trainer(tmp_path / "single")
    for _ in range(k):
        assert reference.train_step(_unrolls(0)) is not None

    learner = build_learner(
        LearnerConfig(
            logdir=str(tmp_path / "k"), unroll_length=T, batch_size=B, max_queue_unrolls=B,
            updates_per_batch=k, normalize_returns=False,
        )
    )  # fmt: skip
    trainer = ThreadHost(make_trainer(learner), learner.queue, learner.stats)
    trainer.start()
    try:
        learner.queue.put(_unrolls(0))
        wait_until(lambda: learner.stats.learner_steps == k, 30.0, interval=0.01)
    finally:
        trainer.stop()
    assert trainer.error is None
    assert learner.step_counter.value == k
    adam_steps = {float(s["step"]) for s in learner.optimizer.state_dict()["state"].values()}
    assert adam_steps == {float(k)}
    for got, want in zip(_weights_of(learner.model), _weights_of(reference.model), strict=True):
        assert torch.equal(got, want)
    record = learner.stats.snapshot()
    # Acted on at step 0, trained at steps 0, 1, 2: the reused batch grows more off-policy.
    assert record["policy_lag"] == pytest.approx(1.0)


def test_reusing_a_batch_moves_the_policy_off_the_behaviour_one(tmp_path):
    """Every pass recomputes the target policy: after the first step the importance
    ratios of the same batch are no longer the first pass's (V-trace has work to do)."""
    trainer = _trainer(tmp_path, updates_per_batch=3, learning_rate=0.05)
    unrolls = _unrolls(0)
    results = trainer.train_batch(unrolls)
    assert all(r is not None for r in results) and len(results) == 3
    rhos = [r["rho_mean"] for r in results if r is not None]
    losses = [r["loss_total"] for r in results if r is not None]
    assert len(set(rhos)) == 3 and len(set(losses)) == 3


def test_a_non_finite_batch_leaves_the_return_scale_as_it_was():
    """The step skips a batch with NaN rewards; its return estimates must not reach the
    running statistics either, or every later batch would be scaled by NaN and skipped."""
    norm = ReturnNormalizer()
    weight = torch.ones(4)
    norm.update(torch.tensor([1.0, 2.0, 3.0, 4.0]), weight)
    before = (norm.count, norm.mean, norm.var, norm.scale)
    norm.update(torch.tensor([1.0, float("nan"), 3.0, 4.0]), weight)
    norm.update(torch.tensor([float("inf"), 2.0, 3.0, 4.0]), weight)
    assert (norm.count, norm.mean, norm.var, norm.scale) == before


def test_a_step_that_moves_the_policy_too_far_is_shrunk_back_to_the_bound(tmp_path):
    """--max-update-kl: a step within the bound is the unbounded step; one beyond it is
    scaled back along its own direction until the policy's change is within the bound."""
    unrolls = _unrolls(0)
    free = _trainer(tmp_path / "free", learning_rate=0.05, max_update_kl=0)
    loose = _trainer(tmp_path / "loose", learning_rate=0.05, max_update_kl=1e6)
    start = _weights_of(free.model)
    for got, want in zip(_weights_of(loose.model), start, strict=True):
        assert torch.equal(got, want)  # the same seed builds the same weights

    assert "update_kl" not in free.train_step(unrolls)
    scalars = loose.train_step(unrolls)
    assert scalars["update_kept"] == 1.0
    for got, want in zip(_weights_of(loose.model), _weights_of(free.model), strict=True):
        assert torch.equal(got, want)
    full_kl = scalars["update_kl"]
    assert full_kl > 0

    bound = full_kl / 10
    tight = _trainer(tmp_path / "tight", learning_rate=0.05, max_update_kl=bound)
    batch = to_time_major(unrolls, torch.device("cpu"))
    before_logp = tight.loss(batch, ())[1]["update_logp"]
    scalars = tight.train_step(unrolls)
    assert scalars["update_kl"] == pytest.approx(full_kl, rel=1e-5)
    kept = scalars["update_kept"]
    assert 0 < kept < 1
    for got, begun, stepped in zip(
        _weights_of(tight.model), start, _weights_of(free.model), strict=True
    ):
        torch.testing.assert_close(got, begun + kept * (stepped - begun))
    moved = float(tight.agent.policy_change(tight.model, batch, (), before_logp))
    assert 0.5 * bound < moved <= bound


@pytest.mark.parametrize(
    ("action", "settings", "bound", "clip", "updates"),
    [
        (gym.spaces.Discrete(3), {}, 1e-4, None, 1),
        (gym.spaces.Box(-1.0, 1.0, (2,), np.float32), {}, 1e-4, None, 1),
        (gym.spaces.MultiDiscrete([7]), {}, 1e-4, None, 1),
        (gym.spaces.MultiDiscrete([7, 7]), {}, 1e-3, 0.2, 4),
        (gym.spaces.MultiDiscrete([7, 7]), {"max_update_kl": 1e-3}, 1e-3, 0.2, 4),
        (gym.spaces.MultiDiscrete([7, 7]), {"policy_clip": 0}, 1e-3, None, 1),
        (gym.spaces.MultiDiscrete([7, 7]), {"updates_per_batch": 2}, 1e-3, 0.2, 2),
        (gym.spaces.Discrete(3), {"policy_clip": 0.1, "updates_per_batch": 3}, 1e-4, 0.1, 3),
        (gym.spaces.Discrete(3), {"max_update_kl": 0}, None, None, 1),
    ],
)
def test_unset_a_joint_action_trains_with_a_looser_bound_and_reuses_each_batch_under_the_clip(
    action: gym.Space,
    settings: dict[str, float],
    bound: float | None,
    clip: float | None,
    updates: int,
) -> None:
    """A joint action's log-probability sums its sub-actions', so the bound measured on one
    choice would hold each step of a MultiDiscrete policy to a fraction of its size, and
    its joint reward made one pass over each batch learn slowly: unset, such an action gets
    a ten times looser bound and four updates on each batch under PPO's clip; what the user
    sets holds whatever the action, and a clip turned off takes the reuse with it."""
    agent = VTraceAgent(LearnerConfig(**settings), codec.space_to_spec(action), torch.device("cpu"))
    obs = codec.space_to_spec(gym.spaces.Box(-1.0, 1.0, (4,), np.float32))
    state = agent.state_for(agent.build_model(obs, "mlp"))
    assert state.update_bounds == ({} if bound is None else {"model": bound})
    assert (agent.policy_clip, agent.updates_per_batch) == (clip, updates)


def test_a_joint_action_left_unset_takes_four_clipped_updates_on_each_batch(tmp_path):
    """What the trainer does with the resolved defaults: four updates on one batch of a
    MultiDiscrete action, each trained through PPO's clipped surrogate (which reports the
    share of clipped ratios), and the frame clock advanced by the batch's frames once."""
    config = LearnerConfig(
        logdir=str(tmp_path), env="spaces_envs:multi_choice", unroll_length=T, batch_size=B,
        max_queue_unrolls=B, normalize_returns=False,
    )  # fmt: skip
    learner = build_learner(config)
    trainer = make_trainer(learner)
    unrolls = learner.builder.empty_unrolls(B)  # uniform acting policy, all first actions
    unrolls.obs[...] = np.random.default_rng(0).normal(size=unrolls.obs.shape)
    unrolls.reward[...] = np.random.default_rng(1).normal(size=unrolls.reward.shape)
    results = trainer.train_batch(unrolls)
    assert len(results) == 4 and all(r is not None and "clip_fraction" in r for r in results)
    assert trainer.frames_per_step == pytest.approx(B * T / 4)


def test_a_step_whose_policy_change_is_not_finite_is_taken_back_whole():
    model = torch.nn.Linear(3, 2)
    bound = UpdateBound(model, max_kl=1e-3)
    before = _weights_of(model)
    bound.remember()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    measures = iter([float("nan"), 0.0])
    scalars = bound.enforce(lambda: next(measures))
    assert scalars["update_kept"] == 0.0 and math.isnan(scalars["update_kl"])
    for got, want in zip(_weights_of(model), before, strict=True):
        assert torch.equal(got, want)
