"""Left-right mirror images of a training batch, for games whose rules do not change under
that flip (Connect Four and most board games): each unroll is trained on as played and as
its mirror image, which doubles what one game teaches.

The image is a real trajectory of the mirrored behaviour policy: the flipped board, the
reversed action index and the reversed behaviour logits (and mask) give every action the
probability it was played with, so V-trace needs no correction beyond its usual one.
Nothing but image leaves, the action mask and a Discrete action has a known mirror
image, so any other leaf, an LSTM (its state came from the unflipped history) or another
action space is refused when the run is set up.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from learner.agents.models import (
    ActionHead,
    CategoricalHead,
    ModelSpec,
    UnsupportedSetup,
    image_layout,
)

Batch = dict[str, torch.Tensor]


def width_axis(shape: tuple[int, ...]) -> int:
    """The axis of an image of ``shape`` that runs left to right."""
    _, _, _, channels_last = image_layout(shape)
    return len(shape) - 2 if channels_last else len(shape) - 1


class Mirror:
    """Appends the mirror image of every unrolled row of a time-major batch along B."""

    def __init__(self, spec: ModelSpec, head: ActionHead) -> None:
        if spec.lstm_size:
            raise UnsupportedSetup("--mirror needs a feed-forward model, not --lstm")
        if not isinstance(head, CategoricalHead):
            raise UnsupportedSetup("--mirror needs a Discrete action space")
        if spec.torso == "leaves":
            self.leaves = [self._leaf_flip(name, dtype, shape, encoder)
                           for name, dtype, shape, encoder, _ in spec.leaf_inputs]  # fmt: skip
        elif spec.torso in ("cnn", "resnet"):
            self.leaves = []
            self.image_axis = width_axis(spec.obs_shape)
        else:
            raise UnsupportedSetup("--mirror needs an image observation or dict of images")
        self.num_actions = head.num_actions
        self.masked = head.masked

    @staticmethod
    def _leaf_flip(
        name: str, dtype: str, shape: tuple[int, ...], encoder: str
    ) -> tuple[int, tuple[int, ...], int]:
        """(byte length, shape, axis to flip) of one packed leaf."""
        if encoder == "cnn":
            axis = width_axis(shape)
        elif encoder == "mask":
            axis = 0
        else:
            raise UnsupportedSetup(
                f"--mirror: observation leaf {name!r} is neither an image nor the action mask, "
                "so its mirror image is unknown"
            )
        # The packed leaf's length, as LeafEncoders slices the row.
        return math.prod(shape) * np.dtype(dtype).itemsize, shape, axis

    def obs(self, obs: torch.Tensor) -> torch.Tensor:
        """Observations ``[T, B, ...]`` flipped left to right (packed leaves byte-wise)."""
        if not self.leaves:
            return obs.flip(2 + self.image_axis)
        parts, start = [], 0
        lead = obs.shape[:-1]
        for nbytes, shape, axis in self.leaves:
            leaf = obs[..., start : start + nbytes]
            # Bytes as [..., *shape, itemsize]: flipping an element axis keeps each
            # element's bytes together, whatever its dtype.
            grid = leaf.reshape(*lead, *shape, nbytes // math.prod(shape))
            parts.append(grid.flip(len(lead) + axis).reshape(*lead, nbytes))
            start += nbytes
        return torch.cat(parts, dim=-1)

    def params(self, params: torch.Tensor) -> torch.Tensor:
        """Behaviour parameters with the logits (and the mask after them) reversed."""
        if not self.masked:
            return params.flip(-1)
        logits, mask = params.split(self.num_actions, dim=-1)
        return torch.cat([logits.flip(-1), mask.flip(-1)], dim=-1)

    def __call__(self, batch: Batch) -> Batch:
        mirrored = dict(batch)
        mirrored["obs"] = self.obs(batch["obs"])
        mirrored["action"] = self.num_actions - 1 - batch["action"]
        mirrored["behaviour_params"] = self.params(batch["behaviour_params"])
        # Per-unroll entries ([B]) join along their only axis, time-major rows along B.
        return {
            key: torch.cat([value, mirrored[key]], dim=0 if value.dim() == 1 else 1)
            for key, value in batch.items()
        }
