"""How the learner reads an env's spaces, where the networks and the normalisers must
agree: which observation leaves are images, and the refusal of spaces no model fits."""

from __future__ import annotations

from seedrl import codec
from seedrl.proto import seedrl_pb2 as pb


class UnsupportedSetup(ValueError):
    """An env's spaces (or a flag) that no model or head here fits; the learner refuses
    them at start-up with this one line."""


def is_image(spec: pb.SpaceSpec) -> bool:
    """Image-like: a rank-3 Box, or a rank-2 uint8 one."""
    rank = len(spec.shape)
    return spec.kind == "box" and (rank == 3 or (rank == 2 and spec.dtype == "uint8"))


def image_layout(shape: tuple[int, ...]) -> tuple[int, int, int, bool]:
    """(C, H, W, channels-last) of an image; channels-last when the last dim is the smallest."""
    if len(shape) == 2:
        return 1, shape[0], shape[1], False
    if len(shape) != 3:
        raise ValueError(f"an image needs rank 2 or 3, got shape {shape}")
    if shape[-1] < shape[0] and shape[-1] <= 16:
        return shape[2], shape[0], shape[1], True
    return shape[0], shape[1], shape[2], False


MIN_IMAGE_SIDE = 3
"""A dict/tuple leaf narrower than this is read by the MLP even when image-like: the
small CNN's 3x3 kernel does not fit it."""


def is_image_leaf(spec: pb.SpaceSpec) -> bool:
    """A dict/tuple observation leaf that ``--model auto`` reads with a CNN."""
    if not is_image(spec):
        return False
    _, height, width, _ = image_layout(codec.spec_shape(spec))
    return min(height, width) >= MIN_IMAGE_SIDE
