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
from seedrl.proto import seedrl_pb2 as pb

CoreState = tuple[torch.Tensor, ...]
"""Recurrent state, each tensor ``[B, H]``; empty for feed-forward models."""


class CategoricalHead:
    """Discrete actions: the policy parameters are logits ``[..., A]``."""

    continuous = False

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


ActionHead = CategoricalHead | GaussianHead

LOG_STD_MIN = -5.0
LOG_STD_MAX = 2.0
"""Bounds of a Gaussian policy's log-std, kept by projecting the parameter after each
optimizer step: std stays in [0.0067, 7.4], and the gradient is never cut off."""


def action_head(action_spec: pb.SpaceSpec) -> ActionHead:
    """The distribution that matches the env's action space."""
    if action_spec.kind == "discrete":
        return CategoricalHead(int(action_spec.n))
    if action_spec.kind == "box":
        low: tuple[float, ...] = ()
        high: tuple[float, ...] = ()
        if action_spec.low.data and action_spec.high.data:
            low_A = codec.decode_tensor(action_spec.low, "action low").astype(float).ravel()
            high_A = codec.decode_tensor(action_spec.high, "action high").astype(float).ravel()
            if np.isfinite(low_A).all() and np.isfinite(high_A).all():
                low, high = tuple(low_A.tolist()), tuple(high_A.tolist())
        return GaussianHead(tuple(int(d) for d in action_spec.shape), low, high)
    raise ValueError(f"unsupported action space kind {action_spec.kind!r}")


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


def choose_torso(obs_spec: pb.SpaceSpec, requested: str) -> str:
    """``auto`` picks the CNN for image-like observations (rank 3, or rank 2 uint8)."""
    if requested != "auto":
        return requested
    rank = len(obs_spec.shape)
    is_image = rank == 3 or (rank == 2 and obs_spec.dtype == "uint8")
    return "cnn" if is_image else "mlp"


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
    """A compact conv encoder for small grids (MinAtar's 10x10) where Nature's strides don't fit."""

    def __init__(self, in_channels: int, height: int, width: int, out_size: int = 128) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(in_channels, 16, 3, stride=1), nn.ReLU(), nn.Flatten())
        flat = 16 * (height - 2) * (width - 2)
        self.fc = nn.Sequential(nn.Linear(flat, out_size), nn.ReLU())
        self.out_size = out_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x))


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
                encoder = NatureCNN(c, h, w) if min(h, w) >= 36 else SmallCNN(c, h, w)
            self.torso = encoder
            torso_out = encoder.out_size
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
        if len(shape) == 2:
            return 1, shape[0], shape[1]
        if len(shape) != 3:
            raise ValueError(
                f"{self.spec.torso} needs a rank-2 or rank-3 observation, got shape {shape}"
            )
        if shape[-1] < shape[0] and shape[-1] <= 16:
            self.hwc_observations = True
            return shape[2], shape[0], shape[1]
        return shape[0], shape[1], shape[2]

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
        return self._params(features, t, b), values, core_state

    def act(
        self, obs_TBO: torch.Tensor, first_TB: torch.Tensor, core_state: CoreState = ()
    ) -> tuple[torch.Tensor, CoreState]:
        """Policy parameters and core state only: what inference needs. Skipping the value
        halves a CartPole forward pass (its value MLP is as big as the policy's)."""
        t, b = obs_TBO.shape[:2]
        _, features, core_state = self._features(obs_TBO, first_TB, core_state)
        return self._params(features, t, b), core_state

    def _features(
        self, obs_TBO: torch.Tensor, first_TB: torch.Tensor, core_state: CoreState
    ) -> tuple[torch.Tensor, torch.Tensor, CoreState]:
        """(network input, policy features, core state after step T)."""
        t, b = obs_TBO.shape[:2]
        x = self._prepare(obs_TBO.reshape(t * b, *obs_TBO.shape[2:]))
        features = self.torso(x)
        if self.core is not None:
            h, c = core_state
            keep_TB1 = (~first_TB.bool()).float().unsqueeze(-1)
            features_TBF = features.reshape(t, b, -1)
            outputs = []
            for step in range(t):
                h, c = self.core(features_TBF[step], (h * keep_TB1[step], c * keep_TB1[step]))
                outputs.append(h)
            core_out = torch.stack(outputs).reshape(t * b, -1)
            features = torch.cat([features, core_out], dim=-1)
            core_state = (h, c)
        return x, features, core_state

    def _params(self, features: torch.Tensor, t: int, b: int) -> torch.Tensor:
        params = self.policy(features).reshape(t, b, -1)
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
) -> ActorCritic:
    """The ActorCritic for an env's spaces."""
    spec = ModelSpec(
        obs_shape=tuple(int(d) for d in obs_spec.shape),
        obs_dtype=obs_spec.dtype,
        torso=choose_torso(obs_spec, torso),
        hidden_sizes=tuple(hidden_sizes),
        param_size=head.param_size,
        lstm_size=lstm_size,
        separate_value=separate_value,
        continuous=head.continuous,
        action_low=head.low if isinstance(head, GaussianHead) else (),
        action_high=head.high if isinstance(head, GaussianHead) else (),
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
