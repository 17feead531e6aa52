"""The network: torso -> optional LSTM core -> policy parameters and value.

Shape suffixes used in names: T time, B batch (envs or unrolls), O observation dims,
P policy-parameter dims, H recurrent hidden size.

One network serves both inference (``T = 1``, one row per pending env frame) and
training (``T = unroll_length + 1``); the optional LSTM core's state is passed in and
out explicitly so the learner can keep it per (actor, env) slot.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from learner.agents.cpu_kernels import conv_input_layout
from learner.agents.models.heads import LOG_STD_MAX, LOG_STD_MIN, ActionHead, GaussianHead
from learner.agents.models.spec import ModelSpec, choose_torso, leaf_inputs
from learner.agents.models.torsos import (
    ImpalaResNet,
    LeafEncoders,
    NatureCNN,
    SmallCNN,
    image_encoder,
    mlp,
)
from learner.common.spaces import UnsupportedSetup, image_layout
from seedrl import codec
from seedrl.proto import seedrl_pb2 as pb

CoreState = tuple[torch.Tensor, ...]
"""Recurrent state, each tensor ``[B, H]``; empty for feed-forward models."""


class TorsoCore(nn.Module):
    """What every network of the agents starts with: observations prepared as network
    input, the torso (MLP, CNN, ResNet or per-leaf encoders) and the optional LSTM core.

    A subclass builds its parts in ``__init__`` in the order its parameters are to have
    (``_build_torso``, its own, ``_build_core``, its heads): the order is the optimizer
    state's and the flat gradient's layout, which checkpoints and ranks share.
    """

    torso: nn.Module
    core: nn.LSTMCell | None

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.hwc_observations = False

    def _build_torso(self, spec: ModelSpec) -> int:
        """Set the torso for ``spec``; returns its feature size."""
        if spec.torso == "mlp":
            self.torso, torso_out = mlp(math.prod(spec.obs_shape), spec.hidden_sizes)
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
        return torso_out

    def _build_core(self, spec: ModelSpec, torso_out: int) -> int:
        """Set the LSTM core (None without one); returns the heads' feature size."""
        self.core = None
        if spec.lstm_size:
            self.core = nn.LSTMCell(torso_out, spec.lstm_size)
            torso_out += spec.lstm_size  # heads see [torso features, core output]
        return torso_out

    def _image_layout(self, shape: tuple[int, ...]) -> tuple[int, int, int]:
        """(C, H, W) of an image observation; channels-last when the last dim is the smallest."""
        if len(shape) not in (2, 3):
            raise ValueError(
                f"{self.spec.torso} needs a rank-2 or rank-3 observation, got shape {shape}"
            )
        c, h, w, self.hwc_observations = image_layout(shape)
        return c, h, w

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

    def _features(
        self, obs_TBO: torch.Tensor, first_TB: torch.Tensor, core_state: CoreState
    ) -> tuple[torch.Tensor, torch.Tensor, CoreState]:
        """(network input, the heads' features, core state after step T)."""
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


class ActorCritic(TorsoCore):
    """Torso (MLP, CNN or ResNet) -> optional LSTM core -> policy parameters and value.

    A feed-forward MLP model gives the value its own MLP (``separate_value``): on
    low-dimensional tasks the large value-loss gradients otherwise swamp the policy's
    shared features (as in PPO/A2C defaults).
    """

    def __init__(self, spec: ModelSpec) -> None:
        if spec.dueling:
            raise ValueError("a dueling spec describes a Q-network, not an actor-critic")
        super().__init__(spec)
        self.value_torso: nn.Module | None = None
        torso_out = self._build_torso(spec)
        if spec.torso == "mlp" and spec.separate_value and not spec.lstm_size:
            self.value_torso, _ = mlp(math.prod(spec.obs_shape), spec.hidden_sizes)
        torso_out = self._build_core(spec, torso_out)
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

    def bound_log_std_(self) -> None:
        """Project a Gaussian policy's log-std into [LOG_STD_MIN, LOG_STD_MAX], in place.

        Called after every optimizer step (and on load): with ``entropy_cost = 0`` nothing
        else resists a drift, and a bound applied inside the forward pass would stop the
        gradient that could bring it back.
        """
        if self.log_std is not None:
            with torch.no_grad():
                self.log_std.clamp_(LOG_STD_MIN, LOG_STD_MAX)

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
    mask_leaf: str = "",
    cnn_channels: tuple[int, ...] = (16,),
    leaf_trunk: tuple[int, ...] = (),
) -> ActorCritic:
    """The ActorCritic for an env's spaces; ``mask_leaf`` names a dict observation's action
    mask (the head must then be a masked one)."""
    return ActorCritic(
        model_spec(
            obs_spec, head, torso, hidden_sizes, lstm_size, separate_value,
            mask_leaf=mask_leaf, cnn_channels=cnn_channels, leaf_trunk=leaf_trunk,
        )
    )  # fmt: skip


def model_spec(
    obs_spec: pb.SpaceSpec,
    head: ActionHead,
    torso: str = "auto",
    hidden_sizes: tuple[int, ...] = (64, 64),
    lstm_size: int = 0,
    separate_value: bool = True,
    dueling: bool = False,
    mask_leaf: str = "",
    cnn_channels: tuple[int, ...] = (16,),
    leaf_trunk: tuple[int, ...] = (),
) -> ModelSpec:
    """The architecture of a network for an env's spaces and an action head; ``leaf_trunk``
    counts only for a dict/tuple observation (torso "leaves")."""
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
    return ModelSpec(
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
        leaf_trunk=tuple(leaf_trunk) if inputs else (),
    )
