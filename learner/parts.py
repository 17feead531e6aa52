"""The assembled parts of one learner process, and how they are built, restored and saved.

:class:`Learner` holds what serving and training share (the agent, model, optimizer,
trajectory builder, unroll store, counters); :func:`build_learner` makes it from a config
(restored from the checkpoint with ``--resume``). The trainer hosts and the inference
engine each take what they need from it, in one place each.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from learner.agents.base import Agent, AgentState, SavedStoreError, Store
from learner.agents.models import (
    ActionHead,
    UnsupportedSetup,
    choose_torso,
    has_action_mask,
    resolve_device,
)
from learner.agents.optim import apply_optimizer_settings
from learner.agents.policy import set_compute_threads
from learner.agents.registry import AgentRecipe
from learner.checkpointing import BestKeeper, Capture, Checkpointer
from learner.population.pbt import POPULATION_KEY, Population
from learner.state import checkpoint
from learner.state.counters import StepCounter
from learner.state.files import Lease
from learner.state.normalize import Normalizer, make_normalizer, normalized_space
from learner.state.stats import LearnerStats
from learner.state.trajectories import TrajectoryBuilder, Unrolls, stored_frame_stack
from learner.training.allocator import keep_freed_memory
from learner.training.trainer import Trainer, TrainerParts, agent_training_state
from seedrl import codec, envs
from seedrl.config import DEFAULT_POLICY, LearnerConfig, policy_pairs, to_json_dict
from seedrl.proto import seedrl_pb2 as pb

if TYPE_CHECKING:
    from learner.league.league import League
    from learner.state.dataset import EpisodeRecorder

log = logging.getLogger(__name__)

ONE_POLICY = "default"
"""The name of a learner's policy when --policy-mapping names none."""
SELF_PLAY_KEY = "self_play"
"""Checkpoint key of the league (pool of snapshots, ratings) with --self-play."""


@dataclass
class PolicySlot:
    """One trained policy of a learner: its agent state, where its unrolls wait, its
    trainer's counters. Only this policy's agents' frames reach its store."""

    name: str
    state: AgentState
    queue: Store
    step_counter: StepCounter
    weights_lock: threading.Lock
    stats: LearnerStats
    """Its trainer's scalars and its own agents' episodes (the learner's stats, alone)."""


@dataclass
class Learner:
    """The assembled parts of one learner process.

    ``state``, ``queue``, ``step_counter`` and ``weights_lock`` are the first policy's;
    :attr:`policies` names every policy (one, unless --policy-mapping names several).
    """

    config: LearnerConfig
    env_spec: Any
    device: torch.device
    agent: Agent
    state: AgentState
    """Everything the agent trains (networks, optimizers, what else it keeps)."""
    recipe: AgentRecipe
    """How another process builds the agent again (the trainer process's child)."""
    stats: LearnerStats
    builder: TrajectoryBuilder
    queue: Store
    step_counter: StepCounter
    weights_lock: threading.Lock
    normalizer: Normalizer | None = None
    league: League | None = None
    """With --self-play: the pool of past selves and the ratings (checkpointed)."""
    recorder: EpisodeRecorder | None = None
    """With --record-dataset: the stream's episodes into a Minari dataset (set by serve)."""
    learner_run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    lease: Lease | None = None
    """Set once serving: this learner's claim on the run directory, which every checkpoint
    rename checks (None: no other learner shares it)."""
    policies: dict[str, PolicySlot] = field(default_factory=dict)
    """Every trained policy by name, the first one holding ``state`` and ``queue``
    (default: that one alone, named :data:`ONE_POLICY`)."""
    agent_policy: np.ndarray | None = None
    """``[A]``: the index into :attr:`policies` of each agent of a multi-agent env (None:
    one policy plays every agent)."""
    population: Population | None = None
    """With --population: the members' hyperparameters and history; :attr:`policies`
    holds the members in its order."""

    def __post_init__(self) -> None:
        if not self.policies:
            self.policies = {
                ONE_POLICY: PolicySlot(
                    ONE_POLICY,
                    self.state,
                    self.queue,
                    self.step_counter,
                    self.weights_lock,
                    self.stats,
                )
            }

    @property
    def several_policies(self) -> bool:
        return len(self.policies) > 1

    @property
    def learner_steps(self) -> int:
        """Optimizer steps of every policy together."""
        return sum(slot.step_counter.value for slot in self.policies.values())

    @property
    def head(self) -> ActionHead:
        return self.agent.head

    @property
    def model(self) -> Any:
        """The network inference runs."""
        return self.state.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The inference network's optimizer."""
        return self.state.optimizer

    def trainer_parts(self, policy: str | None = None) -> TrainerParts:
        """What a trainer of this learner's shared state is built from (every host's):
        of ``policy`` (default: the first)."""
        slot = self.policies[policy] if policy is not None else next(iter(self.policies.values()))
        config, agent = self.config, self.agent
        if self.population is not None:  # a member trains with its own values
            config = self.population.config_of(list(self.policies).index(slot.name))
            agent = self.member_agent(config)
        return TrainerParts(
            config=config,
            agent=agent,
            state=slot.state,
            device=self.device,
            stats=slot.stats,
            weights_lock=slot.weights_lock,
            step_counter=slot.step_counter,
            recipe=self.recipe,
        )

    def member_agent(self, config: LearnerConfig) -> Agent:
        """The agent that computes a population member's losses with ``config``'s values
        (built as the learner's, from its recipe)."""
        return dataclasses.replace(self.recipe, config=config).agent(self.device)


def describe_env(config: LearnerConfig) -> pb.EnvSpec:
    """The env's description, or UnsupportedSetup naming a space seedrl cannot carry."""
    try:
        return envs.describe_env(config.env, config.env_kwargs)
    except codec.UnsupportedSpace as exc:
        raise UnsupportedSetup(f"{config.env}: {exc}") from exc


def build_learner(config: LearnerConfig) -> Learner:
    """Model, optimizer and data path for ``config`` (restored from a checkpoint with --resume)."""
    keep_freed_memory()
    set_compute_threads(config.torch_threads)
    torch.manual_seed(config.seed)
    np.random.seed(config.seed)
    device = resolve_device(config.device)
    env_spec = describe_env(config)
    league = make_league(config, env_spec)
    obs_space = env_spec.observation_space
    masked = has_action_mask(obs_space, config.action_mask)
    obs_shape = codec.spec_shape(obs_space)
    mask_leaf = config.action_mask if masked else ""
    normalizer = None
    if config.normalize_observations:  # the network (and the unrolls) see float32 leaves
        normalizer = make_normalizer(obs_space, mask_leaf)
        obs_space = normalized_space(obs_space, mask_leaf)
    if codec.is_structured(obs_space):  # kept as packed uint8 rows (codec.LeafPacking)
        obs_shape = (codec.LeafPacking(codec.space_leaves(obs_space)).row_bytes,)
    torso = choose_torso(env_spec.observation_space, config.model)
    recipe = AgentRecipe.of(config, env_spec.action_space, obs_space, torso, masked)
    agent, agent_state = recipe.build(device)
    stats = LearnerStats(log_episodes=config.log_episodes, time_phases=config.time_phases)
    step_counter = StepCounter()
    names, agent_policy = assign_policies(config, env_spec)
    if len(names) == 1:  # a mapping of every agent to one policy: the learner's only one
        agent_policy = None
    population = None
    if config.population > 1:
        population = Population(config)
        names = population.names
        for name in config.pbt_params:
            if not hasattr(config, name):
                raise UnsupportedSetup(
                    f"--pbt-params {name}: --agent {config.agent} has no such knob"
                )
    policies: dict[str, PolicySlot] = {}
    if agent_policy is not None or population is not None:
        # each policy its own state, store, counters and stats
        for index, name in enumerate(names):
            first = index == 0
            policies[name] = PolicySlot(
                name, agent_state if first else agent.build(obs_space, torso),
                agent.make_store(), step_counter if first else StepCounter(),
                threading.Lock(), LearnerStats(),
            )  # fmt: skip
    if population is not None:
        population.slots = list(policies.values())
    source = checkpoint.load_for_resume(config) if config.resume else None
    resumed = source is not None
    if source is not None:
        path, loaded = source
        checkpoint.check_policies(path, loaded, names if policies else [])

        def load_training(saved: dict[str, Any]) -> None:
            if policies:
                load_policies(agent, policies, saved)
            else:
                agent.load_state_dict(agent_state, saved)

        saved = checkpoint.restore(
            path, load_training, stats, StepCounter() if policies else step_counter,
            env_spec, normalizer, loaded,
        )  # fmt: skip
        if league is not None and SELF_PLAY_KEY in saved:
            league.load_state_dict(saved[SELF_PLAY_KEY])
        if population is not None:
            if POPULATION_KEY not in saved:
                raise checkpoint.CheckpointError(f"{path}: holds no population's values")
            population.load_state_dict(saved[POPULATION_KEY])
        for slot in policies.values() or [None]:
            for optimizer in (agent_state if slot is None else slot.state).optimizers.values():
                apply_optimizer_settings(optimizer, config)
        defaults = checkpoint.schedule_states(LearnerConfig())
        for key, state in checkpoint.schedule_states(config).items():
            # Older checkpoints: a missing schedule is assumed unchanged, and a setting
            # added since reads as its default, the behaviour it was trained under.
            saved_state = {**defaults[key], **saved[key]} if key in saved else state
            if saved_state != state:
                log.warning(
                    "the checkpoint's %s was %s; this run's flags say %s",
                    key.replace("_", " "), saved_state, state,
                )  # fmt: skip
    if population is not None:  # each member's optimizers at its own rate, from the start
        for index, slot in enumerate(policies.values()):
            for optimizer in slot.state.optimizers.values():
                apply_optimizer_settings(optimizer, population.config_of(index))
    lstm_size = agent_state.model.spec.lstm_size
    unroll_length, overlap = agent.sequence_layout()
    builder = TrajectoryBuilder(
        unroll_length=unroll_length,
        obs_shape=obs_shape,
        obs_dtype=obs_space.dtype or "uint8",
        action_shape=agent.head.action_shape,
        action_dtype=str(agent.head.action_dtype).removeprefix("torch."),
        param_size=agent.head.param_size,
        core_state_sizes=(lstm_size, lstm_size) if lstm_size else (),
        frame_stack=stored_frame_stack(config, env_spec.observation_space),
        overlap=overlap,
        return_discount=agent.return_discount,
    )
    store = policies[names[0]].queue if policies else agent.make_store()
    if resumed and not policies and config.replay_checkpoint and config.replay_path.exists():
        restore_store(store, config.replay_path, builder.empty_unrolls(1))
    return Learner(
        config=config,
        env_spec=env_spec,
        device=device,
        agent=agent,
        state=agent_state,
        recipe=recipe,
        stats=stats,
        builder=builder,
        queue=store,
        step_counter=step_counter,
        normalizer=normalizer,
        league=league,
        weights_lock=policies[names[0]].weights_lock if policies else threading.Lock(),
        policies=policies,
        agent_policy=agent_policy,
        population=population,
    )


def assign_policies(
    config: LearnerConfig, env_spec: pb.EnvSpec
) -> tuple[list[str], np.ndarray | None]:
    """--policy-mapping against the env's agents: the policies' names in the order first
    named, and each agent's index among them (None: no mapping, one policy); an agent the
    env does not have, or a policy left with no agent, is UnsupportedSetup (one line)."""
    pairs = policy_pairs(config)
    if not pairs:
        return [ONE_POLICY], None
    agents = list(env_spec.agents)
    if not agents:
        raise UnsupportedSetup(
            f"--policy-mapping maps the agents of a multi-agent env; {config.env} has one agent"
        )
    names = list(dict.fromkeys(policy for _, policy in pairs))
    given = dict(pairs)
    unknown = [agent for agent in given if agent != DEFAULT_POLICY and agent not in agents]
    if unknown:
        raise UnsupportedSetup(
            f"--policy-mapping names agent {unknown[0]!r}; {config.env} has agents {agents}"
        )
    rest = given.get(DEFAULT_POLICY, names[0])
    agent_policy = np.array([names.index(given.get(agent, rest)) for agent in agents], np.int64)
    idle = [name for index, name in enumerate(names) if index not in agent_policy]
    if idle:
        raise UnsupportedSetup(f"--policy-mapping: policy {idle[0]!r} has no agent of {agents}")
    return names, agent_policy


def load_policies(agent: Agent, policies: dict[str, PolicySlot], saved: dict[str, Any]) -> None:
    """Each policy's state and step count from a checkpoint of several policies."""
    for name, slot in policies.items():
        own = saved[checkpoint.POLICIES][name]
        agent.load_state_dict(slot.state, own)
        slot.step_counter.value = int(own["learner_steps"])
        slot.stats.learner_steps = slot.step_counter.value


def make_league(config: LearnerConfig, env_spec: pb.EnvSpec) -> League | None:
    """With --self-play, the pool and ratings; UnsupportedSetup (one line) for an env that
    is not a two-player game, or a setup the opponents cannot share."""
    if not config.self_play:
        return None
    agents = list(env_spec.agents)
    if len(agents) != 2:
        found = f"agents {agents}" if agents else "one agent"
        raise UnsupportedSetup(
            f"--self-play needs a two-player env (two agents); {config.env} has {found}"
        )
    if config.lstm:
        raise UnsupportedSetup("--self-play serves feed-forward policies: drop --lstm")
    from learner.league import opponents  # the league loads only for self-play
    from learner.league.league import League

    try:  # built now, so a bad name fails here, not at the first game
        scripted = [
            opponents.build(name, config.env, config.seed + 1 + index, "--fixed-opponents")
            for index, name in enumerate(config.fixed_opponents)
        ]
    except ValueError as exc:
        raise UnsupportedSetup(str(exc)) from None
    return League.for_config(config, scripted)


def restore_store(store: Store, path: Path, template: Unrolls) -> None:
    """Refill a resumed run's store from ``path``; one that does not fit this run (or is
    unreadable) is left out with a warning: the run refills the store as a fresh one would."""
    try:
        restored = store.load(path, template)
    except SavedStoreError as exc:
        log.warning("%s; starting with an empty replay", exc)
        return
    log.info("took back %d stored sequences from %s", restored, path)


def make_trainer(learner: Learner) -> Trainer:
    """The trainer over a learner's shared agent, state and counters."""
    return Trainer(learner.trainer_parts())


def capture_training(learner: Learner) -> checkpoint.TrainingState:
    """The learner's own agent state now (each policy's), with no trainer host in between."""
    if not learner.several_policies:
        return agent_training_state(
            learner.agent, learner.state, learner.weights_lock, learner.step_counter
        )
    return checkpoint.TrainingState.of_policies(
        {
            name: agent_training_state(
                learner.agent, slot.state, slot.weights_lock, slot.step_counter
            )
            for name, slot in learner.policies.items()
        }
    )


class _NoReplay:
    """The store a checkpoint of several policies saves: none (each policy's replay is
    refilled on --resume as a fresh run's)."""

    def save(self, path: Path, lease: Lease | None = None) -> int:
        return 0


def make_checkpointer(
    learner: Learner,
    capture: Capture | None = None,
    *,
    counters: Callable[[], tuple[int, int] | None] = lambda: None,
    keeper: BestKeeper | None = None,
    writes: bool = True,
    start: float | None = None,
) -> Checkpointer:
    """The checkpointer of ``learner``'s state, renamed under its lease; ``capture`` gives
    the training state (default: the learner's own model and optimizer)."""
    extra_state: dict[str, Callable[[], Any]] = {}
    if learner.normalizer is not None:
        extra_state["obs_normalizer"] = learner.normalizer.state_dict
    if learner.league is not None:
        extra_state[SELF_PLAY_KEY] = learner.league.state_dict
    if learner.population is not None:
        extra_state[POPULATION_KEY] = learner.population.state_dict
    return Checkpointer(
        learner.config,
        capture or (lambda: capture_training(learner)),
        learner.stats,
        learner.env_spec,
        to_json_dict(learner.model.spec),
        _NoReplay() if learner.several_policies else learner.queue,
        extra_state=extra_state,
        counters=counters,
        keeper=keeper,
        yardstick=learner.league.yardstick if learner.league is not None else None,
        lease=learner.lease,
        writes=writes,
        start=start,
    )


def save_checkpoint(
    learner: Learner,
    training: checkpoint.TrainingState | None = None,
    counters: tuple[int, int] | None = None,
    best: float | None = None,
    best_measure: str = checkpoint.BY_RETURN,
    replay: bool = True,
) -> None:
    """Write the checkpoint of ``training`` (default: the learner's own model and
    optimizer) now, whatever the cadence (:meth:`Checkpointer.write`)."""
    if training is None:
        training = capture_training(learner)
    make_checkpointer(learner).write(training, counters, best, best_measure, replay)
