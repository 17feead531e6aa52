"""The one serving core (``learner.serving.rows.ServingCore``): rows in, every row's action out.

The inference engine serves actors' streams with it and the synchronous driver serves a
vector env's rows with it; these check that the streams add nothing to what the core
computes, that a single-agent batch is a multi-agent one where every row acts, and that
in a multi-agent batch only the rows that act reach the policy, the waiting ones get
action 0 and their rewards go to their slot's next step.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest
import torch

from learner.agents.models import action_head, build_model
from learner.agents.policy import inference_policy
from learner.serving.batcher import PendingRequest
from learner.serving.inference import Connection, FramePayload, InferenceEngine
from learner.serving.rows import FrameBatch, ServingCore
from learner.state.counters import StepCounter
from learner.state.stats import LearnerStats
from learner.state.trajectories import TrajectoryBuilder, UnrollQueue, Unrolls
from seedrl.proto import seedrl_pb2 as pb

T = 4
STREAMS, K = 3, 2
ROWS = STREAMS * K


def _builder(lstm_size: int, action_dtype: str = "int64") -> TrajectoryBuilder:
    states = (lstm_size, lstm_size) if lstm_size else ()
    return TrajectoryBuilder(T, (4,), np.float32, (), action_dtype, 3, states)


def _policy(lstm_size: int) -> tuple[Any, int]:
    """A seeded policy: the numpy MLP (own generator) or the torch LSTM (torch's)."""
    torch.manual_seed(0)
    head = action_head(pb.SpaceSpec(kind="discrete", n=3))
    spec = pb.SpaceSpec(kind="box", shape=[4], dtype="float32")
    model = build_model(spec, head, "mlp", (16,), lstm_size=lstm_size)
    backend = "torch" if lstm_size else "numpy"
    return inference_policy(model, head, torch.device("cpu"), backend, 7), lstm_size


def _script(steps: int, seed: int = 0) -> list[tuple[np.ndarray, ...]]:
    """Random rows of ROWS envs: observations, rewards (0 on every episode's first row,
    as an env gives them), terminated, truncated."""
    rng = np.random.default_rng(seed)
    frames: list[tuple[np.ndarray, ...]] = []
    first = np.ones(ROWS, bool)
    for _ in range(steps):
        obs = rng.normal(size=(ROWS, 4)).astype(np.float32)
        reward = np.where(first, 0.0, rng.normal(size=ROWS)).astype(np.float32)
        terminated, truncated = rng.random(ROWS) < 0.15, rng.random(ROWS) < 0.05
        frames.append((obs, reward, terminated, truncated))
        first = terminated | truncated
    return frames


def _drained(queue: UnrollQueue) -> list[Unrolls]:
    return [queue.get(1) for _ in range(len(queue))]  # type: ignore[misc]


def _through_streams(policy: Any, lstm_size: int, script: list[tuple[np.ndarray, ...]]):
    """The rows as STREAMS actors of K envs send them, through the engine's batches."""
    builder, queue = _builder(lstm_size), UnrollQueue(10_000)
    engine = InferenceEngine(
        policy, builder, queue, LearnerStats(), threading.Lock(), StepCounter()
    )
    conns = [Connection(f"a{i}", "run", "peer", K, builder.allocate(K)) for i in range(STREAMS)]
    answers: list[np.ndarray] = []

    async def run() -> None:
        loop = asyncio.get_running_loop()
        for obs, reward, terminated, truncated in script:
            batch = []
            for i, conn in enumerate(conns):
                part = slice(i * K, (i + 1) * K)
                payload = FramePayload(
                    conn, obs[part].tobytes(), reward[part].tobytes(),
                    terminated[part].tobytes(), truncated[part].tobytes(),
                )  # fmt: skip
                batch.append(PendingRequest(payload, K, loop.create_future()))
            await engine.process(batch)
            answers.append(np.concatenate([r.future.result() for r in batch]))

    asyncio.run(run())
    return answers, _drained(queue)


def _through_core(
    policy: Any, lstm_size: int, script: list[tuple[np.ndarray, ...]], every_row_acts: bool
):
    """The same rows handed to the core as numpy arrays, as the synchronous driver does;
    with ``every_row_acts``, as a multi-agent batch whose rows all act."""
    builder, queue = _builder(lstm_size), UnrollQueue(10_000)
    core = ServingCore(policy, builder, LearnerStats(), threading.Lock(), StepCounter())
    slot_B = builder.allocate(ROWS)
    acting_B = np.ones(ROWS, bool) if every_row_acts else None
    answers: list[np.ndarray] = []
    for obs, reward, terminated, truncated in script:
        action_BA, unrolls = core.serve(
            FrameBatch(slot_B, obs, reward, terminated, truncated, acting_B)
        )
        answers.append(action_BA.copy())
        if unrolls is not None:
            queue.put(unrolls)
    return answers, _drained(queue)


def _assert_same_unrolls(got: list[Unrolls], expected: list[Unrolls]) -> None:
    assert len(got) == len(expected) > 0
    for a, b in zip(got, expected, strict=True):
        for field in ("obs", "first", "reward", "terminated", "truncated", "action"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)
        np.testing.assert_allclose(a.policy_params, b.policy_params, rtol=1e-6)
        for sa, sb in zip(a.core_state, b.core_state, strict=True):
            np.testing.assert_allclose(sa, sb, rtol=1e-6)


@pytest.mark.parametrize("lstm_size", [0, 5], ids=["numpy-mlp", "torch-lstm"])
def test_the_engine_and_the_synchronous_path_serve_rows_with_one_core(lstm_size: int) -> None:
    """The same rows through actors' streams (engine) and as arrays (the synchronous
    driver's way) give the same actions and the same unrolls for a seeded policy."""
    script = _script(3 * T + 2)
    streamed = _through_streams(*_policy(lstm_size), script)
    direct = _through_core(*_policy(lstm_size), script, every_row_acts=False)
    for step, (a, b) in enumerate(zip(streamed[0], direct[0], strict=True)):
        np.testing.assert_array_equal(a, b, err_msg=f"step {step}")
    _assert_same_unrolls(streamed[1], direct[1])


def test_a_single_agent_batch_is_one_where_every_row_acts() -> None:
    script = _script(3 * T + 2, seed=1)
    single = _through_core(*_policy(0), script, every_row_acts=False)
    every = _through_core(*_policy(0), script, every_row_acts=True)
    for a, b in zip(single[0], every[0], strict=True):
        np.testing.assert_array_equal(a, b)
    _assert_same_unrolls(single[1], every[1])


def _recording_policy(calls: list[tuple[np.ndarray, np.ndarray]]) -> Any:
    """Action 10 + the observation's first value; records (observations, slots) it saw."""

    def policy(obs_BO, first_B, state, slot_B=None):
        calls.append((np.array(obs_BO), np.array(slot_B)))
        action = (10 + obs_BO[:, 0]).astype(np.int64)
        return action, np.zeros((len(obs_BO), 3), np.float32), ()

    return policy


def test_a_multi_agent_batch_serves_only_the_rows_that_act() -> None:
    """Three agents' rows: only the acting rows reach the policy and the trajectories,
    the waiting ones get action 0, and a waiting row's reward goes to its slot's next
    step (an agent's first step carries none)."""
    calls: list[tuple[np.ndarray, np.ndarray]] = []
    builder = TrajectoryBuilder(T, (2,), np.float32, (), np.int64, 3)
    stats = LearnerStats()
    core = ServingCore(_recording_policy(calls), builder, stats, threading.Lock(), StepCounter())
    slot_B = builder.allocate(3)
    no = np.zeros(3, bool)

    def serve(step: int, acting: list[bool], reward: list[float]) -> np.ndarray:
        obs_BO = np.array([[10 * step + row, 0] for row in range(3)], np.float32)
        rows = FrameBatch(slot_B, obs_BO, np.array(reward, np.float32), no, no, np.array(acting))
        action_BA, _ = core.serve(rows)
        return action_BA

    np.testing.assert_array_equal(serve(0, [True, False, True], [0, 0, 0]), [10, 0, 12])
    np.testing.assert_array_equal(serve(1, [False, True, True], [1, 2, 3]), [0, 21, 22])
    np.testing.assert_array_equal(serve(2, [True, False, False], [4, 5, 6]), [30, 0, 0])
    assert [obs[:, 0].tolist() for obs, _ in calls] == [[0, 2], [11, 12], [20]]
    assert [slots.tolist() for _, slots in calls] == [
        slot_B[[0, 2]].tolist(),
        slot_B[[1, 2]].tolist(),
        slot_B[[0]].tolist(),
    ]
    assert stats.frames == 5, "only the acting rows are frames of the learning policy"
    recorded = {
        row: builder.reward_SR[slot, : builder.position_S[slot]].tolist()
        for row, slot in enumerate(slot_B)
    }
    # Row 0 waited with reward 1, then acted with 4: its second step carries 1 + 4.
    # Row 1's first step carries no reward (2 came before it); row 2: 0 then 3.
    assert recorded == {0: [0.0, 5.0], 1: [0.0], 2: [0.0, 3.0]}
    assert builder.pending_reward_S[slot_B[1]] == 5.0, "row 1's wait waits for its next step"


def test_the_synchronous_driver_sends_the_newest_frame_where_the_learner_keeps_stacks() -> None:
    """As an actor does when the learner takes frames once: a stacked observation's rows
    carry only its newest frame, which the builder pushes onto each slot's stack."""
    from learner.tools.synchronous import observation_rows

    space = pb.SpaceSpec(kind="box", shape=[4, 3], dtype="float32")
    stacked = TrajectoryBuilder(T, (4, 3), np.float32, (), np.int64, 3, frame_stack=4)
    whole = TrajectoryBuilder(T, (4, 3), np.float32, (), np.int64, 3)
    obs = np.arange(2 * 4 * 3, dtype=np.float64).reshape(2, 4, 3)
    rows = observation_rows(space, stacked)(obs)
    np.testing.assert_array_equal(rows, obs[:, -1])
    assert rows.dtype == np.float32
    np.testing.assert_array_equal(observation_rows(space, whole)(obs), obs)


def test_the_synchronous_driver_plays_every_agent_of_a_multi_agent_env(
    tmp_path, monkeypatch
) -> None:
    """The driver hands a multi-agent env's rows to the core with their acting flags, so
    the learning policy plays every agent by its turns and only the rows that step count
    as its frames: in the turn game a mover's reward is its action, and 2 k frames take the
    mean return from a random policy's (about 1-2) past 4 (5.5-5.6 for seeds 0 and 3)."""
    from learner.tools.synchronous import train_synchronously
    from seedrl.config import LearnerConfig

    served: list[tuple[np.ndarray, int]] = []
    serve = ServingCore.serve

    def recording(core: ServingCore, rows: FrameBatch, fresh: Any = None) -> Any:
        assert rows.acting_B is not None, "a multi-agent env's rows carry their acting flags"
        stepping = rows.acting_B | rows.terminated_B | rows.truncated_B
        before = core.stats.frames
        answer = serve(core, rows, fresh)
        served.append((stepping, core.stats.frames - before))
        return answer

    monkeypatch.setattr(ServingCore, "serve", recording)

    config = LearnerConfig(
        logdir=str(tmp_path), env="multiagent_envs:turn_game", seed=0, unroll_length=4,
        batch_size=4, tensorboard=False, target_return=None,
    )  # fmt: skip
    curve = train_synchronously(config, num_envs=2, frames=2000)
    (_, start), (frames, end) = curve[0], curve[-1]
    assert frames >= 2000 - 2 * 3 * config.unroll_length
    assert start < 2.5 and end > 4.0, f"no learning: {start:.2f} -> {end:.2f}"
    assert all(len(stepping) == 2 * 3 for stepping, _ in served), "a row per agent"
    assert [counted for _, counted in served] == [int(s.sum()) for s, _ in served]
    assert not all(s.all() for s, _ in served), "some rows waited their turn"
