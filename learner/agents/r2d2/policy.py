"""R2D2's action choice in the learner's batched inference: Ape-X's per-actor epsilon-greedy.

Each trajectory slot ``s`` acts epsilon-greedily on the Q-network with its own rate from
a ladder of ``N`` rungs, ``eps_i = eps ** (1 + alpha * i / (N - 1))`` (Horgan et al.
2018), so a few slots explore a lot and most act nearly greedily. By default the ladder
spans the slots handed out so far (``i = s``, N the highest slot + 1): it stretches as
actors connect, and however many come its near-greedy rungs are in use; a fixed ladder
(``--epsilon-slots N``) puts slot ``s`` on rung ``s mod N``. The rate belongs to the
slot, not the actor: a reconnecting actor's envs get whatever slots the learner hands
out then (freed slots are reused first), and with them those slots' rungs.

Shape suffixes: B batch rows, A actions, H core state size.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from learner.agents.models import autocast
from learner.agents.policy import CoreStateArrays
from learner.agents.r2d2.network import QNetwork


def ape_x_epsilons(base: float, alpha: float, rungs: int) -> np.ndarray:
    """``[N]`` exploration rates eps ** (1 + alpha * i / (N - 1)); one rung: eps itself."""
    if rungs == 1:
        return np.array([base], np.float64)
    i = np.arange(rungs, dtype=np.float64)
    return base ** (1.0 + alpha * i / (rungs - 1))


class EpsilonLadder:
    """Each slot's exploration rate: rung ``s mod len(rates)`` of fixed ``rates``, or with
    none Ape-X's ladder of ``base`` and ``alpha`` over the slots seen so far."""

    def __init__(
        self, rates: np.ndarray | None = None, base: float = 0.4, alpha: float = 7.0
    ) -> None:
        self.rates, self.base, self.alpha = rates, base, alpha
        self.span = 1
        """Slots the spanning ladder covers: the highest slot seen + 1."""

    def __call__(self, slot_B: np.ndarray) -> np.ndarray:
        if self.rates is not None:
            return self.rates[slot_B % len(self.rates)]
        if len(slot_B):
            self.span = max(self.span, int(slot_B.max()) + 1)
        return self.base ** (1.0 + self.alpha * slot_B / max(self.span - 1, 1))


class EpsilonGreedyPolicy:
    """Q-values from ``model.act`` (T = 1), then per row the greedy action or, with its
    slot's probability, a uniformly random one; numpy in and out. The unrolls keep the
    Q-values where an actor-critic's rows keep its policy parameters."""

    def __init__(
        self,
        model: QNetwork,
        device: torch.device,
        epsilons: EpsilonLadder | np.ndarray,
        seed: int | tuple[int, ...],
        precision: str = "fp32",
        report: Callable[[tuple[float, float]], None] | None = None,
    ) -> None:
        """``epsilons``: the slots' ladder (an array: a fixed one); ``report`` is told the
        (min, max) rate of each batch (the metrics' range)."""
        self.model, self.device, self.precision = model, device, precision
        self.epsilons = epsilons if isinstance(epsilons, EpsilonLadder) else EpsilonLadder(epsilons)
        self.rng = np.random.default_rng(seed)
        self.report = report

    def __call__(
        self,
        obs_BO: np.ndarray,
        first_B: np.ndarray,
        state: CoreStateArrays,
        slot_B: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, CoreStateArrays]:
        obs = torch.from_numpy(obs_BO).to(self.device)
        first = torch.from_numpy(first_B).to(self.device)
        core = tuple(torch.from_numpy(s).to(self.device) for s in state)
        with torch.no_grad(), autocast(self.device, self.precision):
            q_1BA, core_after = self.model.act(obs.unsqueeze(0), first.unsqueeze(0), core)
        q_BA = q_1BA[0].float().cpu()
        core_arrays = tuple(s.float().cpu().numpy() for s in core_after)
        return self.choose(q_BA, slot_B), q_BA.numpy(), core_arrays

    def choose(self, params_BP: torch.Tensor, slot_B: np.ndarray | None = None) -> np.ndarray:
        q_BA = params_BP.float().cpu().numpy()
        rows = len(q_BA)
        slot_B = np.zeros(rows, np.int64) if slot_B is None else slot_B
        eps_B = self.epsilons(slot_B)
        explore_B = self.rng.random(rows) < eps_B
        random_B = self.rng.integers(0, q_BA.shape[1], rows)
        action_B = np.where(explore_B, random_B, q_BA.argmax(axis=1)).astype(np.int64)
        if self.report is not None and rows:
            self.report((float(eps_B.min()), float(eps_B.max())))
        return action_B
