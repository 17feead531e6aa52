"""The forward pass inference runs: one step of the policy for a batch, then a sample.

Two implementations of one function, ``policy(obs_BO, first_B, state) -> (action_BA,
params_BP, state_after)`` with numpy in and out:

* :class:`TorchPolicy` runs ``ActorCritic.act`` and the head's ``sample``: any model,
  any device.
* :class:`NumpyMLPPolicy` computes the same thing for a feed-forward MLP on the CPU with
  numpy, reading the model's own parameter storage (``Tensor.numpy()`` shares it), so
  every in-place update (optimizer step, weights copied in from the trainer process,
  ``load_state_dict``) is seen at once. Why: for a small MLP the arithmetic is a small
  part of a torch call, the rest is per-op dispatch, and with many actor processes
  sharing the cores that dispatch runs with cold caches at every batch.

:func:`inference_policy` picks one. The learner and the benchmark's in-process ideal both
use it, so their ratio compares the same forward pass.

Shape suffixes: B batch rows, O observation dims, A action dims, P policy parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np
import torch
from threadpoolctl import threadpool_limits
from torch import nn

from learner.agents.cpu_kernels import Linear, Tanh
from learner.agents.models import ActionHead, ActorCritic, CategoricalHead, GaussianHead, autocast
from seedrl.config import INFERENCE_BACKENDS

CoreStateArrays = tuple[np.ndarray, ...]
"""Recurrent state as numpy rows ``[B, H]``; empty for feed-forward models."""


def set_compute_threads(threads: int) -> None:
    """Intra-op threads for torch and for numpy's BLAS alike (0: leave both as they are).

    Both matter: OpenBLAS splits a 512-row matmul over every core and its threads then
    spin-wait, taking CPU from the actors on the same host.
    """
    if threads > 0:
        torch.set_num_threads(threads)
        threadpool_limits(limits=threads, user_api="blas")


class Policy(Protocol):
    """``slot_B`` names each row's trajectory slot, for an action choice that differs by
    slot (R2D2's per-slot epsilon); sampling policies ignore it."""

    def __call__(
        self,
        obs_BO: np.ndarray,
        first_B: np.ndarray,
        state: CoreStateArrays,
        slot_B: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, CoreStateArrays]: ...

    def choose(self, params_BP: torch.Tensor, slot_B: np.ndarray | None = None) -> np.ndarray:
        """The actions for policy parameters computed elsewhere (self-play's stacked
        snapshots): the second half of a call."""
        ...


class TorchPolicy:
    """``model.act`` with T = 1, then ``head.sample``; numpy in, numpy out.

    On CUDA the inputs go through page-locked host buffers kept between batches, so each
    input is one asynchronous copy per batch (from pageable memory torch would stage and
    wait itself); under ``precision`` bf16 the forward pass runs in autocast. ``greedy``
    picks the most likely action (a Gaussian's mean) instead of sampling, as ``evaluate``
    does: a trained policy served, not trained.
    """

    def __init__(
        self,
        model: ActorCritic,
        head: ActionHead,
        device: torch.device,
        precision: str = "fp32",
        greedy: bool = False,
    ) -> None:
        self.model, self.head, self.device = model, head, device
        self.precision = precision
        self.greedy = greedy
        self._pinned = device.type == "cuda"
        self._staging: dict[str, torch.Tensor] = {}

    def _to_device(self, name: str, array: np.ndarray) -> torch.Tensor:
        if not self._pinned:
            return torch.from_numpy(array).to(self.device)
        rows = len(array)
        buffer = self._staging.get(name)
        wanted = torch.from_numpy(array[:0]).dtype
        if buffer is None or len(buffer) < rows or buffer.shape[1:] != array.shape[1:]:
            capacity = max(rows, 2 * len(buffer)) if buffer is not None else rows
            buffer = torch.empty((capacity, *array.shape[1:]), dtype=wanted, pin_memory=True)
            self._staging[name] = buffer
        staged = buffer[:rows]
        # The previous batch's copy out of this buffer finished: its results were read
        # back (a synchronising copy) before this call.
        np.copyto(staged.numpy(), array, casting="no")
        return staged.to(self.device, non_blocking=True)

    def __call__(
        self,
        obs_BO: np.ndarray,
        first_B: np.ndarray,
        state: CoreStateArrays,
        slot_B: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, CoreStateArrays]:
        obs = self._to_device("obs", obs_BO)
        first = self._to_device("first", first_B)
        core = tuple(self._to_device(f"core{i}", s) for i, s in enumerate(state))
        with torch.no_grad():
            with autocast(self.device, self.precision):
                params_1BP, core_after = self.model.act(obs.unsqueeze(0), first.unsqueeze(0), core)
            params_BP = params_1BP[0].float()
        return (
            self.choose(params_BP),
            params_BP.cpu().numpy(),
            tuple(s.float().cpu().numpy() for s in core_after),
        )

    def choose(self, params_BP: torch.Tensor, slot_B: np.ndarray | None = None) -> np.ndarray:
        with torch.no_grad():
            pick = self.head.greedy if self.greedy else self.head.sample
            return pick(params_BP).cpu().numpy()


def _view(tensor: torch.Tensor) -> np.ndarray:
    """A numpy array over the tensor's own storage (no copy: updates show through)."""
    return tensor.detach().numpy()


class NumpyMLPPolicy:
    """``ActorCritic.act`` + ``head.sample`` for a feed-forward MLP, computed with numpy.

    Built by :meth:`of`, which returns None for any model it does not reproduce exactly
    (LSTM, CNN, a layer other than Linear/Tanh, a non-CPU device). Sampling draws from its
    own numpy generator: Gumbel-max for categorical heads, mean + std * normal for
    Gaussian ones, as the torch heads do.
    """

    def __init__(
        self,
        layers: list[tuple[np.ndarray, np.ndarray]],
        policy: tuple[np.ndarray, np.ndarray],
        prepare: Callable[[np.ndarray], np.ndarray],
        finish: Callable[[np.ndarray], np.ndarray],
        sample: Callable[[np.ndarray], np.ndarray],
    ) -> None:
        self._layers = layers  # (weight.T, bias) per hidden layer, views on the model
        self._policy = policy
        self._prepare = prepare
        self._finish = finish
        self._sample = sample

    @classmethod
    def of(
        cls, model: ActorCritic, head: ActionHead, rng: np.random.Generator
    ) -> NumpyMLPPolicy | None:
        """The numpy twin of ``model`` reading its parameters, or None if it has none."""
        spec = model.spec
        if spec.torso != "mlp" or model.core is not None or spec.dueling:
            return None
        if type(head) not in (CategoricalHead, GaussianHead):  # the others sample in torch
            return None
        if any(p.device.type != "cpu" or p.dtype != torch.float32 for p in model.parameters()):
            return None
        layers = _linear_tanh_layers(model.torso)
        if layers is None:
            return None
        policy = (_view(model.policy.weight).T, _view(model.policy.bias))
        sample = _sampler(head, rng)
        return cls(layers, policy, _preparer(spec.obs_dtype), _finisher(model), sample)

    def __call__(
        self,
        obs_BO: np.ndarray,
        first_B: np.ndarray,
        state: CoreStateArrays,
        slot_B: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, CoreStateArrays]:
        x = self._prepare(obs_BO)
        for weight_T, bias in self._layers:
            x = x @ weight_T
            x += bias
            np.tanh(x, out=x)
        weight_T, bias = self._policy
        params_BP = x @ weight_T
        params_BP += bias
        params_BP = self._finish(params_BP)
        return self._sample(params_BP), params_BP, ()

    def choose(self, params_BP: torch.Tensor, slot_B: np.ndarray | None = None) -> np.ndarray:
        return self._sample(params_BP.cpu().numpy())


def _linear_tanh_layers(torso: nn.Module) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """(weight.T, bias) views of a Sequential of (Linear, Tanh) pairs; None otherwise."""
    modules = list(torso.children()) if isinstance(torso, nn.Sequential) else []
    if not modules or len(modules) % 2:
        return None
    layers = []
    for linear, activation in zip(modules[::2], modules[1::2], strict=True):
        # Exact types: a subclass of either may compute something else.
        if not isinstance(linear, nn.Linear) or type(linear) not in (nn.Linear, Linear):
            return None
        if type(activation) not in (nn.Tanh, Tanh) or linear.bias is None:
            return None
        layers.append((_view(linear.weight).T, _view(linear.bias)))
    return layers


def _preparer(obs_dtype: str) -> Callable[[np.ndarray], np.ndarray]:
    """Observations as the float32 rows the MLP reads (``ActorCritic._prepare``)."""
    if obs_dtype == "uint8":
        return lambda obs: obs.reshape(len(obs), -1).astype(np.float32) / np.float32(255.0)
    return lambda obs: obs.reshape(len(obs), -1).astype(np.float32, copy=False)


def _finisher(model: ActorCritic) -> Callable[[np.ndarray], np.ndarray]:
    """The policy head's squash into Box bounds and its log-std (``ActorCritic._params``)."""
    centre = None if model.action_centre is None else _view(model.action_centre)
    half_range = None if model.action_half_range is None else _view(model.action_half_range)
    log_std = None if model.log_std is None else _view(model.log_std)

    def finish(params_BP: np.ndarray) -> np.ndarray:
        if centre is not None and half_range is not None:
            params_BP = centre + half_range * np.tanh(params_BP)
        if log_std is not None:
            params_BP = np.concatenate(
                [params_BP, np.broadcast_to(log_std, params_BP.shape)], axis=-1
            )
        return params_BP

    return finish


def _sampler(head: ActionHead, rng: np.random.Generator) -> Callable[[np.ndarray], np.ndarray]:
    """The head's ``sample`` in numpy (same distribution, own random stream)."""
    if isinstance(head, CategoricalHead):

        def categorical(params_BA: np.ndarray) -> np.ndarray:
            noise = rng.standard_exponential(params_BA.shape, dtype=np.float32)
            # A float32 draw is exactly 0 about once in 7M: log gives -inf and that action
            # wins the race, which is the right sample; only numpy's warning is unwanted.
            with np.errstate(divide="ignore"):
                log_noise = np.log(noise)
            return (params_BA - log_noise).argmax(axis=-1).astype(np.int64, copy=False)

        return categorical
    assert isinstance(head, GaussianHead)
    size, shape = head.action_size, head.action_shape

    def gaussian(params_BP: np.ndarray) -> np.ndarray:
        mean = params_BP[:, :size]
        log_std = params_BP[:, size:]  # kept in bounds by the model (bound_log_std_)
        noise = rng.standard_normal(mean.shape, dtype=np.float32)
        return (mean + np.exp(log_std) * noise).reshape(len(params_BP), *shape)

    return gaussian


def inference_policy(
    model: ActorCritic,
    head: ActionHead,
    device: torch.device,
    backend: str,
    seed: int | tuple[int, ...],
    precision: str = "fp32",
) -> Policy:
    """The policy inference runs: ``auto`` takes numpy when the model allows it, else torch.

    Numpy computes in fp32 only, so ``precision`` bf16 always takes torch.
    """
    if backend not in INFERENCE_BACKENDS:
        raise ValueError(f"inference backend must be one of {INFERENCE_BACKENDS}, got {backend!r}")
    if backend != "torch" and device.type == "cpu" and precision == "fp32":
        fast = NumpyMLPPolicy.of(model, head, np.random.default_rng(seed))
        if fast is not None:
            return fast
    if backend == "numpy":
        raise ValueError(
            "inference backend numpy needs a feed-forward MLP (no --lstm, no cnn) on the CPU"
            " in fp32"
        )
    return TorchPolicy(model, head, device, precision)
