"""Trainer hosts: where the one :class:`~learner.training.trainer.Trainer` runs.

Every host is built the same way, ``Host(parts, store, builder)`` (a torchrun rank's
also takes its membership), from one :class:`~learner.training.trainer.TrainerParts`,
and answers the same small :class:`TrainerHost` protocol, which is all that
``learner.run`` knows of training: start and stop it, whether it is alive or failed,
which weights inference runs and how they are brought up to date, and the training
state a checkpoint takes. The hosts are a thread beside inference (here), a child
process (:mod:`.process_host`), a CUDA stream (:mod:`.device_host`) and a torchrun rank
(:mod:`.distributed`).
"""

from __future__ import annotations

import logging
import threading
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch

from learner.agents.base import Store
from learner.state import checkpoint
from learner.state.stats import LearnerStats
from learner.state.trajectories import TrajectoryBuilder, Unrolls
from learner.training.trainer import Trainer, TrainerParts
from seedrl.config import LearnerConfig

log = logging.getLogger(__name__)


class TrainerHost(Protocol):
    """What the learner's run loop needs of training, wherever it runs."""

    mode: str
    """The ``--trainer`` mode it runs (for the listening line)."""
    error: BaseException | None
    """Why training stopped, once it failed."""
    inference_model: Any
    """The network inference runs, as the agent's ``inference_policy`` takes it (the
    trained network itself, or a copy kept up to date)."""

    @property
    def inference_lock(self) -> AbstractContextManager[Any]:
        """Held around each inference forward pass."""
        ...

    def start(self) -> None: ...
    def stop(self, timeout: float = ...) -> None:
        """Finish the step in flight and stop; inference then holds the last step's weights."""
        ...

    @property
    def alive(self) -> bool: ...
    def refresh_weights(self) -> None:
        """Bring the inference weights up to the newest finished step (before a forward pass)."""
        ...

    def training_state(self) -> checkpoint.TrainingState | None:
        """What a checkpoint takes; None when no consistent state exists (a dead child)."""
        ...

    def metrics(self) -> dict[str, Any]:
        """Extra keys for each metrics record."""
        ...


class ThreadHost:
    """The trainer in a thread of the learner process, on the very model inference uses:
    the weights lock is held only for an optimizer step and for each forward pass, so
    both see whole updates and neither waits long."""

    mode = "thread"

    def __init__(self, parts: TrainerParts, store: Store, builder: TrajectoryBuilder) -> None:
        """``builder``: the trajectories' shapes (a host staging batches its own way needs
        them)."""
        self.trainer = self._trainer(parts)
        self.queue = store
        self.stats: LearnerStats = parts.stats
        self.config: LearnerConfig = parts.config
        self.inference_model: Any = parts.model
        self.inference_lock: AbstractContextManager[Any] = parts.weights_lock
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _trainer(self, parts: TrainerParts) -> Trainer:
        """The trainer this host runs (a host that steps its own way overrides this)."""
        return Trainer(parts)

    def train(self, unrolls: Unrolls, updates: int | None = None) -> list[dict[str, float] | None]:
        """``updates`` steps (default ``--updates-per-batch``) on one batch (a host that
        moves batches its own way overrides this)."""
        return self.trainer.train_batch(unrolls, updates)

    def run(self) -> None:
        """Take batches until stopped; every wait for data is timed (trainer_wait_data)."""
        batch_size = self.config.batch_size
        while not self._stop.is_set():
            with self.stats.timer("trainer_wait_data"):
                unrolls = self.queue.get(batch_size, timeout=0.1)
            if unrolls is None:
                continue
            with self.stats.timer("trainer_step"):
                results = self.train(unrolls)
            for sample_id, priority in self.trainer.take_feedback():
                self.queue.feedback(sample_id, priority)
            for scalars in results:
                if scalars is not None:
                    self.stats.on_train_step(scalars)

    def _run_guarded(self) -> None:
        try:
            self.run()
        except BaseException as exc:  # surfaced by the learner's main loop
            self.error = exc
            log.exception("trainer thread failed")

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run_guarded, name="trainer", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self.queue.close()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def refresh_weights(self) -> None:
        """Nothing to do: inference runs the trained weights themselves."""

    def training_state(self) -> checkpoint.TrainingState | None:
        return self.trainer.training_state()

    def metrics(self) -> dict[str, Any]:
        return {}


class PolicyHosts:
    """The trainers of several policies (--policy-mapping), one host each, as one host:
    started, stopped and checkpointed together; inference takes each policy's weights
    from :attr:`hosts`."""

    def __init__(self, hosts: dict[str, TrainerHost]) -> None:
        self.hosts = hosts
        first = next(iter(hosts.values()))
        self.mode: str = first.mode
        self.inference_model: Any = first.inference_model

    @property
    def error(self) -> BaseException | None:
        """The first policy's trainer failure (training stops for all, as with one)."""
        return next((h.error for h in self.hosts.values() if h.error is not None), None)

    @error.setter
    def error(self, value: BaseException | None) -> None:
        for host in self.hosts.values():
            host.error = value

    @property
    def inference_lock(self) -> AbstractContextManager[Any]:
        return next(iter(self.hosts.values())).inference_lock

    def start(self) -> None:
        for host in self.hosts.values():
            host.start()

    def stop(self, timeout: float = 10.0) -> None:
        for host in self.hosts.values():
            host.stop(timeout)

    @property
    def alive(self) -> bool:
        return all(host.alive for host in self.hosts.values())

    def refresh_weights(self) -> None:
        for host in self.hosts.values():
            host.refresh_weights()

    def training_state(self) -> checkpoint.TrainingState | None:
        states = {name: host.training_state() for name, host in self.hosts.items()}
        if any(state is None for state in states.values()):
            return None
        return checkpoint.TrainingState.of_policies(states)  # type: ignore[arg-type]

    def metrics(self) -> dict[str, Any]:
        return {
            f"{POLICY_PREFIX}{name}/{key}": value
            for name, host in self.hosts.items()
            for key, value in host.metrics().items()
        }


POLICY_PREFIX = "policy/"
"""Metric keys of one of several policies: ``policy/NAME/KEY``."""


def trainer_mode(config: LearnerConfig, device: torch.device, ranked: bool = False) -> str:
    """The host ``--trainer`` asks for on ``device``: process, thread or device.

    Torchrun ranks (``ranked``) train in a thread that steps in lockstep; any other
    explicit mode raises ValueError. A population's members train in threads.
    """
    mode = config.trainer
    if config.population > 1:  # exploit copies states between trainers in this process
        return "thread"
    if ranked:
        if mode not in ("auto", "thread"):
            raise ValueError("torchrun ranks train in a thread: use --trainer auto or thread")
        return "thread"
    if mode == "auto":
        return "device" if device.type == "cuda" else "process"
    return mode
