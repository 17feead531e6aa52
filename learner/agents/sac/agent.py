"""The SAC agent (Haarnoja et al. 2018, with the learned temperature of their second
paper): a squashed-Gaussian actor acting in the learner's batched inference, twin Q
critics with Polyak-averaged targets (:mod:`.network`, :mod:`.losses`), an automatically
tuned entropy temperature, and a replay on the learner (R2D2's, uniform by default).

Unrolls are kept as R2D2's sequences are, with no burn-in and no overlap: each holds
--unroll-length transitions and its bootstrap row, so every transition is in exactly one
stored sequence and an n-step window stops at its sequence's last row.

Shape suffixes: T transitions (T + 1 rows), B sequences, A action dims, P policy
parameters.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any, cast

import torch
from torch import nn

from learner.agents.base import (
    INFERENCE_NETWORK,
    SAMPLE_PRIORITY,
    AgentState,
    LossTerms,
    Optimize,
)
from learner.agents.models import (
    ActionHead,
    GaussianHead,
    ModelSpec,
    UnsupportedSetup,
    action_head,
    autocast,
    model_spec,
    resolve_precision,
)
from learner.agents.optim import make_optimizer
from learner.agents.policy import Policy, TorchPolicy
from learner.agents.r2d2.replay import PrioritizedReplay, replay_for, replayed_frames_per_batch
from learner.agents.r2d2.targets import sequence_priorities, valid_transitions
from learner.agents.sac.head import SquashedGaussianHead
from learner.agents.sac.losses import (
    critic_loss,
    polyak_update,
    soft_q_targets,
    temperature_loss,
)
from learner.agents.sac.network import SquashedGaussianActor, Temperature, TwinQ
from learner.common.schedules import StepClock
from seedrl import codec
from seedrl.config import LearnerConfig
from seedrl.proto import seedrl_pb2 as pb

CRITIC = "critic"
TEMPERATURE = "temperature"
TARGET_CRITIC = "sac_target_critic"
"""Checkpoint keys of the critics, their optimizer, the temperature and its optimizer and
the target critics (the actor and its optimizer are ``model`` and ``optimizer``)."""


def squashed_head(action_space: pb.SpaceSpec) -> SquashedGaussianHead:
    """The head of a Box action space with finite bounds; UnsupportedSetup (one line
    naming --agent) for any other."""
    summary = codec.spec_summary(action_space)
    if action_space.kind not in ("box", "dict", "tuple"):
        raise UnsupportedSetup(
            f"--agent sac acts in Box action spaces, not {summary}: use --agent vtrace or r2d2"
        )
    head = action_head(action_space)
    if type(head) is not GaussianHead:
        raise UnsupportedSetup(
            f"--agent sac acts in Box action spaces, not {summary}: use --agent vtrace"
        )
    if not head.low:
        raise UnsupportedSetup(
            f"--agent sac squashes actions into the Box's bounds, and {summary} has an "
            "infinite one: bound the env's action space, or use --agent vtrace"
        )
    return SquashedGaussianHead(head.action_shape, head.low, head.high)


def trained_network(
    spec: ModelSpec, action_space: pb.SpaceSpec, masked: bool
) -> tuple[nn.Module, ActionHead]:
    """The actor and head a checkpoint's spec describes (what evaluate and export run)."""
    return SquashedGaussianActor(spec), squashed_head(action_space)


def actor_steps(step: int, policy_frequency: int) -> int:
    """Steps of the actor and of the temperature in the update at optimizer step
    ``step``: ``policy_frequency`` on every ``policy_frequency``-th update (the first
    included), none on the others, as CleanRL's SAC delays and compensates them."""
    return policy_frequency if step % policy_frequency == 0 else 0


def update_order(policy_frequency: int, step: int) -> list[str]:
    """The optimizer steps of the update at ``step`` (:attr:`AgentState.update_order`):
    the critics, then the actor and the temperature in turn, :func:`actor_steps` times."""
    return [CRITIC] + [INFERENCE_NETWORK, TEMPERATURE] * actor_steps(step, policy_frequency)


@contextmanager
def frozen(module: nn.Module) -> Iterator[None]:
    """``module``'s parameters take no gradient inside: the actor's loss reads the critics
    without pushing gradients into their buffers."""
    flags = [p.requires_grad for p in module.parameters()]
    module.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in zip(module.parameters(), flags, strict=True):
            p.requires_grad_(flag)


class SACAgent:
    """SAC: a squashed-Gaussian actor, twin soft Q critics, a learned temperature."""

    name = "sac"
    return_discount: float | None = None

    def __init__(
        self,
        config: LearnerConfig,
        action_space: pb.SpaceSpec,
        device: torch.device,
        masked: bool = False,
    ) -> None:
        if masked:
            raise UnsupportedSetup("--agent sac acts in Box action spaces: it takes no action mask")
        self.config = config
        self.device = device
        self.precision = resolve_precision(config.precision, device)
        self.updates_per_batch = config.updates_per_batch or 1
        self.squashed = squashed_head(action_space)
        self.head: ActionHead = self.squashed
        self.target_entropy = -config.target_entropy_scale * self.squashed.action_size
        self.store: PrioritizedReplay | None = None

    # ------------------------------------------------------------------ what it trains

    def build_spec(self, observation_space: pb.SpaceSpec, torso: str) -> ModelSpec:
        cfg = self.config
        return model_spec(
            observation_space, self.squashed, torso, cfg.hidden_sizes, 0, separate_value=False,
            cnn_channels=cfg.cnn_channels,
        )  # fmt: skip

    def build(self, observation_space: pb.SpaceSpec, torso: str) -> AgentState:
        spec = self.build_spec(observation_space, torso)
        actor = SquashedGaussianActor(spec).to(self.device)
        critic = TwinQ(spec, self.squashed.action_size).to(self.device)
        temperature = Temperature(self.config.initial_temperature).to(self.device)
        target = copy.deepcopy(critic).requires_grad_(False)
        tau = self.config.target_smoothing
        return AgentState(
            networks={"model": actor, CRITIC: critic, TEMPERATURE: temperature},
            # Critics first: the actor's loss then reads the critics the batch just
            # improved, as the SAC papers step them.
            optimizers={
                CRITIC: make_optimizer(critic, self.config, self.config.critic_learning_rate_scale),
                "model": make_optimizer(actor, self.config),
                TEMPERATURE: make_optimizer(
                    temperature, self.config, self.config.temperature_learning_rate_scale
                ),
            },
            update_order=partial(update_order, self.config.policy_frequency),
            extras={TARGET_CRITIC: target},
            after_step={CRITIC: lambda: polyak_update(target, critic, tau)},
            # Unclipped, as seed_rl's and CleanRL's SAC leave all three: the critics'
            # gradients scale with the returns, the temperature's with the entropy gap,
            # and no one --max-grad-norm fits them and the actor's together.
            max_grad_norms=dict.fromkeys((CRITIC, "model", TEMPERATURE)),
        )

    def inference_policy(self, model: SquashedGaussianActor, seed: int | tuple[int, ...]) -> Policy:
        # Sampled in torch: the squash and the state-dependent std are not the numpy
        # path's Gaussian.
        return TorchPolicy(cast(Any, model), self.head, self.device, self.precision)

    def sequence_layout(self) -> tuple[int, int]:
        return self.config.unroll_length, 0

    def make_store(self) -> PrioritizedReplay:
        self.store = replay_for(self.config, self.config.unroll_length)
        return self.store

    def new_frames_per_batch(self) -> float:
        return replayed_frames_per_batch(self.config)

    # ------------------------------------------------------------------ one update

    def update(
        self,
        state: AgentState,
        batch: dict[str, torch.Tensor],
        core_state: tuple[torch.Tensor, ...],
        clock: StepClock,
        optimize: Optimize,
    ) -> LossTerms:
        cfg = self.config
        actor: SquashedGaussianActor = state.model
        critic = cast(TwinQ, state.networks[CRITIC])
        temperature = cast(Temperature, state.networks[TEMPERATURE])
        target: TwinQ = state.extras[TARGET_CRITIC]
        obs_T1BO, first_T1B = batch["obs"], batch["first"]
        terminated_T1B, truncated_T1B = batch["terminated"], batch["truncated"]
        reward_T1B = batch["reward"]
        if cfg.reward_scale != 1.0:
            reward_T1B = reward_T1B * cfg.reward_scale
        if cfg.reward_clip is not None:
            reward_T1B = reward_T1B.clamp(-cfg.reward_clip, cfg.reward_clip)
        valid_TB = valid_transitions(terminated_T1B, truncated_T1B).float()
        weight_B = batch.get("sample_weight")
        if weight_B is None:
            weight_B = torch.ones(valid_TB.shape[1], device=valid_TB.device)
        weight_TB = valid_TB * weight_B
        count = valid_TB.sum().clamp(min=1.0)
        alpha = temperature.alpha.detach()

        with autocast(self.device, self.precision):
            params_T1BP, _ = actor.act(obs_T1BO, first_T1B)
        params_T1BP = params_T1BP.float()
        action_T1BA, logp_T1B = self.squashed.rsample_with_log_prob(params_T1BP)

        # The critics: soft n-step targets from the target critics at the policy's
        # own next actions.
        with torch.no_grad(), autocast(self.device, self.precision):
            next_q1_T1B, next_q2_T1B = target(obs_T1BO, action_T1BA)
        target_TB = soft_q_targets(
            reward_T1B, terminated_T1B, truncated_T1B,
            torch.minimum(next_q1_T1B, next_q2_T1B).float(), logp_T1B.detach(), alpha,
            cfg.discount, cfg.n_step,
        )  # fmt: skip
        taken_TBA = batch["action"][:-1].reshape(*valid_TB.shape, -1).float()
        with autocast(self.device, self.precision):
            q1_TB, q2_TB = critic(obs_T1BO[:-1], taken_TBA)
        q1_TB, q2_TB = q1_TB.float(), q2_TB.float()
        loss_critic = critic_loss(q1_TB, q2_TB, target_TB, weight_TB, count)
        optimize.minimize(loss_critic, CRITIC)

        # The actor and the temperature, k times on every k-th update: the first step on
        # the actions sampled above, each later one on a fresh sample of the moved actor.
        logp_TB = logp_T1B[:-1]
        action_TBA = action_T1BA[:-1]
        policy_terms: LossTerms = {}
        for burst in range(actor_steps(clock.step, cfg.policy_frequency)):
            if burst:
                with autocast(self.device, self.precision):
                    params_TBP, _ = actor.act(obs_T1BO[:-1], first_T1B[:-1])
                action_TBA, logp_TB = self.squashed.rsample_with_log_prob(params_TBP.float())
            policy_terms = self._actor_and_temperature(
                state, obs_T1BO[:-1], action_TBA, logp_TB, weight_TB, count, optimize
            )

        abs_td_TB = 0.5 * ((target_TB - q1_TB).abs() + (target_TB - q2_TB).abs()).detach()
        loss_policy = policy_terms.get("loss_policy", torch.zeros(()))
        return {
            "loss_total": (loss_critic + loss_policy).detach(),
            "loss_critic": loss_critic.detach(),
            **policy_terms,
            "temperature": alpha,
            "entropy": -(logp_T1B[:-1].detach() * valid_TB).sum() / count,
            "q_mean": (q1_TB.detach() * valid_TB).sum() / count,
            "td_error": (abs_td_TB * valid_TB).sum() / count,
            "importance_weight_mean": weight_B.mean(),
            SAMPLE_PRIORITY: sequence_priorities(abs_td_TB, valid_TB, cfg.priority_eta),
        }

    def _actor_and_temperature(
        self,
        state: AgentState,
        obs_TBO: torch.Tensor,
        action_TBA: torch.Tensor,
        logp_TB: torch.Tensor,
        weight_TB: torch.Tensor,
        count: torch.Tensor,
        optimize: Optimize,
    ) -> LossTerms:
        """One step of the actor, then one of the temperature, on the policy's own
        (reparameterised) actions ``action_TBA``; their losses as metrics."""
        critic = cast(TwinQ, state.networks[CRITIC])
        temperature = cast(Temperature, state.networks[TEMPERATURE])
        alpha = temperature.alpha.detach()  # as the burst's last temperature step left it
        # The actor: maximise the soft value of its own actions.
        with frozen(critic), autocast(self.device, self.precision):
            pi_q1_TB, pi_q2_TB = critic(obs_TBO, action_TBA)
        pi_q_TB = torch.minimum(pi_q1_TB, pi_q2_TB).float()
        loss_policy = ((alpha * logp_TB - pi_q_TB) * weight_TB).sum() / count
        optimize.minimize(loss_policy, INFERENCE_NETWORK)

        # The temperature: towards the target entropy, on the sample the actor stepped on
        # (CleanRL samples the moved actor again; this spares that forward pass).
        loss_temperature = temperature_loss(
            temperature.log_alpha, logp_TB.detach(), self.target_entropy, weight_TB, count
        )
        if self.config.learn_temperature:
            optimize.minimize(loss_temperature, TEMPERATURE)
        return {"loss_policy": loss_policy.detach(), "loss_temperature": loss_temperature.detach()}

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self, state: AgentState) -> dict[str, Any]:
        return {
            **state.networks_state_dict(),
            CRITIC: state.networks[CRITIC].state_dict(),
            f"{CRITIC}_optimizer": state.optimizers[CRITIC].state_dict(),
            TEMPERATURE: state.networks[TEMPERATURE].state_dict(),
            f"{TEMPERATURE}_optimizer": state.optimizers[TEMPERATURE].state_dict(),
            TARGET_CRITIC: state.extras[TARGET_CRITIC].state_dict(),
        }

    def load_state_dict(self, state: AgentState, saved: dict[str, Any]) -> None:
        state.model.load_state_dict(saved["model"])
        state.optimizer.load_state_dict(saved["optimizer"])
        state.networks[CRITIC].load_state_dict(saved[CRITIC])
        state.optimizers[CRITIC].load_state_dict(saved[f"{CRITIC}_optimizer"])
        state.networks[TEMPERATURE].load_state_dict(saved[TEMPERATURE])
        state.optimizers[TEMPERATURE].load_state_dict(saved[f"{TEMPERATURE}_optimizer"])
        state.extras[TARGET_CRITIC].load_state_dict(saved[TARGET_CRITIC])
