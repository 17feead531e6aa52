"""Several agents: multi-agent envs as rows of a frame on the actors, per-agent slots on
the learner, and self-play against frozen snapshots.

Scripted envs with a known turn order (tests/multiagent_envs.py) give known frames; the
learner's side is checked against a slow per-agent loop written from the rules (an
agent's unroll is its own consecutive acting steps, the rewards that arrived while it
waited credited to its last action).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from league_doubles import ChooseThree, self_play
from multiagent_envs import ACTIONS, OBS, JoinLeave, TurnGame, two_player
from support import actor_args, learner_process, read_records, running

from seedrl import codec, envs
from seedrl.config import LearnerConfig
from seedrl.envs.agents import AgentEnvs

TESTS = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _tests_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))


def _steps(vec: AgentEnvs, frames: int, actions: np.ndarray) -> list[tuple[Any, ...]]:
    """(obs[:, 0], acting, rewards, terminated, truncated) of the reset frame and ``frames``
    steps, every row sent ``actions``."""
    obs, _ = vec.reset(seed=0)
    zeros = np.zeros(vec.num_rows)
    out = [(obs[:, 0].tolist(), vec.acting.tolist(), zeros.tolist(), [False] * 3, [False] * 3)]
    for _ in range(frames):
        obs, reward, terminated, truncated, _ = vec.step(actions)
        out.append(
            (
                obs[:, 0].tolist(), vec.acting.tolist(), np.round(reward.astype(float), 3).tolist(),
                terminated.tolist(), truncated.tolist(),
            )
        )  # fmt: skip
    return out


T, F = True, False


def test_an_aec_game_is_played_by_its_turn_order_with_waits_leaves_and_resets() -> None:
    """a, b, c move in turn; c terminates on its 2nd move (stepped dead by the actor, not
    the learner), then waits with reward 0; after move 8 all end; the next step resets."""
    frames = _steps(AgentEnvs("t", [TurnGame]), 10, np.array([1, 2, 3]))
    expected = [
        # obs t per row, acting, rewards (the mover gets its action, others -t/10), term, trunc
        ([0, 0, 0], [T, F, F], [0, 0, 0], [F, F, F], [F, F, F]),
        ([1, 1, 1], [F, T, F], [1, -0.1, -0.1], [F, F, F], [F, F, F]),
        ([2, 2, 2], [F, F, T], [-0.2, 2, -0.2], [F, F, F], [F, F, F]),
        ([3, 3, 3], [T, F, F], [-0.3, -0.3, 3], [F, F, F], [F, F, F]),
        ([4, 4, 4], [F, T, F], [1, -0.4, -0.4], [F, F, F], [F, F, F]),
        ([5, 5, 5], [F, F, T], [-0.5, 2, -0.5], [F, F, F], [F, F, F]),
        ([6, 6, 6], [T, F, F], [-0.6, -0.6, 3], [F, F, T], [F, F, F]),  # c's final row
        ([7, 7, 6], [F, T, F], [1, -0.7, 0], [F, F, F], [F, F, F]),  # c waits, ended
        ([8, 8, 6], [F, F, F], [-0.8, 2, 0], [T, T, F], [F, F, F]),  # everyone's final row
        ([0, 0, 0], [T, F, F], [0, 0, 0], [F, F, F], [F, F, F]),  # reset frame
        ([1, 1, 1], [F, T, F], [1, -0.1, -0.1], [F, F, F], [F, F, F]),
    ]
    assert frames == expected


def test_parallel_agents_join_and_leave() -> None:
    """a plays throughout, c is truncated at step 3, b joins at step 2 (acting from its
    first observation), everyone ends at step 5 and the env resets."""
    frames = _steps(AgentEnvs("t", [JoinLeave]), 6, np.array([1, 2, 3]))
    acting = [f[1] for f in frames]
    assert acting == [
        [T, F, T], [T, F, T], [T, T, T], [T, T, F], [T, T, F], [F, F, F], [T, F, T],
    ]  # fmt: skip
    rewards = [f[2] for f in frames]
    assert rewards[1] == [2, 0, 4]  # action + step for the live agents a and c
    assert rewards[3] == [4, 5, 6]  # c's final reward with its truncation
    assert rewards[4] == [5, 6, 0]  # c gone: reward 0
    assert [f[4] for f in frames][3] == [F, F, T]
    assert [f[3] for f in frames][5] == [T, T, F]
    assert rewards[6] == [0, 0, 0]  # the reset frame


@pytest.mark.parametrize("bad", ["heterogeneous"])
def test_agents_with_different_spaces_are_refused_in_one_line(bad: str) -> None:
    from gymnasium import spaces

    game = TurnGame()
    game.action_space = lambda agent: spaces.Discrete(3 if agent == "c" else 4)  # type: ignore[method-assign]
    with pytest.raises(envs.EnvError, match="agents 'a' and 'c' have different spaces"):
        AgentEnvs("mine", [lambda: game])


def test_a_users_pettingzoo_env_is_described_with_its_agents() -> None:
    spec = envs.describe_env("multiagent_envs:turn_game")
    assert list(spec.agents) == ["a", "b", "c"]
    assert codec.spec_summary(spec.action_space) == "Discrete(4)"
    assert codec.rows_per_env(spec) == 3


def test_connect_four_plays_by_turns_with_zero_sum_ends() -> None:
    pytest.importorskip("pettingzoo")
    env_id = "pettingzoo.classic.connect_four_v3"
    spec = envs.describe_env(env_id)
    assert list(spec.agents) == ["player_0", "player_1"]
    vec = envs.make_vector_env(env_id, {}, 2)
    obs, _ = vec.reset(seed=0)
    rng = np.random.default_rng(0)
    ended = 0
    for _ in range(200):
        acting = vec.acting.copy()
        assert (acting.reshape(2, 2).sum(axis=1) <= 1).all(), "one mover per board"
        mask = obs["action_mask"]
        actions = np.array(
            [rng.choice(np.flatnonzero(mask[r])) if acting[r] else 0 for r in range(4)]
        )
        obs, reward, terminated, _, _ = vec.step(actions)
        for env in range(2):
            rows = slice(2 * env, 2 * env + 2)
            if terminated[rows].any():
                assert terminated[rows].all() and reward[rows].sum() == 0
                assert not vec.acting[rows].any()
                ended += 1
    assert ended >= 4


# ---------------------------------------------------------------- the learner's side


def _learner_policy(action_of: Callable[[np.ndarray], np.ndarray], calls: list[np.ndarray]):
    def policy(obs_BO, first_B, state, slot_B=None):
        calls.append(np.array(obs_BO))
        return action_of(obs_BO), np.zeros((len(obs_BO), 4), np.float32), ()

    return policy


def _serve(
    make_env: Callable[[], Any],
    frames: int,
    action_of: Callable[[np.ndarray], np.ndarray],
    unroll_length: int = 3,
    self_play: Any = None,
) -> dict[str, Any]:
    """Step one scripted env through a real InferenceEngine (no transport): the frames
    sent, the actions answered, the policy's calls and the unrolls the trainer would get."""
    from learner.serving.batcher import PendingRequest
    from learner.serving.inference import Connection, FramePayload, InferenceEngine
    from learner.state.counters import StepCounter
    from learner.state.stats import LearnerStats
    from learner.state.trajectories import TrajectoryBuilder, UnrollQueue

    vec = AgentEnvs("t", [make_env])
    rows = vec.num_rows
    builder = TrajectoryBuilder(unroll_length, (2,), np.float32, (), np.int64, 4)
    queue = UnrollQueue(10_000)
    stats = LearnerStats()
    calls: list[np.ndarray] = []
    engine = InferenceEngine(
        _learner_policy(action_of, calls), builder, queue, stats, threading.Lock(),
        StepCounter(), self_play=self_play,
    )  # fmt: skip
    conn = Connection("actor", "run", "peer", rows, builder.allocate(rows))
    sent: list[tuple[np.ndarray, ...]] = []
    replies: list[np.ndarray] = []

    async def run() -> None:
        obs, _ = vec.reset(seed=0)
        reward, terminated, truncated = (
            np.zeros(rows, np.float32),
            np.zeros(rows, bool),
            np.zeros(rows, bool),
        )
        for _ in range(frames):
            acting = vec.acting.copy()
            sent.append((obs.copy(), reward.copy(), terminated.copy(), truncated.copy(), acting))
            payload = FramePayload(
                conn, obs.tobytes(), reward.astype(np.float32).tobytes(), terminated.tobytes(),
                truncated.tobytes(), acting.tobytes(),
            )  # fmt: skip
            future = asyncio.get_running_loop().create_future()
            await engine.process([PendingRequest(payload, rows, future)])
            actions = future.result().copy()
            replies.append(actions)
            obs, reward, terminated, truncated, _ = vec.step(actions)
            obs, reward = obs.copy(), reward.copy()
            terminated, truncated = terminated.copy(), truncated.copy()

    asyncio.run(run())
    unrolls = []
    while len(queue):
        unrolls.append(queue.get(1))
    return {
        "sent": sent, "replies": replies, "calls": calls, "unrolls": unrolls, "stats": stats,
        "agents": vec.num_agents,
    }  # fmt: skip


def _expected_steps(sent: list[tuple[np.ndarray, ...]], row: int, plays: Callable[[int], bool]):
    """The slow loop: the frames of ``row`` that the learning policy steps on (acts or
    ends, in frames ``plays`` says it owns), each with (t, first, credited reward, terminated)."""
    steps, pending, first = [], 0.0, True
    for f, (obs, reward, terminated, truncated, acting) in enumerate(sent):
        if not (acting[row] or terminated[row] or truncated[row]):
            pending += float(reward[row])
            continue
        credited = 0.0 if first else pending + float(reward[row])
        pending = 0.0
        if plays(f):
            steps.append((float(obs[row, 0]), first, round(credited, 4), bool(terminated[row])))
        first = bool(terminated[row] or truncated[row])
    return steps


def _unroll_rows(unroll: Any) -> list[tuple[float, bool, float, bool]]:
    return [
        (float(unroll.obs[0, t, 0]), bool(unroll.first[0, t]), round(float(unroll.reward[0, t]), 4),
         bool(unroll.terminated[0, t]))
        for t in range(unroll.first.shape[1])
    ]  # fmt: skip


def test_each_agent_is_a_slot_of_its_own_consecutive_steps_with_waits_credited() -> None:
    """Unrolls per agent hold exactly its acting and final rows, in order, overlapping by
    one, the rewards that came while it waited added to its next row; the policy never
    sees a waiting row and waiting rows are answered 0."""
    length = 3
    run = _serve(TurnGame, 40, lambda obs: obs[:, 1].astype(np.int64) + 1, length)
    sent, replies = run["sent"], run["replies"]
    by_agent: dict[int, list[Any]] = {0: [], 1: [], 2: []}
    for unroll in run["unrolls"]:
        by_agent[int(unroll.obs[0, 0, 1])].append(_unroll_rows(unroll))
    for agent in range(3):
        steps = _expected_steps(sent, agent, lambda f: True)
        expected = [
            steps[k * length : k * length + length + 1] for k in range((len(steps) - 1) // length)
        ]
        assert by_agent[agent] == expected, f"agent {agent}"
        assert expected, "the run is long enough for every agent to fill unrolls"
    stepping = [
        (f, r) for f, (_, _, term, trunc, acting) in enumerate(sent)
        for r in range(3) if acting[r] or term[r] or trunc[r]
    ]  # fmt: skip
    assert sum(len(c) for c in run["calls"]) == len(stepping)
    for f, (_, _, terminated, truncated, acting) in enumerate(sent):
        waiting = ~(acting | terminated | truncated)
        assert (replies[f][waiting] == 0).all()
        assert (replies[f][acting] == np.flatnonzero(acting) + 1).all()


def test_joining_and_leaving_agents_start_and_end_their_own_episodes() -> None:
    run = _serve(JoinLeave, 30, lambda obs: obs[:, 1].astype(np.int64), unroll_length=2)
    sent = run["sent"]
    got: dict[int, list[Any]] = {0: [], 1: [], 2: []}
    for unroll in run["unrolls"]:
        got[int(unroll.obs[0, 0, 1])].append(_unroll_rows(unroll))
    for agent in range(3):
        steps = _expected_steps(sent, agent, lambda f: True)
        assert got[agent] == [steps[2 * k : 2 * k + 3] for k in range((len(steps) - 1) // 2)]
    # b's first row of each episode is a start, and c's truncation ended its episode early
    assert any(rows[0][1] and rows[0][0] == 2.0 for rows in got[1])
    episodes = run["stats"].episodes
    assert episodes == sum(
        int(t[r] or u[r]) for _, _, t, u, _ in sent for r in range(3)
    )  # every agent's end is an episode


def test_rewards_sent_between_an_agents_end_and_its_next_episode_are_ignored() -> None:
    """Another actor may send rewards on rows of an agent whose episode ended; they belong
    to no action of the next episode, whose first row carries reward 0."""
    from learner.serving.batcher import PendingRequest
    from learner.serving.inference import Connection, FramePayload, InferenceEngine
    from learner.state.counters import StepCounter
    from learner.state.stats import LearnerStats
    from learner.state.trajectories import TrajectoryBuilder, UnrollQueue

    builder = TrajectoryBuilder(3, (2,), np.float32, (), np.int64, 4)
    queue, stats = UnrollQueue(100), LearnerStats()
    policy = _learner_policy(lambda obs: np.zeros(len(obs), np.int64), [])
    engine = InferenceEngine(policy, builder, queue, stats, threading.Lock(), StepCounter())
    conn = Connection("actor", "run", "peer", 1, builder.allocate(1))
    # One agent: acts, acts, ends (reward 1), waits twice with reward 5, acts (a new episode).
    script = [
        (0.0, False, True), (0.5, False, True), (1.0, True, False),
        (5.0, False, False), (5.0, False, False), (7.0, False, True),
    ]  # fmt: skip

    async def run() -> None:
        for t, (reward, terminated, acting) in enumerate(script):
            payload = FramePayload(
                conn, np.array([[t, 0]], np.float32).tobytes(),
                np.array([reward], np.float32).tobytes(), np.array([terminated]).tobytes(),
                np.zeros(1, bool).tobytes(), np.array([acting]).tobytes(),
            )  # fmt: skip
            future = asyncio.get_running_loop().create_future()
            await engine.process([PendingRequest(payload, 1, future)])

    asyncio.run(run())
    (unroll,) = [queue.get(1) for _ in range(len(queue))]
    assert _unroll_rows(unroll) == [
        (0.0, True, 0.0, False), (1.0, False, 0.5, False), (2.0, False, 1.0, True),
        (5.0, True, 0.0, False),
    ]  # fmt: skip
    assert stats.returns[-1] == 1.5


def test_self_play_trains_only_the_learning_seat_and_records_each_game() -> None:
    """Two agents: each episode the learning policy plays a seat drawn at random and a
    frozen snapshot (action 3) the other; only the learner's rows reach the unrolls, and
    each game's result (learner as a: its actions 0 lose; as b: win) reaches the pool and
    the ratings."""
    from learner.league.pool import Outcome

    league, play, opponent_calls = self_play()
    length = 2
    run = _serve(two_player, 80, lambda obs: obs[:, 1].astype(np.int64), length, play)
    sent, replies = run["sent"], run["replies"]
    # The learner's rows are answered with its own policy (the agent's index), the
    # opponent's with the snapshot's 3; so the replies tell who held which seat.
    seat_of_frame = []
    for f, (*_, acting) in enumerate(sent):
        movers = np.flatnonzero(acting)
        mover = int(movers[0]) if len(movers) else -1
        learner_moved = mover >= 0 and replies[f][mover] == mover
        seat_of_frame.append(mover if learner_moved else (1 - mover if mover >= 0 else -1))
    # Each episode's seat, from its frames with a mover, applies to its final frame too.
    seat, seats = -1, []
    for f in range(len(sent)):
        seat = seat_of_frame[f] if seat_of_frame[f] >= 0 else seat
        seats.append(seat)
    assert {0, 1} <= set(seats), "both seats drawn over the episodes"
    for agent in range(2):
        steps = _expected_steps(sent, agent, lambda f, a=agent: seats[f] == a)
        got = [_unroll_rows(u) for u in run["unrolls"] if int(u.obs[0, 0, 1]) == agent]
        flat = [row for rows in got for row in rows[:-1]]
        assert flat == steps[: len(flat)], f"agent {agent}: only its learning-seat steps"
    assert all((u.action[0] != 3).all() for u in run["unrolls"]), "no opponent frame trained"
    assert sum(len(c) for c in opponent_calls) > 0
    # Games: the learner's final rows; as agent 0 it loses, as agent 1 it wins.
    expected = {Outcome.WIN: 0, Outcome.DRAW: 0, Outcome.LOSS: 0}
    for f, (_, _, term, _, _) in enumerate(sent):
        if term.any():
            expected[Outcome.LOSS if seats[f] == 0 else Outcome.WIN] += 1
    (snapshot_id,) = league.pool.ids()
    wins, draws, losses = league.pool.results()[snapshot_id]
    assert (wins, draws, losses) == (expected[Outcome.WIN], 0, expected[Outcome.LOSS])
    assert wins and losses
    metrics = league.metrics()
    games = wins + losses
    assert metrics["selfplay_win_rate"] == pytest.approx(wins / games)
    assert metrics["vs_snapshot_0_wins"] == wins
    assert league.ratings.rating("learner") != 1000.0


def test_a_fixed_opponent_acts_on_its_rows_and_its_games_are_counted() -> None:
    """--fixed-opponents: a scripted player (action 2) drawn beside the snapshot (action 3)
    chooses the actions of exactly the rows where its agent moves; its games count in the
    pool and the ratings under its own name; none of its frames is trained on."""
    from learner.league.league import League
    from learner.league.pool import PoolConfig
    from learner.serving.selfplay import SelfPlay

    league = League(PoolConfig(1000, 4, "uniform", fixed_opponents=("scripted",)), 0)
    _, snapshot_play, _ = self_play()
    scripted_rows: list[np.ndarray] = []

    def scripted(obs_BO: np.ndarray) -> np.ndarray:
        scripted_rows.append(np.array(obs_BO))
        return np.full(len(obs_BO), 2, np.int64)

    play = SelfPlay(
        league, 2, 1000, snapshot_play.snapshots, ChooseThree(), lambda: {}, 0, {-1: scripted}
    )
    run = _serve(two_player, 160, lambda obs: obs[:, 1].astype(np.int64), 2, play)
    sent, replies = run["sent"], run["replies"]
    moves = {2: 0, 3: 0}
    for f, (*_, acting) in enumerate(sent):
        for mover in np.flatnonzero(acting):
            if replies[f][mover] in moves:
                moves[int(replies[f][mover])] += 1
    assert moves[2] and moves[3], "both opponents drawn"
    assert sum(len(rows) for rows in scripted_rows) == moves[2], "its moving rows, no others"
    assert all((u.action[0] < 2).all() for u in run["unrolls"]), "no opponent frame trained"
    games = sum(int(term.any()) for _, _, term, _, _ in sent)
    results = league.pool.results()
    assert sum(sum(r) for r in results.values()) == games
    assert sum(results[-1]) > 0
    assert league.ratings.rating("scripted") != 1000.0


def test_the_league_survives_a_checkpoint_round_trip(tmp_path) -> None:

    league, play, _ = self_play()
    play.snapshot_due(0)
    league.record(0, __import__("learner.league.pool", fromlist=["Outcome"]).Outcome.WIN)
    path = tmp_path / "league.pt"
    torch.save(league.state_dict(), path)
    restored, _, _ = self_play(seed=5)
    restored.load_state_dict(torch.load(path, weights_only=True))
    assert restored.pool.results() == league.pool.results() == {0: (1, 0, 0)}
    assert restored.ratings.table() == league.ratings.table()


# ---------------------------------------------------------------- the wire


def test_a_single_agent_frame_and_env_spec_keep_their_bytes() -> None:
    """An actor written before several agents existed sends the same bytes: no agents in
    the EnvSpec, no acting tensor in the Frame."""
    import gymnasium as gym

    from actors.actor import StepWire
    from seedrl.proto import seedrl_pb2 as pb

    env = gym.make("CartPole-v1")
    spec = codec.env_spec("CartPole-v1", {}, env.observation_space, env.action_space)
    old_spec = pb.EnvSpec(
        env_id="CartPole-v1", env_kwargs_json="{}",
        observation_space=codec.space_to_spec(env.observation_space),
        action_space=codec.space_to_spec(env.action_space),
    )  # fmt: skip
    assert spec.SerializeToString() == old_spec.SerializeToString()
    wire = StepWire(spec, 2)
    obs = np.arange(8, dtype=np.float32).reshape(2, 4)
    reward, flags = np.array([1.0, 2.0], np.float32), np.array([True, False])
    old = pb.ActorMessage(
        frame=pb.Frame(
            observations=codec.encode_tensor(obs), rewards=codec.encode_tensor(reward),
            terminated=codec.encode_tensor(flags), truncated=codec.encode_tensor(~flags),
        )
    )  # fmt: skip
    assert wire.frame(obs, reward, flags, ~flags) == old.SerializeToString()


def _servicer(env_id: str):
    from learner.serving.servicer import LearnerServicer
    from learner.state.stats import LearnerStats
    from seedrl.config import LearnerConfig

    config = LearnerConfig(env=env_id)
    return LearnerServicer(config, envs.describe_env(env_id), None, None, None, LearnerStats())


def test_acting_is_required_exactly_for_multi_agent_envs() -> None:
    from learner.serving.inference import Connection
    from seedrl.proto import seedrl_pb2 as pb

    def frame(rows: int, acting: bool) -> pb.Frame:
        msg = pb.Frame(
            observations=codec.encode_tensor(np.zeros((rows, *shape), np.float32)),
            rewards=codec.encode_tensor(np.zeros(rows, np.float32)),
            terminated=codec.encode_tensor(np.zeros(rows, bool)),
            truncated=codec.encode_tensor(np.zeros(rows, bool)),
        )
        if acting:
            msg.acting.CopyFrom(codec.encode_tensor(np.ones(rows, bool)))
        return msg

    shape = (2,)
    multi = _servicer("multiagent_envs:turn_game")
    conn = Connection("a", "r", "p", 6, np.arange(6))
    layout = multi.frame_layout(6)
    payload = multi.frame_payload(conn, layout, frame(6, acting=True))
    assert payload.acting == np.ones(6, bool).tobytes()
    with pytest.raises(codec.WireError, match="acting is missing"):
        multi.frame_payload(conn, layout, frame(6, acting=False))
    shape = (4,)
    single = _servicer("CartPole-v1")
    conn = Connection("a", "r", "p", 2, np.arange(2))
    with pytest.raises(codec.WireError, match="acting is for multi-agent envs"):
        single.frame_payload(conn, single.frame_layout(2), frame(2, acting=True))
    assert single.frame_payload(conn, single.frame_layout(2), frame(2, False)).acting is None


def test_a_hello_without_the_learners_agents_is_refused() -> None:
    from seedrl.proto import seedrl_pb2 as pb

    multi = _servicer("multiagent_envs:turn_game")
    theirs = pb.EnvSpec()
    theirs.CopyFrom(multi.env_spec)
    del theirs.agents[:]
    hello = pb.Hello(protocol_version=1, actor_id="x", run_id="r", num_envs=1, env=theirs)
    assert "agents [] but the learner's has ['a', 'b', 'c']" in (multi._check_hello(hello) or "")


# ---------------------------------------------------------------- end to end

ENV = {"PYTHONPATH": os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)}


def _self_play_run(tmp_path: Path, frames: int, *extra: str) -> tuple[int, list[str], list[str]]:
    args = ["--env", "multiagent_envs:two_player", "--self-play", "--snapshot-every", "3",
            "--total-frames", str(frames), "--unroll-length", "4", "--batch-size", "4",
            "--checkpoint-interval-s", "3600", "--trainer", "thread", *extra]  # fmt: skip
    with learner_process(tmp_path, *args, env=ENV, timeout=180) as (learner, port):
        allow = ["--allow-env-module", "multiagent_envs"]
        with running(actor_args(port, 2, 3, *allow), env=ENV) as actors:
            code = learner.wait(240)
    return code, learner.lines, actors.lines


def test_self_play_trains_from_the_commands_and_its_pool_resumes(tmp_path) -> None:
    """Learner and actor processes play a two-player game by self-play: results reach the
    metrics and the progress line, the pool reaches the checkpoint, and --resume carries
    on with it (its snapshots, results and ratings) rather than starting a new one."""
    from learner.state import checkpoint

    fixed = ("--fixed-opponents", "multiagent_envs:scripted_player")
    code, learner_log, actor_log = _self_play_run(tmp_path, 600, *fixed)
    assert code == 0, "\n".join(learner_log[-30:])
    assert not any("Traceback" in line for line in actor_log), "\n".join(actor_log[-30:])
    records = read_records(tmp_path)
    assert any("selfplay_win_rate" in r for r in records)
    assert any("win/draw/loss" in line for line in learner_log)
    saved = checkpoint.load(tmp_path / "checkpoint.pt")["self_play"]
    ids = [s["id"] for s in saved["pool"]["snapshots"]]
    games = sum(sum(s["results"]) for s in saved["pool"]["snapshots"])
    assert len(ids) >= 2 and games > 0
    (scripted,) = saved["pool"]["fixed"]
    assert scripted["name"] == "multiagent_envs:scripted_player" and sum(scripted["results"]) > 0
    more = checkpoint.load(tmp_path / "checkpoint.pt")["frames"] + 600
    code, learner_log, _ = _self_play_run(tmp_path, more, "--resume", *fixed)
    assert code == 0, "\n".join(learner_log[-30:])
    resumed = checkpoint.load(tmp_path / "checkpoint.pt")["self_play"]
    kept = {s["id"]: s for s in resumed["pool"]["snapshots"]}
    assert min(kept) >= min(ids) and max(kept) > max(ids), "new snapshots after the saved ones"
    for snapshot in saved["pool"]["snapshots"]:  # a kept snapshot's games only add up
        if snapshot["id"] in kept:
            assert sum(kept[snapshot["id"]]["results"]) >= sum(snapshot["results"])
    assert resumed["ratings"]["games"]["learner"] > saved["ratings"]["games"]["learner"]
    assert sum(resumed["pool"]["fixed"][0]["results"]) >= sum(scripted["results"])


def test_self_play_on_a_game_that_is_not_for_two_stops_with_one_line(tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "learner", "--env", "multiagent_envs:turn_game", "--self-play",
         "--logdir", str(tmp_path)],
        env={**os.environ, **ENV}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--self-play needs a two-player env" in lines[0], result.stderr


def test_a_fixed_opponent_that_cannot_play_stops_the_learner_with_one_line() -> None:
    from learner.agents.models import UnsupportedSetup
    from learner.parts import make_league

    spec = codec.env_spec("multiagent_envs:two_player", {}, OBS, ACTIONS, agents=("a", "b"))
    ok = make_league(LearnerConfig(self_play=True, fixed_opponents=("random",)), spec)
    assert ok is not None and ok.pool.fixed_ids() == [-1]
    assert list(ok.scripted) == [-1] and type(ok.scripted[-1]).__name__ == "RandomOpponent"
    for name, words in (
        ("heuristic", "--fixed-opponents heuristic reads a Connect Four board"),
        ("multiagent_envs:missing", "has no 'missing'"),
    ):
        config = LearnerConfig(self_play=True, fixed_opponents=(name,))
        with pytest.raises(UnsupportedSetup, match=words):
            make_league(config, spec)
