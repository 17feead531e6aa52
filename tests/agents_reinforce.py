"""A tiny REINFORCE agent (Williams 1992), only to prove the agent seam: everything an
algorithm needs is here, and the learner hosts it by one registry entry.

Each row's return is the discounted reward to go within its unroll (no bootstrap), less
the batch's mean return at that row, so an action followed by an earlier episode end
than its neighbours' is made less likely.

Shape suffixes: T transitions of an unroll, B unrolls, P policy parameters.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch

from learner.agents.base import AgentState, LossTerms, Optimize
from learner.agents.models import ActorCritic, action_head, build_model
from learner.agents.optim import make_optimizer
from learner.agents.policy import Policy, inference_policy
from learner.common.schedules import StepClock
from learner.state.trajectories import UnrollQueue
from seedrl.config import AgentOptions, LearnerConfig, require_range
from seedrl.proto import seedrl_pb2 as pb


@dataclasses.dataclass(frozen=True)
class ReinforceOptions(AgentOptions):
    """REINFORCE's own knobs: the ``--agent reinforce`` section of the learner's config."""

    continuous_actions: ClassVar[bool] = False

    reinforce_entropy_bonus: float = 0.01
    """Weight of the entropy bonus beside the policy gradient."""

    def check(self, config: LearnerConfig) -> None:
        require_range(self, ("reinforce_entropy_bonus",), low=0)


class ReinforceAgent:
    """Monte-Carlo policy gradient on each unroll, with a per-row batch-mean baseline."""

    name = "reinforce"
    return_discount: float | None = None

    def __init__(
        self,
        config: LearnerConfig,
        action_space: pb.SpaceSpec,
        device: torch.device,
        masked: bool = False,
    ) -> None:
        self.config = config
        self.device = device
        self.updates_per_batch = config.updates_per_batch or 1
        self.head = action_head(action_space, masked)

    def build(self, observation_space: pb.SpaceSpec, torso: str) -> AgentState:
        model = build_model(observation_space, self.head, torso, self.config.hidden_sizes)
        model = model.to(self.device)
        return AgentState({"model": model}, {"model": make_optimizer(model, self.config)})

    def inference_policy(self, model: ActorCritic, seed: int | tuple[int, ...]) -> Policy:
        backend = self.config.inference_backend
        return inference_policy(model, self.head, self.device, backend, seed)

    def sequence_layout(self) -> tuple[int, int]:
        return self.config.unroll_length, 0

    def make_store(self) -> UnrollQueue:
        return UnrollQueue(self.config.max_queue_unrolls)

    def new_frames_per_batch(self) -> float:
        return float(self.config.batch_size * self.config.unroll_length)

    def update(
        self,
        state: AgentState,
        batch: dict[str, torch.Tensor],
        core_state: tuple[torch.Tensor, ...],
        clock: StepClock,
        optimize: Optimize,
    ) -> LossTerms:
        t = batch["action"].shape[0] - 1
        params_T1BP, _, _ = state.model(batch["obs"], batch["first"], core_state)
        logp_TB, entropy_TB = self.head.log_prob_and_entropy(params_T1BP[:t], batch["action"][:t])
        ended_T1B = batch["terminated"] | batch["truncated"]
        valid_TB = (~ended_T1B[:t]).float()  # row t -> t+1 is one episode's transition
        goes_on_TB = (~ended_T1B[1:]).float()
        reward_TB = batch["reward"][1:]
        return_TB = torch.zeros_like(reward_TB)
        to_go_B = torch.zeros_like(reward_TB[0])
        for row in reversed(range(t)):
            to_go_B = reward_TB[row] + self.config.discount * goes_on_TB[row] * to_go_B
            return_TB[row] = to_go_B
        count_T1 = valid_TB.sum(1, keepdim=True).clamp(min=1.0)
        baseline_T1 = (return_TB * valid_TB).sum(1, keepdim=True) / count_T1
        advantage_TB = (return_TB - baseline_T1) * valid_TB
        advantage_TB = advantage_TB / (advantage_TB.square().sum() / valid_TB.sum()).sqrt().clamp(
            min=1e-6
        )
        count = valid_TB.sum().clamp(min=1.0)
        policy_loss = -(logp_TB * advantage_TB.detach() * valid_TB).sum() / count
        entropy = (entropy_TB * valid_TB).sum() / count
        optimize.minimize(policy_loss - self.config.reinforce_entropy_bonus * entropy, "model")
        return {"loss_policy": policy_loss.detach(), "entropy": entropy.detach()}

    def state_dict(self, state: AgentState) -> dict[str, Any]:
        return state.networks_state_dict()

    def load_state_dict(self, state: AgentState, saved: dict[str, Any]) -> None:
        state.model.load_state_dict(saved["model"])
        state.optimizer.load_state_dict(saved["optimizer"])
