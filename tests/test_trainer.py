"""The V-trace actor-critic loss (masking, termination vs truncation, advantage scaling)
and the step around it (flat gradients, clipping)."""

from __future__ import annotations

import dataclasses

import torch
from support import random_unrolls

from learner.parts import build_learner, make_trainer
from learner.trainer import GradientBuffer, Trainer, to_time_major
from learner.trajectories import Unrolls
from seedrl import vtrace
from seedrl.config import LearnerConfig

T, B = 6, 3


def _trainer(tmp_path, **overrides) -> Trainer:
    config = LearnerConfig(
        logdir=str(tmp_path), unroll_length=T, batch_size=B, max_queue_unrolls=B, **overrides
    )
    return make_trainer(build_learner(config))


def _unrolls(seed: int = 0) -> Unrolls:
    return random_unrolls(B, T, seed)


def _loss(trainer: Trainer, unrolls: Unrolls) -> dict[str, float]:
    _, parts = trainer.loss(to_time_major(unrolls, torch.device("cpu")), ())
    return {k: float(v) for k, v in parts.items()}


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
