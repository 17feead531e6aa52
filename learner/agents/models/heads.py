"""Action heads: how a network's policy parameters become actions, log-probabilities and
entropies, one head per kind of action space (categorical, masked, multi-discrete,
Bernoulli, Gaussian, and their product for dict/tuple actions).

Shape suffixes: A action dims, P policy-parameter dims, G action groups.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from learner.agents.cpu_kernels import log_softmax_last
from learner.common.spaces import UnsupportedSetup
from seedrl import codec
from seedrl.config import LOG_STD_RANGE
from seedrl.proto import seedrl_pb2 as pb

MASKED_LOGIT = torch.finfo(torch.float32).min
"""A masked action's logit: finite, so log-softmax and entropy stay finite (0 * -inf would
be NaN), yet its probability is exactly 0."""


def masked_logits(params: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked parameters ``[..., 2 * size]`` (logits, then 1 where allowed and 0 where masked)
    -> (logits with MASKED_LOGIT at masked actions, the boolean mask)."""
    logits, mask = params[..., :size], params[..., size:] > 0.5
    return logits.masked_fill(~mask, MASKED_LOGIT), mask


def gumbel_argmax(logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """An exact categorical sample over the last axis; with ``mask`` never a masked action:
    the allowed scores are made finite and the masked ones -inf, whatever the logits."""
    scores = logits - torch.empty_like(logits).exponential_().log()
    if mask is not None:
        scores = torch.where(mask, torch.nan_to_num(scores), float("-inf"))
    return scores.argmax(dim=-1)


class CategoricalHead:
    """Discrete actions: the policy parameters are logits ``[..., A]``."""

    continuous = False
    masked = False

    def __init__(self, num_actions: int) -> None:
        self.num_actions = num_actions
        self.param_size = num_actions
        self.action_shape: tuple[int, ...] = ()
        self.action_dtype = torch.int64
        self.max_entropy: float | None = math.log(num_actions)
        """The uniform policy's entropy (what a collapse is measured against)."""

    def sample(self, params: torch.Tensor) -> torch.Tensor:
        """Gumbel-max: argmax(logits + Gumbel noise) is an exact categorical sample, and
        cheaper in CPU than softmax + multinomial, which builds a distribution first."""
        gumbel_noise = -torch.empty_like(params).exponential_().log()
        return (params + gumbel_noise).argmax(dim=-1)

    def greedy(self, params: torch.Tensor) -> torch.Tensor:
        return params.argmax(dim=-1)

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        logp = log_softmax_last(params)
        return logp.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        logp = log_softmax_last(params)
        return -(logp.exp() * logp).sum(-1)

    def log_prob_and_entropy(
        self, params: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``log_prob`` and ``entropy`` of the same parameters over one log-softmax: the
        loss needs both of the learner's policy, and the second pass (forward and
        backward) was a training step's largest op after the matmuls and tanh."""
        logp = log_softmax_last(params)
        chosen = logp.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
        return chosen, -(logp.exp() * logp).sum(-1)


class GaussianHead:
    """Continuous actions: diagonal Gaussian, parameters ``[..., 2A]`` = mean, log-std.

    Actions are sampled unclipped (so log-probabilities stay exact for V-trace); the
    actor's env clips them to the Box bounds.
    """

    continuous = True
    masked = False

    def __init__(
        self,
        action_shape: tuple[int, ...],
        low: tuple[float, ...] = (),
        high: tuple[float, ...] = (),
    ) -> None:
        self.action_shape = action_shape
        self.low, self.high = low, high  # flat Box bounds; () when unbounded
        self.action_size = math.prod(action_shape)
        self.param_size = 2 * self.action_size
        self.action_dtype = torch.float32
        self.max_entropy: float | None = None
        """None: a Gaussian's entropy has no maximum to measure a collapse against."""

    def _split(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # No clamp here: its gradient is zero outside the range, so a log-std pushed past
        # a bound could never come back. The model keeps it in bounds instead
        # (ActorCritic.bound_log_std_ after each optimizer step).
        mean, log_std = params.split(self.action_size, dim=-1)
        return mean, log_std

    def _shape(self, flat: torch.Tensor) -> torch.Tensor:
        return flat.reshape(*flat.shape[:-1], *self.action_shape)

    def sample(self, params: torch.Tensor) -> torch.Tensor:
        mean, log_std = self._split(params)
        return self._shape(mean + log_std.exp() * torch.randn_like(mean))

    def greedy(self, params: torch.Tensor) -> torch.Tensor:
        return self._shape(self._split(params)[0])

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        mean, log_std = self._split(params)
        a = actions.reshape(mean.shape).to(mean.dtype)
        z = (a - mean) / log_std.exp()
        return (-0.5 * z.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        _, log_std = self._split(params)
        return (log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(-1)

    def log_prob_and_entropy(
        self, params: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``log_prob`` and ``entropy`` together (nothing to share for a Gaussian)."""
        return self.log_prob(params, actions), self.entropy(params)


class MaskedCategoricalHead(CategoricalHead):
    """Discrete actions under an action mask: the parameters are ``[..., 2A]``, the logits
    then the mask (1 allowed, 0 masked) the model copied from the observation, so the
    behaviour parameters kept with each frame carry the mask they were sampled under and
    the loss applies the same one to the learner's logits."""

    masked = True

    def __init__(self, num_actions: int) -> None:
        super().__init__(num_actions)
        self.param_size = 2 * num_actions

    def sample(self, params: torch.Tensor) -> torch.Tensor:
        return gumbel_argmax(*masked_logits(params, self.num_actions))

    def greedy(self, params: torch.Tensor) -> torch.Tensor:
        logits, mask = masked_logits(params, self.num_actions)
        return torch.where(mask, torch.nan_to_num(logits), float("-inf")).argmax(dim=-1)

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return super().log_prob(masked_logits(params, self.num_actions)[0], actions)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        return super().entropy(masked_logits(params, self.num_actions)[0])

    def log_prob_and_entropy(
        self, params: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = masked_logits(params, self.num_actions)[0]
        return super().log_prob_and_entropy(logits, actions)


class MultiCategoricalHead:
    """MultiDiscrete actions: one independent categorical per element, the parameters
    their logits side by side ``[..., sum(nvec)]`` (then as many mask entries when
    ``masked``, as for :class:`CategoricalHead`); log-probabilities and entropies add up."""

    continuous = False

    def __init__(
        self, nvec: tuple[int, ...], action_shape: tuple[int, ...], dtype: str, masked: bool
    ) -> None:
        self.nvec = nvec
        self.masked = masked
        self.num_logits = sum(nvec)
        self.param_size = 2 * self.num_logits if masked else self.num_logits
        self.max_entropy: float | None = sum(math.log(n) for n in nvec)
        """The uniform policy's entropy: the parts' entropies add up."""
        self.action_shape = action_shape
        self.action_dtype = getattr(torch, dtype)

    def _groups(self, params: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        if self.masked:
            logits, mask = masked_logits(params, self.num_logits)
            return list(logits.split(self.nvec, -1)), list(mask.split(self.nvec, -1))
        return list(params.split(self.nvec, -1)), [None] * len(self.nvec)

    def _shape(self, flat: torch.Tensor) -> torch.Tensor:
        return flat.reshape(*flat.shape[:-1], *self.action_shape).to(self.action_dtype)

    def sample(self, params: torch.Tensor) -> torch.Tensor:
        logits, masks = self._groups(params)
        samples = [gumbel_argmax(x, m) for x, m in zip(logits, masks, strict=True)]
        return self._shape(torch.stack(samples, -1))

    def greedy(self, params: torch.Tensor) -> torch.Tensor:
        logits, masks = self._groups(params)
        best = [
            (x if m is None else torch.where(m, torch.nan_to_num(x), float("-inf"))).argmax(-1)
            for x, m in zip(logits, masks, strict=True)
        ]
        return self._shape(torch.stack(best, -1))

    def log_prob_and_entropy(
        self, params: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits, _ = self._groups(params)
        actions_G = actions.reshape(*actions.shape[: actions.dim() - len(self.action_shape)], -1)
        logp_sum = torch.zeros(params.shape[:-1], device=params.device)
        entropy_sum = torch.zeros_like(logp_sum)
        for g, group_logits in enumerate(logits):
            logp = log_softmax_last(group_logits)
            logp_sum = logp_sum + logp.gather(-1, actions_G[..., g : g + 1].long()).squeeze(-1)
            entropy_sum = entropy_sum - (logp.exp() * logp).sum(-1)
        return logp_sum, entropy_sum

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.log_prob_and_entropy(params, actions)[0]

    def part_log_probs(self, params: torch.Tensor) -> list[torch.Tensor]:
        """Each sub-action's log-probabilities ``[..., n_g]``, one tensor per element of
        nvec (masked choices at the masked logit's): what a diagnostic per sub-action reads."""
        logits, _ = self._groups(params)
        return [log_softmax_last(x) for x in logits]

    def part_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """The actions ``[..., *action_shape]`` as ``[..., len(nvec)]`` sub-action indices."""
        return actions.reshape(*actions.shape[: actions.dim() - len(self.action_shape)], -1).long()

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        logits, _ = self._groups(params)
        total = torch.zeros(params.shape[:-1], device=params.device)
        for group_logits in logits:
            logp = log_softmax_last(group_logits)
            total = total - (logp.exp() * logp).sum(-1)
        return total


class BernoulliHead:
    """MultiBinary actions: one independent Bernoulli per element, parameters its logits."""

    continuous = False
    masked = False

    def __init__(self, action_shape: tuple[int, ...], dtype: str) -> None:
        self.action_shape = action_shape
        self.param_size = math.prod(action_shape)
        self.action_dtype = getattr(torch, dtype)
        self.max_entropy: float | None = self.param_size * math.log(2.0)
        """The uniform policy's entropy: one fair coin per switch."""

    def _shape(self, flat: torch.Tensor) -> torch.Tensor:
        return flat.reshape(*flat.shape[:-1], *self.action_shape).to(self.action_dtype)

    def sample(self, params: torch.Tensor) -> torch.Tensor:
        return self._shape(torch.rand_like(params) < torch.sigmoid(params))

    def greedy(self, params: torch.Tensor) -> torch.Tensor:
        return self._shape(params > 0)

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        a = actions.reshape(params.shape).to(params.dtype)
        # log sigmoid(l) for ones and log sigmoid(-l) for zeros, stable for any logit.
        return (
            a * nn.functional.logsigmoid(params) + (1 - a) * nn.functional.logsigmoid(-params)
        ).sum(-1)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        p = torch.sigmoid(params)
        logp, log1mp = nn.functional.logsigmoid(params), nn.functional.logsigmoid(-params)
        return -(p * logp + (1 - p) * log1mp).sum(-1)

    def log_prob_and_entropy(
        self, params: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.log_prob(params, actions), self.entropy(params)


class ProductHead:
    """Dict/Tuple actions of Discrete, MultiDiscrete and MultiBinary leaves: one independent
    head per leaf, their parameters side by side and their actions side by side as int64
    columns (:func:`seedrl.codec.action_columns`); the joint log-probability and entropy
    are the parts' sums, as for any product of independent distributions."""

    continuous = False
    masked = False

    def __init__(self, parts: list[CategoricalHead | MultiCategoricalHead | BernoulliHead]) -> None:
        self.parts = parts
        self.param_sizes = [part.param_size for part in parts]
        self.param_size = sum(self.param_sizes)
        self.columns = [max(1, math.prod(part.action_shape)) for part in parts]
        self.action_shape: tuple[int, ...] = (sum(self.columns),)
        self.action_dtype = torch.int64
        entropies = [part.max_entropy for part in parts]
        self.max_entropy: float | None = sum(e for e in entropies if e is not None)
        """The uniform policy's entropy: the parts' add up."""

    def _params(self, params: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return params.split(self.param_sizes, dim=-1)

    def _actions(self, actions: torch.Tensor) -> list[torch.Tensor]:
        """Each part's actions in its own shape, out of the side-by-side columns."""
        batch = actions.shape[:-1]
        return [
            a.reshape(*batch, *part.action_shape)
            for a, part in zip(actions.split(self.columns, dim=-1), self.parts, strict=True)
        ]

    def _join(self, actions: list[torch.Tensor], batch: torch.Size) -> torch.Tensor:
        return torch.cat([a.reshape(*batch, -1).to(torch.int64) for a in actions], dim=-1)

    def sample(self, params: torch.Tensor) -> torch.Tensor:
        parts = zip(self.parts, self._params(params), strict=True)
        return self._join([part.sample(p) for part, p in parts], params.shape[:-1])

    def greedy(self, params: torch.Tensor) -> torch.Tensor:
        parts = zip(self.parts, self._params(params), strict=True)
        return self._join([part.greedy(p) for part, p in parts], params.shape[:-1])

    def log_prob_and_entropy(
        self, params: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logp_sum = torch.zeros(params.shape[:-1], device=params.device)
        entropy_sum = torch.zeros_like(logp_sum)
        for part, p, a in zip(
            self.parts, self._params(params), self._actions(actions), strict=True
        ):
            logp, entropy = part.log_prob_and_entropy(p, a)
            logp_sum, entropy_sum = logp_sum + logp, entropy_sum + entropy
        return logp_sum, entropy_sum

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.log_prob_and_entropy(params, actions)[0]

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        total = torch.zeros(params.shape[:-1], device=params.device)
        for part, p in zip(self.parts, self._params(params), strict=True):
            total = total + part.entropy(p)
        return total


ActionHead = (
    CategoricalHead
    | MaskedCategoricalHead
    | GaussianHead
    | MultiCategoricalHead
    | BernoulliHead
    | ProductHead
)


LOG_STD_MIN, LOG_STD_MAX = LOG_STD_RANGE
"""Bounds of a Gaussian policy's log-std, kept by projecting the parameter after each
optimizer step: std stays in [0.0067, 7.4], and the gradient is never cut off."""


def action_head(action_spec: pb.SpaceSpec, masked: bool = False) -> ActionHead:
    """The distribution that matches the env's action space; ``masked``: its parameters
    carry an action mask (Discrete and MultiDiscrete only)."""
    if masked and action_spec.kind not in ("discrete", "multi_discrete"):
        raise UnsupportedSetup(
            f"an action mask needs a Discrete or MultiDiscrete action space, not "
            f"{codec.spec_summary(action_spec)}"
        )
    if codec.is_structured(action_spec):
        return _structured_head(action_spec)
    if action_spec.kind == "discrete":
        n = int(action_spec.n)
        return MaskedCategoricalHead(n) if masked else CategoricalHead(n)
    if action_spec.kind == "multi_discrete":
        shape = tuple(int(d) for d in action_spec.shape)
        return MultiCategoricalHead(
            tuple(int(n) for n in action_spec.nvec), shape, action_spec.dtype, masked
        )
    if action_spec.kind == "multi_binary":
        return BernoulliHead(tuple(int(d) for d in action_spec.shape), action_spec.dtype)
    if action_spec.kind == "box":
        return _gaussian_head([action_spec], tuple(int(d) for d in action_spec.shape))
    raise UnsupportedSetup(
        f"action space {codec.spec_summary(action_spec)} is not supported: the learner's "
        "heads take Discrete, Box, MultiDiscrete and MultiBinary"
    )


def _gaussian_head(boxes: list[pb.SpaceSpec], action_shape: tuple[int, ...]) -> GaussianHead:
    """One diagonal Gaussian over the Box spaces' elements side by side, squashed into
    their bounds when every bound is finite."""
    bounds = []
    for spec in boxes:
        if not (spec.low.data and spec.high.data):
            return GaussianHead(action_shape)
        bounds.append(
            (
                codec.decode_tensor(spec.low, "action low").astype(float).ravel(),
                codec.decode_tensor(spec.high, "action high").astype(float).ravel(),
            )
        )
    low_A = np.concatenate([low for low, _ in bounds])
    high_A = np.concatenate([high for _, high in bounds])
    if not (np.isfinite(low_A).all() and np.isfinite(high_A).all()):
        return GaussianHead(action_shape)
    return GaussianHead(action_shape, tuple(low_A.tolist()), tuple(high_A.tolist()))


def _structured_head(action_spec: pb.SpaceSpec) -> GaussianHead | ProductHead:
    """A dict/tuple action space's head: all Box leaves make one diagonal Gaussian over
    their elements side by side (a product of diagonal Gaussians is one); all Discrete,
    MultiDiscrete and MultiBinary leaves make a :class:`ProductHead`. A mix is refused."""
    leaves = codec.space_leaves(action_spec, action=True)
    kinds = {leaf.spec.kind for leaf in leaves}
    if kinds == {"box"}:
        return _gaussian_head(
            [leaf.spec for leaf in leaves], (sum(codec.action_columns(action_spec)),)
        )
    if "box" in kinds:
        raise UnsupportedSetup(
            f"action space {codec.spec_summary(action_spec)} is not supported: a dict/tuple "
            "action space takes either only Box leaves or only Discrete, MultiDiscrete and "
            "MultiBinary leaves, not both"
        )
    parts = []
    for leaf in leaves:
        part = action_head(leaf.spec)
        assert isinstance(part, CategoricalHead | MultiCategoricalHead | BernoulliHead)
        parts.append(part)
    return ProductHead(parts)
