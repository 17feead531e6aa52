"""The R2D2 agent (Kapturowski et al. 2019) with Ape-X prioritized replay (Horgan et al.
2018): a recurrent dueling Q-network acting epsilon-greedily per slot
(:mod:`.policy`), sequences kept in a prioritized replay on the learner (:mod:`.replay`),
and n-step double-Q learning on rescaled values with burn-in (:mod:`.targets`).

Shape suffixes: T rows trained on after the burn-in (their last one only bootstraps),
B sequences, A actions.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from learner.agents.base import SAMPLE_PRIORITY, AgentState, LossTerms, Optimize
from learner.agents.models import (
    ActionHead,
    CategoricalHead,
    ModelSpec,
    UnsupportedSetup,
    action_head,
    autocast,
    model_spec,
    resolve_precision,
)
from learner.agents.optim import make_optimizer
from learner.agents.policy import Policy
from learner.agents.r2d2.network import QNetwork
from learner.agents.r2d2.policy import EpsilonGreedyPolicy, EpsilonLadder, ape_x_epsilons
from learner.agents.r2d2.replay import PrioritizedReplay, replay_for, replayed_frames_per_batch
from learner.agents.r2d2.targets import (
    n_step_double_q_targets,
    sequence_priorities,
    valid_transitions,
)
from learner.common.schedules import StepClock
from seedrl.config import LearnerConfig
from seedrl.proto import seedrl_pb2 as pb

TARGET_KEY = "r2d2_target"
TARGET_STEP_KEY = "r2d2_target_step"


class TargetNetwork:
    """The target network: a copy of the online one, made at the first step (or restored
    from a checkpoint then), refreshed every --target-update-interval optimizer steps."""

    def __init__(self) -> None:
        self.network: QNetwork | None = None
        self.step = -1
        """The optimizer step the target was last copied at (-1: never)."""
        self.saved: dict[str, torch.Tensor] | None = None
        """A checkpoint's target weights, loaded when the copy is first made."""

    def at(self, model: QNetwork, step: int, interval: int) -> QNetwork:
        """The target for optimizer step ``step``, copied from ``model`` when it is due."""
        if self.network is None:
            self.network = copy.deepcopy(model).requires_grad_(False)
            if self.saved is not None:
                self.network.load_state_dict(self.saved)
                self.saved = None
            else:
                self.step = step
        if step - self.step >= interval:
            with torch.no_grad():
                for dst, src in zip(self.network.parameters(), model.parameters(), strict=True):
                    dst.copy_(src)
            self.step = step
        return self.network

    def state_dict(self) -> dict[str, Any]:
        if self.network is None and self.saved is None:
            return {}
        weights = self.network.state_dict() if self.network is not None else self.saved
        return {TARGET_KEY: weights, TARGET_STEP_KEY: self.step}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        weights = saved.get(TARGET_KEY)
        if weights is None:
            return
        self.step = int(saved.get(TARGET_STEP_KEY, -1))
        if self.network is not None:
            self.network.load_state_dict(weights)
        else:
            self.saved = weights


def q_network(
    spec: ModelSpec, action_space: pb.SpaceSpec, masked: bool
) -> tuple[torch.nn.Module, ActionHead]:
    """R2D2's dueling Q-network and the space's categorical head (what a checkpoint's
    spec rebuilds)."""
    return QNetwork(spec), action_head(action_space, masked)


class R2D2Agent:
    """R2D2: epsilon-greedy on a dueling Q-network, a prioritized replay, n-step double Q."""

    name = "r2d2"
    return_discount: float | None = None  # the value rescaling h stands in for a return scale

    def __init__(
        self,
        config: LearnerConfig,
        action_space: pb.SpaceSpec,
        device: torch.device,
        masked: bool = False,
    ) -> None:
        if masked:  # epsilon-greedy and the Q targets would have to skip masked actions
            raise UnsupportedSetup("--agent r2d2 does not take action masks yet (use vtrace)")
        self.config = config
        self.device = device
        self.precision = resolve_precision(config.precision, device)
        self.updates_per_batch = config.updates_per_batch or 1
        self.head = action_head(action_space)
        if not isinstance(self.head, CategoricalHead):
            raise ValueError("--agent r2d2 needs a discrete action space (Q-learning)")
        rungs = config.epsilon_slots
        fixed = ape_x_epsilons(config.epsilon, config.epsilon_alpha, rungs) if rungs else None
        self.epsilons = EpsilonLadder(fixed, config.epsilon, config.epsilon_alpha)
        self.store: PrioritizedReplay | None = None

    def build_model(self, observation_space: pb.SpaceSpec, torso: str) -> QNetwork:
        """The online Q-network, on the CPU."""
        cfg = self.config
        lstm_size = cfg.lstm_size if cfg.lstm else 0
        return QNetwork(
            model_spec(
                observation_space, self.head, torso, cfg.hidden_sizes, lstm_size,
                separate_value=False, dueling=True, cnn_channels=cfg.cnn_channels,
            )
        )  # fmt: skip

    def build(self, observation_space: pb.SpaceSpec, torso: str) -> AgentState:
        return self.state_for(self.build_model(observation_space, torso).to(self.device))

    def state_for(
        self, model: QNetwork, optimizer: torch.optim.Optimizer | None = None
    ) -> AgentState:
        """The state that trains ``model`` (with ``optimizer``; default: the shared Adam)."""
        return AgentState(
            networks={"model": model},
            optimizers={"model": optimizer or make_optimizer(model, self.config)},
            extras={TARGET_KEY: TargetNetwork()},
        )

    def inference_policy(self, model: QNetwork, seed: int | tuple[int, ...]) -> Policy:
        report = None
        if self.store is not None:
            store = self.store

            def report(rates: tuple[float, float]) -> None:
                store.epsilon_range = rates

        return EpsilonGreedyPolicy(model, self.device, self.epsilons, seed, self.precision, report)

    def sequence_layout(self) -> tuple[int, int]:
        return self.config.burn_in + self.config.unroll_length, self.config.sequence_overlap

    def make_store(self) -> PrioritizedReplay:
        cfg = self.config
        self.store = replay_for(cfg, cfg.burn_in + cfg.unroll_length - cfg.sequence_overlap)
        return self.store

    def new_frames_per_batch(self) -> float:
        return replayed_frames_per_batch(self.config)

    def target_network(self, state: AgentState, step: int) -> QNetwork:
        """The target network for optimizer step ``step``, copied from the online one when
        it is due (or restored from a checkpoint on first use)."""
        holder: TargetNetwork = state.extras[TARGET_KEY]
        return holder.at(state.model, step, self.config.target_update_interval)

    def update(
        self,
        state: AgentState,
        batch: dict[str, torch.Tensor],
        core_state: tuple[torch.Tensor, ...],
        clock: StepClock,
        optimize: Optimize,
    ) -> LossTerms:
        total, terms = self.loss(state, batch, core_state, clock)
        optimize.minimize(total, "model")
        return terms

    def loss(
        self,
        state: AgentState,
        batch: dict[str, torch.Tensor],
        core_state: tuple[torch.Tensor, ...],
        clock: StepClock,
    ) -> tuple[torch.Tensor, LossTerms]:
        """The TD loss and its parts (with :data:`SAMPLE_PRIORITY`)."""
        cfg = self.config
        model: QNetwork = state.model
        target = self.target_network(state, clock.step)
        burn = cfg.burn_in
        obs, first = batch["obs"], batch["first"]
        with autocast(self.device, self.precision):
            online_state, target_state = core_state, core_state
            if burn and model.core is not None:
                # Burn-in: the stored start state is stale; unroll it without gradient.
                with torch.no_grad():
                    _, online_state = model.act(obs[:burn], first[:burn], core_state)
                    _, target_state = target.act(obs[:burn], first[:burn], core_state)
            q_T1BA, _ = model.act(obs[burn:], first[burn:], online_state)
            with torch.no_grad():
                target_q_T1BA, _ = target.act(obs[burn:], first[burn:], target_state)
        q_T1BA, target_q_T1BA = q_T1BA.float(), target_q_T1BA.float()

        reward_T1B = batch["reward"][burn:]
        if cfg.reward_scale != 1.0:
            reward_T1B = reward_T1B * cfg.reward_scale
        if cfg.reward_clip is not None:
            reward_T1B = reward_T1B.clamp(-cfg.reward_clip, cfg.reward_clip)
        terminated_T1B, truncated_T1B = batch["terminated"][burn:], batch["truncated"][burn:]
        target_TB = n_step_double_q_targets(
            reward_T1B, terminated_T1B, truncated_T1B, q_T1BA.detach(), target_q_T1BA,
            cfg.discount, cfg.n_step, cfg.value_rescale_eps,
        )  # fmt: skip
        action_TB = batch["action"][burn:-1].long()
        q_taken_TB = q_T1BA[:-1].gather(-1, action_TB.unsqueeze(-1)).squeeze(-1)
        td_TB = target_TB - q_taken_TB
        valid_TB = valid_transitions(terminated_T1B, truncated_T1B).float()
        weight_B = batch.get("sample_weight")
        if weight_B is None:
            weight_B = torch.ones(valid_TB.shape[1], device=valid_TB.device)
        count = valid_TB.sum().clamp(min=1.0)
        total = (0.5 * td_TB.square() * valid_TB * weight_B).sum() / count

        abs_td_TB = td_TB.detach().abs()
        terms: LossTerms = {
            "loss_total": total.detach(),
            "q_mean": (q_taken_TB.detach() * valid_TB).sum() / count,
            "td_error": (abs_td_TB * valid_TB).sum() / count,
            "importance_weight_mean": weight_B.mean(),
            SAMPLE_PRIORITY: sequence_priorities(abs_td_TB, valid_TB, cfg.priority_eta),
        }
        return total, terms

    def state_dict(self, state: AgentState) -> dict[str, Any]:
        holder: TargetNetwork = state.extras[TARGET_KEY]
        return {**state.networks_state_dict(), **holder.state_dict()}

    def load_state_dict(self, state: AgentState, saved: dict[str, Any]) -> None:
        state.model.load_state_dict(saved["model"])
        state.optimizer.load_state_dict(saved["optimizer"])
        holder: TargetNetwork = state.extras[TARGET_KEY]
        holder.load_state_dict(saved)
