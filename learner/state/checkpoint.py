"""Checkpoints: model, optimizer, counters, config and RNG state, written atomically.

A checkpoint is written to a temporary file in the same directory, flushed and fsynced,
then renamed over the old one (and the directory fsynced), so a kill at any moment
leaves either the previous checkpoint or the new one, never a torn file.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from learner.state.normalize import ReturnNormalizer
from seedrl import codec
from seedrl.proto import seedrl_pb2 as pb

FORMAT = "seedrl-checkpoint"
VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, corrupt or from an incompatible run."""


@dataclass
class TrainingState:
    """What training owns: weights, optimizer state and the step count they belong to."""

    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    learner_steps: int
    return_normalizer: dict[str, torch.Tensor] | None = None
    """The running return statistics (``--normalize-returns``), else None."""


def capture(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    weights_lock: AbstractContextManager[Any],
    learner_steps: Callable[[], int],
    return_normalizer: ReturnNormalizer | None = None,
) -> TrainingState:
    """A consistent CPU copy of the training state, taken under the weights lock (fast copies)."""
    with weights_lock:
        return TrainingState(
            model={k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()},
            optimizer=_to_cpu(optimizer.state_dict()),
            learner_steps=learner_steps(),
            return_normalizer=None if return_normalizer is None else return_normalizer.state_dict(),
        )


def snapshot(training: TrainingState, **extra: Any) -> dict[str, Any]:
    """The checkpoint dict: the training state, this process's torch RNG, and ``extra``."""
    state = {
        "format": FORMAT,
        "version": VERSION,
        "model": training.model,
        "optimizer": training.optimizer,
        "learner_steps": training.learner_steps,
        "torch_rng": torch.get_rng_state(),
        **extra,
    }
    if training.return_normalizer is not None:
        state["return_normalizer"] = training.return_normalizer
    return state


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    return obj


def save(path: str | os.PathLike[str], state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically (temp file + fsync + rename + dir fsync)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(buffer.getbuffer())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    # Temp files of writers that were killed mid-write (other pids) are garbage now.
    for stale in target.parent.glob(f".{target.name}.tmp-*"):
        stale.unlink(missing_ok=True)


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An exception as one line of at most ``limit`` characters: torch's load errors run to
    a page, and a bad input gets one line."""
    text = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    text = f"{type(exc).__name__}: {text}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def load(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a checkpoint, raising :class:`CheckpointError` that names the file on any problem."""
    p = Path(path)
    if not p.is_file():
        raise CheckpointError(f"{p}: no checkpoint file")
    try:
        state = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"{p}: not a readable checkpoint ({one_line(exc)})") from exc
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{p}: not a seedrl checkpoint")
    if state.get("version") != VERSION:
        raise CheckpointError(
            f"{p}: checkpoint version {state.get('version')}, this seedrl reads version {VERSION}"
        )
    return state


def check_env(path: str | os.PathLike[str], saved_env_spec: bytes, env_spec: pb.EnvSpec) -> None:
    """Raise CheckpointError when a checkpoint was trained on another env or other spaces."""
    try:
        saved = pb.EnvSpec.FromString(saved_env_spec)
    except Exception as exc:
        raise CheckpointError(f"{path}: unreadable env description ({exc})") from exc
    if saved.env_id != env_spec.env_id:
        raise CheckpointError(
            f"{path}: trained on env {saved.env_id!r}, this learner runs {env_spec.env_id!r}; "
            "use another --logdir or drop --resume"
        )
    for name in ("observation_space", "action_space"):
        theirs, ours = getattr(saved, name), getattr(env_spec, name)
        if not codec.specs_match(theirs, ours):
            raise CheckpointError(
                f"{path}: trained with {name} {codec.spec_summary(theirs)}, this learner has "
                f"{codec.spec_summary(ours)}; use another --logdir or drop --resume"
            )
