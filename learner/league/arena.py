"""Two-player games between a policy and an opponent, in process: win / draw / loss per
seat, what ``python -m learner evaluate --opponent ...`` prints.

The games are PettingZoo AEC games (Connect Four), stepped turn by turn with
``agent_iter``; each agent's return is the sum of the rewards ``last()`` hands it, and
the one with more wins (zero-sum games give +1 / -1, a draw 0 / 0). The policy plays
``games`` games in the first seat and ``games`` in the second, since the side to move
first can make a game easy or hard.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from collections.abc import Callable
from typing import Any, Protocol

from learner.league.pool import Outcome
from learner.state.checkpoint import one_line
from seedrl import envs

SEATS = ("first", "second")


class Player(Protocol):
    def reset(self) -> None: ...

    def act(self, obs: Any) -> Any: ...


class ScriptedPlayer:
    """A function of the observation as a :class:`Player` (its state is its own business)."""

    def __init__(self, act: Callable[[Any], Any]) -> None:
        self._act = act

    def reset(self) -> None:
        pass

    def act(self, obs: Any) -> Any:
        return self._act(obs)


PETTINGZOO_MODULE = re.compile(r"^pettingzoo\.\w+\.\w+_v\d+$")
"""PettingZoo's module form of a game id (``pettingzoo.classic.connect_four_v3``), the
form the learner's env family uses."""
REGISTRY_ID = re.compile(r"^\w+/[\w-]+-v\d+$")
"""PettingZoo's registry form (``classic/connect_four-v3``, PettingZoo >= 1.27)."""


def is_pettingzoo_id(env_id: str) -> bool:
    """An id naming one of PettingZoo's own games (installed code, safe to build)."""
    return bool(PETTINGZOO_MODULE.match(env_id) or REGISTRY_ID.match(env_id))


def make_aec_env(env_id: str, env_kwargs: dict[str, Any] | None = None) -> Any:
    """A two-player PettingZoo AEC env from an id: PettingZoo's module path
    (``pettingzoo.classic.connect_four_v3``: its ``env()``) or registry id
    (``classic/connect_four-v3``), or a ``module:callable`` returning an AEC or Parallel
    env (a Parallel one converted with PettingZoo's ``parallel_to_aec``). ValueError in
    one line otherwise."""
    kwargs = dict(env_kwargs or {})
    if PETTINGZOO_MODULE.match(env_id):
        env = _from_module(env_id, kwargs)
    elif REGISTRY_ID.match(env_id):
        env = _from_registry(env_id, kwargs)
    elif ":" in env_id:
        env = _from_factory(env_id, kwargs)
    else:
        raise ValueError(
            f"{env_id}: not a PettingZoo game (give a PettingZoo id such as "
            "pettingzoo.classic.connect_four_v3, or a module:callable that returns one)"
        )
    if not hasattr(env, "agent_iter") and hasattr(env, "possible_agents"):
        from pettingzoo.utils.conversions import parallel_to_aec

        env = parallel_to_aec(env)
    if not hasattr(env, "agent_iter"):
        raise ValueError(f"{env_id}: built {type(env).__name__}, not a PettingZoo env")
    if len(env.possible_agents) != 2:
        raise ValueError(
            f"{env_id}: {len(env.possible_agents)} agents ({', '.join(env.possible_agents)}); "
            "evaluate --opponent plays two-player games"
        )
    return env


def _from_module(env_id: str, kwargs: dict[str, Any]) -> Any:
    """The learner's own way to build the game (its env family), so both play the same
    API of it; a Parallel env is converted by the caller."""
    from seedrl.envs.pettingzoo import env_factory

    return env_factory(env_id)(**kwargs)


def _from_registry(env_id: str, kwargs: dict[str, Any]) -> Any:
    try:
        from pettingzoo import make
    except ImportError as exc:
        raise ValueError(
            f"{env_id}: PettingZoo's registry ids need pettingzoo>=1.27 (or use the module "
            "path, e.g. pettingzoo.classic.connect_four_v3)"
        ) from exc
    try:
        return make("aec", env_id, **kwargs)
    except Exception as exc:  # the registry's NameNotFound, a kwarg the game does not take
        raise ValueError(f"{env_id}: {one_line(exc)}") from exc


def _from_factory(env_id: str, kwargs: dict[str, Any]) -> Any:
    module_name, _, attr = env_id.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{env_id}: cannot import {module_name!r} ({exc})") from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"{env_id}: {module_name!r} has no callable {attr!r}")
    return factory(**kwargs)


def check_aec_env_allowed(env_id: str, allowed: list[str], named_by: str) -> None:
    """A ``module:callable`` game named by a checkpoint runs only when this command's user
    allows its module (PettingZoo's own modules are installed code, always allowed)."""
    if not is_pettingzoo_id(env_id):
        envs.check_env_allowed(env_id, allowed, named_by)


@dataclasses.dataclass
class SeatResult:
    """The policy's results from one seat."""

    wins: int = 0
    draws: int = 0
    losses: int = 0
    cut: int = 0
    """Games stopped at the step cap before they ended (counted as draws)."""

    @property
    def games(self) -> int:
        return self.wins + self.draws + self.losses

    def add(self, outcome: Outcome) -> None:
        if outcome is Outcome.WIN:
            self.wins += 1
        elif outcome is Outcome.DRAW:
            self.draws += 1
        else:
            self.losses += 1

    def rates(self) -> dict[str, float]:
        n = max(1, self.games)
        return {"win": self.wins / n, "draw": self.draws / n, "loss": self.losses / n}

    def line(self) -> str:
        r = self.rates()
        cut = f", {self.cut} cut at the step cap" if self.cut else ""
        return (
            f"win {100 * r['win']:.1f} %  draw {100 * r['draw']:.1f} %  "
            f"loss {100 * r['loss']:.1f} %  ({self.wins}/{self.draws}/{self.losses} of "
            f"{self.games}{cut})"
        )


@dataclasses.dataclass
class MatchResult:
    """A policy's games against one opponent, by the seat the policy sat in."""

    opponent: str
    seats: dict[str, SeatResult]
    agents: tuple[str, str]
    """The env's agent names of the first and second seat."""

    @property
    def total(self) -> SeatResult:
        total = SeatResult()
        for seat in self.seats.values():
            for field in ("wins", "draws", "losses", "cut"):
                setattr(total, field, getattr(total, field) + getattr(seat, field))
        return total

    def summary(self) -> str:
        lines = [
            f"  {seat:<6} ({agent}): {self.seats[seat].line()}"
            for seat, agent in zip(SEATS, self.agents, strict=True)
        ]
        lines.append(f"  both seats:        {self.total.line()}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "opponent": self.opponent,
            "seats": {
                seat: {**dataclasses.asdict(r), **r.rates()} for seat, r in self.seats.items()
            },
            "total": {**dataclasses.asdict(self.total), **self.total.rates()},
        }


def play_game(
    env: Any, players: dict[str, Player], seed: int, max_steps: int
) -> tuple[dict[str, float], bool]:
    """One game: each agent's return and whether the game ended before ``max_steps`` turns."""
    env.reset(seed=seed)
    for player in players.values():
        player.reset()
    returns = dict.fromkeys(env.possible_agents, 0.0)
    turns = 0
    for agent in env.agent_iter():
        obs, reward, terminated, truncated, _ = env.last()
        returns[agent] += float(reward)
        if terminated or truncated:
            env.step(None)  # the AEC way to retire a finished agent
            continue
        if turns >= max_steps:
            return returns, False
        env.step(players[agent].act(obs))
        turns += 1
    return returns, True


def outcome_of(returns: dict[str, float], me: str, other: str) -> Outcome:
    if returns[me] > returns[other]:
        return Outcome.WIN
    if returns[me] < returns[other]:
        return Outcome.LOSS
    return Outcome.DRAW


def seat_agents(env: Any, learner_first: bool) -> tuple[str, str]:
    """(the policy's agent, the opponent's) for the seat the policy takes."""
    first, second = env.possible_agents
    return (first, second) if learner_first else (second, first)


def play_match(
    env: Any,
    policy: Player,
    opponent: Player,
    games: int,
    opponent_name: str = "opponent",
    seed: int = 0,
    max_steps: int = 10_000,
) -> MatchResult:
    """``games`` games with the policy first, then ``games`` with it second (game ``g`` of
    each seat reset with ``seed + g``)."""
    if games < 1:
        raise ValueError(f"--games must be >= 1, got {games}")
    seats: dict[str, SeatResult] = {}
    for seat, learner_first in zip(SEATS, (True, False), strict=True):
        me, other = seat_agents(env, learner_first)
        result = SeatResult()
        for game in range(games):
            returns, ended = play_game(env, {me: policy, other: opponent}, seed + game, max_steps)
            result.add(outcome_of(returns, me, other))
            result.cut += not ended
        seats[seat] = result
    return MatchResult(opponent_name, seats, seat_agents(env, learner_first=True))
