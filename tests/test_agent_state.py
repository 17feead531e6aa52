"""An agent owns its state, and the trainer shell applies its losses: checkpoints of the
format before (R2D2's network was an actor-critic then) load bit-equal, and an agent with
several optimizers gets each step once, in order, under one step count."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from support import random_unrolls, small_learner

from learner.agents.base import AgentState, LossTerms, Optimize
from learner.agents.r2d2.agent import TARGET_KEY, R2D2Agent
from learner.agents.r2d2.network import QNetwork
from learner.agents.trained_policy import Policy
from learner.common.schedules import StepClock
from learner.parts import build_learner, make_trainer, save_checkpoint
from learner.training.trainer import Trainer, TrainerParts, to_time_major
from seedrl.config import LearnerConfig

CPU = torch.device("cpu")

R2D2_PARAMETERS = [
    ("torso.0.weight", (8, 4)),
    ("torso.0.bias", (8,)),
    ("core.weight_ih", (16, 8)),
    ("core.weight_hh", (16, 4)),
    ("core.bias_ih", (16,)),
    ("core.bias_hh", (16,)),
    ("policy.weight", (2, 12)),
    ("policy.bias", (2,)),
    ("baseline.weight", (1, 12)),
    ("baseline.bias", (1,)),
]
"""R2D2's parameters on CartPole (hidden 8, LSTM 4), in order, as its checkpoints wrote
them when its network was a dueling actor-critic: the Adam state is indexed by this order."""


def _old_r2d2_training(seed: int) -> dict[str, Any]:
    """Weights, Adam state and target of the old format, random but of the right shapes."""
    g = torch.Generator().manual_seed(seed)

    def weights() -> dict[str, torch.Tensor]:
        return {name: torch.randn(shape, generator=g) for name, shape in R2D2_PARAMETERS}

    moments = {
        index: {
            "step": torch.tensor(5.0),
            "exp_avg": torch.randn(shape, generator=g),
            "exp_avg_sq": torch.rand(shape, generator=g),
        }
        for index, (_, shape) in enumerate(R2D2_PARAMETERS)
    }
    return {"model": weights(), "moments": moments, "target": weights()}


def test_an_r2d2_checkpoint_from_its_actor_critic_days_resumes_bit_equal(tmp_path) -> None:
    settings = dict(agent="r2d2", burn_in=1, sequence_overlap=0, hidden_sizes=(8,), lstm=True,
                    lstm_size=4)  # fmt: skip
    learner = small_learner(tmp_path, 3, 2, **settings)
    save_checkpoint(learner)  # the rest of the file as any run writes it
    path = learner.config.checkpoint_path
    saved = torch.load(path, weights_only=True)
    assert [(k, tuple(v.shape)) for k, v in saved["model"].items()] == R2D2_PARAMETERS
    old = _old_r2d2_training(1)
    saved["model"] = old["model"]
    saved["optimizer"]["state"] = old["moments"]
    saved["r2d2_target"], saved["r2d2_target_step"] = old["target"], 3
    torch.save(saved, path)

    resumed = build_learner(dataclasses.replace(learner.config, resume=True))
    assert isinstance(resumed.model, QNetwork)
    for name, value in resumed.model.state_dict().items():
        assert torch.equal(value, old["model"][name]), name
    moments = resumed.optimizer.state_dict()["state"]
    params = list(resumed.model.parameters())
    for index, want in old["moments"].items():
        assert moments[index]["exp_avg"].shape == params[index].shape
        assert torch.equal(moments[index]["exp_avg"], want["exp_avg"])
    agent = resumed.agent
    assert isinstance(agent, R2D2Agent)
    target = agent.target_network(resumed.state, 3)  # not due: the saved one
    assert resumed.state.extras[TARGET_KEY].step == 3
    for name, value in target.state_dict().items():
        assert torch.equal(value, old["target"][name]), name
    unrolls = resumed.builder.empty_unrolls(2)  # zeros, with the LSTM's state
    unrolls.obs[...] = torch.randn(unrolls.obs.shape).numpy()
    assert make_trainer(resumed).train_step(unrolls) is not None  # the moments fit the weights

    policy = Policy.load(path)  # what evaluate, serve and export start from
    assert isinstance(policy.model, QNetwork)
    for name, value in policy.model.state_dict().items():
        assert torch.equal(value, old["model"][name]), name


class TwoOptimizerAgent:
    """An actor and a critic with an optimizer each (SAC's shape), critic first."""

    name = "two"
    return_discount = None
    updates_per_batch = 1

    def __init__(self, critic_loss: float = 1.0, skip_critic: bool = False) -> None:
        self.critic_scale, self.skip_critic = critic_loss, skip_critic
        self.order = ("critic", "model")

    def build(self) -> AgentState:
        torch.manual_seed(0)
        actor, critic = torch.nn.Linear(4, 2), torch.nn.Linear(4, 1)
        return AgentState(
            networks={"model": actor, "critic": critic},
            optimizers={
                name: torch.optim.SGD(net.parameters(), lr=0.1)
                for name, net in (("critic", critic), ("model", actor))
            },
        )

    def new_frames_per_batch(self) -> float:
        return 1.0

    def update(
        self,
        state: AgentState,
        batch: dict[str, torch.Tensor],
        core_state: tuple[torch.Tensor, ...],
        clock: StepClock,
        optimize: Optimize,
    ) -> LossTerms:
        obs = batch["obs"].reshape(-1, 4)
        losses = {
            "critic": self.critic_scale * state.networks["critic"](obs).square().mean(),
            "model": state.model(obs).square().mean(),
        }
        for name in self.order:
            if name == "critic" and self.skip_critic:
                continue
            optimize.minimize(losses[name], name)
        return {"loss_actor": losses["model"].detach()}


def _weights(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def _update(agent: TwoOptimizerAgent) -> tuple[Trainer, AgentState, dict[str, float] | None]:
    state = agent.build()
    config = LearnerConfig(unroll_length=4, batch_size=2, max_queue_unrolls=2)
    trainer = Trainer(TrainerParts.unshared(config, agent, state, CPU))  # type: ignore[arg-type]
    unrolls = random_unrolls(2, 4, discount=None)
    return trainer, state, trainer.step_on(to_time_major(unrolls, CPU), (), unrolls, 0)


def test_each_optimizer_steps_once_in_its_order_under_one_step_count() -> None:
    agent = TwoOptimizerAgent()
    before = agent.build()
    trainer, state, scalars = _update(agent)
    assert trainer.step_counter.value == 1  # one update, one step on the clock
    assert scalars is not None
    assert {"grad_norm", "learning_rate", "grad_norm_critic", "learning_rate_critic"} <= set(
        scalars
    )
    for name in ("model", "critic"):
        moved = _weights(state.networks[name])
        assert not all(
            torch.equal(a, b) for a, b in zip(moved, _weights(before.networks[name]), strict=True)
        ), name


def test_an_optimizer_the_update_leaves_out_keeps_its_weights() -> None:
    """A step of the actor alone (a delayed update): the critic is joined, not stepped."""
    agent = TwoOptimizerAgent(skip_critic=True)
    before = agent.build()
    trainer, state, scalars = _update(agent)
    assert trainer.step_counter.value == 1 and scalars is not None
    assert "grad_norm_critic" not in scalars
    for a, b in zip(
        _weights(state.networks["critic"]), _weights(before.networks["critic"]), strict=True
    ):
        assert torch.equal(a, b)


def test_a_non_finite_loss_skips_that_optimizer_and_reports_nothing() -> None:
    agent = TwoOptimizerAgent(critic_loss=float("nan"))
    before = agent.build()
    trainer, state, scalars = _update(agent)
    assert scalars is None and trainer.stats.nonfinite_skipped == 1
    for a, b in zip(
        _weights(state.networks["critic"]), _weights(before.networks["critic"]), strict=True
    ):
        assert torch.equal(a, b)
    assert trainer.step_counter.value == 1  # the actor's loss was fine: it stepped


def test_optimizers_minimised_out_of_their_order_are_refused() -> None:
    """Ranks meet in each optimizer's exchange in the state's order; an update that went
    back would meet its peers in the wrong collective."""
    agent = TwoOptimizerAgent()
    agent.order = ("model", "critic")
    with pytest.raises(ValueError, match="came too late"):
        _update(agent)


class RepeatingAgent(TwoOptimizerAgent):
    """The critic on every update, the actor twice on every second one (a delayed actor
    that catches up), its state naming that order and its update following it."""

    def build(self) -> AgentState:
        state = super().build()
        state.update_order = lambda step: ["critic"] + ["model"] * (2 if step % 2 == 0 else 0)
        return state

    def update(self, state, batch, core_state, clock, optimize) -> LossTerms:
        obs = batch["obs"].reshape(-1, 4)
        optimize.minimize(state.networks["critic"](obs).square().mean(), "critic")
        for _ in range(self.actor_steps(clock.step)):
            optimize.minimize(state.model(obs).square().mean(), "model")
        return {}

    def actor_steps(self, step: int) -> int:
        return 2 if step % 2 == 0 else 0


def _counting_steps(state: AgentState, log: list[tuple[int, str]], update: list[int]) -> None:
    """Each optimizer's ``step`` also logs (the update it ran in, the optimizer's name)."""
    for name, optimizer in state.optimizers.items():

        def counted(*args: Any, _name: str = name, _step: Any = optimizer.step, **kw: Any) -> Any:
            log.append((update[0], _name))
            return _step(*args, **kw)

        optimizer.step = counted  # type: ignore[method-assign]


def test_an_update_order_may_step_an_optimizer_several_times() -> None:
    agent = RepeatingAgent()
    state = agent.build()
    config = LearnerConfig(unroll_length=4, batch_size=2, max_queue_unrolls=2)
    trainer = Trainer(TrainerParts.unshared(config, agent, state, CPU))  # type: ignore[arg-type]
    unrolls = random_unrolls(2, 4, discount=None)
    batch = to_time_major(unrolls, CPU)
    log: list[tuple[int, str]] = []
    update = [0]
    _counting_steps(state, log, update)
    for update[0] in range(4):
        trainer.step_on(batch, (), unrolls, trainer.step_counter.value)
    both = ["critic", "model", "model"]
    assert log == [(u, name) for u, names in enumerate([both, ["critic"]] * 2) for name in names]
    assert trainer.step_counter.value == 4  # an update is one step on the clock, however many


def test_an_optimizer_minimised_more_often_than_the_order_names_is_refused() -> None:
    """An update that stepped the actor a third time would meet its peers' next
    collective (or none) with its gradient."""
    agent = RepeatingAgent()
    agent.actor_steps = lambda step: 3  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="too often"):
        _update(agent)
