"""Where and in what precision a network runs: the device ``--device`` names and the
autocast region of a forward pass."""

from __future__ import annotations

import torch


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
