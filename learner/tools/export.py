"""``python -m learner export``: a checkpoint's policy as one ONNX or TorchScript file.

The file maps an observation (one input per leaf: ``obs`` for a flat space, the leaf
names for a dict/tuple one, the action mask among them) and, with an LSTM core, the core
state ``core_h``/``core_c`` to the greedy ``action``, the distribution's ``params`` and the
core state after the step (``core_h_out``/``core_c_out``); the checkpoint's observation
statistics are folded into the graph, so the caller feeds raw observations. Every tensor
has a leading batch axis of any size. ``FILE.json`` beside it lists the inputs and
outputs (names, dtypes, shapes), what ``params`` holds and the action space, so a runner
in any language needs neither seedrl nor torch.

Shape suffixes: B batch rows, P policy parameters, H core state size.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from learner.agents.models import (
    ActionHead,
    BernoulliHead,
    GaussianHead,
    LeafEncoders,
    MaskedCategoricalHead,
    MultiCategoricalHead,
    ProductHead,
    mask_floats,
)
from learner.agents.trained_policy import Policy
from learner.population.pbt import add_member_argument
from learner.state import checkpoint
from learner.state.normalize import CLIP, EPSILON, LeafNormalizer, ObservationNormalizer
from seedrl import codec
from seedrl.proto import seedrl_pb2 as pb

FORMATS = ("onnx", "torchscript")
ONNX_OPSET = 17
"""An opset every onnxruntime of the last years runs (LSTM cells export as plain ops)."""
STATE_NAMES = ("core_h", "core_c")


class ExportError(ValueError):
    """A checkpoint or request that cannot be exported; the command prints it as one line."""


def input_leaves(obs_spec: pb.SpaceSpec) -> list[tuple[str, np.dtype, tuple[int, ...]]]:
    """(name, dtype, shape) of each observation input, in the model's leaf order."""
    if codec.is_structured(obs_spec):
        return [(leaf.name, leaf.dtype, leaf.shape) for leaf in codec.space_leaves(obs_spec)]
    return [("obs", np.dtype(obs_spec.dtype), codec.spec_shape(obs_spec))]


def _stats(stats: ObservationNormalizer) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, 1 / std) of frozen statistics, float32, as the graph applies them."""
    scale = 1.0 / np.sqrt(stats.var + EPSILON)
    return torch.from_numpy(stats.mean.astype(np.float32)), torch.from_numpy(
        scale.astype(np.float32)
    )


class ExportedPolicy(nn.Module):
    """Raw observation leaves (+ core state) -> greedy action, parameters (+ core state).

    What :class:`learner.agents.trained_policy.Policy` does for one frame, as one traceable
    graph: the observation statistics applied per leaf, the model's torso, core and policy
    layer, then the head's greedy choice (masked actions never chosen).
    """

    def __init__(self, policy: Policy) -> None:
        super().__init__()
        self.model: Any = policy.model
        """Any agent's inference network: ``torso``, ``core_step``, ``policy_params``."""
        self.head: ActionHead = policy.head
        obs_spec = policy.env_spec.observation_space
        self.leaves = input_leaves(obs_spec)
        self.recurrent = self.model.core is not None
        self.normalized: list[int] = []
        normalizer = policy.normalizer
        if isinstance(normalizer, ObservationNormalizer):
            self._add_stats(0, normalizer)
        elif isinstance(normalizer, LeafNormalizer):
            for index, stats in normalizer.leaf_stats.items():
                self._add_stats(index, stats)

    def _add_stats(self, index: int, stats: ObservationNormalizer) -> None:
        mean, scale = _stats(stats)
        self.register_buffer(f"mean{index}", mean)
        self.register_buffer(f"scale{index}", scale)
        self.normalized.append(index)

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values = list(inputs[: len(self.leaves)])
        state = tuple(inputs[len(self.leaves) :])
        for index in self.normalized:  # as ObservationNormalizer.normalize, in float32
            mean, scale = getattr(self, f"mean{index}"), getattr(self, f"scale{index}")
            values[index] = torch.clamp((values[index].float() - mean) * scale, -CLIP, CLIP)
        model = self.model
        mask = None
        if isinstance(model.torso, LeafEncoders):
            features = model.torso.encode(values)
            if model.masked:
                mask = mask_floats(values[model.torso.mask_index])
        else:
            features = model.torso(model._prepare(values[0]))
        batch = values[0].shape[0]
        features, state = model.core_step(features, None, state)
        params_BP = model.policy_params(features, 1, batch, mask)[0]
        return (self.head.greedy(params_BP), params_BP, *state)

    def example_inputs(self, batch: int = 2) -> tuple[torch.Tensor, ...]:
        """Inputs of the right dtypes and shapes (zeros), to trace the graph with."""
        leaves = [
            torch.from_numpy(np.zeros((batch, *shape), dtype)) for _, dtype, shape in self.leaves
        ]
        state = [torch.zeros(batch, self.model.spec.lstm_size) for _ in STATE_NAMES]
        return (*leaves, *(state if self.recurrent else []))

    def input_names(self) -> list[str]:
        return [name for name, _, _ in self.leaves] + (list(STATE_NAMES) if self.recurrent else [])

    def output_names(self) -> list[str]:
        state = [f"{name}_out" for name in STATE_NAMES] if self.recurrent else []
        return ["action", "params", *state]


def params_layout(head: ActionHead) -> str:
    """What the ``params`` output holds, in words a runner can act on (a head of an
    agent's own says it: ``params_layout()``)."""
    own = getattr(head, "params_layout", None)
    if callable(own):
        return str(own())
    if isinstance(head, GaussianHead):
        return (
            f"mean ({head.action_size}) then log_std ({head.action_size}) of a diagonal "
            "Gaussian; the action is the mean (clip it to the Box bounds)"
        )
    if isinstance(head, MaskedCategoricalHead):
        return f"logits ({head.num_actions}) then the action mask as 0/1 ({head.num_actions})"
    if isinstance(head, MultiCategoricalHead):
        mask = f" then the action mask as 0/1 ({head.num_logits})" if head.masked else ""
        return f"logits of each element side by side (choices {list(head.nvec)}){mask}"
    if isinstance(head, BernoulliHead):
        return f"one Bernoulli logit per switch ({head.param_size})"
    if isinstance(head, ProductHead):
        return (
            f"each action leaf's parameters side by side (sizes {head.param_sizes}); the "
            f"action is their columns side by side (widths {head.columns})"
        )
    return f"logits ({head.param_size}) of a categorical distribution"


def space_json(spec: pb.SpaceSpec) -> dict[str, Any]:
    """A space as plain JSON: kind, shape, dtype, and n / nvec / bounds / children."""
    out: dict[str, Any] = {"kind": spec.kind}
    if codec.is_structured(spec):
        out["children"] = [
            {**({"name": child.name} if spec.kind == "dict" else {}), **space_json(child)}
            for child in spec.children
        ]
        return out
    out.update(shape=[int(d) for d in spec.shape], dtype=spec.dtype)
    if spec.kind == "discrete":
        out["n"] = int(spec.n)
    if spec.kind == "multi_discrete":
        out["nvec"] = [int(n) for n in spec.nvec]
    if spec.low.data and spec.high.data:
        out["low"] = codec.decode_tensor(spec.low, "low").astype(float).ravel().tolist()
        out["high"] = codec.decode_tensor(spec.high, "high").astype(float).ravel().tolist()
    return out


def describe(wrapper: ExportedPolicy, policy: Policy, fmt: str) -> dict[str, Any]:
    """The sidecar ``FILE.json``: what goes in and comes out, and what it means."""
    hidden = wrapper.model.spec.lstm_size
    inputs = [
        {"name": name, "dtype": dtype.name, "shape": ["batch", *shape]}
        for name, dtype, shape in wrapper.leaves
    ]
    state = [{"name": n, "dtype": "float32", "shape": ["batch", hidden]} for n in STATE_NAMES]
    head = wrapper.head
    action = {
        "name": "action",
        "dtype": str(head.action_dtype).removeprefix("torch."),
        "shape": ["batch", *head.action_shape],
    }
    params = {"name": "params", "dtype": "float32", "shape": ["batch", head.param_size]}
    outputs = [action, params]
    if wrapper.recurrent:
        inputs += state
        outputs += [{**s, "name": f"{s['name']}_out"} for s in state]
    return {
        "format": fmt,
        "env_id": policy.env_id,
        "env_kwargs": policy.env_kwargs,
        "inputs": inputs,
        "outputs": outputs,
        "action": "greedy (the most likely action, masked actions never chosen)",
        "params": params_layout(head),
        "recurrent": (
            "feed core_h/core_c zeros at an episode's start, then each step's *_out back"
            if wrapper.recurrent
            else None
        ),
        "normalization": "folded in: feed raw observations" if wrapper.normalized else "none",
        "observation_space": space_json(policy.env_spec.observation_space),
        "action_space": space_json(policy.env_spec.action_space),
        "checkpoint": str(policy.checkpoint_info.path) if policy.checkpoint_info else None,
        "member": policy.member,
    }


def export(policy: Policy, fmt: str, out: Path) -> Path:
    """Write ``policy`` to ``out`` as ``fmt`` and its description beside it; the JSON path."""
    if fmt not in FORMATS:
        raise ExportError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    wrapper = ExportedPolicy(policy).eval()
    example = wrapper.example_inputs()
    out.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        if fmt == "onnx":
            _export_onnx(wrapper, example, out)
        else:
            traced = torch.jit.trace(wrapper, example, check_trace=False)
            torch.jit.save(traced, str(out))
    sidecar = out.with_name(out.name + ".json")
    sidecar.write_text(json.dumps(describe(wrapper, policy, fmt), indent=2) + "\n")
    return sidecar


def _export_onnx(wrapper: ExportedPolicy, example: tuple[torch.Tensor, ...], out: Path) -> None:
    """The TorchScript-based exporter: it needs only torch and onnx, where the dynamo one
    also needs onnxscript, and it traces this small fixed graph exactly."""
    names = wrapper.input_names() + wrapper.output_names()
    torch.onnx.export(
        wrapper,
        example,
        str(out),
        input_names=wrapper.input_names(),
        output_names=wrapper.output_names(),
        dynamic_axes={name: {0: "batch"} for name in names},
        opset_version=ONNX_OPSET,
        dynamo=False,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m learner export",
        description="Write a checkpoint's policy as one ONNX or TorchScript file (plus FILE.json).",
    )
    parser.add_argument("--checkpoint", required=True, help="checkpoint.pt to export")
    parser.add_argument("--format", choices=FORMATS, default="onnx", help="file format")
    parser.add_argument("--out", required=True, help="file to write (FILE.json beside it)")
    add_member_argument(parser)
    args = parser.parse_args(argv)
    try:
        policy = Policy.load(args.checkpoint, member=args.member)
    except checkpoint.CheckpointError as exc:
        print(f"python -m learner export: error: {exc}", file=sys.stderr)
        return 2
    try:
        sidecar = export(policy, args.format, Path(args.out))
    except (ExportError, ImportError) as exc:
        print(f"python -m learner export: error: {checkpoint.one_line(exc)}", file=sys.stderr)
        return 2
    member = "" if policy.member is None else f" ({policy.member} of the population)"
    print(f"wrote {args.out} and {sidecar}{member}")
    return 0
