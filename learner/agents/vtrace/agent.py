"""The V-trace actor-critic agent (IMPALA): policy and value from one network, trained
off-policy on unrolls with V-trace targets (:mod:`.targets`) and the loss in :mod:`.loss`."""

from __future__ import annotations

from typing import Any

import torch

from learner.agents.base import UPDATE_LOGP, AgentState, LossTerms, Optimize
from learner.agents.mirror import Mirror
from learner.agents.models import (
    ActionHead,
    ActorCritic,
    ModelSpec,
    MultiCategoricalHead,
    UnsupportedSetup,
    action_head,
    autocast,
    build_model,
    resolve_precision,
)
from learner.agents.optim import make_optimizer
from learner.agents.policy import Policy, inference_policy
from learner.agents.vtrace.config import VTraceOptions
from learner.agents.vtrace.loss import VTraceCosts, update_kl, valid_transitions, vtrace_loss
from learner.common.schedules import StepClock, entropy_cost_schedule
from learner.state.normalize import ReturnNormalizer
from learner.state.trajectories import UnrollQueue
from seedrl.config import LearnerConfig
from seedrl.proto import seedrl_pb2 as pb

RETURN_NORMALIZER_KEY = "return_normalizer"


def actor_critic_network(
    spec: ModelSpec, action_space: pb.SpaceSpec, masked: bool
) -> tuple[torch.nn.Module, ActionHead]:
    """The shipped actor-critic and the space's own head (V-trace's, and the default
    :attr:`~learner.agents.registry.Registered.trained_network`)."""
    return ActorCritic(spec), action_head(action_space, masked)


class VTraceAgent:
    """V-trace actor-critic: sampled actions, an unroll queue, the IMPALA loss."""

    name = "vtrace"

    def __init__(
        self,
        config: LearnerConfig,
        action_space: pb.SpaceSpec,
        device: torch.device,
        masked: bool = False,
    ) -> None:
        self.config = config
        self.device = device
        self.precision = resolve_precision(config.precision, device)
        self.head = action_head(action_space, masked)
        options = config.agent_options
        assert isinstance(options, VTraceOptions)
        sub_actions = len(self.head.nvec) if isinstance(self.head, MultiCategoricalHead) else 1
        self.max_update_kl = options.update_bound(sub_actions)
        """The bound on each step, resolved against the action (None: no bound)."""
        self.policy_clip = options.clip_for(sub_actions)
        """PPO's clip on the policy term, resolved against the action (None: V-trace's)."""
        self.updates_per_batch = options.updates_for(sub_actions, config.updates_per_batch)
        self.entropy_cost = entropy_cost_schedule(config)
        self.return_discount = config.discount if config.normalize_returns else None
        """The scale is measured on each episode's discounted reward sum so far, which the
        trajectories keep: a statistic the value head cannot feed back into."""
        self._mirror: Mirror | None = None
        """Built from the first model it meets (``--mirror``): the model knows the leaves."""

    def build_model(self, observation_space: pb.SpaceSpec, torso: str) -> ActorCritic:
        cfg = self.config
        lstm_size = cfg.lstm_size if cfg.lstm else 0
        model = build_model(
            observation_space, self.head, torso, cfg.hidden_sizes, lstm_size,
            mask_leaf=cfg.action_mask if self.head.masked else "",
            cnn_channels=cfg.cnn_channels, leaf_trunk=cfg.leaf_trunk,
        )  # fmt: skip
        if cfg.mirror:
            Mirror(model.spec, self.head)  # refuses, at setup, what has no mirror image
        if cfg.log_std_init:
            if model.log_std is None:
                raise UnsupportedSetup(
                    "--log-std-init sets a Gaussian policy's noise; this action space has none"
                )
            with torch.no_grad():
                model.log_std.fill_(cfg.log_std_init)
        return model

    def build(self, observation_space: pb.SpaceSpec, torso: str) -> AgentState:
        return self.state_for(self.build_model(observation_space, torso).to(self.device))

    def state_for(
        self, model: ActorCritic, optimizer: torch.optim.Optimizer | None = None
    ) -> AgentState:
        """The state that trains ``model`` (with ``optimizer``; default: the shared Adam)."""
        cfg = self.config
        extras: dict[str, Any] = {}
        if cfg.normalize_returns:  # rewards divided by a running scale of the return
            extras[RETURN_NORMALIZER_KEY] = ReturnNormalizer()
        bound = self.max_update_kl
        return AgentState(
            networks={"model": model},
            optimizers={"model": optimizer or make_optimizer(model, cfg)},
            extras=extras,
            # Every step keeps a Gaussian's noise within bounds (see bound_log_std_).
            after_step={"model": model.bound_log_std_},
            update_bounds={} if bound is None else {"model": bound},
        )

    def inference_policy(self, model: ActorCritic, seed: int | tuple[int, ...]) -> Policy:
        return inference_policy(
            model, self.head, self.device, self.config.inference_backend, seed, self.precision
        )

    def sequence_layout(self) -> tuple[int, int]:
        return self.config.unroll_length, 0

    def make_store(self) -> UnrollQueue:
        return UnrollQueue(self.config.max_queue_unrolls)

    def new_frames_per_batch(self) -> float:
        return float(self.config.batch_size * self.config.unroll_length)  # each unroll once

    def update(
        self,
        state: AgentState,
        batch: dict[str, torch.Tensor],
        core_state: tuple[torch.Tensor, ...],
        clock: StepClock,
        optimize: Optimize,
    ) -> LossTerms:
        total, terms = self.loss(state, batch, core_state, clock)
        before_logp = terms.pop(UPDATE_LOGP, None)
        measure = None
        if before_logp is not None:

            def measure() -> torch.Tensor:
                return self.policy_change(state.model, batch, core_state, before_logp)

        optimize.minimize(total, "model", measure)
        return terms

    def loss(
        self,
        state: AgentState,
        batch: dict[str, torch.Tensor],
        core_state: tuple[torch.Tensor, ...],
        clock: StepClock,
    ) -> tuple[torch.Tensor, LossTerms]:
        """The total loss and its parts (with :data:`UPDATE_LOGP` when steps are bounded)."""
        cfg = self.config
        model = state.model
        batch = self._as_trained(model, batch)
        with autocast(self.device, self.precision):
            params_T1BP, values_T1B, _ = model(batch["obs"], batch["first"], core_state)
        # V-trace and the loss terms in fp32 whatever the forward pass ran in.
        params_T1BP, values_T1B = params_T1BP.float(), values_T1B.float()
        reward_TB = batch["reward"][1:]
        if cfg.reward_scale != 1.0:
            reward_TB = reward_TB * cfg.reward_scale
        if cfg.reward_clip is not None:
            reward_TB = reward_TB.clamp(-cfg.reward_clip, cfg.reward_clip)
        norm: ReturnNormalizer | None = state.extras.get(RETURN_NORMALIZER_KEY)
        scale = 1.0 if norm is None else norm.scale
        if norm is not None:
            reward_TB = norm.normalize(reward_TB)
        entropy_cost = self.entropy_cost(clock.frames)
        costs = VTraceCosts(
            discount=cfg.discount,
            baseline_cost=cfg.baseline_cost,
            entropy_cost=entropy_cost,
            clip_rho_threshold=cfg.clip_rho_threshold,
            clip_pg_rho_threshold=cfg.clip_pg_rho_threshold,
            lambda_=cfg.lambda_,
            normalize_advantages=cfg.normalize_advantages,
            policy_clip=self.policy_clip,
        )
        result = vtrace_loss(self.head, params_T1BP, values_T1B, batch, reward_TB, costs)
        terms = result.terms
        if norm is not None:
            if torch.isfinite(result.total):  # a batch the step skips leaves no trace
                norm.update(batch["running_return"][1:] * cfg.reward_scale, result.weight_TB)
            terms["reward_norm_scale"] = torch.tensor(scale)
            terms["reward_norm_clipped"] = torch.tensor(float(norm.clipped_values))
        if cfg.final_entropy_cost is not None:
            terms["entropy_cost"] = torch.tensor(entropy_cost)
        if self.max_update_kl is not None:
            terms[UPDATE_LOGP] = result.target_logp_TB
        return result.total, terms

    def policy_change(
        self,
        model: ActorCritic,
        batch: dict[str, torch.Tensor],
        core_state: tuple[torch.Tensor, ...],
        before_logp: torch.Tensor,
    ) -> torch.Tensor:
        batch = self._as_trained(model, batch)
        t = before_logp.shape[0]
        with torch.no_grad(), autocast(self.device, self.precision):
            params_T1BP, _, _ = model(batch["obs"], batch["first"], core_state)
        after_logp = self.head.log_prob(params_T1BP[:t].float(), batch["action"][:t])
        return update_kl(before_logp, after_logp, valid_transitions(batch, t).float())

    def _as_trained(
        self, model: ActorCritic, batch: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """The batch as the loss sees it: with ``--mirror``, doubled by its mirror image."""
        if not self.config.mirror:
            return batch
        if self._mirror is None:
            self._mirror = Mirror(model.spec, self.head)
        return self._mirror(batch)  # no core state to double: Mirror refuses an LSTM

    def state_dict(self, state: AgentState) -> dict[str, Any]:
        saved = state.networks_state_dict()
        norm: ReturnNormalizer | None = state.extras.get(RETURN_NORMALIZER_KEY)
        if norm is not None:
            saved[RETURN_NORMALIZER_KEY] = norm.state_dict()
        return saved

    def load_state_dict(self, state: AgentState, saved: dict[str, Any]) -> None:
        state.model.load_state_dict(saved["model"])
        state.model.bound_log_std_()  # a checkpoint from before the bound was kept this way
        state.optimizer.load_state_dict(saved["optimizer"])
        norm: ReturnNormalizer | None = state.extras.get(RETURN_NORMALIZER_KEY)
        if norm is not None and saved.get(RETURN_NORMALIZER_KEY) is not None:
            norm.load_state_dict(saved[RETURN_NORMALIZER_KEY])
