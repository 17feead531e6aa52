"""The serving tier's trajectories: unrolls built in a frontend from the model's reply rows.

The same frames through the one-process path (a serving core over a full trajectory
builder) and through the tier's split (the model process's :class:`ModelRows` writing
reply rows into shared memory, a frontend's builder recording them, its ring carrying
the unrolls) give the same unrolls, field by field, episode statistics and dropped
frames; and a frontend killed in the middle of writing an unroll leaves none half-written.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import signal
import time
from typing import NamedTuple

import numpy as np
import pytest
from league_doubles import self_play

from learner.serving import tier_unrolls
from learner.serving.rows import FrameBatch, ServingCore
from learner.serving.slots import SlotTable, TableSpec, new_doorbell
from learner.serving.tier_batch import LaneRows
from learner.serving.tier_unrolls import (
    FRONTEND_SLOTS,
    FrontendTrajectories,
    ModelRows,
    ReplyRows,
    ReplySpec,
    RingSpec,
    UnrollDrain,
    UnrollRing,
)
from learner.state.counters import StepCounter
from learner.state.dataset import EpisodeStitcher, RowConverter
from learner.state.normalize import ObservationNormalizer
from learner.state.stats import LearnerStats
from learner.state.trajectories import (
    FinishedEpisodes,
    TrajectoryBuilder,
    UnrollQueue,
    Unrolls,
)
from seedrl.proto import seedrl_pb2 as pb

FEATURES = 4
_SPEC = pb.EnvSpec(
    env_id="synthetic",
    observation_space=pb.SpaceSpec(kind="box", shape=[FEATURES], dtype="float32"),
    action_space=pb.SpaceSpec(kind="discrete", dtype="int64", n=2),
)
"""The env the dataset recorder is told of (its frames only unpack by it)."""
ENVS = (2, 1, 3)
"""Envs of each stream at the start."""


def fake_policy(obs_BO, first_B, state, slot_B):
    """Actions, parameters and a next core state that depend on the frame and on the state
    before it (so a wrong start state shows)."""
    flat_BX = obs_BO.reshape(len(obs_BO), -1).astype(np.float32)
    action_B = (flat_BX.sum(1) > 0).astype(np.int64)
    params_BP = np.stack([flat_BX.sum(1), flat_BX[:, -1]], 1).astype(np.float32)
    after = tuple(np.where(first_B[:, None], 0, s) * 0.5 + flat_BX[:, :1] for s in state)
    return action_B, params_BP, after


def _builder(stack: int, states: tuple[int, ...], overlap: int) -> TrajectoryBuilder:
    obs_shape = (stack, FEATURES) if stack > 1 else (FEATURES,)
    return TrajectoryBuilder(
        unroll_length=5, obs_shape=obs_shape, obs_dtype=np.float32, action_shape=(),
        action_dtype=np.int64, param_size=2, core_state_sizes=states, frame_stack=stack,
        overlap=overlap, return_discount=0.9 if overlap else None,
    )  # fmt: skip


def _core(builder, steps, normalize: bool) -> ServingCore:
    normalizer = ObservationNormalizer(builder.obs_shape, np.float32) if normalize else None
    return ServingCore(
        fake_policy, builder, LearnerStats(), contextlib.nullcontext(), steps,
        normalizer=normalizer,
    )  # fmt: skip


class _Tier(NamedTuple):
    """The tier's split over one slot table: the model's rows and one frontend's builder."""

    table: SlotTable
    reply: ReplyRows
    model: ModelRows
    ring: UnrollRing
    front: FrontendTrajectories

    def close(self) -> None:
        for block in (self.ring, self.reply, self.table):
            block.close()


def _tier(
    reference: TrajectoryBuilder,
    rows: int,
    seen: tuple[int, ...] | None = None,
    multi_agent: bool = False,
    counts_episodes: bool = False,
    policies: bool = False,
) -> _Tier:
    """A table and reply rows of ``rows`` rows laid out as ``reference``'s (``policies``:
    with each row's policy), the model's rows over them and a frontend's builder with
    its ring."""
    layout = reference.layout()
    table = SlotTable(TableSpec(rows, max(rows, 4), 4 * FEATURES, "<i8", ()))
    states = tuple(layout["core_state_sizes"])
    reply = ReplyRows(ReplySpec(rows, 2, states, seen, multi_agent, policies))
    model = ModelRows(TrajectoryBuilder(**layout), reply, counts_episodes)
    ring = UnrollRing(RingSpec.of(reference, 64))
    front = FrontendTrajectories(TrajectoryBuilder(**layout), table, reply, ring)
    return _Tier(table, reply, model, ring, front)


class Stream:
    """One stream in both paths: its table rows, model slots, frontend slots, reference slots."""

    def __init__(self, begin, count, model, front, reference) -> None:
        self.rows = np.arange(begin, begin + count)
        self.model = model.allocate_rows(begin, count)
        self.front = front.open(count)
        self.reference = reference.allocate(count)


@pytest.mark.parametrize(
    ("stack", "states", "overlap", "normalize"),
    [(1, (3, 3), 0, False), (3, (), 0, False), (1, (2,), 2, False), (1, (3, 3), 0, True)],
    ids=["recurrent", "frame stack", "overlap and running returns", "normalized"],
)
def test_unrolls_built_in_a_frontend_equal_the_one_process_builders(
    stack, states, overlap, normalize
):
    rng = np.random.default_rng(0)
    reference = _builder(stack, states, overlap)
    rows = sum(ENVS) + 4
    tier = _tier(reference, rows, seen=reference.obs_shape if normalize else None)
    table, model, ring, front = tier.table, tier.model, tier.ring, tier.front
    steps_ref, steps_tier = StepCounter(), StepCounter()
    core_ref = _core(reference, steps_ref, normalize)
    core_tier = _core(model, steps_tier, normalize)
    obs_RF = table.obs_bytes.view(np.float32).reshape(rows, FEATURES)
    reward_R = table.reward_bytes.view(np.float32)
    terminated_R, truncated_R = (
        b.view(np.bool_) for b in (table.terminated_bytes, table.truncated_bytes)
    )
    streams = [Stream(b, k, model, front, reference) for b, k in zip((0, 2, 3), ENVS, strict=True)]
    closed: list[Stream] = []
    built, expected, lost = [], [], []
    origins_ref: list[tuple[np.ndarray, np.ndarray]] = []
    origins_tier: list[tuple[np.ndarray, np.ndarray]] = []
    try:
        for step in range(60):
            if step == 33:  # a stream closes mid-unroll; a new one takes rows elsewhere
                gone = streams.pop(1)
                closed.append(gone)
                lost.append((reference.release(gone.reference), model.release(gone.model)))
                front.close(gone.front)
                streams.append(Stream(6, 2, model, front, reference))
            chosen = [s for s in streams if rng.random() < 0.8] or streams[:1]
            row_B = np.concatenate([s.rows for s in chosen])
            n = len(row_B)
            obs_RF[row_B] = rng.normal(size=(n, FEATURES)).astype(np.float32)
            reward_R[row_B] = rng.normal(size=n).astype(np.float32)
            terminated_R[row_B] = rng.random(n) < 0.1
            truncated_R[row_B] = rng.random(n) < 0.05
            steps_ref.value = steps_tier.value = step // 3
            frames = dict(
                obs_BO=obs_RF[row_B].copy(), reward_B=reward_R[row_B].copy(),
                terminated_B=terminated_R[row_B].copy(), truncated_B=truncated_R[row_B].copy(),
            )  # fmt: skip
            ref_slot_B = np.concatenate([s.reference for s in chosen])
            action_ref, unrolls = core_ref.serve(FrameBatch(ref_slot_B, **frames))
            ref_origin = reference.last_origin
            model_slot_B = np.concatenate([s.model for s in chosen])
            action_tier, none = core_tier.serve(FrameBatch(model_slot_B, **frames))
            assert none is None  # the model process builds no unroll
            table.action_RA[row_B] = action_tier  # the reply, as the slot batcher writes it
            front.record(np.concatenate([s.front for s in chosen]), row_B)
            np.testing.assert_array_equal(action_tier, action_ref)
            if unrolls is not None:
                expected.append(unrolls)
                origins_ref.append(ref_origin)
            taken = ring.read()
            if taken is not None:
                built.append(taken)
                origins_tier.append(ring.last_origin)
        episodes = ring.read_episodes()
        assert episodes is not None
        assert episodes.returns.tolist() == list(core_ref.stats.returns)
        assert episodes.lengths.tolist() == list(core_ref.stats.lengths)
        assert core_tier.stats.episodes == 0  # they reach the learner's stats by the drain
        assert lost == [(a, a) for a, _ in lost] and lost[0][0] > 0, lost
        assert len(built) == len(expected) and expected
        _assert_same(Unrolls.concat(built), Unrolls.concat(expected))
        _assert_chained(built, overlap)
        # Each unroll's slot (the frontend's, standing for the reference's) and number
        # among its slot's unrolls, which the dataset recorder stitches episodes by.
        to_reference = {
            int(f): int(r)
            for s in [*streams, *closed]
            for f, r in zip(s.front, s.reference, strict=True)
        }
        slot_ref, count_ref = (np.concatenate(part) for part in zip(*origins_ref, strict=True))
        slot_tier, count_tier = (np.concatenate(part) for part in zip(*origins_tier, strict=True))
        assert [to_reference[int(f)] for f in slot_tier] == slot_ref.tolist()
        assert count_tier.tolist() == count_ref.tolist() and count_ref.max() > 1
        if not normalize:  # (--record-dataset keeps raw frames only)
            assert _dataset(built, origins_tier, overlap) == _dataset(
                expected, origins_ref, overlap
            )
    finally:
        tier.close()


def test_multi_agent_rows_built_in_a_frontend_equal_the_one_process_builders():
    """A multi-agent env's rows through the tier: only the rows that act or end reach the
    trajectories, a waiting row's reward is credited to its agent's next step, and the
    frontend, told by the model which rows it recorded and with what reward, builds the
    unrolls and episodes the one-process builder builds."""
    rng = np.random.default_rng(1)
    reference = _builder(1, (3,), 0)
    agents_of = (2, 2, 4)  # each stream's rows: its envs' agents
    rows = sum(agents_of) + 2
    tier = _tier(reference, rows, multi_agent=True)
    table, model, ring, front = tier.table, tier.model, tier.ring, tier.front
    core_ref = _core(reference, StepCounter(), False)
    core_tier = _core(model, StepCounter(), False)
    lanes = LaneRows(table, np.dtype(np.float32), (FEATURES,), multi_agent=True)
    obs_RF = table.obs_bytes.view(np.float32).reshape(rows, FEATURES)
    reward_R = table.reward_bytes.view(np.float32)
    terminated_R = table.terminated_bytes.view(np.bool_)
    acting_R = table.acting_bytes.view(np.bool_)
    begins = (0, 2, 4)
    streams = [
        Stream(b, k, model, front, reference) for b, k in zip(begins, agents_of, strict=True)
    ]
    for s in streams:
        lanes.slot_R[s.rows] = s.model
    built, expected = [], []
    waits = 0
    try:
        for _ in range(80):
            chosen = [s for s in streams if rng.random() < 0.8] or streams[:1]
            row_B = np.concatenate([s.rows for s in chosen])
            n = len(row_B)
            obs_RF[row_B] = rng.normal(size=(n, FEATURES)).astype(np.float32)
            reward_R[row_B] = rng.normal(size=n).astype(np.float32)
            terminated_R[row_B] = rng.random(n) < 0.08
            acting_R[row_B] = rng.random(n) < 0.5
            waits += int((~acting_R[row_B] & ~terminated_R[row_B]).sum())
            rows_tier = lanes.gather(row_B)  # as the slot batcher gathers them
            assert rows_tier.acting_B is not None
            rows_ref = FrameBatch(
                np.concatenate([s.reference for s in chosen]), rows_tier.obs_BO.copy(),
                rows_tier.reward_B.copy(), rows_tier.terminated_B.copy(),
                rows_tier.truncated_B.copy(), rows_tier.acting_B.copy(),
            )  # fmt: skip
            action_ref, unrolls = core_ref.serve(rows_ref)
            action_tier, none = core_tier.serve(rows_tier)
            assert none is None
            np.testing.assert_array_equal(action_tier, action_ref)
            table.action_RA[row_B] = action_tier
            front.record(np.concatenate([s.front for s in chosen]), row_B)
            if unrolls is not None:
                expected.append(unrolls)
            taken = ring.read()
            if taken is not None:
                built.append(taken)
        assert waits > 50  # rows that waited, and whose rewards had to be carried over
        episodes = ring.read_episodes()
        assert episodes is not None
        assert episodes.returns.tolist() == list(core_ref.stats.returns)
        assert episodes.lengths.tolist() == list(core_ref.stats.lengths)
        assert len(built) == len(expected) and expected
        _assert_same(Unrolls.concat(built), Unrolls.concat(expected))
        lost = [(reference.release(s.reference), model.release(s.model)) for s in streams]
        assert lost == [(a, a) for a, _ in lost] and any(a for a, _ in lost), lost
    finally:
        tier.close()


def _other_policy(obs_BO, first_B, state, slot_B):
    """A second policy, told apart from :func:`fake_policy` by its actions and parameters."""
    action_B, params_BP, after = fake_policy(obs_BO, first_B, state, slot_B)
    return 1 - action_B, 2 * params_BP, after


def test_each_policys_rows_reach_its_own_store_and_stats_through_the_tier(monkeypatch):
    """--policy-mapping through the tier: agent 0 of each env plays policy 0, agent 1
    policy 1; the frontend tags each unroll and episode with its slot's policy and the
    drain hands each to that policy's store and stats alone, as one process does."""
    from learner.serving.rows import ServedPolicy

    monkeypatch.setattr(tier_unrolls, "DRAIN_PERIOD_S", 3600.0)  # only this test's takes read
    rng = np.random.default_rng(3)
    reference = _builder(1, (3,), 0)
    agent_policy = np.array([0, 1], np.int64)
    envs = (2, 1)
    rows = 2 * sum(envs)
    tier = _tier(reference, rows, multi_agent=True, policies=True)
    table, model, ring, front = tier.table, tier.model, tier.ring, tier.front

    def served(stats_of: list[LearnerStats]) -> list[ServedPolicy]:
        return [
            ServedPolicy(p, contextlib.nullcontext(), StepCounter(), stats)
            for p, stats in zip((fake_policy, _other_policy), stats_of, strict=True)
        ]

    stats_ref, stats_tier = [LearnerStats(), LearnerStats()], [LearnerStats(), LearnerStats()]
    core_ref = ServingCore(
        fake_policy, reference, LearnerStats(), contextlib.nullcontext(), StepCounter(),
        policies=served(stats_ref),
    )  # fmt: skip
    core_tier = ServingCore(
        fake_policy, model, LearnerStats(), contextlib.nullcontext(), StepCounter(),
        policies=served([LearnerStats(), LearnerStats()]),
    )  # fmt: skip
    lanes = LaneRows(
        table, np.dtype(np.float32), (FEATURES,), True, agent_policy, tier.reply.policy_R
    )
    stores = [UnrollQueue(256), UnrollQueue(256)]
    drainer = UnrollDrain(
        [ring], stores[0], True, LearnerStats(),
        policies=list(zip(stores, stats_tier, strict=True)),
    )  # fmt: skip
    streams = [Stream(b, 2 * k, model, front, reference) for b, k in zip((0, 4), envs, strict=True)]
    for lane, s in enumerate(streams):
        lanes.open(lane, int(s.rows[0]), len(s.rows), 0, s.model)
    obs_RF = table.obs_bytes.view(np.float32).reshape(rows, FEATURES)
    reward_R = table.reward_bytes.view(np.float32)
    terminated_R = table.terminated_bytes.view(np.bool_)
    acting_R = table.acting_bytes.view(np.bool_)
    expected: list[list[Unrolls]] = [[], []]
    loop = asyncio.new_event_loop()
    try:
        drainer.start(loop)
        for _ in range(80):
            row_B = lanes.rows_of(np.arange(len(streams)))
            n = len(row_B)
            obs_RF[row_B] = rng.normal(size=(n, FEATURES)).astype(np.float32)
            reward_R[row_B] = rng.normal(size=n).astype(np.float32)
            terminated_R[row_B] = np.repeat(rng.random(n // 2) < 0.1, 2)
            acting_R[row_B] = rng.random(n) < 0.7
            rows_tier = lanes.gather(row_B)
            assert rows_tier.acting_B is not None and lanes.policy_R is not None
            policy_B = lanes.policy_R[row_B]
            rows_ref = FrameBatch(
                np.concatenate([s.reference for s in streams]), rows_tier.obs_BO.copy(),
                rows_tier.reward_B.copy(), rows_tier.terminated_B.copy(),
                rows_tier.truncated_B.copy(), rows_tier.acting_B.copy(),
            )  # fmt: skip
            action_ref, handoffs = core_ref.serve_policies(rows_ref, None, policy_B)
            action_tier, none = core_tier.serve_policies(rows_tier, None, policy_B)
            assert all(h.unrolls is None for h in none)
            np.testing.assert_array_equal(action_tier, action_ref)
            table.action_RA[row_B] = action_tier
            assert lanes.played_R is not None  # as LaneRows.serve writes them
            lanes.played_R[row_B] = policy_B
            front.record(np.concatenate([s.front for s in streams]), row_B)
            for handoff in handoffs:
                if handoff.unrolls is not None:
                    expected[handoff.policy].append(handoff.unrolls)
            drainer.take(0)
        loop.run_until_complete(asyncio.sleep(0.05))  # the episode counts the drain scheduled
        for policy in (0, 1):
            assert expected[policy], policy
            want = Unrolls.concat(expected[policy])
            got = stores[policy].get(len(want), timeout=5)
            assert got is not None and len(stores[policy]) == 0, policy
            _assert_same(got, want)
            assert stats_ref[policy].episodes > 0
            assert list(stats_tier[policy].returns) == list(stats_ref[policy].returns), policy
        assert drainer.stats.episodes == stats_ref[0].episodes + stats_ref[1].episodes
    finally:
        assert drainer.stop(timeout_s=60)
        loop.close()
        tier.close()


def _third_policy(obs_BO, first_B, state, slot_B):
    """A third policy, told apart from the other two by its parameters."""
    action_B, params_BP, after = fake_policy(obs_BO, first_B, state, slot_B)
    return action_B, 3 * params_BP, after


def test_a_populations_members_take_and_move_slots_through_the_tier_as_in_one_process(
    monkeypatch,
):
    """--population through the tier: the model's engine gives each slot its member and
    writes it into the reply rows; the frontend tags unrolls and episodes by it and, when
    a slot comes back played by another member (moved as its episode ended, after a
    stream left), drops its partial unroll as one process does. Every member's unrolls,
    episodes and frames, every row's action and the dropped frames equal one process's."""
    from learner.population.assignment import MemberSlots
    from learner.serving.batcher import PendingRequest
    from learner.serving.inference import Connection, FramePayload, InferenceEngine
    from learner.serving.rows import ServedPolicy

    monkeypatch.setattr(tier_unrolls, "DRAIN_PERIOD_S", 3600.0)  # only this test's takes read
    rng = np.random.default_rng(5)
    reference = _builder(1, (3,), 0)
    members, rows = 3, 8
    tier = _tier(reference, rows, policies=True)
    table, model, ring, front = tier.table, tier.model, tier.ring, tier.front
    policies = (fake_policy, _other_policy, _third_policy)

    def engine(builder: TrajectoryBuilder) -> InferenceEngine:
        served = [
            (ServedPolicy(p, contextlib.nullcontext(), StepCounter(), LearnerStats()),
             UnrollQueue(512))
            for p in policies
        ]  # fmt: skip
        return InferenceEngine(
            fake_policy, builder, UnrollQueue(1), LearnerStats(), contextlib.nullcontext(),
            StepCounter(), policies=served, members=MemberSlots(members),
        )  # fmt: skip

    one, split = engine(reference), engine(model)
    lanes = LaneRows(table, np.dtype(np.float32), (FEATURES,), played_R=tier.reply.policy_R)
    each = [(store, s.stats) for store, s in zip(split.stores, split.served, strict=True)]
    drainer = UnrollDrain([ring], split.stores[0], True, split.stats, policies=each)

    class Both(NamedTuple):
        """One single-env stream in both paths."""

        lane: int
        row: int
        reference: Connection
        model: Connection
        front: np.ndarray

    def open_stream(lane: int, row: int) -> Both:
        ref = Connection(f"a{lane}", "run", "peer", 1, reference.allocate(1))
        own = Connection(f"a{lane}", "", "frontend", 1, model.allocate_rows(row, 1))
        lanes.open(lane, row, 1, 0, own.slot_ids)
        return Both(lane, row, ref, own, front.open(1))

    streams = [open_stream(i, i) for i in range(5)]
    fresh = {s.row for s in streams}
    obs_RF = table.obs_bytes.view(np.float32).reshape(rows, FEATURES)
    reward_R = table.reward_bytes.view(np.float32)
    terminated_R = table.terminated_bytes.view(np.bool_)
    loop = asyncio.new_event_loop()

    def member_of(stream: Both) -> int:
        assert split.members is not None
        return int(split.members.member_S[stream.model.slot_ids[0]])

    try:
        drainer.start(loop)
        moved_from = None
        for step in range(120):
            if step == 30:  # member 2's only stream leaves: a slot is promised to it
                gone = next(s for s in streams if member_of(s) == 2)
                streams.remove(gone)
                one.release_later(gone.reference)
                split.release_later(gone.model)
                front.close(gone.front)
                moved_from = {s.lane: member_of(s) for s in streams}
            if step == 80:  # a stream comes back and takes the member with fewest
                streams.append(open_stream(5, 5))
                fresh.add(5)
            row_B = np.array([s.row for s in streams])
            n = len(row_B)
            obs_RF[row_B] = rng.normal(size=(n, FEATURES)).astype(np.float32)
            # An env's reset frame carries no reward (a new stream's first, or after an end).
            starts_B = np.isin(row_B, list(fresh)) | terminated_R[row_B]
            reward_R[row_B] = np.where(starts_B, 0.0, rng.normal(size=n)).astype(np.float32)
            terminated_R[row_B] = rng.random(n) < 0.15
            fresh.clear()
            batch = [
                PendingRequest(
                    FramePayload(
                        s.reference, obs_RF[[s.row]].tobytes(), reward_R[[s.row]].tobytes(),
                        terminated_R[[s.row]].tobytes(), np.zeros(1, np.bool_).tobytes(),
                    ),
                    1, loop.create_future(),
                )
                for s in streams
            ]  # fmt: skip
            loop.run_until_complete(one.process(batch))
            action_ref = np.concatenate([r.future.result() for r in batch])
            status = lanes.serve(split, np.array([s.lane for s in streams]))
            assert (status == 0).all()
            np.testing.assert_array_equal(table.action_RA[row_B], action_ref)
            front.record(np.concatenate([s.front for s in streams]), row_B)
            drainer.take(0)
        loop.run_until_complete(asyncio.sleep(0.05))  # the episode counts the drain scheduled
        assert moved_from is not None
        moved = {lane: m for lane, m in moved_from.items() if any(
            s.lane == lane and member_of(s) != m for s in streams
        )}  # fmt: skip
        assert len(moved) == 1 and 2 in [member_of(s) for s in streams], "one slot moved to 2"
        np.testing.assert_array_equal(split.members.member_S, one.members.member_S)
        assert split.stats.frames_dropped == one.stats.frames_dropped > 0
        for m in range(members):
            want_store, got_store = one.stores[m], split.stores[m]
            assert len(want_store) > 0, m
            want = want_store.get(len(want_store), timeout=5)
            got = got_store.get(len(got_store), timeout=5)
            assert want is not None and got is not None
            _assert_same(got, want)
            want_stats, got_stats = one.served[m].stats, split.served[m].stats
            assert want_stats is not None and got_stats is not None
            assert want_stats.episodes > 0
            assert list(got_stats.returns) == list(want_stats.returns), m
            assert list(got_stats.lengths) == list(want_stats.lengths), m
            assert got_stats.frames == want_stats.frames, m
    finally:
        assert drainer.stop(timeout_s=60)
        loop.close()
        tier.close()


def test_self_play_through_the_tier_seats_records_and_scores_as_one_process():
    """Two-player games (two rows an env, turns by move, a zero-sum end): with the model's
    rows ending the learning seat's episodes themselves, the tier's model and frontend
    give the same seats (actions), unrolls, episode statistics and league results as one
    process, and the frontends' ring episodes are dropped by the drain, not counted twice."""
    rng = np.random.default_rng(2)
    reference = _builder(1, (3,), 0)
    envs = (2, 1)
    rows = 2 * sum(envs)
    tier = _tier(reference, rows, multi_agent=True, counts_episodes=True)
    table, model, ring, front = tier.table, tier.model, tier.ring, tier.front
    league_ref, play_ref, _ = self_play(5)
    league_tier, play_tier, _ = self_play(5)
    stats_tier = LearnerStats()
    core_ref = ServingCore(
        fake_policy, reference, LearnerStats(), contextlib.nullcontext(), StepCounter(),
        self_play=play_ref,
    )  # fmt: skip
    core_tier = ServingCore(
        fake_policy, model, stats_tier, contextlib.nullcontext(), StepCounter(),
        self_play=play_tier,
    )  # fmt: skip
    lanes = LaneRows(table, np.dtype(np.float32), (FEATURES,), multi_agent=True)
    streams = [Stream(b, 2 * k, model, front, reference) for b, k in zip((0, 4), envs, strict=True)]
    for s in streams:
        lanes.slot_R[s.rows] = s.model
        play_tier.reset(s.model)  # as the slot batcher does when it leases a stream's rows
    obs_RF = table.obs_bytes.view(np.float32).reshape(rows, FEATURES)
    reward_R = table.reward_bytes.view(np.float32)
    terminated_R = table.terminated_bytes.view(np.bool_)
    acting_R = table.acting_bytes.view(np.bool_)
    moves_E = np.zeros(rows // 2, np.int64)
    built, expected = [], []
    opponent_moves = 0
    try:
        for step in range(90):
            # Every env moves each frame: its mover acts; after 4 moves both rows end,
            # one winning what the other loses; the next frame starts a new game.
            ended_E = moves_E == 4
            mover_E = moves_E % 2
            acting_RE = np.stack([mover_E == 0, mover_E == 1], 1) & ~ended_E[:, None]
            acting_R[:] = acting_RE.reshape(-1)
            terminated_R[:] = np.repeat(ended_E, 2)
            sign_E = np.where(rng.random(len(moves_E)) < 0.5, 1.0, -1.0)
            reward_R[:] = (np.stack([sign_E, -sign_E], 1) * ended_E[:, None]).reshape(-1)
            obs_RF[:] = rng.normal(size=(rows, FEATURES)).astype(np.float32)
            moves_E = np.where(ended_E, 0, moves_E + 1)
            row_B = np.arange(rows)
            rows_tier = lanes.gather(row_B)
            fresh = np.concatenate([s.reference for s in streams]) if step == 0 else None
            rows_ref = FrameBatch(
                np.concatenate([s.reference for s in streams]), rows_tier.obs_BO.copy(),
                rows_tier.reward_B.copy(), rows_tier.terminated_B.copy(),
                rows_tier.truncated_B.copy(), rows_tier.acting_B.copy(),
            )  # fmt: skip
            action_ref, unrolls = core_ref.serve(rows_ref, fresh)
            action_tier, none = core_tier.serve(rows_tier)
            assert none is None
            np.testing.assert_array_equal(action_tier, action_ref)  # the same seats
            opponent_moves += int((action_ref == 3).sum())
            table.action_RA[row_B] = action_tier
            front.record(np.concatenate([s.front for s in streams]), row_B)
            if unrolls is not None:
                expected.append(unrolls)
            taken = ring.read()
            if taken is not None:
                built.append(taken)
        assert opponent_moves > 20  # the snapshots held a seat in every game
        assert core_ref.stats.episodes > 10
        assert list(stats_tier.returns) == list(core_ref.stats.returns)
        assert list(stats_tier.lengths) == list(core_ref.stats.lengths)
        assert league_tier.pool.results() == league_ref.pool.results()
        assert sum(sum(r) for r in league_ref.pool.results().values()) == core_ref.stats.episodes
        assert len(built) == len(expected) and expected
        _assert_same(Unrolls.concat(built), Unrolls.concat(expected))
        assert (Unrolls.concat(built).action != 3).all()  # no opponent's row trained
        # The frontend ends the same episodes into its ring, which the drain drops then.
        front_episodes = ring.read_episodes()
        assert front_episodes is not None
        assert front_episodes.returns.tolist() == list(core_ref.stats.returns)
    finally:
        tier.close()


@pytest.mark.parametrize("counts", [True, False], ids=["counted", "model ends them"])
def test_the_drain_counts_the_rings_episodes_unless_the_model_ends_them(counts):
    ring = UnrollRing(RingSpec.of(_builder(1, (), 0), 4))
    stats = LearnerStats()
    drainer = UnrollDrain([ring], UnrollQueue(8), True, stats, counts_episodes=counts)
    loop = asyncio.new_event_loop()
    try:
        drainer.start(loop)
        ring.write_episodes(FinishedEpisodes(np.array([1.0, -1.0]), np.array([3, 4])))
        deadline = time.monotonic() + 30
        while ring.arrays["ep_tail"][0] < 2 and time.monotonic() < deadline:
            loop.run_until_complete(asyncio.sleep(0.01))
        loop.run_until_complete(asyncio.sleep(0.05))  # the callbacks the drain scheduled
        assert ring.arrays["ep_tail"][0] == 2  # taken either way
        assert stats.episodes == (2 if counts else 0)
    finally:
        assert drainer.stop(timeout_s=60)
        loop.close()
        ring.close()


def _dataset(parts: list[Unrolls], origins, overlap: int) -> list[tuple]:
    """The episodes the dataset recorder stitches from ``parts`` and their origins, as
    comparable values (observations, actions, rewards, flags)."""
    stitcher = EpisodeStitcher(RowConverter(_SPEC), overlap)
    episodes = []
    for unrolls, (slot_N, count_N) in zip(parts, origins, strict=True):
        episodes += stitcher.add(unrolls, slot_N, count_N)
    assert episodes, "no episode completed"
    return [
        (e.observations.tobytes(), e.actions.tolist(), e.rewards.tolist(),
         e.terminations.tolist(), e.truncations.tolist())
        for e in episodes
    ]  # fmt: skip


def _origin(n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.arange(n, dtype=np.int64), np.zeros(n, np.int64)


def _assert_same(got: Unrolls, want: Unrolls) -> None:
    for name in ("obs", "first", "reward", "terminated", "truncated", "action",
                 "policy_params", "acted_step", "running_return"):  # fmt: skip
        a, b = getattr(got, name), getattr(want, name)
        if b is None:
            assert a is None, name
            continue
        np.testing.assert_array_equal(a, b, err_msg=name)
    assert len(got.core_state) == len(want.core_state)
    for a, b in zip(got.core_state, want.core_state, strict=True):
        np.testing.assert_array_equal(a, b, err_msg="core_state")


def _assert_chained(built: list[Unrolls], overlap: int) -> None:
    """Each slot's unroll starts with the last rows of the one before (its bootstrap frame)."""
    merged = Unrolls.concat(built)
    by_start: dict[bytes, int] = {}
    chained = 0
    for i in range(len(merged)):
        head = (
            merged.first[i, : overlap + 1].tobytes()
            + merged.policy_params[i, : overlap + 1].tobytes()
        )
        by_start[head] = i
    for i in range(len(merged)):
        tail = (
            merged.first[i, -overlap - 1 :].tobytes()
            + merged.policy_params[i, -overlap - 1 :].tobytes()
        )
        j = by_start.get(tail)
        if j is not None and j != i:
            np.testing.assert_array_equal(
                merged.acted_step[j, : overlap + 1], merged.acted_step[i, -overlap - 1 :]
            )
            np.testing.assert_array_equal(
                merged.action[j, : overlap + 1], merged.action[i, -overlap - 1 :]
            )
            chained += 1
    assert chained >= len(merged) // 2, (chained, len(merged))


# ------------------------------------------------------------ a writer killed mid-write


class _Killer:
    """A field whose read, halfway through an unroll's write, kills the writing process."""

    def __getitem__(self, index):
        os.kill(os.getpid(), signal.SIGKILL)


def _write_then_die(spec: RingSpec, name: str, whole: Unrolls, half: Unrolls) -> None:
    ring = UnrollRing(spec, name)
    assert ring.write(whole, _origin(1)) == 1
    ring.write(half, _origin(1))  # dies in here, its rows partly written
    os._exit(0)


def _unroll(builder: TrajectoryBuilder, value: float) -> Unrolls:
    unrolls = builder.empty_unrolls(1)
    unrolls.sample_id = unrolls.sample_weight = None
    for name in ("obs", "reward", "policy_params", "acted_step"):
        getattr(unrolls, name)[:] = value
    for state in unrolls.core_state:
        state[:] = value
    return unrolls


def test_a_frontend_killed_while_writing_an_unroll_leaves_no_half_unroll():
    builder = _builder(1, (3, 3), 0)
    spec = RingSpec.of(builder, 4)
    ring = UnrollRing(spec)
    try:
        whole, half = _unroll(builder, 1.0), _unroll(builder, 2.0)
        half.acted_step = _Killer()  # written after obs, rewards, actions, parameters, state
        child = mp.get_context("spawn").Process(
            target=_write_then_die, args=(spec, ring.name, whole, half)
        )
        child.start()
        child.join(60)
        assert child.exitcode == -signal.SIGKILL
        taken = ring.read()
        assert taken is not None and len(taken) == 1  # the committed one, whole
        _assert_same(taken, whole)
        assert ring.read() is None
        # The restarted frontend writes over the dead one's partial rows.
        again = UnrollRing(spec, ring.name)
        assert again.write(_unroll(builder, 3.0), _origin(1)) == 1
        taken = ring.read()
        assert taken is not None and len(taken) == 1
        _assert_same(taken, _unroll(builder, 3.0))
        again.close()
    finally:
        ring.close()


def test_a_full_ring_takes_what_fits_and_the_frontend_keeps_the_rest():
    builder = _builder(1, (), 0)
    ring = UnrollRing(RingSpec.of(builder, 3))
    try:
        five = Unrolls.concat([_unroll(builder, float(v)) for v in range(5)])
        assert ring.write(five, _origin(5)) == 3
        assert ring.write(five, _origin(5)) == 0
        taken = ring.read()
        assert taken is not None and taken.reward[:, 0].tolist() == [0.0, 1.0, 2.0]
        assert ring.write(five.split(3)[1], _origin(2)) == 2
        taken = ring.read()
        assert taken is not None and taken.reward[:, 0].tolist() == [3.0, 4.0]
    finally:
        ring.close()


def test_a_stream_waiting_for_room_in_a_full_ring_ends_when_the_frontend_closes():
    """Back-pressure holds a frontend's next frames while its ring is full; at the run's
    end the trainer that would make room may be gone, so a closing frontend stops waiting."""
    builder = _builder(1, (), 0)
    table = SlotTable(TableSpec(1, 1, 4 * FEATURES, "<i8", ()))
    reply = ReplyRows(ReplySpec(1, 2, (), None))
    ring = UnrollRing(RingSpec.of(builder, 1))
    front = FrontendTrajectories(_builder(1, (), 0), table, reply, ring)
    try:
        assert ring.write(_unroll(builder, 9.0), _origin(1)) == 1  # the ring is full
        slot = front.open(1)
        for _ in range(6):  # one unroll of 5 steps and its bootstrap frame
            front.record(slot, np.zeros(1, np.int64))
        assert front.backlog
        loop = asyncio.new_event_loop()
        try:
            waiting = loop.create_task(front.room(lambda: False))
            loop.run_until_complete(asyncio.sleep(0.05))
            assert not waiting.done()  # still full: it waits
            closing = False
            waiting.cancel()
            held = loop.create_task(front.room(lambda: closing))
            loop.run_until_complete(asyncio.sleep(0.05))
            assert not held.done()
            closing = True
            loop.run_until_complete(asyncio.wait_for(held, 5.0))  # ends, the ring still full
            assert front.backlog
        finally:
            loop.close()
    finally:
        for block in (ring, reply, table):
            block.close()


def _rung(bell: int) -> bool:
    """Whether the doorbell was rung since it was last read (and read it)."""
    try:
        os.read(bell, 8)
    except BlockingIOError:
        return False
    return True


_ORIGIN_ONE = (np.zeros(1, np.int64), np.zeros(1, np.int64))
"""One unroll's builder slot and number, as a builder's ``last_origin`` gives them."""


def test_a_frontend_rings_the_drain_once_half_its_ring_waits():
    builder = _builder(1, (), 0)
    table = SlotTable(TableSpec(4, 1, 4 * FEATURES, "<i8", ()))
    reply = ReplyRows(ReplySpec(4, 2, (), None))
    ring = UnrollRing(RingSpec.of(builder, 4))
    bell = new_doorbell()
    front = FrontendTrajectories(TrajectoryBuilder(**builder.layout()), table, reply, ring, bell)
    try:
        front._unrolls.append((_unroll(builder, 0.0), _ORIGIN_ONE, None))
        front.flush()
        assert not _rung(bell)  # a quarter of the ring: the drain's period takes it
        front._unrolls.append((_unroll(builder, 1.0), _ORIGIN_ONE, None))
        front.flush()
        assert _rung(bell)  # half: a trainer batch waits
        assert ring.read() is not None
        front._unrolls.append((_unroll(builder, 2.0), _ORIGIN_ONE, None))
        front.flush()
        assert not _rung(bell)  # taken: the count starts again
    finally:
        os.close(bell)
        table.close()
        reply.close()
        ring.close()


def test_the_drain_takes_a_ring_when_rung_without_waiting_for_its_period(monkeypatch):
    monkeypatch.setattr(tier_unrolls, "DRAIN_PERIOD_S", 3600.0)
    builder = _builder(1, (), 0)
    ring = UnrollRing(RingSpec.of(builder, 4))
    queue = UnrollQueue(8)
    drainer = UnrollDrain([ring], queue, True, LearnerStats())
    try:
        drainer.start(None)  # type: ignore[arg-type]  # no episodes: no loop needed
        two = Unrolls.concat([_unroll(builder, v) for v in (1.0, 2.0)])
        assert ring.write(two, (np.zeros(2, np.int64), np.arange(2, dtype=np.int64))) == 2
        os.write(drainer.bell, (1).to_bytes(8, "little"))
        taken = queue.get(2, timeout=60)
        assert taken is not None and taken.reward[:, 0].tolist() == [1.0, 2.0]
    finally:
        assert drainer.stop(timeout_s=60)  # the stop rings it too
        ring.close()


# ------------------------------------------------------------ the model side's gather


def test_a_batch_gathers_its_lanes_rows_by_index_lane_by_lane():

    table = SlotTable(TableSpec(8, 4, 4 * FEATURES, "<i8", ()))
    try:
        lanes = LaneRows(table, np.dtype(np.float32), (FEATURES,))
        for lane, (begin, count) in enumerate([(0, 2), (2, 1), (5, 3)]):
            lanes.open(lane, begin, count, owner=lane % 2, slot_K=np.arange(count) + 10 * lane)
        assert lanes.rows_of(np.array([2, 0])).tolist() == [5, 6, 7, 0, 1]
        assert lanes.rows_of(np.array([1])).tolist() == [2]
        lanes.obs_RO[:] = np.arange(8)[:, None]
        lanes.reward_R[:] = np.arange(8) / 2
        rows = lanes.gather(lanes.rows_of(np.array([2, 1])))
        assert rows.slot_B.tolist() == [20, 21, 22, 10]
        assert rows.obs_BO[:, 0].tolist() == [5, 6, 7, 2] and rows.obs_BO.flags.writeable
        assert rows.reward_B.tolist() == [2.5, 3.0, 3.5, 1.0]
        del rows
    finally:
        table.close()


# ------------------------------------------------------------ the drain's dataset offers


class _Stitching:
    """The dataset recorder's side of the drain's offers, stitched at once (no thread)."""

    def __init__(self) -> None:
        self.stitcher = EpisodeStitcher(RowConverter(_SPEC), 0)
        self.slots: set[int] = set()
        self.episodes = 0

    def offer(self, unrolls: Unrolls, slot_N: np.ndarray, index_N: np.ndarray) -> None:
        self.slots.update(slot_N.tolist())
        self.episodes += len(self.stitcher.add(unrolls, slot_N, index_N))


def test_the_drain_offers_each_frontends_unrolls_under_slots_of_its_own():
    """Two frontends' builders both hand out slot 0; the recorder must see two slots, or
    it would stitch one frontend's unrolls onto the other's episodes and cut them."""
    builders = [_builder(1, (), 0) for _ in range(2)]
    rings = [UnrollRing(RingSpec.of(builders[0], 16)) for _ in builders]
    recorder = _Stitching()
    drain = UnrollDrain(rings, None, False, LearnerStats(), recorder)  # type: ignore[arg-type]
    played = 0
    try:
        slot_B = [b.allocate(1) for b in builders]
        assert slot_B[0].tolist() == slot_B[1].tolist() == [0]
        for step in range(36):  # unrolls of 5 steps end at frames 5, 10, ..., 35
            done = step % 7 == 6  # episodes of 6 steps: every one ends inside an unroll
            played += 2 * done
            for index, (builder, ring) in enumerate(zip(builders, rings, strict=True)):
                unrolls, _ = builder.record(
                    slot_B[index], np.full((1, FEATURES), 100.0 * index + step, np.float32),
                    np.ones(1, np.float32), np.array([done]), np.zeros(1, bool),
                    builder.first_flags(slot_B[index]), np.zeros(1, np.int64),
                    np.zeros((1, 2), np.float32), (), (), 0,
                )  # fmt: skip
                if unrolls is not None:
                    assert ring.write(unrolls, builder.last_origin) == len(unrolls)
                drain.take(index)
        assert recorder.slots == {0, FRONTEND_SLOTS}
        assert recorder.stitcher.cut == 0
        assert recorder.episodes == played == 10
    finally:
        for ring in rings:
            ring.close()
