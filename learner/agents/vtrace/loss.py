"""The V-trace actor-critic loss (IMPALA, Espeholt et al. 2018, section 4.2), as one pure
function of the network's outputs and the batch, every term in view.

Transitions ``t -> t+1`` of an unroll (``t < T``) are trained on; a transition that
starts on a frame where the episode ended (final observation -> reset observation) is
not a real transition: it is masked out by giving it ``log_rho = -inf`` (V-trace then
leaves it untouched and cuts the trace there) and zero weight in every loss term.
Discount is 0 only into a *terminated* frame; a *truncated* frame keeps ``gamma`` so the
episode bootstraps from the value of its final observation.

Shape suffixes: T unroll length, B unrolls in the batch, P policy parameters, G the
sub-actions of a MultiDiscrete action, N one sub-action's choices.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from learner.agents.base import LossTerms
from learner.agents.models import ActionHead, MultiCategoricalHead
from learner.agents.vtrace import targets


@dataclass(frozen=True)
class VTraceCosts:
    """The loss's hyper-parameters at one optimizer step."""

    discount: float
    baseline_cost: float
    entropy_cost: float
    clip_rho_threshold: float | None = 1.0
    clip_pg_rho_threshold: float | None = 1.0
    lambda_: float = 1.0
    normalize_advantages: bool = False
    policy_clip: float | None = None
    """PPO's clip on the ratio to the behaviour policy (APPO); None: V-trace's gradient."""


@dataclass
class VTraceLoss:
    """The total loss, its terms, and which transitions it trained on."""

    total: torch.Tensor
    terms: LossTerms
    weight_TB: torch.Tensor
    """1 where a transition counts (return statistics fold in the same ones), else 0."""
    target_logp_TB: torch.Tensor
    """The learner's log-probability of each trained action, detached."""


def valid_transitions(batch: dict[str, torch.Tensor], t: int) -> torch.Tensor:
    """``[T, B]`` True where row t -> t+1 is a real transition (row t is no episode's end)."""
    return ~(batch["terminated"][:t] | batch["truncated"][:t])


def vtrace_loss(
    head: ActionHead,
    params_T1BP: torch.Tensor,
    values_T1B: torch.Tensor,
    batch: dict[str, torch.Tensor],
    reward_TB: torch.Tensor,
    costs: VTraceCosts,
) -> VTraceLoss:
    """The loss of one time-major batch from the target network's outputs over its
    ``T + 1`` rows, with ``reward_TB`` the rewards of rows ``1..T`` as trained on (scaled,
    clipped or normalised by the caller)."""
    t = params_T1BP.shape[0] - 1
    action_TB = batch["action"][:t]
    target_logp_TB, entropy_TB = head.log_prob_and_entropy(params_T1BP[:t], action_TB)
    behaviour_logp_TB = head.log_prob(batch["behaviour_params"][:t], action_TB)

    valid_TB = valid_transitions(batch, t)
    log_rhos_TB = torch.where(valid_TB, target_logp_TB.detach() - behaviour_logp_TB, float("-inf"))
    discount_TB = (~batch["terminated"][1:]).float() * costs.discount
    vs_TB, pg_adv_TB = targets.from_importance_weights(
        log_rhos=log_rhos_TB,
        discounts=discount_TB,
        rewards=reward_TB,
        values=values_T1B[:t].detach(),
        bootstrap_value=values_T1B[t].detach(),
        clip_rho_threshold=costs.clip_rho_threshold,
        clip_pg_rho_threshold=costs.clip_pg_rho_threshold,
        lambda_=costs.lambda_,
    )
    weight_TB = valid_TB.float()
    count = weight_TB.sum().clamp(min=1.0)
    if costs.policy_clip is not None:
        # The ratio carries the off-policy weight, so the advantage goes without rho.
        vs_next_TB = torch.cat([vs_TB[1:], values_T1B[t:].detach()])
        pg_adv_TB = reward_TB + discount_TB * vs_next_TB - values_T1B[:t].detach()
    if costs.normalize_advantages:
        mean = (pg_adv_TB * weight_TB).sum() / count
        std = (((pg_adv_TB - mean) * weight_TB).pow(2).sum() / count).sqrt()
        pg_adv_TB = (pg_adv_TB - mean) / (std + 1e-8)

    clip_terms = {}
    if costs.policy_clip is None:
        policy_loss = -(target_logp_TB * pg_adv_TB * weight_TB).sum() / count
    else:
        eps = costs.policy_clip
        ratio_TB = torch.where(valid_TB, target_logp_TB - behaviour_logp_TB, 0.0).exp()
        surrogate_TB = torch.minimum(
            ratio_TB * pg_adv_TB, ratio_TB.clamp(1.0 - eps, 1.0 + eps) * pg_adv_TB
        )
        policy_loss = -(surrogate_TB * weight_TB).sum() / count
        with torch.no_grad():
            clipped_TB = ((ratio_TB - 1.0).abs() > eps).float()
            clip_terms["clip_fraction"] = (clipped_TB * weight_TB).sum() / count
    baseline_loss = 0.5 * ((vs_TB - values_T1B[:t]).pow(2) * weight_TB).sum() / count
    entropy = (entropy_TB * weight_TB).sum() / count
    total = policy_loss + costs.baseline_cost * baseline_loss - costs.entropy_cost * entropy

    with torch.no_grad():
        rho_mean = (log_rhos_TB.clamp(min=-20).exp() * weight_TB).sum() / count
    if isinstance(head, MultiCategoricalHead) and len(head.nvec) > 1:
        clip_terms.update(sub_action_terms(head, params_T1BP[:t], action_TB, pg_adv_TB, weight_TB))
    terms = {
        "loss_total": total.detach(),
        "loss_policy": policy_loss.detach(),
        "loss_baseline": baseline_loss.detach(),
        "loss_entropy": -entropy.detach(),
        "entropy": entropy.detach(),
        "rho_mean": rho_mean,
        "value_mean": (values_T1B[:t].detach() * weight_TB).sum() / count,
        "value_target_mean": (vs_TB * weight_TB).sum() / count,
        **clip_terms,
    }
    return VTraceLoss(total, terms, weight_TB, target_logp_TB.detach())


@torch.no_grad()
def sub_action_terms(
    head: MultiCategoricalHead,
    params_TBP: torch.Tensor,
    action_TB: torch.Tensor,
    pg_adv_TB: torch.Tensor,
    weight_TB: torch.Tensor,
) -> LossTerms:
    """Per sub-action g of a MultiDiscrete action: its policy's entropy (``entropy_head{g}``)
    and the RMS over transitions of the policy term's gradient with respect to its logits,
    ``|A| * ||onehot(a_g) - p_g||`` (``pg_signal_head{g}``): which sub-action has turned
    deterministic, and which one the advantages still move, where the summed entropy hides
    both."""
    count = weight_TB.sum().clamp(min=1.0)
    parts_TBG = head.part_actions(action_TB)
    terms: LossTerms = {}
    for g, logp_TBN in enumerate(head.part_log_probs(params_TBP.detach())):
        p_TBN = logp_TBN.exp()
        entropy_TB = -(p_TBN * logp_TBN).sum(-1)
        onehot_TBN = torch.nn.functional.one_hot(parts_TBG[..., g], p_TBN.shape[-1])
        grad_sq_TB = pg_adv_TB.pow(2) * (onehot_TBN - p_TBN).pow(2).sum(-1)
        terms[f"entropy_head{g}"] = (entropy_TB * weight_TB).sum() / count
        terms[f"pg_signal_head{g}"] = ((grad_sq_TB * weight_TB).sum() / count).sqrt()
    return terms


def update_kl(
    before_logp_TB: torch.Tensor, after_logp_TB: torch.Tensor, weight_TB: torch.Tensor
) -> torch.Tensor:
    """Estimate of KL(before || after) from two policies' log-probabilities of actions drawn
    from (about) the first: the weighted mean of ``r - 1 - log r``, ``r = after / before``.
    Unbiased for actions drawn from ``before``, never negative, and of low variance
    (Schulman's "k3"); it needs only ``log_prob``, which every action head has. The
    actors' actions stand in for draws from the policy before the step: they come from one
    a few updates older."""
    log_r_TB = after_logp_TB - before_logp_TB
    k3_TB = torch.expm1(log_r_TB) - log_r_TB
    return (k3_TB * weight_TB).sum() / weight_TB.sum().clamp(min=1.0)
