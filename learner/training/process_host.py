"""Training in its own process, so serving and training stop sharing one GIL.

In one process the trainer thread and the event loop that serves actors take turns on
the GIL: a learner step then takes much longer than alone, and a core sits idle while
one waits for the other. Here a spawned child (no fork
after gRPC has started threads) owns the training model and optimizer and runs the
same :class:`~learner.training.trainer.Trainer` step; the learner process keeps its own copy of
the weights for inference. Three channels connect them:

* **unrolls**: ``SLOTS`` batch-sized sets of shared-memory tensors. The feeder thread
  copies a batch from the :class:`UnrollQueue` into a free slot and sends the slot's
  index; the child trains on the slot in place and hands the index back, so the next
  batch is copied while the current one trains (double buffering).
* **weights**: after every batch (its ``--updates-per-batch`` steps) the child copies
  its parameters into one shared set, under a cross-process lock held only for that
  copy, and publishes the step number. Before a batch, inference compares the published
  step with its own and, when newer, copies the shared set into its model the same way.
  No lock spans a forward pass.
* **results** (a pipe): per batch each step's loss scalars and the timings, checkpoint
  state on request (``torch.save`` bytes) and a traceback if the child fails. A child
  that dies closes the pipe, which the receiver thread turns into
  :attr:`ProcessHost.error`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
import signal
import sys
import threading
import time
import traceback
import types
from collections.abc import Iterator
from multiprocessing.connection import Connection
from queue import Empty, SimpleQueue
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as mp

from learner.agents.base import Store
from learner.agents.models import resolve_device
from learner.agents.policy import set_compute_threads
from learner.agents.registry import AgentRecipe
from learner.state import checkpoint
from learner.state.counters import StepCounter
from learner.state.trajectories import TrajectoryBuilder, Unrolls
from learner.training.allocator import keep_freed_memory
from learner.training.trainer import Trainer, TrainerParts, agent_training_state
from seedrl.config import LearnerConfig
from seedrl.timing import process_rss_mb

log = logging.getLogger(__name__)

SLOTS = 2
"""Batches in flight between the learner process and the trainer process."""
STATE_TIMEOUT_S = 120.0
"""Longest wait for the child's training state (it answers between two steps)."""
STOP_TIMEOUT_S = 30.0
"""How long a stopping child gets to finish its step and hand over its final state."""
WAIT_REPORT_S = 0.1
"""A trainer waiting for data reports its wait this often, so each metrics interval
counts the waiting that happened in it (not a long wait all at once when it ends)."""


def _shared_like(array: np.ndarray) -> torch.Tensor:
    """A zeroed shared-memory tensor of ``array``'s shape and dtype."""
    dtype = torch.from_numpy(array[:0]).dtype
    return torch.zeros(array.shape, dtype=dtype).share_memory_()


@dataclasses.dataclass
class SharedUnrolls:
    """One slot: the :class:`Unrolls` fields as shared tensors, with numpy views of them."""

    tensors: dict[str, Any]  # field -> tensor, "core_state" -> tuple of tensors

    @classmethod
    def like(cls, unrolls: Unrolls) -> SharedUnrolls:
        tensors: dict[str, Any] = {}
        for f in dataclasses.fields(unrolls):
            value = getattr(unrolls, f.name)
            if f.name == "core_state":
                tensors[f.name] = tuple(_shared_like(s) for s in value)
            elif value is None:
                tensors[f.name] = None
            else:
                tensors[f.name] = _shared_like(value)
        return cls(tensors)

    def view(self) -> Unrolls:
        """Unrolls whose arrays are this slot's memory (writes land in the slot)."""
        fields = {
            name: tuple(t.numpy() for t in value)
            if name == "core_state"
            else (None if value is None else value.numpy())
            for name, value in self.tensors.items()
        }
        return Unrolls(**fields)  # type: ignore[arg-type]


def copy_unrolls(dst: Unrolls, src: Unrolls) -> None:
    """Copy every field of ``src`` into ``dst`` (same shapes and dtypes)."""
    for f in dataclasses.fields(src):
        d, s = getattr(dst, f.name), getattr(src, f.name)
        if f.name == "core_state":
            for d_part, s_part in zip(d, s, strict=True):
                np.copyto(d_part, s_part, casting="no")
        elif d is None:
            continue
        elif s is None:  # queued unrolls: not sampled, weight 1
            d.fill(-1 if f.name == "sample_id" else 1)
        else:
            np.copyto(d, s, casting="no")


@dataclasses.dataclass
class _ChildArgs:
    """Everything the spawned child needs, pickled once at start."""

    config: LearnerConfig
    recipe: AgentRecipe  # the child builds its own agent and state by asking it
    initial_state: bytes  # torch.save of a TrainingState
    slots: list[SharedUnrolls]
    weights: list[torch.Tensor]
    weights_lock: Any  # multiprocessing Lock
    published_step: Any  # multiprocessing Value("q")
    log_level: int


def _to_bytes(state: checkpoint.TrainingState) -> bytes:
    buffer = io.BytesIO()
    torch.save(dataclasses.asdict(state), buffer)
    return buffer.getvalue()


def _from_bytes(data: bytes) -> checkpoint.TrainingState:
    return checkpoint.TrainingState(**torch.load(io.BytesIO(data), weights_only=True))


class ProcessHost:
    """The trainer in a child process (a :class:`~learner.training.hosts.TrainerHost`);
    ``refresh_weights`` is the inference side's half of the weight exchange."""

    mode = "process"

    def __init__(self, parts: TrainerParts, store: Store, builder: TrajectoryBuilder) -> None:
        if parts.recipe is None:
            raise ValueError("a trainer process needs the recipe of the agent it rebuilds")
        config, model, step_counter = parts.config, parts.model, parts.step_counter
        self.config = config
        self.recipe = parts.recipe
        self.agent = parts.agent
        self.state = parts.state
        """What the child starts from; it trains (and checkpoints) its own copy."""
        self.queue = store
        self.stats = parts.stats
        self.weights_lock = parts.weights_lock
        self.step_counter = step_counter
        self.inference_model = model
        self.inference_lock = parts.weights_lock
        self.error: BaseException | None = None
        self._ctx = mp.get_context("spawn")
        empty = builder.empty_unrolls(config.batch_size)
        self._slots = [SharedUnrolls.like(empty) for _ in range(SLOTS)]
        self._slot_views = [slot.view() for slot in self._slots]
        self._inference_weights = list(model.state_dict().values())
        self._shared_weights = [
            t.detach().to("cpu", copy=True).share_memory_() for t in self._inference_weights
        ]
        self._shared_lock = self._ctx.Lock()
        self._published = self._ctx.Value("q", step_counter.value, lock=False)
        self._free_slots: SimpleQueue[int] = SimpleQueue()
        for i in range(SLOTS):
            self._free_slots.put(i)
        self._send_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._state_ready = threading.Event()
        self._state_reply: bytes | None = None
        self._final_state: checkpoint.TrainingState | None = None
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._process: Any = None
        self._commands: Connection | None = None
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Spawn the child and the feeder and receiver threads."""
        args = _ChildArgs(
            config=self.config,
            recipe=self.recipe,
            initial_state=_to_bytes(self._own_state()),
            slots=self._slots,
            weights=self._shared_weights,
            weights_lock=self._shared_lock,
            published_step=self._published,
            log_level=logging.getLogger().getEffectiveLevel(),
        )
        command_read, command_write = self._ctx.Pipe(duplex=False)
        result_read, result_write = self._ctx.Pipe(duplex=False)
        self._process = self._ctx.Process(
            target=_child_main,
            args=(args, command_read, result_write),
            name="seedrl-trainer",
            daemon=True,
        )
        with _spawn_without_main():
            self._process.start()
        # Only the child holds these ends now: its exit closes the result pipe (EOF here).
        command_read.close()
        result_write.close()
        self._commands = command_write
        self._threads = [
            threading.Thread(target=self._feed, name="trainer-feeder", daemon=True),
            threading.Thread(
                target=self._receive, args=(result_read,), name="trainer-results", daemon=True
            ),
        ]
        for thread in self._threads:
            thread.start()
        # Serve only once training can follow: a short run must not end before its first step.
        self._ready.wait(STATE_TIMEOUT_S)
        if self.error is not None or not self._ready.is_set():
            raise RuntimeError("the trainer process did not start") from self.error

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Let the child finish its step, keep its final state, and end it."""
        self._stopping.set()
        self.queue.close()
        if self._process is None:
            return
        with contextlib.suppress(OSError, ValueError):
            self._send(("stop",))
        self._process.join(timeout)
        if self._process.is_alive():
            log.error("trainer process did not stop in %.0f s; killing it", timeout)
            self._process.kill()
            self._process.join(5.0)
        for thread in self._threads:
            thread.join(timeout)
        if self._commands is not None:
            self._commands.close()
        self.refresh_weights(wait=True)  # the learner ends with the last step's weights

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def metrics(self) -> dict[str, Any]:
        """The child's resident memory, while it lives."""
        return {"trainer_rss_mb": process_rss_mb(self.pid)} if self.alive else {}

    def _own_state(self) -> checkpoint.TrainingState:
        """The learner process's copy of the training state (what the child starts from)."""
        return agent_training_state(self.agent, self.state, self.weights_lock, self.step_counter)

    # ------------------------------------------------------------------ weights

    def refresh_weights(self, wait: bool = False) -> None:
        """Load the child's newest published weights into the inference model, if newer.

        Unless ``wait``, it never waits: while the child holds the lock to publish, this
        batch runs on the weights it has and the next one loads the new ones. Waiting
        there stalled every stream for the child's copy, and on a busy host for as long
        as the child sat preempted holding the lock.
        """
        if self._published.value == self.step_counter.value:
            return
        if not self._shared_lock.acquire(block=wait):
            return
        try:
            with self.weights_lock, torch.no_grad():
                for dst, src in zip(self._inference_weights, self._shared_weights, strict=True):
                    dst.copy_(src)
                step = self._published.value
        finally:
            self._shared_lock.release()
        self.step_counter.value = step

    def training_state(self) -> checkpoint.TrainingState | None:
        """The child's weights and optimizer state; None if it died (no consistent state)."""
        if self._final_state is not None:
            return self._final_state
        if self._process is None:  # never started: the state it would start from
            return self._own_state()
        with self._state_lock:
            if not self.alive or self._stopping.is_set():
                return self._final_state
            self._state_ready.clear()
            self._send(("state",))
            if not self._state_ready.wait(STATE_TIMEOUT_S) or self._state_reply is None:
                return None
            return _from_bytes(self._state_reply)

    # ------------------------------------------------------------------ threads

    def _send(self, message: tuple[Any, ...]) -> None:
        assert self._commands is not None
        with self._send_lock:
            self._commands.send(message)

    def _feed(self) -> None:
        """Queue -> free slot -> child, until stopped."""
        batch_size = self.config.batch_size
        while not self._stopping.is_set():
            try:
                slot = self._free_slots.get(timeout=0.1)
            except Empty:
                continue
            batch = None
            while batch is None and not self._stopping.is_set():
                batch = self.queue.get(batch_size, timeout=0.1)
            if batch is None:
                return
            copy_unrolls(self._slot_views[slot], batch)
            try:
                self._send(("train", slot))
            except OSError:
                return  # the child is gone; the receiver reports it

    def _receive(self, results: Connection) -> None:
        """Child messages -> stats, freed slots, checkpoint replies; EOF -> error if unplanned."""
        stats = self.stats
        try:
            while True:
                message = results.recv()
                kind = message[0]
                if kind == "waited":
                    stats.timer.add("trainer_wait_data", message[1])
                elif kind == "trained":
                    _, slot, results_of_steps, feedback, wait_s, step_s = message
                    for sample_id, priority in feedback:
                        self.queue.feedback(sample_id, priority)
                    self._free_slots.put(slot)
                    stats.timer.add("trainer_wait_data", wait_s)
                    stats.timer.add("trainer_step", step_s)
                    for scalars in results_of_steps:
                        if scalars is None:
                            stats.nonfinite_skipped += 1
                        else:
                            stats.on_train_step(scalars)
                elif kind == "ready":
                    self._ready.set()
                elif kind == "state":
                    self._state_reply = message[1]
                    self._state_ready.set()
                elif kind == "final":
                    self._final_state = _from_bytes(message[1])
                elif kind == "error":
                    self.error = RuntimeError(f"trainer process failed:\n{message[1]}")
        except (EOFError, OSError):
            pass
        finally:
            results.close()
            if self.error is None and self._final_state is None:
                self._process.join(1.0)
                self.error = RuntimeError(
                    f"trainer process {self._process.pid} exited with code {self._process.exitcode}"
                )
                log.error("%s", self.error)
            self._state_ready.set()  # nobody waits forever on a dead child
            self._ready.set()


@contextlib.contextmanager
def _spawn_without_main() -> Iterator[None]:
    """Start a spawned child without re-running the parent's ``__main__`` module.

    Spawn re-imports a script's main module in the child, so a script that calls
    ``learner.train`` at top level without an ``if __name__ == "__main__"`` guard would
    start a second learner there. The child needs only this module, so it is shown an
    empty ``__main__`` while it starts.
    """
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


# ---------------------------------------------------------------------- the child


def _child_main(args: _ChildArgs, commands: Connection, results: Connection) -> None:
    """The trainer process: train on slots as they come, publish weights after each step."""
    # Ctrl-C (or a supervisor's SIGTERM) may reach the whole process group; the learner
    # stops us in order instead, after taking our final state. Its death ends us (EOF).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s trainer: %(message)s"
    )
    try:
        _train_until_stopped(args, commands, results)
    except (EOFError, BrokenPipeError):
        pass  # the learner process is gone; nothing to report to
    except BaseException:
        with contextlib.suppress(OSError, ValueError):
            results.send(("error", traceback.format_exc()))
        os._exit(1)


def _train_until_stopped(args: _ChildArgs, commands: Connection, results: Connection) -> None:
    config = args.config
    keep_freed_memory()
    set_compute_threads(config.torch_threads)
    device = resolve_device(config.device)
    agent, state = args.recipe.build(device)
    initial = _from_bytes(args.initial_state)
    agent.load_state_dict(state, initial.saved())
    steps = StepCounter(initial.learner_steps)
    # The child's batches come from the slots and its only thread shares no weights.
    trainer = Trainer(TrainerParts.unshared(config, agent, state, device, steps))
    views = [slot.view() for slot in args.slots]
    params = list(state.model.state_dict().values())

    results.send(("ready",))

    def state_bytes() -> bytes:
        return _to_bytes(trainer.training_state())

    while True:
        waited = time.perf_counter()
        while not commands.poll(WAIT_REPORT_S):  # report long waits in pieces, as they pass
            now = time.perf_counter()
            results.send(("waited", now - waited))
            waited = now
        message = commands.recv()
        began = time.perf_counter()
        kind = message[0]
        if kind == "train":
            slot = message[1]
            # All --updates-per-batch steps on the slot, then one publication of the
            # weights: inference needs the newest, not every one in between.
            trained = trainer.train_batch(views[slot])
            if any(scalars is not None for scalars in trained):
                with args.weights_lock, torch.no_grad():
                    for dst, src in zip(args.weights, params, strict=True):
                        dst.copy_(src)
                    args.published_step.value = steps.value
            feedback = trainer.take_feedback()
            elapsed = time.perf_counter() - began
            results.send(("trained", slot, trained, feedback, began - waited, elapsed))
        elif kind == "state":
            results.send(("state", state_bytes()))
        elif kind == "stop":
            results.send(("final", state_bytes()))
            return
