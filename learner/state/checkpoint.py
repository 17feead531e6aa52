"""Checkpoints: model, optimizer, counters, config and RNG state, written atomically, and
read back into a learner's parts (:func:`restore`); when a running learner writes which
one is :mod:`learner.checkpointing`'s.

A checkpoint is written to a temporary file in the same directory, flushed and fsynced,
then renamed over the old one (and the directory fsynced), so a kill at any moment
leaves either the previous checkpoint or the new one, never a torn file
(:mod:`learner.state.files`: two writers never share a temp file, and a learner's rename
waits on its lease of the run directory).
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from learner.common.measures import BY_RETURN
from learner.common.measures import BY_YARDSTICK as BY_YARDSTICK  # the measures a best records
from learner.state.counters import StepCounter
from learner.state.files import Lease, atomic_file
from learner.state.normalize import Normalizer
from learner.state.stats import LearnerStats
from seedrl import codec
from seedrl.config import LearnerConfig
from seedrl.proto import seedrl_pb2 as pb

log = logging.getLogger(__name__)

FORMAT = "seedrl-checkpoint"
VERSION = 1
BEST_RETURN = "best_return_mean"
"""Key of checkpoint-best.pt's value of its measure: what made it the best when written."""
BEST_MEASURE = "best_measure"
"""Key of what that value measures (absent: ``BY_RETURN``, as before there was a choice)."""


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, corrupt or from an incompatible run."""


@dataclass
class TrainingState:
    """What training owns: weights, optimizer state and the step count they belong to."""

    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    learner_steps: int
    agent_state: dict[str, Any] = field(default_factory=dict)
    """The rest of what the agent keeps (target networks, statistics), by checkpoint key."""

    def saved(self) -> dict[str, Any]:
        """Everything the agent saved, by checkpoint key, as its ``load_state_dict`` reads
        it (a checkpoint's own keys beside them are ignored there)."""
        return {"model": self.model, "optimizer": self.optimizer, **self.agent_state}


def capture(
    agent_state: Callable[[], dict[str, Any]],
    weights_lock: AbstractContextManager[Any],
    learner_steps: Callable[[], int],
) -> TrainingState:
    """A consistent CPU copy of the training state, taken under the weights lock (fast
    copies): ``agent_state`` gives everything the agent trains by checkpoint key, the
    inference network's weights and optimizer under ``model`` and ``optimizer``."""
    with weights_lock:
        saved = dict(agent_state())
        model, optimizer = saved.pop("model"), saved.pop("optimizer")
        return TrainingState(
            model={k: v.detach().to("cpu", copy=True) for k, v in model.items()},
            optimizer=_to_cpu(optimizer),
            learner_steps=learner_steps(),
            agent_state=_to_cpu(saved),
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
        **training.agent_state,
        **extra,
    }
    return state


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    return obj


def save(path: str | os.PathLike[str], state: dict[str, Any], lease: Lease | None = None) -> None:
    """Write ``state`` to ``path`` atomically (temp file + fsync + rename + dir fsync)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    with atomic_file(path, lease) as f:
        f.write(buffer.getbuffer())


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


@dataclass(frozen=True)
class CheckpointInfo:
    """What a loaded checkpoint is: where it came from and how good its run was then."""

    path: Path
    frames: int
    return_mean: float | None
    """Mean of the episode returns the checkpoint kept (the last 100 when it was written)."""
    best_return: float | None
    """Set on a best checkpoint: the value of ``best_measure`` that made it the run's best."""
    best_measure: str = BY_RETURN

    @classmethod
    def of(cls, path: str | os.PathLike[str], state: dict[str, Any]) -> CheckpointInfo:
        returns = [float(r) for r in state.get("returns", [])]
        best = state.get(BEST_RETURN)
        return cls(
            path=Path(path),
            frames=int(state.get("frames", 0)),
            return_mean=sum(returns) / len(returns) if returns else None,
            best_return=None if best is None else float(best),
            best_measure=str(state.get(BEST_MEASURE, BY_RETURN)),
        )

    def describe(self) -> str:
        """One line saying which checkpoint this is, for ``evaluate`` to print."""
        if self.best_return is not None:
            return (
                f"{self.path}: the run's best, written at {self.frames:,} frames with a "
                f"{self.best_measure} of {best_text(self.best_return, self.best_measure)}"
            )
        level = "" if self.return_mean is None else f", mean-100 return {self.return_mean:.1f}"
        return f"{self.path}: written at {self.frames:,} frames{level}"


def best_text(value: float, measure: str) -> str:
    """A best checkpoint's value as its measure reads: a return, or a score in percent."""
    return f"{value:.1f}" if measure == BY_RETURN else f"{100 * value:.1f} %"


BEST_FILE = "checkpoint-best.pt"
"""The best checkpoint's name in a logdir (``LearnerConfig.best_checkpoint_path``)."""


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
    if (mismatch := codec.space_mismatch(saved, env_spec)) is not None:
        name, theirs, ours = mismatch
        raise CheckpointError(
            f"{path}: trained with {name} {theirs}, this learner has {ours}; use another "
            "--logdir or drop --resume"
        )


def resume_candidates(config: LearnerConfig) -> list[Path]:
    """What ``--resume`` may start from, in the order tried: checkpoint.pt, the history
    checkpoints newest first, checkpoint-best.pt."""
    logdir = Path(config.logdir)
    history = []
    for path in (logdir / "checkpoints").glob("frames-*.pt"):
        frames = path.stem.removeprefix("frames-")
        if frames.isdigit():
            history.append((int(frames), path))
    newest_first = [path for _, path in sorted(history, reverse=True)]
    return [config.checkpoint_path, *newest_first, config.best_checkpoint_path]


def load_for_resume(config: LearnerConfig) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint of the run directory that loads (None: there is none to
    resume from); each one skipped on the way is named in a warning with why.

    A corrupt checkpoint.pt beside a readable history or best checkpoint is not a reason
    to stop: under ``restart: on-failure`` that is a crash loop. When none loads, the
    CheckpointError names checkpoint.pt (or the first one tried).
    """
    skipped: list[str] = []
    candidates = resume_candidates(config)
    present = [path for path in candidates if path.is_file()]
    for path in present:
        try:
            state = load(path)
        except CheckpointError as exc:
            skipped.append(str(exc))
            continue
        if skipped or path != config.checkpoint_path:
            if not config.checkpoint_path.is_file():
                skipped.insert(0, f"{config.checkpoint_path}: no checkpoint file")
            log.warning("resuming from %s; skipped %s", path, "; ".join(skipped))
        return path, state
    if not skipped:
        return None
    others = len(skipped) - 1
    beside = f"; none of the {others} other checkpoints beside it loads either" if others else ""
    raise CheckpointError(skipped[0] + beside)


def restore(
    path: Path,
    load_training: Callable[[dict[str, Any]], None],
    stats: LearnerStats,
    step_counter: StepCounter,
    env_spec: Any = None,
    normalizer: Normalizer | None = None,
    state: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Load a checkpoint into the parts and return it (``state``: ``path`` loaded
    already); ``load_training`` takes what training owns out of it (the agent's
    ``load_state_dict``). A mismatch raises CheckpointError naming the file."""
    state = load(path) if state is None else state
    if env_spec is not None and "env_spec" in state:
        check_env(path, state["env_spec"], env_spec)
    saved_stats = state.get("obs_normalizer")
    if (saved_stats is None) != (normalizer is None):
        trained = "with" if saved_stats is not None else "without"
        raise CheckpointError(
            f"{path}: trained {trained} --normalize-observations; resume with the same "
            "setting, use another --logdir or drop --resume"
        )
    try:
        if normalizer is not None and saved_stats is not None:
            normalizer.load_state_dict(saved_stats)
        load_training(state)
        torch.set_rng_state(state["torch_rng"])
        frames, steps = int(state["frames"]), int(state["learner_steps"])
        episodes, returns = int(state["episodes"]), list(state.get("returns", []))
    except (RuntimeError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"{path}: does not fit this model/config ({one_line(exc)}); "
            "use another --logdir or drop --resume"
        ) from exc
    stats.restore(
        frames=frames, steps=steps, episodes=episodes, returns=returns,
        return_first=state.get("return_first"), return_best=state.get("return_best"),
    )  # fmt: skip
    step_counter.value = steps
    log.info("resumed from %s at frame %d, step %d", path, stats.frames, step_counter.value)
    return state


def schedule_states(config: LearnerConfig) -> dict[str, dict[str, Any]]:
    """What defines the learning rate and the entropy bonus at each step, by checkpoint key
    (the step count is saved anyway, so a resumed run with the same flags continues both
    schedules exactly)."""
    return {
        "lr_schedule": {
            "schedule": config.effective_lr_schedule,
            "learning_rate": config.learning_rate,
            "total_frames": config.total_frames,
            "decay_start": config.lr_decay_start,
            "hold_frames": config.lr_hold_frames,
        },
        "entropy_schedule": {
            "entropy_cost": config.entropy_cost,
            "final_entropy_cost": config.final_entropy_cost,
            # A constant bonus does not depend on the budget: a run extended to more frames
            # keeps the same schedule.
            "total_frames": config.total_frames if config.final_entropy_cost is not None else 0,
        },
    }
