"""Dormant ReLU units of a checkpoint's network: ``python -m benchmarks.dormant``.

A unit (a channel of a conv layer, a neuron of a dense one) that never fires on the states
its own policy visits is dead weight: it gets no gradient and adds nothing to the policy
(the "dormant neuron" capacity loss that Sokar et al. describe). A network whose first conv
layer has lost most of its channels learns from fewer features, which may cap how far a
run climbs; comparing checkpoints of a run (``--checkpoint-history-frames``) shows when
units die.

    python -m benchmarks.dormant --checkpoint runs/x/checkpoint.pt [--steps 600]

Prints one JSON line per ReLU layer: units, units that never fired, and the mean share of
active outputs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from learner.state.checkpoint import CheckpointError
from learner.tools.evaluate import evaluation_env
from learner.tools.trained_policy import Policy


def visited_states_activity(policy: Policy, steps: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """For each ReLU layer, whether each output fired, per visited state: ``[N, units, positions]``
    (positions 1 for dense layers), from ``steps`` env steps of the policy itself."""
    fired: dict[str, list[torch.Tensor]] = {}

    def record(name: str) -> Any:
        def hook(module: torch.nn.Module, inputs: Any, output: torch.Tensor) -> None:
            out = output.detach() > 0
            fired.setdefault(name, []).append(out.flatten(2) if out.dim() == 4 else out[..., None])

        return hook

    handles = [
        module.register_forward_hook(record(name))
        for name, module in policy.model.named_modules()
        if isinstance(module, torch.nn.ReLU)
    ]
    env = evaluation_env(policy)
    try:
        obs, _ = env.reset(seed=seed)
        policy.reset()
        for _ in range(steps):
            obs, _, terminated, truncated, _ = env.step(policy.act(obs))
            if terminated or truncated:
                obs, _ = env.reset()
                policy.reset()
    finally:
        env.close()
        for handle in handles:
            handle.remove()
    return {name: torch.cat(batches) for name, batches in fired.items()}


def dormant_report(activity: dict[str, torch.Tensor]) -> list[dict[str, Any]]:
    """Per layer: units that never fired at any position of any visited state."""
    rows = []
    for name, fired in activity.items():
        ever = fired.any(dim=2).any(dim=0)
        rows.append(
            {
                "layer": name,
                "units": int(ever.numel()),
                "never_fired": int((~ever).sum()),
                "active_share": round(float(fired.float().mean()), 4),
            }
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.dormant",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--checkpoint", required=True, type=Path)
    parser.add_argument("--steps", type=int, default=600, help="env steps of the policy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--greedy", action="store_true", help="greedy actions (default: sampled)")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be >= 1")
    torch.set_num_threads(1)  # a few hundred single-state forward passes
    torch.manual_seed(args.seed)
    try:
        policy = Policy.load(args.checkpoint, greedy=args.greedy)
    except CheckpointError as exc:
        parser.exit(2, f"error: {exc}\n")
    rows = dormant_report(visited_states_activity(policy, args.steps, args.seed))
    if not rows:
        parser.exit(2, f"error: {args.checkpoint}: the network has no ReLU layers\n")
    for row in rows:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
