"""Many frozen copies of one network, run as one forward pass.

Self-play's opponents are snapshots of the learning policy: same architecture, different
weights, and a batch holds a few rows for each of many of them. One forward pass per
snapshot pays the per-call cost of every layer once per snapshot, which for a small
network is most of the time; here the snapshots' weights are stacked along a leading
dimension and ``torch.func.vmap`` runs them all in one call, each on its own rows (padded
to the largest group).

Shape suffixes: B rows, G snapshots in the call, M rows per snapshot (padded), O
observation bytes, P policy parameters.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap

from learner.agents.models import ActorCritic, autocast

VMAP_FROM = 4
"""Members in one call from which vmap pays: its own overhead costs about two plain
forward passes of a small network, so fewer members take a pass each."""


class _Act(nn.Module):
    """``model.act`` as a module's forward, so ``functional_call`` can swap its weights."""

    def __init__(self, model: ActorCritic) -> None:
        super().__init__()
        self.model = model

    def forward(self, obs_TBO: torch.Tensor, first_TB: torch.Tensor) -> torch.Tensor:
        params_TBP, _ = self.model.act(obs_TBO, first_TB, ())
        return params_TBP


class StackedModels:
    """The weights of several feed-forward :class:`ActorCritic` of one architecture, kept
    stacked, with :meth:`act` computing every row's policy parameters under its own
    member's weights in one vmapped call.

    Members are added and removed by id; a removed member's place is reused, so the
    stack grows only to the most members held at once.
    """

    def __init__(self, template: ActorCritic, precision: str = "fp32") -> None:
        """``template``: a model of the members' architecture, device and dtype (its own
        weights are never used)."""
        if template.core is not None:
            raise ValueError("stacked models are feed-forward: their rows carry no state")
        self._act = _Act(copy.deepcopy(template)).requires_grad_(False)
        self.precision = precision
        named = {**dict(self._act.named_parameters()), **dict(self._act.named_buffers())}
        self._stack: dict[str, torch.Tensor] = {
            name: torch.empty((0, *t.shape), dtype=t.dtype, device=t.device)
            for name, t in named.items()
        }
        self.device = next(iter(named.values())).device
        self._place: dict[int, int] = {}
        self._free: list[int] = []

    def __contains__(self, member: int) -> bool:
        return member in self._place

    def __len__(self) -> int:
        return len(self._place)

    def members(self) -> list[int]:
        return list(self._place)

    def add(self, member: int, weights: Mapping[str, torch.Tensor]) -> None:
        """Hold ``weights`` (a state dict of the template's architecture) as ``member``."""
        if member in self._place:
            raise ValueError(f"member {member} is already held")
        mismatched = {f"model.{k}" for k in weights} ^ set(self._stack)
        if mismatched:
            raise ValueError(f"weights do not match the template: {sorted(mismatched)[:3]}")
        if self._free:
            place = self._free.pop()
        else:
            place = len(next(iter(self._stack.values())))
            capacity = max(1, 2 * place)
            for name, stacked in self._stack.items():
                grown = stacked.new_empty((capacity, *stacked.shape[1:]))
                grown[:place] = stacked
                self._stack[name] = grown
            self._free = list(range(capacity - 1, place, -1))
        with torch.no_grad():
            for key, value in weights.items():
                self._stack[f"model.{key}"][place].copy_(value)
        self._place[member] = place

    def remove(self, member: int) -> None:
        self._free.append(self._place.pop(member))

    def act(self, obs_BO: np.ndarray, member_B: np.ndarray) -> torch.Tensor:
        """Policy parameters ``[B, P]`` of every row under its member's weights."""
        members_G, group_B = np.unique(member_B, return_inverse=True)
        obs = torch.from_numpy(obs_BO).to(self.device)
        if len(members_G) < VMAP_FROM:
            params_BP: torch.Tensor | None = None
            for g, member in enumerate(members_G.tolist()):
                rows = torch.from_numpy(np.flatnonzero(group_B == g)).to(self.device)
                weights = {
                    name: stacked[self._place[member]] for name, stacked in self._stack.items()
                }
                params_MP = self._forward(weights, obs[rows][None])[0]
                if params_BP is None:
                    params_BP = params_MP.new_empty((len(obs_BO), params_MP.shape[-1]))
                params_BP[rows] = params_MP
            assert params_BP is not None
            return params_BP
        # Each group's rows padded to the largest group: row b sits at padded_B[b].
        count_G = np.bincount(group_B)
        m = int(count_G.max())
        order_B = np.argsort(group_B, kind="stable")
        rank_B = np.arange(len(order_B)) - np.repeat(np.cumsum(count_G) - count_G, count_G)
        padded_B = np.empty(len(order_B), np.int64)
        padded_B[order_B] = np.repeat(np.arange(len(members_G)) * m, count_G) + rank_B
        padded = torch.from_numpy(padded_B).to(self.device)
        obs_GMO = obs.new_zeros((len(members_G) * m, *obs.shape[1:]))
        obs_GMO[padded] = obs
        places = torch.tensor([self._place[g] for g in members_G.tolist()], device=self.device)
        weights = {name: stacked[places] for name, stacked in self._stack.items()}
        obs_G1MO = obs_GMO.reshape(len(members_G), 1, m, *obs.shape[1:])
        params_G1MP = vmap(self._forward)(weights, obs_G1MO)
        return params_G1MP.reshape(len(members_G) * m, -1)[padded]

    def _forward(self, weights: dict[str, torch.Tensor], obs_1MO: torch.Tensor) -> torch.Tensor:
        """One member's policy parameters ``[1, M, P]`` (first rows of no episode: the
        members are feed-forward)."""
        first_1M = torch.zeros(obs_1MO.shape[:2], dtype=torch.bool, device=obs_1MO.device)
        with torch.no_grad(), autocast(self.device, self.precision):
            params = functional_call(self._act, weights, (obs_1MO, first_1M))
        return params.float()
