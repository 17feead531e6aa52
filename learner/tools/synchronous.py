"""seedrl in one process: the learner's own parts (serving core, trajectory builder, store
(queue or replay), trainer) fed by a gymnasium vector env stepped as an actor steps it.

It reads top to bottom as the whole loop: the env's frame becomes rows (one per env, or
per agent of a multi-agent env, with its acting flags), the serving core acts on them and
records them into unrolls (what the learner does for every batch of actors' frames,
without the streams), the env steps on the actions, and the trainer trains on every batch
the store gives. Unlike the learner it serves raw observations (no
--normalize-observations) and has no self-play opponents.

Frames, unrolls and updates come in a fixed order, so a seeded run gives the same numbers
every time: the learning claims of the tests, and the stability probe
(``benchmarks.learning.probe``), without the scheduling noise of real processes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from learner.parts import build_learner, make_trainer
from learner.serving.rows import FrameBatch, ServingCore
from learner.state.stats import LearnerStats
from learner.state.trajectories import TrajectoryBuilder
from learner.training.trainer import Trainer
from seedrl import codec, envs
from seedrl.config import LearnerConfig
from seedrl.envs.agents import AgentEnvs
from seedrl.proto import seedrl_pb2 as pb

BatchHook = Callable[[Trainer, LearnerStats, list[dict[str, float] | None]], bool]
"""Called after every training batch with the trainer, the counters and the batch's
per-step scalars; True ends the run there."""


def train_synchronously(
    config: LearnerConfig, num_envs: int, frames: int, on_batch: BatchHook | None = None
) -> list[tuple[int, float]]:
    """Train ``config``'s env for ``frames`` (or until ``on_batch`` says stop) with
    ``num_envs`` envs, Box actions clipped for the env only, as actors clip them (a
    multi-agent env's every agent played by the learning policy).

    Returns ``(frames, mean-100 return)`` after every training batch that has one.
    """
    learner = build_learner(config)
    core = ServingCore(
        learner.agent.inference_policy(learner.model, config.seed), learner.builder,
        learner.stats, learner.weights_lock, learner.step_counter,
    )  # fmt: skip
    trainer = make_trainer(learner)
    vec_env = envs.make_vector_env(config.env, config.env_kwargs, num_envs)
    # A multi-agent env: a row per agent, and some rows wait their turn.
    agent_envs = vec_env if isinstance(vec_env, AgentEnvs) else None
    num_rows = num_envs if agent_envs is None else agent_envs.num_rows
    slot_B = learner.builder.allocate(num_rows)
    rows_of = observation_rows(learner.env_spec.observation_space, learner.builder)
    env_actions = actions_for_env(learner.env_spec.action_space)
    curve: list[tuple[int, float]] = []
    try:
        with torch.random.fork_rng():
            obs, _ = vec_env.reset(seed=config.seed)
            reward_B = np.zeros(num_rows, np.float32)
            terminated_B = truncated_B = np.zeros(num_rows, np.bool_)
            while learner.stats.frames < frames:
                # Inference: the frame's rows through the serving core, as a batch of actors'.
                acting_B = None if agent_envs is None else agent_envs.acting.copy()
                obs_BO = rows_of(obs)
                rows = FrameBatch(slot_B, obs_BO, reward_B, terminated_B, truncated_B, acting_B)
                action_BA, unrolls = core.serve(rows)
                if unrolls is not None:
                    learner.queue.put(unrolls)
                # The actor's side: step the envs on the actions.
                obs, reward, terminated, truncated, _ = vec_env.step(env_actions(action_BA))
                reward_B = np.asarray(reward, np.float32)
                terminated_B = np.asarray(terminated, np.bool_)
                truncated_B = np.asarray(truncated, np.bool_)
                # Training: every batch the store will give now (a queue's full ones, or
                # what a replay's minimum fill and replay ratio allow); new priorities go
                # back as a host sends them.
                while (batch := learner.queue.get(config.batch_size, timeout=0)) is not None:
                    results = trainer.train_batch(batch)
                    for sample_id, priority in trainer.take_feedback():
                        learner.queue.feedback(sample_id, priority)
                    if learner.stats.return_mean is not None:
                        curve.append((learner.stats.frames, learner.stats.return_mean))
                    if on_batch is not None and on_batch(trainer, learner.stats, results):
                        return curve
    finally:
        vec_env.close()
    return curve


def observation_rows(
    space: pb.SpaceSpec, builder: TrajectoryBuilder
) -> Callable[[object], np.ndarray]:
    """The vector env's observations as the rows an actor's frame carries: a dict/tuple
    observation packed into one row per env as the servicer packs its leaves' tensors, a
    stacked one's newest frame where the builder keeps the stacks (the learner takes
    frames once)."""
    packing = codec.LeafPacking(codec.space_leaves(space)) if codec.is_structured(space) else None

    def rows_of(obs: object) -> np.ndarray:
        if packing is not None:
            packed = packing.pack_values(codec.flatten_values(space, obs))  # fresh bytes
            return packed.view(builder.obs_dtype).reshape(-1, *builder.frame_shape)
        obs_BO = np.asarray(obs)
        if builder.frame_stack > 1:
            obs_BO = obs_BO[:, -1]
        return np.array(obs_BO, builder.obs_dtype)

    return rows_of


def actions_for_env(space: pb.SpaceSpec) -> Callable[[np.ndarray], object]:
    """Actions as an actor hands them to its envs: Box leaves clipped to their bounds, a
    dict/tuple action unflattened from its one tensor per leaf."""
    low, high = codec.action_bounds(space)
    leaves = codec.space_leaves(space, action=True)
    bounds = [codec.action_bounds(leaf.spec) for leaf in leaves]

    def for_env(action_BA: np.ndarray) -> object:
        if low is not None:
            action_BA = np.clip(action_BA, low, high)
        if not codec.is_structured(space):
            return action_BA
        clipped = [
            a if low_high[0] is None else np.clip(a, *low_high)
            for a, low_high in zip(codec.action_leaves_of(space, action_BA), bounds, strict=True)
        ]
        return codec.unflatten_values(space, clipped)

    return for_env
