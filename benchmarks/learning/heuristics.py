"""Scripted baselines the learning benchmark scores beside a trained policy, on the same
evaluation episodes: what a hand-written rule reaches where no published figure shares
the env's conventions.

A heuristic is a chooser, ``(agent index, that agent's observation) -> action``, that
plays every agent of a multi-agent env (:func:`seedrl.envs.agents.play_episode`), or the
one agent (index 0) of a single-agent env.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.learning import structured

COAST = 0.1 / 0.25
"""How far an MPE particle still travels, in units of its velocity, once it stops
pushing: each step moves it by ``velocity * dt`` (dt 0.1) and keeps ``1 - damping``
(0.75) of its velocity, a geometric sum of ``dt / damping``."""
TOLERANCE = 0.1
"""Closer than this (where it would coast to) the particle stops pushing: half of the
0.2 that one push moves its stopping point."""
NOOP, LEFT, RIGHT, DOWN, UP = range(5)
"""MPE's discrete movement actions."""


def spread_layout(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """simple_spread's observation of N agents (``[vel 2, pos 2, landmarks 2N, other
    agents 2(N-1), communication 2(N-1)]``, 6N numbers) as the agent's velocity, every
    agent's position relative to this one (itself first, ``[N, 2]``) and the landmarks'
    (``[N, 2]``)."""
    size = obs.shape[0]
    if size % 6 or size < 6:
        raise ValueError(f"not a simple_spread observation (6N numbers): {size}")
    n = size // 6
    vel = obs[0:2]
    landmarks_N2 = obs[4 : 4 + 2 * n].reshape(n, 2)
    others = obs[4 + 2 * n : 4 + 2 * n + 2 * (n - 1)].reshape(n - 1, 2)
    agents_N2 = np.concatenate([np.zeros((1, 2), obs.dtype), others])
    return vel, agents_N2, landmarks_N2


def spread_assignment(agents_N2: np.ndarray, landmarks_N2: np.ndarray) -> tuple[int, ...]:
    """The landmark of each agent (``perm[i]`` for agent i) that minimises the summed
    agent-landmark distances, over all N! assignments: a fact of the geometry, so every
    agent computing it from its own (translated) view finds the same one."""
    dist_NN = np.linalg.norm(agents_N2[:, None, :] - landmarks_N2[None, :, :], axis=-1)
    n = len(agents_N2)
    rows = np.arange(n)
    return min(itertools.permutations(range(n)), key=lambda p: float(dist_NN[rows, p].sum()))


def spread_action(obs: Any) -> int:
    """simple_spread (discrete actions): head for this agent's landmark of the team's best
    assignment, braking for where the particle would coast to, one axis at a time."""
    vel, agents_N2, landmarks_N2 = spread_layout(np.asarray(obs, np.float64))
    target = landmarks_N2[spread_assignment(agents_N2, landmarks_N2)[0]]
    dx, dy = target - COAST * vel
    if max(abs(dx), abs(dy)) < TOLERANCE:
        return NOOP
    if abs(dx) >= abs(dy):
        return RIGHT if dx > 0 else LEFT
    return UP if dy > 0 else DOWN


def _single(act: Callable[[Any], Any]) -> Callable[[int, Any], Any]:
    """A single-agent policy (observation -> action) as a chooser."""
    return lambda row, obs: act(obs)


HEURISTICS: dict[str, Callable[[int, Any], Any]] = {
    "spread": lambda row, obs: spread_action(obs),
    # the structured suite's scripted policies, each reaching its env's upper level
    **{f"structured-{name}": _single(lv.scripted) for name, lv in structured.LEVELS.items()},
}
"""The named heuristics a suite's env can be scored against (``EnvSpec.heuristic``)."""
