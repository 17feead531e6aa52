"""The torsos that turn an observation into features: a tanh MLP, the Nature and small
CNNs, IMPALA's residual encoder, and one encoder per leaf of a dict/tuple observation."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from learner.agents.cpu_kernels import Linear, Tanh, TanhMLP
from learner.agents.models.spec import EMBEDDING_SIZE, ModelSpec
from learner.common.spaces import UnsupportedSetup, image_layout


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
        # Without it each leaf's features only add up in the heads' logits, which cannot
        # express an answer that depends on two leaves at once.
        self.trunk: nn.Module | None = None
        if spec.leaf_trunk:
            self.trunk, out_size = mlp(out_size, spec.leaf_trunk)
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
        joined = torch.cat(features, dim=-1)
        return joined if self.trunk is None else self.trunk(joined)


def mask_floats(mask_leaf: torch.Tensor) -> torch.Tensor:
    """An action mask leaf ``[N, *shape]`` as floats ``[N, A]``: 1 allowed, 0 masked."""
    return (mask_leaf != 0).flatten(1).float()


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
    grow block after block (measurements: docs/logs/learning-log.md).
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
