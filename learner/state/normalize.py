"""Running statistics on the learner: observations (``--normalize-observations``) and
the return scale that training rewards are divided by (``--normalize-returns``).

The learner sees every frame it serves, so it keeps the per-element mean and variance of
the observations there (the actors stay as they are) and feeds the network
``clip((obs - mean) / sqrt(var + eps), -CLIP, CLIP)``. Inference updates the statistics
with each batch, then normalizes the batch; the trajectory builder stores the normalized
frames, so training sees exactly the inputs the behaviour policy acted on, even though
the statistics keep moving (recomputing with newer statistics at training time would make
the behaviour log-probabilities, and so V-trace's importance weights, wrong).

A dict/tuple observation (packed rows, :class:`seedrl.codec.LeafPacking`) is normalized
leaf by leaf (:class:`LeafNormalizer`): each float vector leaf keeps its own statistics and
becomes float32 in the rows the network reads; images, discrete leaves and the action mask
pass through byte for byte, since scaling pixels or category ids would only hide them.

Both kinds of statistics are bounded against one extreme but finite value (a simulator
that blows up once, a hostile frame: the wire refuses only NaN and inf): before it is folded
in, each value is clipped to ``mean +- UPDATE_SIGMAS * std`` of the statistics so far (to
``+-WARMUP_CAP`` while fewer than ``WARMUP_FRAMES`` have been seen). One value then moves the
mean by at most ``UPDATE_SIGMAS * std / (count + 1)`` and multiplies the variance by at most
``1 + UPDATE_SIGMAS**2 / (count + 1)``, so the honest frames after it still normalize to
O(1); honest drift is still followed, since values at the bound widen it batch by batch.
The frame itself is served as usual (its network input is clipped to +-CLIP anyway); the
learner only counts the clipped values (``obs_norm/clipped_values``).

Shape suffixes: B frames in a batch, O observation dims, R packed row bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from learner.common.spaces import UnsupportedSetup, is_image_leaf
from seedrl import codec
from seedrl.proto import seedrl_pb2 as pb

CLIP = 10.0
"""Normalized observations are clipped to [-CLIP, CLIP] (as SB3's VecNormalize and RLlib's
MeanStdFilter do), so one extreme frame cannot blow up a pre-activation."""
EPSILON = 1e-8
"""Added to the variance: a constant element normalizes to 0, not to NaN."""
UPDATE_SIGMAS = CLIP
"""Values are folded into the statistics clipped to mean +- this many std: what the network
would see clipped at +-CLIP enters the statistics at that same bound."""
WARMUP_FRAMES = 8
"""Below this many values the std is no bound yet (one frame has none): values are clipped
to +-WARMUP_CAP instead."""
WARMUP_CAP = 1e6
"""The bound on the first values of a run, above any sane observation or return."""


def update_bounds(count: float, mean: Any, var: Any) -> tuple[Any, Any]:
    """The (low, high) that values are clipped to before they join statistics of ``count``
    values with this ``mean`` and (population) ``var``."""
    if count < WARMUP_FRAMES:
        return -WARMUP_CAP, WARMUP_CAP
    reach = UPDATE_SIGMAS * np.sqrt(var + EPSILON)
    return mean - reach, mean + reach


def normalizes_leaf(leaf: codec.Leaf, mask_leaf: str = "") -> bool:
    """Whether a dict/tuple observation's leaf gets its own statistics: a float Box that the
    model does not read as an image (and not the action mask)."""
    spec = leaf.spec
    return (
        spec.kind == "box"
        and leaf.dtype.kind == "f"
        and not is_image_leaf(spec)
        and leaf.name != mask_leaf
    )


def normalized_space(obs_spec: pb.SpaceSpec, mask_leaf: str = "") -> pb.SpaceSpec:
    """The observation space the network sees under normalisation: float32, same shape; for
    a dict/tuple space only its normalized leaves change (to float32)."""
    spec = pb.SpaceSpec()
    spec.CopyFrom(obs_spec)
    if not codec.is_structured(spec):
        spec.dtype = "float32"
        return spec
    names = {x.name for x in codec.space_leaves(obs_spec) if normalizes_leaf(x, mask_leaf)}

    def walk(node: pb.SpaceSpec, path: tuple[str, ...]) -> None:
        if codec.is_structured(node):
            for index, child in enumerate(node.children):
                walk(child, (*path, child.name if node.kind == "dict" else str(index)))
        elif codec.LEAF_SEPARATOR.join(path) in names:
            node.dtype = "float32"

    walk(spec, ())
    return spec


def make_normalizer(
    obs_spec: pb.SpaceSpec, mask_leaf: str = ""
) -> ObservationNormalizer | LeafNormalizer:
    """The normaliser for an env's observation space (``--normalize-observations``): one
    set of statistics for a leaf space, one per float leaf for a dict/tuple space."""
    if codec.is_structured(obs_spec):
        return LeafNormalizer(obs_spec, mask_leaf)
    return ObservationNormalizer(codec.spec_shape(obs_spec), obs_spec.dtype)


class ObservationNormalizer:
    """Running mean and variance of observations, in float64, merged batch by batch.

    Each batch is folded in with Chan et al.'s parallel update of (count, mean, M2), which
    is exact for any split of the stream and does not lose precision the way running sums
    of squares do. The state is one tuple replaced whole, so a checkpoint written from
    another thread never sees a half-updated one.
    """

    def __init__(self, obs_shape: tuple[int, ...], obs_dtype: Any) -> None:
        self.obs_shape = tuple(obs_shape)
        self.obs_dtype = np.dtype(obs_dtype)
        """The raw observations' dtype (as the actors send them)."""
        zeros = np.zeros(self.obs_shape, np.float64)
        self._state: tuple[int, np.ndarray, np.ndarray] = (0, zeros, zeros.copy())
        self.frozen = False
        """Statistics as loaded, never moved (a trained policy served as ``evaluate`` runs it)."""
        self.clipped_values = 0
        """Values clipped by the update bound so far (not checkpointed: a metric)."""

    @property
    def count(self) -> int:
        return self._state[0]

    @property
    def mean(self) -> np.ndarray:
        return self._state[1]

    @property
    def var(self) -> np.ndarray:
        """Population variance (numpy's ``var``, ddof 0); ones before any frame."""
        count, _, m2 = self._state
        return m2 / count if count else np.ones(self.obs_shape, np.float64)

    def update(self, obs_BO: np.ndarray) -> None:
        """Fold a batch of raw observations into the statistics (unless frozen), each value
        clipped to :func:`update_bounds` of the statistics before the batch."""
        if self.frozen:
            return
        raw = np.asarray(obs_BO, np.float64).reshape(-1, *self.obs_shape)
        n = len(raw)
        if n == 0:
            return
        count, mean, m2 = self._state
        low, high = update_bounds(count, mean, m2 / count if count else 0.0)
        x = np.clip(raw, low, high)
        self.clipped_values += int(np.count_nonzero(x != raw))
        batch_mean = x.mean(axis=0)
        batch_m2 = np.square(x - batch_mean).sum(axis=0)
        total = count + n
        delta = batch_mean - mean
        self._state = (
            total,
            mean + delta * (n / total),
            m2 + batch_m2 + np.square(delta) * (count * n / total),
        )

    def normalize(self, obs_BO: np.ndarray) -> np.ndarray:
        """Raw observations -> the float32 network input under the current statistics."""
        _, mean, _ = self._state
        scale = 1.0 / np.sqrt(self.var + EPSILON)
        out = (np.asarray(obs_BO, np.float64) - mean) * scale
        return np.clip(out, -CLIP, CLIP).astype(np.float32)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The statistics as tensors, for a checkpoint (``torch.load(weights_only=True)``)."""
        count, mean, m2 = self._state
        return {
            "count": torch.tensor(count, dtype=torch.int64),
            "mean": torch.from_numpy(mean.copy()),
            "m2": torch.from_numpy(m2.copy()),
        }

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        mean = state["mean"].numpy().astype(np.float64)
        m2 = state["m2"].numpy().astype(np.float64)
        if mean.shape != self.obs_shape or m2.shape != self.obs_shape:
            raise ValueError(
                f"observation statistics of shape {tuple(mean.shape)}, expected {self.obs_shape}"
            )
        self._state = (int(state["count"]), mean, m2)


class LeafNormalizer:
    """Per-leaf statistics of a dict/tuple observation, on the learner's packed rows.

    Takes the raw rows the actors' frames pack into (``[B, R]`` uint8) and gives the rows
    of :func:`normalized_space`: every float vector leaf normalized by its own
    :class:`ObservationNormalizer` (as float32), every other leaf's bytes unchanged.
    """

    def __init__(self, obs_spec: pb.SpaceSpec, mask_leaf: str = "") -> None:
        leaves = codec.space_leaves(obs_spec)
        self.raw = codec.LeafPacking(leaves)
        self.out = codec.LeafPacking(codec.space_leaves(normalized_space(obs_spec, mask_leaf)))
        self.leaf_stats = {
            index: ObservationNormalizer(leaf.shape, leaf.dtype)
            for index, leaf in enumerate(leaves)
            if normalizes_leaf(leaf, mask_leaf)
        }
        """Leaf index -> its statistics, for the normalized leaves only."""
        if not self.leaf_stats:
            raise UnsupportedSetup(
                "--normalize-observations: the observation "
                f"{codec.spec_summary(obs_spec)} has no float vector leaf to normalize "
                "(images, discrete leaves and the action mask are left as they are)"
            )
        self.obs_shape = (self.raw.row_bytes,)
        """The raw rows' shape, as the actors' frames pack into them."""
        self.obs_dtype = np.dtype(np.uint8)
        self.frozen = False
        """Statistics as loaded, never moved (a trained policy served as ``evaluate`` runs it)."""

    @property
    def count(self) -> int:
        return next(iter(self.leaf_stats.values())).count

    @property
    def clipped_values(self) -> int:
        return sum(stats.clipped_values for stats in self.leaf_stats.values())

    def stats_of(self, name: str) -> ObservationNormalizer:
        """The statistics of the leaf called ``name``."""
        for index, stats in self.leaf_stats.items():
            if self.raw.leaves[index].name == name:
                return stats
        raise KeyError(f"leaf {name!r} is not normalized")

    def update(self, rows_BR: np.ndarray) -> None:
        """Fold a batch of raw packed rows into every normalized leaf's statistics (unless
        frozen)."""
        if self.frozen:
            return
        values = self.raw.unpack(np.asarray(rows_BR).reshape(-1, self.raw.row_bytes))
        for index, stats in self.leaf_stats.items():
            stats.update(values[index])

    def normalize(self, rows_BR: np.ndarray) -> np.ndarray:
        """Raw packed rows -> the rows the network reads (float leaves normalized)."""
        values = self.raw.unpack(np.asarray(rows_BR).reshape(-1, self.raw.row_bytes))
        for index, stats in self.leaf_stats.items():
            values[index] = stats.normalize(values[index])
        return self.out.pack_values(values)

    def state_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        """Each normalized leaf's statistics under its name, for a checkpoint."""
        return {
            self.raw.leaves[index].name: stats.state_dict()
            for index, stats in self.leaf_stats.items()
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        names = [self.raw.leaves[index].name for index in self.leaf_stats]
        if sorted(state) != sorted(names):
            raise ValueError(f"statistics of leaves {sorted(state)}, expected {sorted(names)}")
        for index, stats in self.leaf_stats.items():
            stats.load_state_dict(state[self.raw.leaves[index].name])


Normalizer = ObservationNormalizer | LeafNormalizer
"""Either normaliser: both take and give batches of the learner's observation arrays."""


class ReturnNormalizer:
    """Running scale of the discounted return, to divide training rewards by.

    A new env's reward scale is unknown: rewards of thousands swamp the value loss and
    the clipped gradient, rewards of 1e-3 vanish under the entropy bonus. Like PPO's
    VecNormalize, rewards are divided by a running std of the discounted return (no
    mean subtracted, so signs stay), and the result is clipped to +-``clip``. The
    returns measured are VecNormalize's too: each episode's discounted reward sum so far,
    kept per env by the trajectory builder. Not the value targets: those hold the value
    head's own outputs, so a falling scale inflated them (the head lags the new units) and
    the scale fell further. The statistics are checkpointed with the weights: a resumed
    run goes on with the scale it trained at.
    """

    def __init__(self, clip: float = 10.0, epsilon: float = 1e-8) -> None:
        self.clip = clip
        self.epsilon = epsilon
        self.count = 0.0
        self.mean = 0.0
        self.var = 1.0
        self.clipped_values = 0
        """Return values clipped by the update bound so far (not checkpointed)."""

    @property
    def scale(self) -> float:
        """Current multiplier of raw rewards (1 until the first update)."""
        return 1.0 / (self.var + self.epsilon) ** 0.5 if self.count else 1.0

    def normalize(self, reward: torch.Tensor) -> torch.Tensor:
        if not self.count:
            return reward  # no statistics yet: a clip now would hide the scale from them
        return (reward * self.scale).clamp(-self.clip, self.clip)

    def update(self, raw_returns: torch.Tensor, weight: torch.Tensor) -> None:
        """Fold a batch of raw-unit return estimates (``weight`` 1 where valid) in, each
        clipped to :func:`update_bounds` of the statistics before the batch."""
        n = float(weight.sum())
        if n < 1 or not bool(torch.isfinite(raw_returns).all()):
            return  # a non-finite batch is skipped by the step; it must not poison the scale
        low, high = update_bounds(self.count, self.mean, self.var)
        clipped = raw_returns.clamp(low, high)
        self.clipped_values += int(((clipped != raw_returns) & (weight > 0)).sum())
        raw_returns = clipped
        mean = float((raw_returns * weight).sum()) / n
        var = float(((raw_returns - mean).pow(2) * weight).sum()) / n
        total = self.count + n
        delta = mean - self.mean
        m2 = self.var * self.count + var * n + delta * delta * self.count * n / total
        self.mean += delta * n / total
        self.var = m2 / total
        self.count = total

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The statistics as tensors, for a checkpoint (``torch.load(weights_only=True)``)."""
        return {
            name: torch.tensor(value, dtype=torch.float64)
            for name, value in (("count", self.count), ("mean", self.mean), ("var", self.var))
        }

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.count, self.mean, self.var = (float(state[k]) for k in ("count", "mean", "var"))

    @classmethod
    def from_state_dict(cls, state: dict[str, torch.Tensor] | None) -> ReturnNormalizer | None:
        """The normaliser a checkpoint's ``state`` describes; None for a run without one."""
        if state is None:
            return None
        normalizer = cls()
        normalizer.load_state_dict(state)
        return normalizer
