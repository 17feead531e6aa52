"""What a network is built from (:class:`ModelSpec`, kept in checkpoints) and how
``--model auto`` reads an env's observation space: the torso, and one encoder per leaf of
a dict/tuple observation."""

from __future__ import annotations

from dataclasses import dataclass

from learner.common.spaces import UnsupportedSetup, is_image, is_image_leaf
from seedrl import codec
from seedrl.proto import seedrl_pb2 as pb


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
    # torso "leaves": widths of a tanh MLP over the leaves' joined features, so the heads
    # can read what leaves mean together; (): the joined features reach the heads as they are.
    leaf_trunk: tuple[int, ...] = ()


MAX_EMBEDDED_CHOICES = 256
"""Discrete observation leaves with up to this many choices per element are embedded;
larger ones are read as numbers by an MLP."""
EMBEDDING_SIZE = 16


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
