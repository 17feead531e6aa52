"""Training in one process, step by step: the learner's own parts (inference engine,
trajectory builder, store (queue or replay), trainer) fed by a gymnasium vector env
stepped as an actor steps it.

Frames, unrolls and updates come in a fixed order, so a seeded run gives the same numbers
every time: the learning claims of the tests, and the stability probe
(``benchmarks.learning.probe``), without the scheduling noise of real processes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np
import torch

from learner.parts import build_learner, make_trainer
from learner.serving.batcher import PendingRequest
from learner.serving.inference import Connection, FramePayload, InferenceEngine
from learner.state.stats import LearnerStats
from learner.training.trainer import Trainer
from seedrl import codec, envs
from seedrl.config import LearnerConfig

BatchHook = Callable[[Trainer, LearnerStats, list[dict[str, float] | None]], bool]
"""Called after every training batch with the trainer, the counters and the batch's
per-step scalars; True ends the run there."""


def train_synchronously(
    config: LearnerConfig, num_envs: int, frames: int, on_batch: BatchHook | None = None
) -> list[tuple[int, float]]:
    """Train ``config``'s env for ``frames`` (or until ``on_batch`` says stop) with
    ``num_envs`` envs, Box actions clipped for the env only, as actors clip them.

    Returns ``(frames, mean-100 return)`` after every training batch that has one.
    """
    learner = build_learner(config)
    engine = InferenceEngine(
        learner.agent.inference_policy(learner.model, config.seed), learner.builder,
        learner.queue, learner.stats, learner.weights_lock, learner.step_counter,
    )  # fmt: skip
    trainer = make_trainer(learner)
    slots = learner.builder.allocate(num_envs)
    conn = Connection("synchronous", "run", "in-process", num_envs, slots)
    vec_env = envs.make_vector_env(config.env, config.env_kwargs, num_envs)
    low, high = codec.action_bounds(learner.env_spec.action_space)  # what actors clip to
    obs_space = learner.env_spec.observation_space
    act_space = learner.env_spec.action_space
    bounds = [codec.action_bounds(x.spec) for x in codec.space_leaves(act_space, action=True)]
    packing = None
    if codec.is_structured(obs_space):  # what the servicer makes of one tensor per leaf
        packing = codec.LeafPacking(codec.space_leaves(obs_space))
    curve: list[tuple[int, float]] = []

    async def run() -> None:
        loop = asyncio.get_running_loop()
        obs, _ = vec_env.reset(seed=config.seed)
        reward = np.zeros(num_envs, np.float32)
        terminated = truncated = np.zeros(num_envs, np.bool_)
        while learner.stats.frames < frames:
            if packing is not None:
                obs_bytes = packing.pack_values(codec.flatten_values(obs_space, obs)).tobytes()
            else:
                obs_bytes = np.ascontiguousarray(obs, learner.builder.obs_dtype).tobytes()
            payload = FramePayload(
                conn, obs_bytes, reward.tobytes(), terminated.tobytes(), truncated.tobytes()
            )
            request = PendingRequest(payload, num_envs, loop.create_future())
            await engine.process([request])
            actions = request.future.result()
            if low is not None:
                actions = np.clip(actions, low, high)
            if codec.is_structured(act_space):  # what actors make of one tensor per leaf
                leaves = codec.action_leaves_of(act_space, actions)
                clipped = [
                    a if low_high[0] is None else np.clip(a, *low_high)
                    for a, low_high in zip(leaves, bounds, strict=True)
                ]
                actions = codec.unflatten_values(act_space, clipped)
            obs, raw_reward, raw_terminated, raw_truncated, _ = vec_env.step(actions)
            reward = np.asarray(raw_reward, np.float32)
            terminated = np.asarray(raw_terminated, np.bool_)
            truncated = np.asarray(raw_truncated, np.bool_)
            # Every batch the store will give now: a queue's full ones, or what a replay's
            # minimum fill and replay ratio allow; new priorities go back as a host sends them.
            while (unrolls := learner.queue.get(config.batch_size, timeout=0)) is not None:
                results = trainer.train_batch(unrolls)
                for sample_id, priority in trainer.take_feedback():
                    learner.queue.feedback(sample_id, priority)
                if learner.stats.return_mean is not None:
                    curve.append((learner.stats.frames, learner.stats.return_mean))
                if on_batch is not None and on_batch(trainer, learner.stats, results):
                    return

    try:
        with torch.random.fork_rng():
            asyncio.run(run())
    finally:
        vec_env.close()
    return curve
