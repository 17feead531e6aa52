"""Exploit and explore (Jaderberg et al. 2017, "Population Based Training of Neural
Networks"): every --pbt-interval frames of its own, a member whose recent return ranks in
the bottom --pbt-fraction copies a member of the top fraction (weights, optimizer state,
the agent's normalisers) and perturbs the copied hyperparameters.

The pure parts (:func:`perturb`, :func:`choose_source`) take the random generator they
draw from; :class:`Population` is what a checkpoint keeps (each member's values, the
history of events, the generator), and :class:`Exploiter` applies an event to the live
members: under the source's lock a copy of its state, under the member's lock the copy
loaded and the trainer retuned, so neither trainer ever steps on a half-copied state.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from learner.state import checkpoint
from seedrl.config import PBT_BOUNDS, LearnerConfig, pbt_start_values

if TYPE_CHECKING:
    from learner.agents.base import Agent, AgentState
    from learner.state.stats import LearnerStats


class PolicySlot(Protocol):
    """What exploit reaches of a member (``learner.parts.PolicySlot``)."""

    @property
    def state(self) -> AgentState: ...
    @property
    def weights_lock(self) -> AbstractContextManager[Any]: ...
    @property
    def stats(self) -> LearnerStats: ...


log = logging.getLogger(__name__)

PERTURB_FACTORS = (0.8, 1.2)
"""What an exploited value is multiplied by, one of them at even odds (the PBT paper's)."""
POPULATION_KEY = "population"
"""Checkpoint key of the population's values, history and random state."""
MEMBER_PREFIX = "member"
EVENT_KEY = "pbt_events"
"""Key of a metrics record's list of this interval's exploit events."""
BEST_RETURN_KEY = "pbt/best_return"
"""Metric key of the best member's ranking return: the population's learning curve."""
PBT_PREFIX = "pbt/"
COPIED_KEY = "copied"
"""Metric keys of a member's hyperparameters and ranking return: ``pbt/NAME/KEY``."""


def member_names(population: int) -> list[str]:
    return [f"{MEMBER_PREFIX}{index}" for index in range(population)]


def perturb(
    values: dict[str, float], names: tuple[str, ...], rng: np.random.Generator, resample: float
) -> dict[str, float]:
    """``values`` with each of ``names`` explored: drawn afresh log-uniformly within its
    bounds with probability ``resample``, else multiplied by 0.8 or 1.2; clipped to its
    bounds (:data:`seedrl.config.PBT_BOUNDS`). Draws per name: one, then one more."""
    new = dict(values)
    for name in names:
        low, high = PBT_BOUNDS[name]
        if rng.random() < resample:
            value = math.exp(rng.uniform(math.log(low), math.log(high)))
        else:
            value = values[name] * PERTURB_FACTORS[int(rng.random() >= 0.5)]
        new[name] = min(max(value, low), high)
    return new


def choose_source(
    returns: dict[int, float], member: int, fraction: float, rng: np.random.Generator
) -> int | None:
    """Truncation selection: the member ``member`` copies, drawn evenly from the top
    ``fraction`` of the ranked members (``returns``: member -> recent return), when it is
    in the bottom ``fraction``; None when it is not, or fewer than two are ranked. Ties
    rank the lower index lower; each fraction holds at least one member and at most half."""
    if member not in returns or len(returns) < 2:
        return None
    order = sorted(returns, key=lambda m: (returns[m], m))
    k = min(max(1, int(len(order) * fraction)), len(order) // 2)
    if member not in order[:k]:
        return None
    top = order[-k:]
    return top[int(rng.integers(len(top)))]


class Population:
    """The members' hyperparameters and history: what a checkpoint keeps of a population."""

    def __init__(self, config: LearnerConfig) -> None:
        self.base = config
        self.names = member_names(config.population)
        self.rng = np.random.default_rng([config.seed, 0x5EED])
        base = {name: float(getattr(config, name)) for name in config.pbt_params}
        starts = pbt_start_values(config)
        self.values: list[dict[str, float]] = []
        for index in range(config.population):
            values = base if index == 0 else perturb(base, config.pbt_params, self.rng, 1.0)
            values = {**values, **{k: v[index] for k, v in starts.items()}}
            self.values.append(values)
        self.checked_frames = [0] * config.population
        """Each member's own frames at its last check."""
        self.copied_episodes = [0] * config.population
        """Each member's own episode count when it last copied another: its ranking return
        is of its episodes since (it played another policy before)."""
        self.history: list[dict[str, Any]] = []
        """Every exploit event, in order (:meth:`Exploiter.exploit`)."""
        self.slots: list[PolicySlot] = []
        """The members' slots (stats, state) once the learner holds them, in order."""

    def config_of(self, index: int) -> LearnerConfig:
        """The config member ``index`` trains with: the run's, with its own values."""
        return self.base.with_changes(**self.values[index])

    def returns(self) -> dict[int, float]:
        """Each ranked member's recent return (members with no fresh episode are unranked)."""
        ranked = {}
        for index, slot in enumerate(self.slots):
            value = recent_return(slot, self.copied_episodes[index])
            if value is not None:
                ranked[index] = value
        return ranked

    def state_dict(self) -> dict[str, Any]:
        return {
            "returns": self.returns(),
            "names": list(self.names),
            "values": copy.deepcopy(self.values),
            "frames_since_check": [
                slot.stats.frames - checked
                for slot, checked in zip(self.slots, self.checked_frames, strict=True)
            ],
            "history": copy.deepcopy(self.history),
            "rng": copy.deepcopy(self.rng.bit_generator.state),
        }

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Take back a checkpoint's population (its member names must be this run's)."""
        if list(saved["names"]) != self.names:
            raise ValueError(f"the checkpoint's population is {saved['names']}, not {self.names}")
        for index, values in enumerate(saved["values"]):
            # A param this run perturbs that the checkpoint's did not starts at the flag's.
            self.values[index] = {**self.values[index], **values}
        # A resumed member's own frames and episodes count afresh from 0 (its ranking
        # window with them): its next check comes when the saved interval is made up.
        self.checked_frames = [-int(f) for f in saved["frames_since_check"]]
        self.copied_episodes = [0] * len(self.names)
        self.history = list(saved["history"])
        self.rng.bit_generator.state = saved["rng"]


def recent_return(slot: PolicySlot, since_episode: int) -> float | None:
    """The mean of a member's last episodes (at most the learner's return window, 100)
    that ended after its episode ``since_episode``; None when none has."""
    fresh = min(slot.stats.episodes - since_episode, len(slot.stats.returns))
    if fresh <= 0:
        return None
    returns = list(slot.stats.returns)[-fresh:]
    return float(np.mean(returns))


@dataclass
class LiveMember:
    """One member as exploit reaches it: its slot (state, lock, stats) and what retunes
    its trainer to new values (``Trainer.retune``, called under its lock)."""

    slot: PolicySlot
    retune: Callable[[Agent, LearnerConfig], None]
    between_updates: AbstractContextManager[Any]
    """Held by its trainer over each whole update (``Trainer.between_updates``): the
    copy and the retune are written under it."""


class Exploiter:
    """Runs the checks of a population's live members (on the learner's supervisor)."""

    def __init__(
        self,
        population: Population,
        agent: Agent,
        members: list[LiveMember],
        agent_for: Callable[[LearnerConfig], Agent],
    ) -> None:
        """``agent``: whose ``state_dict`` copies a member; ``agent_for``: the agent that
        computes a member's losses with a config's values."""
        self.population = population
        self.agent = agent
        self.members = members
        self.agent_for = agent_for

    def due(self) -> list[tuple[int, int, dict[int, float]]]:
        """Check every member that trained --pbt-interval frames since its last check:
        (member, the member it copies, the returns ranked) for each that will copy. Reads
        the members' episode statistics: run it where they are written (the event loop)."""
        population, config = self.population, self.population.base
        plan = []
        for index, member in enumerate(self.members):
            if member.slot.stats.frames - population.checked_frames[index] < config.pbt_interval:
                continue
            population.checked_frames[index] = member.slot.stats.frames
            returns = population.returns()
            source = choose_source(returns, index, config.pbt_fraction, population.rng)
            if source is not None:
                plan.append((index, source, returns))
        return plan

    def apply(
        self, plan: list[tuple[int, int, dict[int, float]]], frames: int
    ) -> list[dict[str, Any]]:
        """The exploits :meth:`due` planned, each waiting for its member's update in
        flight to end (run it off the event loop); their events (``frames``: the
        learner's total, for the record)."""
        return [self.exploit(index, source, returns, frames) for index, source, returns in plan]

    def tick(self, frames: int) -> list[dict[str, Any]]:
        """:meth:`due` and :meth:`apply` in one call (in one thread)."""
        return self.apply(self.due(), frames)

    def exploit(
        self, index: int, source: int, returns: dict[int, float], frames: int
    ) -> dict[str, Any]:
        """Member ``index`` becomes a copy of member ``source`` with perturbed values."""
        population, config = self.population, self.population.base
        target, origin = self.members[index], self.members[source]
        with origin.slot.weights_lock:
            copied = copy.deepcopy(self.agent.state_dict(origin.slot.state))
        old = population.values[index]
        new = perturb(
            population.values[source], config.pbt_params, population.rng, config.pbt_resample
        )
        population.values[index] = new
        member_config = population.config_of(index)
        agent = self.agent_for(member_config)
        with target.between_updates, target.slot.weights_lock:
            self.agent.load_state_dict(target.slot.state, copied)
            target.retune(agent, member_config)
        population.copied_episodes[index] = target.slot.stats.episodes
        event = {
            "frames": frames,
            "member": population.names[index],
            "copied": population.names[source],
            "return": returns[index],
            "copied_return": returns[source],
            "old_values": old,
            "copied_values": dict(population.values[source]),
            "values": new,
        }
        population.history.append(event)
        log.info(
            "pbt: %s (return %.1f) copies %s (return %.1f): %s",
            event["member"], event["return"], event["copied"], event["copied_return"],
            describe_values(new),
        )  # fmt: skip
        return event

    def metrics(self) -> dict[str, Any]:
        """Each member's values and ranking return, as ``pbt/NAME/KEY``, and the best
        ranking return."""
        returns = self.population.returns()
        record: dict[str, Any] = {
            "pbt/exploits": len(self.population.history),
            BEST_RETURN_KEY: max(returns.values()) if returns else None,
        }
        for index, name in enumerate(self.population.names):
            for key, value in self.population.values[index].items():
                record[f"{PBT_PREFIX}{name}/{key}"] = value
            record[f"{PBT_PREFIX}{name}/return"] = returns.get(index)
        return record


def event_scalars(events: list[dict[str, Any]]) -> dict[str, float]:
    """This interval's exploit events as scalars a TensorBoard takes: ``pbt/NAME/copied``,
    the index of the member NAME copied (the values follow in ``pbt/NAME/<param>``)."""
    return {
        f"{PBT_PREFIX}{event['member']}/{COPIED_KEY}": float(
            event["copied"].removeprefix(MEMBER_PREFIX)
        )
        for event in events
    }


def describe_values(values: dict[str, float]) -> str:
    return " ".join(f"{key} {value:.3g}" for key, value in values.items())


def describe_event(event: dict[str, Any]) -> str:
    """An exploit event for the progress line: who copied whom, the new values."""
    return f"{event['member']}<-{event['copied']} {describe_values(event['values'])}"


MEMBER_HELP = (
    "a population's checkpoint (--population): play member N (default: the member with the "
    "best recent return when it was written)"
)
"""``--member``'s help, one text for every tool that loads a policy from a checkpoint."""


def add_member_argument(parser: Any) -> None:
    """``--member N`` on a tool that loads one policy from a checkpoint (evaluate, serve,
    export): the index :func:`member_checkpoint` takes."""
    parser.add_argument("--member", type=int, default=None, metavar="N", help=MEMBER_HELP)


def member_checkpoint(path: Any, state: dict[str, Any], member: int | None) -> dict[str, Any]:
    """A population checkpoint read as one member's (``member``: its index; None: the best
    one, :func:`best_member`), with ``member`` naming it and ``config`` the member's own, a
    one-policy run with its values (as a tool rebuilding a learner from it must read it);
    any other checkpoint as it is, where a ``member`` is a CheckpointError. The one place
    evaluate, serve and export choose a member."""
    if POPULATION_KEY not in state:
        if member is not None:
            raise checkpoint.CheckpointError(
                f"{path}: --member {member} picks a member of a population; this run trained none"
            )
        return state
    saved = state[POPULATION_KEY]
    names = list(saved["names"])
    index = best_member(saved) if member is None else member
    if not 0 <= index < len(names):
        raise checkpoint.CheckpointError(
            f"{path}: --member {index}: the population has members 0 to {len(names) - 1}"
        )
    rest = {k: v for k, v in state.items() if k != checkpoint.POLICIES}
    one = {**rest, **state[checkpoint.POLICIES][names[index]], "member": names[index]}
    if "config" in state:
        one["config"] = {
            **state["config"], **saved["values"][index], "population": 1, "pbt_start": [],
        }  # fmt: skip
    return one


def best_member(saved: dict[str, Any]) -> int:
    """The index of a checkpoint's best member: the highest return its last ranking
    gave (``returns`` in the population's state), else member 0."""
    returns = saved.get("returns") or {}
    if not returns:
        return 0
    return int(max(returns, key=lambda index: (returns[index], -int(index))))
