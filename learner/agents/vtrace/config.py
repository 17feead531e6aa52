"""V-trace's own knobs: the ``--agent vtrace`` section of the learner's config."""

from __future__ import annotations

import dataclasses

from seedrl.config import LOG_STD_RANGE, AgentOptions, LearnerConfig, require_range

DEFAULT_MAX_UPDATE_KL = 1e-4
"""The bound on each step when --max-update-kl is unset and the action is one choice or
one Box (docs/stability.md)."""
JOINT_MAX_UPDATE_KL = 1e-3
"""The bound when --max-update-kl is unset and the action is several categorical choices
(MultiDiscrete): a joint action's KL sums its sub-actions', and at the one-choice bound
every step of such a policy was held to a fraction of its size (docs/learning.md, suite
structured)."""
JOINT_POLICY_CLIP = 0.2
"""PPO's clip when --policy-clip is unset and the action is several categorical choices."""
JOINT_UPDATES_PER_BATCH = 4
"""Updates on each batch when --updates-per-batch is unset and the action is several
categorical choices: with one pass over each batch such a policy learned per frame at a
fraction of the pace of PPO's epochs over its rollouts, and the clip keeps the reuse near
the acting policy (docs/learning.md, suite structured)."""


@dataclasses.dataclass(frozen=True)
class VTraceOptions(AgentOptions):
    """V-trace (IMPALA's off-policy actor-critic): its targets, its loss and the bounds on
    each step; it trains on the unrolls of the bounded queue and acts in every action space."""

    lambda_: float = 1.0
    """V-trace lambda (trace cutting)."""
    clip_rho_threshold: float = 1.0
    """V-trace rho-bar."""
    clip_pg_rho_threshold: float = 1.0
    """V-trace rho-bar for the policy-gradient advantage."""
    baseline_cost: float = 0.5
    """Weight of the value (baseline) loss."""
    max_update_kl: float | None = None
    """Bound on how far one optimizer step may move the policy: the mean KL divergence, over
    the batch's actions, from the policy before the step to the one after it. A step that
    goes further is shrunk back along its own direction to the bound. Adam's steps keep
    their size when the gradient turns from tiny to large (a solved policy's first
    failures), and such a step can throw the policy far from what it knew
    (docs/stability.md). Unset: 1e-4, the bound the default --learning-rate was measured
    with, for a Discrete or Box action; 1e-3 for a MultiDiscrete one, whose joint
    log-probability sums its sub-actions', so that the one-choice bound held every step
    to a fraction of its size (docs/learning.md, suite structured); 0 bounds nothing (the
    presets, each tuned without it)."""
    policy_clip: float | None = None
    """PPO's clipped surrogate for the policy term, as Sample Factory's APPO uses it beside
    V-trace's targets: the advantage r + gamma * v_{s+1} - V(x_s) is weighted by the ratio
    of the learner's policy to the one that acted, and a ratio past [1 - x, 1 + x] in the
    advantage's favour stops pulling. Several updates on one batch (--updates-per-batch)
    then cannot carry the policy far from the one that acted, which V-trace's truncated
    weights alone do not stop. Unset: 0.2 for a MultiDiscrete action, which trains on each
    batch four times unless --updates-per-batch says otherwise; V-trace's own policy
    gradient for a Discrete or Box one. 0: V-trace's own gradient whatever the action."""
    normalize_advantages: bool = False
    """Scale V-trace policy-gradient advantages to zero mean, unit std per batch (helps
    continuous control; IMPALA itself does not)."""
    mirror: bool = False
    """Train on every unroll twice, as played and as its left-right mirror image (image
    leaves flipped along their width, the action mask and the Discrete action reversed),
    for games whose rules do not change under the flip, such as Connect Four: twice the
    experience per game at twice the training compute."""
    leaf_trunk: tuple[int, ...] = (64,)
    """Widths of a tanh MLP that a dict/tuple observation's per-leaf features pass
    through, joined, before the policy and value heads, so that a choice can depend on two
    leaves at once (docs/learning.md, suite structured). Empty: the joined features reach
    the heads directly, where each leaf's only adds its own term to the logits. A flat
    observation has no leaves and no trunk."""
    log_std_init: float = 0.0
    """Starting log-std of a Gaussian policy (Box actions), on every action dimension: 0
    starts with unit noise; lower starts quieter, for robots whose random flailing ends
    episodes early or costs more in control penalty than staying up earns (Ant)."""

    def check(self, config: LearnerConfig) -> None:
        require_range(self, ("baseline_cost", "max_update_kl", "policy_clip"), low=0)
        require_range(
            self, ("clip_rho_threshold", "clip_pg_rho_threshold"), low=0, low_open=True
        )  # fmt: skip
        require_range(self, ("lambda_",), low=0, high=1)
        require_range(self, ("leaf_trunk",), low=1)
        require_range(self, ("log_std_init",), low=LOG_STD_RANGE[0], high=LOG_STD_RANGE[1])

    @property
    def effective_max_update_kl(self) -> float | None:
        """``max_update_kl`` with unset resolved for a one-choice action (the default
        bound) and 0 read as no bound: None when nothing bounds the step. The agent,
        which knows the action, resolves unset for several choices (:meth:`update_bound`)."""
        if self.max_update_kl is None:
            return DEFAULT_MAX_UPDATE_KL
        return self.max_update_kl or None

    def update_bound(self, sub_actions: int) -> float | None:
        """The bound on each step for an action of ``sub_actions`` categorical choices
        (1 for a Discrete or Box action): unset bounds several more loosely."""
        if self.max_update_kl is None and sub_actions > 1:
            return JOINT_MAX_UPDATE_KL
        return self.effective_max_update_kl

    def clip_for(self, sub_actions: int) -> float | None:
        """PPO's clip for an action of ``sub_actions`` categorical choices (None: V-trace's
        own gradient): unset clips a joint action, 0 clips nothing."""
        if self.policy_clip is None:
            return JOINT_POLICY_CLIP if sub_actions > 1 else None
        return self.policy_clip or None

    def updates_for(self, sub_actions: int, updates_per_batch: int | None) -> int:
        """Updates on each batch: ``updates_per_batch`` when set, else more for a joint
        action trained under the clip, which keeps the reuse near the acting policy."""
        if updates_per_batch is not None:
            return updates_per_batch
        joint = sub_actions > 1 and self.clip_for(sub_actions) is not None
        return JOINT_UPDATES_PER_BATCH if joint else 1
