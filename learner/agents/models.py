"""Policy/value networks and their action distributions (learner side only: imports torch).

Shape suffixes used in names: T time, B batch (envs or unrolls), O observation dims,
A action dims, P policy-parameter dims (A logits for discrete actions, 2A mean and
log-std for continuous ones), H recurrent hidden size.

One network serves both inference (``T = 1``, one row per pending env frame) and
training (``T = unroll_length + 1``); the optional LSTM core's state is passed in and
out explicitly so the learner can keep it per (actor, env) slot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from learner.agents.cpu_kernels import Linear, Tanh, TanhMLP, conv_input_layout, log_softmax_last
from seedrl import codec
from seedrl.config import LOG_STD_RANGE
from seedrl.proto import seedrl_pb2 as pb

CoreState = tuple[torch.Tensor, ...]
"""Recurrent state, each tensor ``[B, H]``; empty for feed-forward models."""


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


class UnsupportedSetup(ValueError):
    """An env's spaces (or a flag) that no model or head here fits; the learner refuses
    them at start-up with this one line."""


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


@dataclass(frozen=True)
class ModelSpec:
    """What the network is built from; stored in checkpoints so they can be rebuilt."""

    obs_shape: tuple[int, ...]
    obs_dtype: str
    torso: str  # "mlp", "cnn" or "resnet"
    hidden_sizes: tuple[int, ...]
    param_size: int
    lstm_size: int  # 0: no LSTM
    separate_value: bool = False  # MLP only: the value gets its own MLP (no shared torso)
    continuous: bool = False  # Gaussian head: state-independent log-std (params = mean, log-std)
    action_low: tuple[float, ...] = ()  # finite Box bounds: the mean is squashed into them
    action_high: tuple[float, ...] = ()
    dueling: bool = False  # Q-network: params are Q = V + A - mean(A), from shared features
    # torso "leaves": a dict/tuple observation packed into uint8 rows (seedrl.codec.LeafPacking),
    # one (name, dtype, shape, encoder, categories) per leaf in wire order; encoder is "cnn",
    # "mlp", "embed" (categories: the choices of each element) or "mask" (the action mask).
    leaf_inputs: tuple[tuple[str, str, tuple[int, ...], str, tuple[int, ...]], ...] = ()
    cnn_channels: tuple[int, ...] = (16,)  # the small-grid CNN's conv layers


MAX_EMBEDDED_CHOICES = 256
"""Discrete observation leaves with up to this many choices per element are embedded;
larger ones are read as numbers by an MLP."""
EMBEDDING_SIZE = 16


def is_image(spec: pb.SpaceSpec) -> bool:
    """Image-like: a rank-3 Box, or a rank-2 uint8 one."""
    rank = len(spec.shape)
    return spec.kind == "box" and (rank == 3 or (rank == 2 and spec.dtype == "uint8"))


MIN_IMAGE_SIDE = 3
"""A dict/tuple leaf narrower than this is read by the MLP even when image-like: the
small CNN's 3x3 kernel does not fit it."""


def is_image_leaf(spec: pb.SpaceSpec) -> bool:
    """A dict/tuple observation leaf that ``--model auto`` reads with a CNN."""
    if not is_image(spec):
        return False
    _, height, width, _ = image_layout(codec.spec_shape(spec))
    return min(height, width) >= MIN_IMAGE_SIDE


def choose_torso(obs_spec: pb.SpaceSpec, requested: str) -> str:
    """``auto`` picks the CNN for image-like observations (rank 3, or rank 2 uint8) and one
    encoder per leaf ("leaves") for dict/tuple observations."""
    if codec.is_structured(obs_spec):
        if requested not in ("auto", "leaves"):
            raise UnsupportedSetup(
                f"--model {requested} reads one observation tensor; dict/tuple observations "
                "need --model auto (one encoder per leaf)"
            )
        return "leaves"
    if requested != "auto":
        return requested
    return "cnn" if is_image(obs_spec) else "mlp"


def leaf_inputs(
    obs_spec: pb.SpaceSpec, mask_leaf: str = ""
) -> tuple[tuple[str, str, tuple[int, ...], str, tuple[int, ...]], ...]:
    """How ``--model auto`` reads each leaf of a dict/tuple observation: a CNN for images,
    an embedding for small discrete leaves, an MLP for the rest; ``mask_leaf`` is the
    action mask, which masks the policy instead of feeding the torso."""
    inputs = []
    for leaf in codec.space_leaves(obs_spec):
        choices: tuple[int, ...] = ()
        if leaf.name == mask_leaf:
            encoder = "mask"
        elif is_image_leaf(leaf.spec):
            encoder = "cnn"
        elif leaf.spec.kind == "discrete" and leaf.spec.n <= MAX_EMBEDDED_CHOICES:
            encoder, choices = "embed", (int(leaf.spec.n),)
        elif leaf.spec.kind == "multi_discrete" and max(leaf.spec.nvec) <= MAX_EMBEDDED_CHOICES:
            encoder, choices = "embed", tuple(int(n) for n in leaf.spec.nvec)
        else:
            encoder = "mlp"
        inputs.append((leaf.name, leaf.dtype.name, leaf.shape, encoder, choices))
    if all(encoder == "mask" for *_, encoder, _ in inputs):
        raise UnsupportedSetup("the observation holds only the action mask: nothing to read")
    return tuple(inputs)


def has_action_mask(obs_spec: pb.SpaceSpec, mask_leaf: str) -> bool:
    """True when a dict/tuple observation has a leaf named ``mask_leaf`` (``--action-mask``)."""
    return bool(mask_leaf) and any(x.name == mask_leaf for x in codec.space_leaves(obs_spec))


def _torch_dtype(name: str) -> torch.dtype:
    return torch.bool if name == "bool" else getattr(torch, name)


class LeafEncoders(nn.Module):
    """One encoder per leaf of a packed dict/tuple observation, features concatenated.

    Input: uint8 rows ``[N, row_bytes]`` with each leaf's bytes side by side (the learner's
    storage, :class:`seedrl.codec.LeafPacking`); each leaf is viewed back in its dtype.
    """

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.leaves = spec.leaf_inputs
        self.slices: list[tuple[int, int]] = []
        self.mask_index = -1
        encoders: dict[str, nn.Module] = {}
        out_size, offset = 0, 0
        for index, (_, dtype, shape, encoder, choices) in enumerate(self.leaves):
            nbytes = math.prod(shape) * np.dtype(dtype).itemsize
            self.slices.append((offset, offset + nbytes))
            offset += nbytes
            key = f"leaf{index}"
            module: nn.Module
            if encoder == "mask":
                self.mask_index = index
                continue
            if encoder == "cnn":
                c, h, w, _ = image_layout(shape)
                module = image_encoder(c, h, w, spec.cnn_channels)
                size = module.out_size
            elif encoder == "embed":
                offsets = torch.tensor([0, *np.cumsum(choices)[:-1].tolist()])
                self.register_buffer(f"{key}_offsets", offsets)
                module = nn.Embedding(int(sum(choices)), EMBEDDING_SIZE)
                size = EMBEDDING_SIZE * math.prod(shape)
            else:
                module, size = mlp(math.prod(shape), spec.hidden_sizes)
            encoders[key] = module
            out_size += size
        self.encoders = nn.ModuleDict(encoders)
        self.out_size = out_size

    def leaf(self, rows_NR: torch.Tensor, index: int) -> torch.Tensor:
        """Leaf ``index``'s values ``[N, *shape]`` in their own dtype."""
        _, dtype, shape, _, _ = self.leaves[index]
        start, end = self.slices[index]
        # A fresh dense copy, not .contiguous(): one row's slice counts as contiguous yet
        # keeps its byte offset and row stride, which a wider dtype cannot be viewed from.
        raw = rows_NR[:, start:end].clone(memory_format=torch.contiguous_format)
        return raw.view(_torch_dtype(dtype)).reshape(len(rows_NR), *shape)

    def mask(self, rows_NR: torch.Tensor) -> torch.Tensor | None:
        """The action mask leaf as floats ``[N, A]`` (1 allowed), or None without one."""
        if self.mask_index < 0:
            return None
        return mask_floats(self.leaf(rows_NR, self.mask_index))

    def forward(self, rows_NR: torch.Tensor) -> torch.Tensor:
        return self.encode([self.leaf(rows_NR, i) for i in range(len(self.leaves))])

    def encode(self, values: list[torch.Tensor]) -> torch.Tensor:
        """The features of the leaves' values ``[N, *shape]`` each, in leaf order: what
        ``forward`` reads out of packed rows, taken whole (an exported policy's inputs)."""
        features = []
        for index, (_, dtype, shape, encoder, _) in enumerate(self.leaves):
            if encoder == "mask":
                continue
            key = f"leaf{index}"
            x = values[index]
            if encoder == "embed":
                ids = x.long().reshape(len(x), -1) + getattr(self, f"{key}_offsets")
                features.append(self.encoders[key](ids).flatten(1))
                continue
            x = x.float() / 255.0 if dtype == "uint8" else x.float()
            if encoder == "cnn":
                c, h, w, hwc = image_layout(shape)
                images = x.permute(0, 3, 1, 2) if hwc else x.reshape(len(x), c, h, w)
                features.append(self.encoders[key](images))
            else:
                features.append(self.encoders[key](x.flatten(1)))
        return torch.cat(features, dim=-1)


def mask_floats(mask_leaf: torch.Tensor) -> torch.Tensor:
    """An action mask leaf ``[N, *shape]`` as floats ``[N, A]``: 1 allowed, 0 masked."""
    return (mask_leaf != 0).flatten(1).float()


def image_layout(shape: tuple[int, ...]) -> tuple[int, int, int, bool]:
    """(C, H, W, channels-last) of an image; channels-last when the last dim is the smallest."""
    if len(shape) == 2:
        return 1, shape[0], shape[1], False
    if len(shape) != 3:
        raise ValueError(f"an image needs rank 2 or 3, got shape {shape}")
    if shape[-1] < shape[0] and shape[-1] <= 16:
        return shape[2], shape[0], shape[1], True
    return shape[0], shape[1], shape[2], False


def init_orthogonal_relu(encoder: nn.Module) -> None:
    """Every conv and linear layer of ``encoder`` orthogonal with the ReLU gain, biases zero:
    the init under which an Atari encoder's features tell near-identical frames apart."""
    for layer in encoder.modules():
        if isinstance(layer, nn.Conv2d | nn.Linear):
            nn.init.orthogonal_(layer.weight, gain=nn.init.calculate_gain("relu"))
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)


class NatureCNN(nn.Module):
    """The Nature-DQN encoder (Mnih et al. 2015); input ``[N, C, H, W]`` scaled to [0, 1].

    Initialised orthogonally with the ReLU gain and zero biases, as the Atari agents of
    OpenAI Baselines, SB3 and CleanRL are: under PyTorch's default init each of its four
    layers shrinks the signal, and on Atari frames (mostly the same background) the
    features barely differ between observations, so the policy can only learn a
    state-independent action preference at first.
    """

    def __init__(self, in_channels: int, height: int, width: int, out_size: int = 512) -> None:
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(in_channels, 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            flat = self.conv(torch.zeros(1, in_channels, height, width)).shape[-1]
        self.fc = nn.Sequential(nn.Linear(flat, out_size), nn.ReLU())
        self.out_size = out_size
        init_orthogonal_relu(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x))


class SmallCNN(nn.Module):
    """A compact conv encoder for small grids (MinAtar's 10x10) where Nature's strides don't
    fit: unpadded 3x3 convs, one per entry of ``channels``, then one ReLU layer.

    One 16-channel layer is MinAtar's own network. Each further layer widens what one
    feature sees by a cell on every side: two see a 5x5 window, which holds every line of
    four on a Connect Four board, so one shared filter can find a line anywhere.
    """

    def __init__(
        self, in_channels: int, height: int, width: int, out_size: int = 128,
        channels: tuple[int, ...] = (16,),
    ) -> None:  # fmt: skip
        super().__init__()
        trimmed = 2 * len(channels)
        if not channels or min(height, width) <= trimmed:
            raise UnsupportedSetup(
                f"--cnn-channels {','.join(map(str, channels))}: {len(channels)} unpadded 3x3 "
                f"layers need a grid more than {trimmed} cells a side, got {height}x{width}"
            )
        layers: list[nn.Module] = []
        for out_channels in channels:
            layers += [nn.Conv2d(in_channels, out_channels, 3, stride=1), nn.ReLU()]
            in_channels = out_channels
        self.conv = nn.Sequential(*layers, nn.Flatten())
        flat = channels[-1] * (height - trimmed) * (width - trimmed)
        self.fc = nn.Sequential(nn.Linear(flat, out_size), nn.ReLU())
        self.out_size = out_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x))


def image_encoder(
    in_channels: int, height: int, width: int, small_channels: tuple[int, ...]
) -> NatureCNN | SmallCNN:
    """Nature's CNN for frames at least 36 pixels a side, the small-grid CNN below that."""
    if min(height, width) >= 36:
        return NatureCNN(in_channels, height, width)
    return SmallCNN(in_channels, height, width, channels=small_channels)


class ResidualBlock(nn.Module):
    """ReLU, 3x3 conv, ReLU, 3x3 conv, plus the input: the block IMPALA's deep encoder stacks."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class ImpalaResNet(nn.Module):
    """IMPALA's deep encoder (Espeholt et al. 2018, fig. 3): three sections of conv, 3x3 max
    pool with stride 2 and two residual blocks, with (16, 32, 32) channels, then a 256-unit
    layer. Several times the Nature CNN's arithmetic per frame, so it is for a GPU learner:
    the larger network IMPALA reports its best Atari scores with (TorchBeast ships it too).

    Initialised orthogonally with the ReLU gain, as the Nature CNN is, except that each
    residual block's second conv starts at zero (Goyal et al. 2017; Fixup), so every block
    starts as the identity: with PyTorch's default init the features of near-identical
    Atari frames barely differ, and with the ReLU gain on every conv the residual sums
    grow block after block (measurements: docs/learning-log.md).
    """

    def __init__(
        self, in_channels: int, height: int, width: int, out_size: int = 256,
        channels: tuple[int, ...] = (16, 32, 32),
    ) -> None:  # fmt: skip
        super().__init__()
        layers: list[nn.Module] = []
        probe = torch.zeros(1, in_channels, height, width)
        for out_channels in channels:
            layers += [
                nn.Conv2d(in_channels, out_channels, 3, padding=1),
                nn.MaxPool2d(3, stride=2, padding=1),
                ResidualBlock(out_channels),
                ResidualBlock(out_channels),
            ]
            in_channels = out_channels
        layers += [nn.ReLU(), nn.Flatten()]
        self.conv = nn.Sequential(*layers)
        with torch.no_grad():
            flat = self.conv(probe).shape[-1]
        self.fc = nn.Sequential(nn.Linear(flat, out_size), nn.ReLU())
        self.out_size = out_size
        init_orthogonal_relu(self)
        for block in self.modules():
            if isinstance(block, ResidualBlock):
                nn.init.zeros_(block.conv1.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x))


def mlp(in_size: int, hidden_sizes: tuple[int, ...]) -> tuple[TanhMLP, int]:
    """Tanh MLP and its output width."""
    layers: list[nn.Module] = []
    size = in_size
    for width in hidden_sizes:
        layers += [Linear(size, width), Tanh()]
        size = width
    return TanhMLP(*layers), size


class ActorCritic(nn.Module):
    """Torso (MLP, CNN or ResNet) -> optional LSTM core -> policy parameters and value.

    A feed-forward MLP model gives the value its own MLP (``separate_value``): on
    low-dimensional tasks the large value-loss gradients otherwise swamp the policy's
    shared features (as in PPO/A2C defaults).
    """

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.hwc_observations = False
        self.value_torso: nn.Module | None = None
        self.torso: nn.Module
        if spec.torso == "mlp":
            self.torso, torso_out = mlp(math.prod(spec.obs_shape), spec.hidden_sizes)
            if spec.separate_value and not spec.lstm_size:
                self.value_torso, _ = mlp(math.prod(spec.obs_shape), spec.hidden_sizes)
        elif spec.torso in ("cnn", "resnet"):
            c, h, w = self._image_layout(spec.obs_shape)
            encoder: NatureCNN | SmallCNN | ImpalaResNet
            if spec.torso == "resnet":
                encoder = ImpalaResNet(c, h, w)
            else:
                encoder = image_encoder(c, h, w, spec.cnn_channels)
            self.torso = encoder
            torso_out = encoder.out_size
        elif spec.torso == "leaves":
            self.torso = LeafEncoders(spec)
            torso_out = self.torso.out_size
        else:
            raise ValueError(f"unknown torso {spec.torso!r}")
        self.core: nn.LSTMCell | None = None
        if spec.lstm_size:
            self.core = nn.LSTMCell(torso_out, spec.lstm_size)
            torso_out += spec.lstm_size  # heads see [torso features, core output]
        # A continuous policy learns one log-std per action dim, not per state: a
        # state-dependent std collapses within a few hundred V-trace steps on Pendulum.
        self.log_std: nn.Parameter | None = None
        policy_out = spec.param_size
        self.masked = isinstance(self.torso, LeafEncoders) and self.torso.mask_index >= 0
        if self.masked:  # params = logits, then the mask copied from the observation
            policy_out = spec.param_size // 2
        if spec.continuous:
            policy_out = spec.param_size // 2
            self.log_std = nn.Parameter(torch.zeros(policy_out))
        # Bounded continuous actions: mean = centre + half-range * tanh(raw). An unbounded
        # mean drifts past the bounds, where the clipped action no longer changes and
        # the policy sticks at full torque (Pendulum's -1600 plateau).
        self.action_centre: torch.Tensor | None
        self.action_half_range: torch.Tensor | None
        centre = half_range = None
        if spec.continuous and spec.action_low:
            low = torch.tensor(spec.action_low, dtype=torch.float32)
            high = torch.tensor(spec.action_high, dtype=torch.float32)
            centre, half_range = (high + low) / 2, (high - low) / 2
        self.register_buffer("action_centre", centre)
        self.register_buffer("action_half_range", half_range)
        self.policy = nn.Linear(torso_out, policy_out)
        self.baseline = nn.Linear(torso_out, 1)
        nn.init.orthogonal_(self.policy.weight, gain=0.01)
        nn.init.zeros_(self.policy.bias)

    def _image_layout(self, shape: tuple[int, ...]) -> tuple[int, int, int]:
        """(C, H, W) of an image observation; channels-last when the last dim is the smallest."""
        if len(shape) not in (2, 3):
            raise ValueError(
                f"{self.spec.torso} needs a rank-2 or rank-3 observation, got shape {shape}"
            )
        c, h, w, self.hwc_observations = image_layout(shape)
        return c, h, w

    def bound_log_std_(self) -> None:
        """Project a Gaussian policy's log-std into [LOG_STD_MIN, LOG_STD_MAX], in place.

        Called after every optimizer step (and on load): with ``entropy_cost = 0`` nothing
        else resists a drift, and a bound applied inside the forward pass would stop the
        gradient that could bring it back.
        """
        if self.log_std is not None:
            with torch.no_grad():
                self.log_std.clamp_(LOG_STD_MIN, LOG_STD_MAX)

    def initial_state(self, batch: int, device: torch.device | str = "cpu") -> CoreState:
        if self.core is None:
            return ()
        zeros = torch.zeros(batch, self.spec.lstm_size, device=device)
        return (zeros, zeros.clone())

    def _prepare(self, obs_NO: torch.Tensor) -> torch.Tensor:
        """Observations as float network input: scaled bytes, flattened or channels-first."""
        if self.spec.torso == "leaves":
            return obs_NO  # packed rows: each leaf's encoder reads its own bytes
        if self.spec.torso == "mlp":
            x = obs_NO.float()
            return (x / 255.0 if self.spec.obs_dtype == "uint8" else x).flatten(1)
        if obs_NO.dim() == 3:
            images = obs_NO.unsqueeze(1)
        else:
            images = obs_NO.permute(0, 3, 1, 2) if self.hwc_observations else obs_NO
        # The layout is set on the raw (often uint8) frames: the float copy keeps it.
        x = conv_input_layout(images).float()
        return x / 255.0 if self.spec.obs_dtype == "uint8" else x

    def forward(
        self, obs_TBO: torch.Tensor, first_TB: torch.Tensor, core_state: CoreState = ()
    ) -> tuple[torch.Tensor, torch.Tensor, CoreState]:
        """Policy parameters ``[T, B, P]``, values ``[T, B]`` and the core state after step T.

        ``first_TB`` marks the first frame of an episode: the LSTM state is zeroed there.
        """
        t, b = obs_TBO.shape[:2]
        x, features, core_state = self._features(obs_TBO, first_TB, core_state)
        value_features = features if self.value_torso is None else self.value_torso(x)
        values = self.baseline(value_features).reshape(t, b)
        return self._params(features, t, b, x), values, core_state

    def act(
        self, obs_TBO: torch.Tensor, first_TB: torch.Tensor, core_state: CoreState = ()
    ) -> tuple[torch.Tensor, CoreState]:
        """Policy parameters and core state only: what inference needs. Skipping the value
        halves a CartPole forward pass (its value MLP is as big as the policy's)."""
        t, b = obs_TBO.shape[:2]
        x, features, core_state = self._features(obs_TBO, first_TB, core_state)
        return self._params(features, t, b, x), core_state

    def _features(
        self, obs_TBO: torch.Tensor, first_TB: torch.Tensor, core_state: CoreState
    ) -> tuple[torch.Tensor, torch.Tensor, CoreState]:
        """(network input, policy features, core state after step T)."""
        t, b = obs_TBO.shape[:2]
        x = self._prepare(obs_TBO.reshape(t * b, *obs_TBO.shape[2:]))
        features, core_state = self.core_step(self.torso(x), first_TB, core_state)
        return x, features, core_state

    def core_step(
        self, features: torch.Tensor, first_TB: torch.Tensor | None, core_state: CoreState
    ) -> tuple[torch.Tensor, CoreState]:
        """The torso's features ``[T * B, F]`` through the LSTM core, when there is one:
        (the heads' features, the core state after step T). ``first_TB`` None: no frame
        starts an episode (the caller passes zeros for a fresh one)."""
        if self.core is None:
            return features, core_state
        h, c = core_state
        t = 1 if first_TB is None else first_TB.shape[0]
        features_TBF = features.reshape(t, -1, features.shape[-1])
        outputs = []
        for step in range(t):
            if first_TB is not None:
                keep_B1 = (~first_TB[step].bool()).float().unsqueeze(-1)
                h, c = h * keep_B1, c * keep_B1
            h, c = self.core(features_TBF[step], (h, c))
            outputs.append(h)
        core_out = torch.stack(outputs).reshape(features.shape[0], -1)
        return torch.cat([features, core_out], dim=-1), (h, c)

    def _params(self, features: torch.Tensor, t: int, b: int, x: torch.Tensor) -> torch.Tensor:
        mask = None
        if self.masked:
            assert isinstance(self.torso, LeafEncoders)
            mask = self.torso.mask(x)
        return self.policy_params(features, t, b, mask)

    def policy_params(
        self, features: torch.Tensor, t: int, b: int, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The policy parameters ``[T, B, P]`` of the heads' features; ``mask`` ``[T * B, A]``
        (a masked model's action mask as floats) is appended after the logits."""
        params = self.policy(features).reshape(t, b, -1)
        if self.masked:
            assert mask is not None
            params = torch.cat([params, mask.reshape(t, b, -1).to(params.dtype)], dim=-1)
        if self.spec.dueling:  # Wang et al. 2016: the advantages' mean is the baseline's
            value = self.baseline(features).reshape(t, b, 1)
            return value + params - params.mean(dim=-1, keepdim=True)
        if self.action_centre is not None and self.action_half_range is not None:
            params = self.action_centre + self.action_half_range * torch.tanh(params)
        if self.log_std is not None:
            params = torch.cat([params, self.log_std.expand_as(params)], dim=-1)
        return params


def build_model(
    obs_spec: pb.SpaceSpec,
    head: ActionHead,
    torso: str = "auto",
    hidden_sizes: tuple[int, ...] = (64, 64),
    lstm_size: int = 0,
    separate_value: bool = True,
    dueling: bool = False,
    mask_leaf: str = "",
    cnn_channels: tuple[int, ...] = (16,),
) -> ActorCritic:
    """The ActorCritic for an env's spaces; ``mask_leaf`` names a dict observation's action
    mask (the head must then be a masked one)."""
    torso = choose_torso(obs_spec, torso)
    inputs = leaf_inputs(obs_spec, mask_leaf) if torso == "leaves" else ()
    has_mask = any(encoder == "mask" for *_, encoder, _ in inputs)
    if has_mask != head.masked:
        raise ValueError(f"mask leaf {mask_leaf!r} and head (masked={head.masked}) disagree")
    for name, _, shape, encoder, _ in inputs:
        if encoder == "mask" and math.prod(shape) != head.param_size // 2:
            raise UnsupportedSetup(
                f"action mask {name!r} has {math.prod(shape)} entries but the action space "
                f"has {head.param_size // 2} choices (one entry per action, side by side)"
            )
    obs_shape = tuple(int(d) for d in obs_spec.shape)
    obs_dtype = obs_spec.dtype
    if inputs:
        obs_shape, obs_dtype = (codec.LeafPacking(codec.space_leaves(obs_spec)).row_bytes,), "uint8"
    spec = ModelSpec(
        obs_shape=obs_shape,
        obs_dtype=obs_dtype,
        torso=torso,
        leaf_inputs=inputs,
        hidden_sizes=tuple(hidden_sizes),
        param_size=head.param_size,
        lstm_size=lstm_size,
        separate_value=separate_value,
        continuous=head.continuous,
        action_low=head.low if isinstance(head, GaussianHead) else (),
        action_high=head.high if isinstance(head, GaussianHead) else (),
        dueling=dueling,
        cnn_channels=tuple(cnn_channels),
    )
    return ActorCritic(spec)


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU; anything else is passed to torch."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_precision(name: str, device: torch.device) -> str:
    """``auto`` -> bf16 on CUDA, fp32 elsewhere; fp32 and bf16 are kept as asked."""
    if name == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    if name not in ("fp32", "bf16"):
        raise ValueError(f"precision must be auto, fp32 or bf16, got {name!r}")
    return name


def autocast(device: torch.device, precision: str) -> torch.autocast:
    """The autocast region of a forward pass: bf16 matmuls and convolutions under
    ``precision`` bf16, while parameters (and so the optimizer's master copy) stay fp32."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
