"""Running statistics on the learner: observations (``--normalize-observations``) and
the return scale that training rewards are divided by (``--normalize-returns``).

The learner sees every frame it serves, so it keeps the per-element mean and variance of
the observations there (the actors stay as they are) and feeds the network
``clip((obs - mean) / sqrt(var + eps), -CLIP, CLIP)``. Inference updates the statistics
with each batch, then normalizes the batch; the trajectory builder stores the normalized
frames, so training sees exactly the inputs the behaviour policy acted on, even though
the statistics keep moving (recomputing with newer statistics at training time would make
the behaviour log-probabilities, and so V-trace's importance weights, wrong).

Shape suffixes: B frames in a batch, O observation dims.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from seedrl.proto import seedrl_pb2 as pb

CLIP = 10.0
"""Normalized observations are clipped to [-CLIP, CLIP] (as SB3's VecNormalize and RLlib's
MeanStdFilter do), so one extreme frame cannot blow up a pre-activation."""
EPSILON = 1e-8
"""Added to the variance: a constant element normalizes to 0, not to NaN."""


def normalized_space(obs_spec: pb.SpaceSpec) -> pb.SpaceSpec:
    """The observation space the network sees under normalisation: float32, same shape."""
    spec = pb.SpaceSpec()
    spec.CopyFrom(obs_spec)
    spec.dtype = "float32"
    return spec


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
        """Fold a batch of raw observations into the statistics."""
        x = np.asarray(obs_BO, np.float64).reshape(-1, *self.obs_shape)
        n = len(x)
        if n == 0:
            return
        count, mean, m2 = self._state
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


class ReturnNormalizer:
    """Running scale of the discounted return, to divide training rewards by.

    A new env's reward scale is unknown: rewards of thousands swamp the value loss and
    the clipped gradient, rewards of 1e-3 vanish under the entropy bonus. Like PPO's
    VecNormalize, rewards are divided by a running std of the discounted return (no
    mean subtracted, so signs stay), and the result is clipped to +-``clip``. The
    return estimates are the V-trace targets of each batch, brought back to raw reward
    units, so no per-env state is needed. The statistics are checkpointed with the
    weights: a resumed run goes on with the scale it trained at.
    """

    def __init__(self, clip: float = 10.0, epsilon: float = 1e-8) -> None:
        self.clip = clip
        self.epsilon = epsilon
        self.count = 0.0
        self.mean = 0.0
        self.var = 1.0

    @property
    def scale(self) -> float:
        """Current multiplier of raw rewards (1 until the first update)."""
        return 1.0 / (self.var + self.epsilon) ** 0.5 if self.count else 1.0

    def normalize(self, reward: torch.Tensor) -> torch.Tensor:
        if not self.count:
            return reward  # no statistics yet: a clip now would hide the scale from them
        return (reward * self.scale).clamp(-self.clip, self.clip)

    def update(self, raw_returns: torch.Tensor, weight: torch.Tensor) -> None:
        """Fold a batch of raw-unit return estimates (``weight`` 1 where valid) in."""
        n = float(weight.sum())
        if n < 1:
            return
        mean = float((raw_returns * weight).sum()) / n
        var = float(((raw_returns - mean).pow(2) * weight).sum()) / n
        if not math.isfinite(mean + var):
            return  # a non-finite batch is skipped by the step; it must not poison the scale
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
