"""The device-resident trainer: training and inference share one device in one process.

On an accelerator the forward pass for a batch of actors is cheap, and what costs is
moving data: the process trainer would copy its weights device -> shared host memory
after every step and inference would copy them back. Here the trainer is a thread of
the learner process and trains ``model`` on its own CUDA stream, while inference runs a
second copy of the weights (``inference_model``) on the event loop's stream. After a
step the trainer only marks the step done (a CUDA event); before its next forward pass
inference copies the new weights into its own with one device-to-device copy on its
stream, ordered after that event, and the trainer's next optimizer step waits for that
copy to have read them. Neither thread waits for the other's kernels on the host.

Batches of unrolls are staged in page-locked host buffers (two, used in turn) and sent
with one asynchronous copy per field per batch.

On the CPU there are no streams: the same code runs with plain copies under the weights
lock, so tests cover its logic on machines without a GPU.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from learner.agents.base import Store
from learner.state import checkpoint
from learner.state.counters import StepCounter
from learner.state.trajectories import TrajectoryBuilder, Unrolls
from learner.training.hosts import ThreadHost
from learner.training.trainer import (
    Trainer,
    TrainerParts,
    agent_training_state,
    row_fields,
    stack_frames,
)

STAGING_BUFFERS = 2
"""Pinned batches in turn: one is filled while the other's copy to the device runs."""


def copy_for_inference(model: torch.nn.Module) -> torch.nn.Module:
    """A second model on the same device with the same weights (inference's own copy)."""
    twin = copy.deepcopy(model)
    twin.requires_grad_(False)
    return twin


class _StagedBatch:
    """A batch of unrolls in host memory the device can read directly (pinned on CUDA).

    Unrolls stored as single frames travel as frames; their stacks are rebuilt on the
    device, as the other trainers do.
    """

    def __init__(self, empty: Unrolls, pinned: bool) -> None:
        self.frame_stack = empty.frame_stack

        def host(array: Any) -> torch.Tensor:
            return torch.empty(array.shape, dtype=torch.from_numpy(array).dtype, pin_memory=pinned)

        self.tensors = {
            "obs": host(empty.obs),
            **{name: host(array) for name, array in row_fields(empty).items()},
        }
        self.core_state = tuple(host(s) for s in empty.core_state)
        self.sample_weight = host(np.ones(len(empty), np.float32))  # [B]: per unroll
        self.copied: torch.cuda.Event | None = None

    def fill(self, unrolls: Unrolls) -> None:
        if self.copied is not None:
            self.copied.synchronize()  # its last copy to the device has read it
        arrays = {"obs": unrolls.obs, **row_fields(unrolls)}
        for name, tensor in self.tensors.items():  # what this learner's unrolls carry
            tensor.numpy()[...] = arrays[name]
        for dst, src in zip(self.core_state, unrolls.core_state, strict=True):
            dst.numpy()[...] = src
        weight = unrolls.sample_weight
        self.sample_weight.numpy()[...] = 1.0 if weight is None else weight

    def to_device(
        self, device: torch.device, stream: torch.cuda.Stream | None
    ) -> tuple[dict[str, torch.Tensor], tuple[torch.Tensor, ...]]:
        """Time-major device tensors ``[T+1, B, ...]`` (asynchronous from pinned memory)."""
        sent = {name: t.to(device, non_blocking=True) for name, t in self.tensors.items()}
        sent["obs"] = stack_frames(sent["obs"], self.tensors["first"].numpy(), self.frame_stack)
        batch = {name: t.transpose(0, 1) for name, t in sent.items()}
        batch["sample_weight"] = self.sample_weight.to(device, non_blocking=True)
        core = tuple(s.to(device, non_blocking=True) for s in self.core_state)
        if stream is not None:
            self.copied = torch.cuda.Event()
            self.copied.record(stream)
        return batch, core


class DeviceHost(ThreadHost):
    """The trainer as a thread on its own stream, handing weights to inference.

    ``trainer.model`` is the trained model (fp32 master weights, the checkpoint's);
    inference runs ``inference_model``, which ``refresh_weights`` (called by inference
    before each forward pass) brings up to the newest finished step. ``inference_step``
    is the step inference's weights are at; ``trainer.step_counter`` the trainer's own.
    """

    mode = "device"

    def __init__(self, parts: TrainerParts, queue: Store, builder: TrajectoryBuilder) -> None:
        """``parts.weights_lock`` and ``parts.step_counter`` are the ones inference holds;
        the trainer keeps its own lock and counter and hands finished steps over."""
        inference_step = parts.step_counter
        super().__init__(parts, queue, builder)
        # The trainer's own lock now orders only its update against checkpoints;
        # ``handoff_lock`` orders it against inference's copy.
        self.handoff_lock = parts.weights_lock
        self.inference_model = copy_for_inference(parts.model)
        # The copy is touched only by the event loop, so inference's forward pass needs
        # no lock shared with the trainer.
        self.inference_lock = threading.Lock()
        self.inference_step = inference_step
        config, device, model = parts.config, parts.device, parts.model
        self.device = device
        cuda = device.type == "cuda"
        self.stream: torch.cuda.Stream | None = torch.cuda.Stream(device) if cuda else None
        self._stepped = torch.cuda.Event() if cuda else None
        self._read = torch.cuda.Event() if cuda else None
        self._published = inference_step.value
        self._staging = [
            _StagedBatch(builder.empty_unrolls(config.batch_size), pinned=cuda)
            for _ in range(STAGING_BUFFERS)
        ]
        self._next_staging = 0
        self._trained = list(model.state_dict().values())
        self._inferred = list(self.inference_model.state_dict().values())
        if self.stream is not None:
            # The weights, gradient buffer and inference copy were made on the current
            # stream; the trainer's stream starts after that work.
            self.stream.wait_stream(torch.cuda.current_stream(device))

    # ------------------------------------------------------------------ the trainer side

    def _trainer(self, parts: TrainerParts) -> Trainer:
        own = dataclasses.replace(
            parts, weights_lock=threading.Lock(), step_counter=StepCounter(parts.step_counter.value)
        )
        return Trainer(own, update_guard=self._handoff)

    def train(self, unrolls: Unrolls, updates: int | None = None) -> list[dict[str, float] | None]:
        staged = self._staging[self._next_staging]
        self._next_staging = (self._next_staging + 1) % len(self._staging)
        staged.fill(unrolls)
        with self._on_stream():
            batch, core_state = staged.to_device(self.device, self.stream)
            return self.trainer.steps_on(batch, core_state, unrolls, updates)

    def train_step(self, unrolls: Unrolls) -> dict[str, float] | None:
        """One optimizer step on ``unrolls`` through the staging buffers and the stream."""
        return self.train(unrolls, updates=1)[0]

    @property
    def step_counter(self) -> StepCounter:
        """The trainer's own step count (inference's is ``inference_step``)."""
        return self.trainer.step_counter

    @contextlib.contextmanager
    def _handoff(self) -> Iterator[None]:
        """Around each optimizer step: after inference's copy has read the last step, under
        the trainer's own lock; then the step is marked done for inference."""
        with self.handoff_lock:
            if self.stream is not None and self._read is not None:
                self.stream.wait_event(self._read)  # inference's copy has read the last step
            with self.trainer.weights_lock:
                yield
            if self._stepped is not None:
                self._stepped.record(self.stream)
            self._published = self.trainer.step_counter.value

    def _on_stream(self) -> contextlib.AbstractContextManager[Any]:
        if self.stream is None:
            return contextlib.nullcontext()
        return torch.cuda.stream(self.stream)

    def training_state(self) -> checkpoint.TrainingState:
        trainer = self.trainer
        with trainer.weights_lock:
            if self.stream is not None:
                self.stream.synchronize()  # the last issued step has landed in the weights
            return agent_training_state(
                trainer.agent, trainer.state, contextlib.nullcontext(), trainer.step_counter
            )

    # ------------------------------------------------------------------ the inference side

    def refresh_weights(self) -> None:
        """Copy the newest finished step into the inference weights (device to device)."""
        if self._published == self.inference_step.value:
            return
        with self.handoff_lock, torch.no_grad():
            step = self._published
            if self._stepped is not None:
                torch.cuda.current_stream(self.device).wait_event(self._stepped)
            torch._foreach_copy_(self._inferred, self._trained)
            if self._read is not None:
                self._read.record(torch.cuda.current_stream(self.device))
        self.inference_step.value = step

    def stop(self, timeout: float = 10.0) -> None:
        super().stop(timeout)
        self.refresh_weights()  # the learner ends holding the last step's weights and count
