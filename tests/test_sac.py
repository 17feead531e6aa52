"""The SAC agent: its squashed log-probability against torch.distributions, its soft
target, temperature loss and Polyak update against hand-derived numbers, the action
spaces it refuses, Pendulum learnt past a random policy's return measured here, and a run
through a real host resumed with its replay, temperature and target critics."""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, cast

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import AffineTransform, Normal, TanhTransform, TransformedDistribution

import learner
from learner.agents.models import UnsupportedSetup
from learner.agents.registry import make_agent
from learner.agents.sac.agent import TARGET_CRITIC, TEMPERATURE
from learner.agents.sac.head import SquashedGaussianHead
from learner.agents.sac.losses import (
    critic_loss,
    polyak_update,
    soft_q_targets,
    temperature_loss,
)
from learner.agents.sac.network import Temperature
from learner.parts import build_learner
from learner.tools.export import export
from learner.tools.synchronous import train_synchronously
from seedrl import codec
from seedrl.config import LearnerConfig

LOW, HIGH = (-2.0, 0.0), (2.0, 3.0)


def squashed(mean: torch.Tensor, log_std: torch.Tensor) -> TransformedDistribution:
    """The reference distribution: N(mean, std), tanh, then the affine map onto the bounds."""
    low, high = torch.tensor(LOW), torch.tensor(HIGH)
    return TransformedDistribution(
        Normal(mean, log_std.exp()),
        [TanhTransform(), AffineTransform((high + low) / 2, (high - low) / 2)],
    )


def test_squashed_log_prob_matches_torch_distributions_with_a_tanh_transform() -> None:
    torch.manual_seed(0)
    head = SquashedGaussianHead((2,), LOW, HIGH)
    mean, log_std = torch.randn(64, 2), torch.randn(64, 2).clamp(-2, 1)
    params = torch.cat([mean, log_std], dim=-1)
    reference = squashed(mean, log_std)
    action = reference.sample()
    torch.testing.assert_close(
        head.log_prob(params, action), reference.log_prob(action).sum(-1), atol=2e-3, rtol=1e-4
    )
    sampled, logp = head.rsample_with_log_prob(params)
    assert ((sampled >= torch.tensor(LOW)) & (sampled <= torch.tensor(HIGH))).all()
    torch.testing.assert_close(logp, reference.log_prob(sampled).sum(-1), atol=2e-3, rtol=1e-4)
    # The affine scaling's log-determinant is in it: log 2 + log 1.5 per sample.
    assert head.log_scale == pytest.approx(math.log(2.0) + math.log(1.5))
    centre, half = torch.tensor([0.0, 1.5]), torch.tensor([2.0, 1.5])
    torch.testing.assert_close(head.greedy(params), centre + half * torch.tanh(mean))


def test_the_soft_target_and_the_critic_loss_by_hand() -> None:
    # One sequence of 3 transitions (4 rows); row 2 terminated, so transition 2 is masked
    # and transition 1 (into the terminal row) bootstraps nothing.
    reward = torch.tensor([[0.0], [1.0], [2.0], [4.0]])
    terminated = torch.tensor([[False], [False], [True], [False]])
    truncated = torch.zeros_like(terminated)
    next_q = torch.tensor([[10.0], [20.0], [30.0], [40.0]])
    next_logp = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    alpha, gamma = 0.5, 0.9
    one = soft_q_targets(reward, terminated, truncated, next_q, next_logp, alpha, gamma, 1)
    # y0 = r1 + g (Q1 - a logp1) = 1 + 0.9 (20 - 1); y1 = r2 (terminal); y2 = r3 + g (40 - 2)
    expected = torch.tensor([[1 + 0.9 * 19.0], [2.0], [4 + 0.9 * 38.0]])
    torch.testing.assert_close(one, expected)
    two = soft_q_targets(reward, terminated, truncated, next_q, next_logp, alpha, gamma, 2)
    # y0 = r1 + g r2, stopped by the terminal row; y2's window stops at the last row.
    torch.testing.assert_close(two, torch.tensor([[1 + 0.9 * 2.0], [2.0], [4 + 0.9 * 38.0]]))
    truncated_at_2 = torch.tensor([[False], [False], [True], [False]])
    cut = soft_q_targets(reward, truncated, truncated_at_2, next_q, next_logp, alpha, gamma, 2)
    # Truncated, row 2 bootstraps from its final observation: 1 + 0.9 * 2 + 0.81 * 28.5.
    assert float(cut[0, 0]) == pytest.approx(1 + 0.9 * 2 + 0.81 * (30 - 1.5))
    q1, q2 = torch.tensor([[18.0], [2.0], [0.0]]), torch.tensor([[17.0], [3.0], [0.0]])
    weight = torch.tensor([[1.0], [1.0], [0.0]])
    # 0.5 ((18.1-18)^2 + (18.1-17)^2 + 0 + 1) / 2 over the two real transitions
    loss = critic_loss(q1, q2, one, weight, weight.sum())
    assert float(loss) == pytest.approx(0.5 * (0.01 + 1.21 + 0.0 + 1.0) / 2, rel=1e-4)


def test_the_temperature_loss_and_its_gradient_by_hand() -> None:
    log_alpha = torch.tensor(math.log(2.0), requires_grad=True)
    logp = torch.tensor([[-0.5], [1.5], [9.0]])
    weight = torch.tensor([[1.0], [1.0], [0.0]])
    loss = temperature_loss(log_alpha, logp, -1.0, weight, weight.sum())
    # mean(-2 (-0.5 - 1), -2 (1.5 - 1)) = mean(3, -1) = 1; d/dlog_alpha is the same.
    assert float(loss.detach()) == pytest.approx(1.0)
    loss.backward()
    assert log_alpha.grad is not None and float(log_alpha.grad) == pytest.approx(1.0)
    # The entropy (-0.5 on average) is above the target (-1): descent lowers alpha.


def test_the_polyak_update_moves_the_target_by_tau() -> None:
    online, target = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    torch.nn.init.constant_(online.weight, 1.0)
    torch.nn.init.constant_(target.weight, 0.0)
    polyak_update(target, online, 0.1)
    torch.testing.assert_close(target.weight, torch.full((2, 3), 0.1))
    polyak_update(target, online, 0.1)
    torch.testing.assert_close(target.weight, torch.full((2, 3), 0.19))
    assert torch.equal(online.weight, torch.ones(2, 3))


@pytest.mark.parametrize(
    ("space", "words"),
    [
        (gym.spaces.Discrete(3), "--agent sac acts in Box action spaces"),
        (gym.spaces.Box(-np.inf, np.inf, (2,)), "has an infinite one"),
    ],
)
def test_sac_refuses_discrete_and_unbounded_actions_in_one_line(space, words) -> None:
    config = LearnerConfig(env="Pendulum-v1", agent="sac")
    with pytest.raises(UnsupportedSetup) as caught:
        make_agent(config, codec.space_to_spec(space), torch.device("cpu"))
    assert words in str(caught.value) and "--agent" in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("knobs", "words"),
    [({"lstm": True}, "drop --lstm"), ({"inference_backend": "numpy"}, "samples its actions")],
)
def test_sac_refuses_what_it_cannot_train_with_in_one_line(knobs, words) -> None:
    with pytest.raises(ValueError, match=words):
        LearnerConfig(env="Pendulum-v1", agent="sac", **knobs)


RANDOM_EPISODES = 10
EVAL_EPISODES = 5
FRAMES = 6_000


def episode_returns(act, episodes: int, seed: int) -> float:
    env = gym.make("Pendulum-v1")
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(act(obs))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return float(np.mean(returns))


def sac_config(tmp_path, **overrides) -> LearnerConfig:
    fields = dict(
        env="Pendulum-v1", agent="sac", device="cpu", logdir=str(tmp_path / "run"),
        hidden_sizes=(64, 64), unroll_length=8, batch_size=16, learning_rate=3e-3, torch_threads=1,
        n_step=3, replay_min_frames=1000, replay_ratio=64.0, seed=0,
    )  # fmt: skip
    fields.update(overrides)
    return LearnerConfig(**fields)


@pytest.mark.long
def test_sac_learns_pendulum_past_a_random_policy_synchronously(tmp_path) -> None:
    rng = np.random.default_rng(0)
    random_return = episode_returns(lambda _: rng.uniform(-2, 2, (1,)), RANDOM_EPISODES, 100)
    bar = random_return / 2  # half the random policy's cost (returns are negative)
    config = sac_config(tmp_path)
    trained = {}

    def keep(trainer, stats, results) -> bool:
        trained["model"], trained["head"] = trainer.model, trainer.agent.head
        return False

    began = time.monotonic()
    threads = torch.get_num_threads()
    try:
        train_synchronously(config, 8, FRAMES, keep)
    finally:
        torch.set_num_threads(threads)
    model, head = trained["model"], trained["head"]

    def greedy(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            params, _ = model.act(torch.from_numpy(obs[None, None]).float(), torch.zeros(1, 1))
        return head.greedy(params[0, 0]).numpy()

    got = episode_returns(greedy, EVAL_EPISODES, 100)
    elapsed = time.monotonic() - began
    assert got > bar, f"greedy return {got:.0f} after {FRAMES} frames; random {random_return:.0f}"
    assert elapsed < 120


def test_a_real_host_trains_and_resumes_with_replay_temperature_and_targets(tmp_path) -> None:
    overrides: dict[str, Any] = dict(replay_min_frames=400, checkpoint_interval_s=3600.0)
    result = learner.train(
        "Pendulum-v1", num_actors=1, envs_per_actor=4, logdir=tmp_path / "run", agent="sac",
        device="cpu", hidden_sizes=(32, 32), unroll_length=8, batch_size=8, seed=0,
        replay_ratio=16.0, max_seconds=8.0, **overrides,
    )  # fmt: skip
    assert result.learner_steps > 0
    obs = result.policy.make_env().reset(seed=0)[0]
    action = result.policy.act(obs)
    assert action.shape == (1,) and -2.0 <= float(action[0]) <= 2.0
    # The registry's entry rebuilt the actor and its head from the checkpoint: an export
    # acts as the loaded policy does, the squashed mean.
    export(result.policy, "torchscript", tmp_path / "policy.pt")
    exported = torch.jit.load(str(tmp_path / "policy.pt"))
    result.policy.reset()
    greedy = result.policy.act(obs)
    torch.testing.assert_close(
        exported(torch.from_numpy(obs[None]))[0][0].detach(), torch.from_numpy(greedy)
    )
    config = LearnerConfig(
        env="Pendulum-v1", agent="sac", device="cpu", logdir=str(tmp_path / "run"),
        hidden_sizes=(32, 32), unroll_length=8, batch_size=8, resume=True, **overrides,
    )  # fmt: skip
    saved = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    resumed = build_learner(config)
    alpha = cast(Temperature, resumed.state.networks[TEMPERATURE]).alpha.detach()
    assert float(alpha) == pytest.approx(float(saved[TEMPERATURE]["log_alpha"].exp()))
    assert float(alpha) != pytest.approx(1.0)  # it moved from --initial-temperature
    target = resumed.state.extras[TARGET_CRITIC].state_dict()
    for name, value in saved[TARGET_CRITIC].items():
        assert torch.equal(target[name], value), name
    assert not torch.equal(target["q1.value.weight"], saved["critic"]["q1.value.weight"])
    assert len(resumed.queue) > 0, "the replay came back empty"
    fresh = build_learner(dataclasses.replace(config, resume=False, logdir=str(tmp_path / "x")))
    assert len(fresh.queue) == 0


class StepEach:
    """The trainer's side of an update, bare: each loss's backward and its optimizer's
    step, then the step's ``after_step``, recording the order."""

    def __init__(self, state) -> None:
        self.state = state
        self.order: list[str] = []

    def minimize(self, loss, optimizer="model", policy_change=None) -> bool:
        self.order.append(optimizer)
        self.state.optimizers[optimizer].zero_grad()
        loss.backward()
        self.state.optimizers[optimizer].step()
        after = self.state.after_step.get(optimizer)
        if after is not None:
            after()
        return True


def test_one_update_on_dict_observations_steps_critics_actor_and_temperature() -> None:
    from learner.agents.models import choose_torso
    from learner.common.schedules import StepClock

    observation = gym.spaces.Dict(
        {"pos": gym.spaces.Box(-1, 1, (3,)), "grid": gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)}
    )
    obs_spec = codec.space_to_spec(observation)
    bounds = np.array([-1.0, 0.0], np.float32), np.array([1.0, 5.0], np.float32)
    box = codec.space_to_spec(gym.spaces.Box(*bounds))
    config = LearnerConfig(env="Pendulum-v1", agent="sac", hidden_sizes=(16,), seed=0)
    agent = make_agent(config, box, torch.device("cpu"))
    torso = choose_torso(obs_spec, "auto")
    assert torso == "leaves"
    state = agent.build(obs_spec, torso)
    row_bytes = codec.LeafPacking(codec.space_leaves(obs_spec)).row_bytes
    t1, b = 5, 3
    obs = torch.randint(0, 255, (t1, b, row_bytes), dtype=torch.uint8)
    action = torch.rand(t1, b, 2) * torch.tensor([2.0, 5.0]) + torch.tensor([-1.0, 0.0])
    batch = {
        "obs": obs, "first": torch.zeros(t1, b, dtype=torch.bool), "action": action,
        "reward": torch.randn(t1, b), "terminated": torch.zeros(t1, b, dtype=torch.bool),
        "truncated": torch.zeros(t1, b, dtype=torch.bool),
    }  # fmt: skip
    before = {name: [p.detach().clone() for p in net.parameters()]
              for name, net in state.networks.items()}  # fmt: skip
    target = state.extras[TARGET_CRITIC]
    target_before = [p.detach().clone() for p in target.parameters()]
    optimize = StepEach(state)
    terms = agent.update(state, batch, (), StepClock(0, 0.0), optimize)
    assert optimize.order == ["critic", "model", "temperature"]
    for name, net in state.networks.items():
        pairs = zip(before[name], net.parameters(), strict=True)
        moved = any(not torch.equal(a, p) for a, p in pairs)
        assert moved, f"{name} did not move"
    tau = config.target_smoothing
    for old, new, online in zip(
        target_before, target.parameters(), state.networks["critic"].parameters(), strict=True
    ):
        torch.testing.assert_close(new, (1 - tau) * old + tau * online.detach())
    assert terms["sample_priority"].shape == (b,)
    params, _ = state.model.act(obs[:1], batch["first"][:1])
    sampled = agent.head.sample(params[0])
    assert ((sampled >= torch.tensor([-1.0, 0.0])) & (sampled <= torch.tensor([1.0, 5.0]))).all()


def test_the_critics_rate_scale_survives_the_schedule_and_a_resume() -> None:
    from learner.agents.optim import apply_optimizer_settings
    from learner.training.trainer import Trainer, TrainerParts

    box = codec.space_to_spec(gym.spaces.Box(-1.0, 1.0, (1,)))
    obs = codec.space_to_spec(gym.spaces.Box(-1.0, 1.0, (3,)))
    config = LearnerConfig(
        env="Pendulum-v1", agent="sac", learning_rate=1e-3, critic_learning_rate_scale=3.0,
        lr_schedule="linear", total_frames=1000,
    )  # fmt: skip
    agent = make_agent(config, box, torch.device("cpu"))
    state = agent.build(obs, "mlp")
    assert state.optimizers["critic"].param_groups[0]["lr"] == pytest.approx(3e-3)
    trainer = Trainer(TrainerParts.unshared(config, agent, state, torch.device("cpu")))
    for name in state.optimizers:
        trainer.set_learning_rate(0, name)
    assert state.optimizers["critic"].param_groups[0]["lr"] == pytest.approx(3e-3)
    assert state.optimizers["model"].param_groups[0]["lr"] == pytest.approx(1e-3)
    again = agent.build(obs, "mlp")
    agent.load_state_dict(again, agent.state_dict(state))
    for optimizer in again.optimizers.values():
        apply_optimizer_settings(optimizer, config)  # as --resume does
    assert again.optimizers["critic"].param_groups[0]["lr"] == pytest.approx(3e-3)
    assert again.optimizers["temperature"].param_groups[0]["lr"] == pytest.approx(1e-3)


def test_the_mujoco_preset_takes_cleanrls_rates_and_policy_frequency() -> None:
    """CleanRL's sac_continuous_action: the critics and the temperature at q_lr 1e-3, the
    actor at policy_lr 3e-4, the policy delayed to policy_frequency 2."""
    from seedrl.presets import build_config, load_preset

    config = build_config(LearnerConfig, {"device": "cpu"}, load_preset("mujoco-sac"))
    assert config.policy_frequency == 2
    box = codec.space_to_spec(gym.spaces.Box(-1.0, 1.0, (6,)))
    obs = codec.space_to_spec(gym.spaces.Box(-1.0, 1.0, (17,)))
    state = make_agent(config, box, torch.device("cpu")).build(obs, "mlp")
    rates = {name: o.param_groups[0]["lr"] for name, o in state.optimizers.items()}
    assert rates == pytest.approx({"critic": 1e-3, "model": 3e-4, "temperature": 1e-3}, rel=1e-3)


def test_sacs_optimizers_step_unclipped_where_the_trainer_clips_others() -> None:
    """seed_rl's and CleanRL's SAC clip none of the critics', actor's and temperature's
    gradients; --max-grad-norm (0.5 by default) still clips an optimizer that sets none."""
    from learner.training.trainer import Trainer, TrainerParts

    box = codec.space_to_spec(gym.spaces.Box(-2.0, 2.0, (1,)))
    obs_spec = codec.space_to_spec(gym.spaces.Box(-1.0, 1.0, (3,)))
    config = LearnerConfig(env="Pendulum-v1", agent="sac", hidden_sizes=(16,), seed=0)
    assert config.max_grad_norm == 0.5
    t1, b = 5, 4
    generator = torch.Generator().manual_seed(0)
    batch = {
        "obs": torch.rand(t1, b, 3, generator=generator) * 2 - 1,
        "first": torch.zeros(t1, b, dtype=torch.bool),
        "action": torch.rand(t1, b, 1, generator=generator) * 4 - 2,
        "reward": -100 * torch.rand(t1, b, generator=generator),  # Q errors far above 0.5
        "terminated": torch.zeros(t1, b, dtype=torch.bool),
        "truncated": torch.zeros(t1, b, dtype=torch.bool),
    }

    def gradient_norms(clip_all: bool) -> dict[str, float]:
        agent = make_agent(config, box, torch.device("cpu"))
        state = agent.build(obs_spec, "mlp")
        if clip_all:
            state.max_grad_norms.clear()
        trainer = Trainer(TrainerParts.unshared(config, agent, state, torch.device("cpu")))
        trainer.step_on(batch, (), None, 0)
        return {name: float(g.flat.norm()) for name, g in trainer.gradients.items()}

    unclipped, clipped = gradient_norms(False), gradient_norms(True)
    assert set(unclipped) == {"critic", "model", "temperature"}
    assert unclipped["critic"] > 10 * config.max_grad_norm, unclipped
    for name, norm in clipped.items():
        assert norm <= config.max_grad_norm * 1.001, (name, norm)
    assert unclipped["critic"] > clipped["critic"]


def _pendulum_batch(t1: int = 5, b: int = 4) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {
        "obs": torch.rand(t1, b, 3, generator=generator) * 2 - 1,
        "first": torch.zeros(t1, b, dtype=torch.bool),
        "action": torch.rand(t1, b, 1, generator=generator) * 4 - 2,
        "reward": -torch.rand(t1, b, generator=generator),
        "terminated": torch.zeros(t1, b, dtype=torch.bool),
        "truncated": torch.zeros(t1, b, dtype=torch.bool),
    }


@pytest.mark.parametrize("k", [1, 2])
def test_delayed_policy_updates_step_actor_and_temperature_k_times_every_kth_update(k) -> None:
    """CleanRL's SAC delays the policy, compensated: with --policy-frequency k the critics
    step on every update, the actor then the temperature, in turn, k times on updates
    0, k, 2k, ... and not at all on the others. Over 4 updates with k = 2 that is 4 critic
    steps, and 4 actor and 4 temperature steps in 2 bursts (updates 0 and 2)."""
    from learner.training.trainer import Trainer, TrainerParts

    box = codec.space_to_spec(gym.spaces.Box(-2.0, 2.0, (1,)))
    obs_spec = codec.space_to_spec(gym.spaces.Box(-1.0, 1.0, (3,)))
    config = LearnerConfig(
        env="Pendulum-v1", agent="sac", hidden_sizes=(16,), seed=0, policy_frequency=k
    )
    agent = make_agent(config, box, torch.device("cpu"))
    state = agent.build(obs_spec, "mlp")
    trainer = Trainer(TrainerParts.unshared(config, agent, state, torch.device("cpu")))
    steps: list[tuple[int, str]] = []
    update = [0]
    for name, optimizer in state.optimizers.items():

        def counted(*args: Any, _name: str = name, _step: Any = optimizer.step, **kw: Any) -> Any:
            steps.append((update[0], _name))
            return _step(*args, **kw)

        optimizer.step = counted  # type: ignore[method-assign]
    batch = _pendulum_batch()
    for update[0] in range(4):
        trainer.step_on(batch, (), None, trainer.step_counter.value)
    burst = ["critic"] + ["model", "temperature"] * k
    if k == 1:
        want = [(u, name) for u in range(4) for name in burst]
    else:
        plan = [burst, ["critic"], burst, ["critic"]]
        want = [(u, name) for u, names in enumerate(plan) for name in names]
    assert steps == want
    counts = {name: sum(1 for _, n in steps if n == name) for name in state.optimizers}
    assert counts == {"critic": 4, "model": 4, "temperature": 4}
    assert trainer.step_counter.value == 4


class _NoStep:
    """An Optimize that applies nothing (for reading an update's terms)."""

    def minimize(self, loss, optimizer="model", policy_change=None) -> bool:
        return False


def test_an_update_without_its_delayed_actor_step_reports_no_actor_loss() -> None:
    """The metrics average a key over the updates that report it: an update whose actor
    waits leaves the actor's and the temperature's losses out rather than a zero."""
    from learner.common.schedules import StepClock
    from learner.state.stats import LearnerStats

    box = codec.space_to_spec(gym.spaces.Box(-2.0, 2.0, (1,)))
    obs_spec = codec.space_to_spec(gym.spaces.Box(-1.0, 1.0, (3,)))
    config = LearnerConfig(
        env="Pendulum-v1", agent="sac", hidden_sizes=(16,), seed=0, policy_frequency=2
    )
    agent = make_agent(config, box, torch.device("cpu"))
    state = agent.build(obs_spec, "mlp")
    batch = _pendulum_batch()
    on = agent.update(state, batch, (), StepClock(2, 0.0), _NoStep())
    off = agent.update(state, batch, (), StepClock(3, 0.0), _NoStep())
    assert {"loss_policy", "loss_temperature"} <= set(on)
    assert not {"loss_policy", "loss_temperature"} & set(off)
    stats = LearnerStats()
    stats.on_train_step({"loss_critic": 1.0, "loss_policy": 4.0})
    stats.on_train_step({"loss_critic": 3.0})
    record = stats.snapshot()
    assert record["loss_critic"] == 2.0 and record["loss_policy"] == 4.0
