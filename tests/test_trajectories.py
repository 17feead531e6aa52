"""TrajectoryBuilder, Unrolls and UnrollQueue, driven by scripted per-slot frame streams.

The scripts follow the actor's NEXT_STEP autoreset protocol: a slot's first frame is a
reset observation (reward 0, no flags); an episode of L steps then sends L frames, the
last one carrying ``terminated`` or ``truncated``; the frame after it is the next reset
observation (reward 0).

Every recorded value encodes where it came from, so any row of any unroll can be traced
back: frame ``i`` of slot ``s`` has ``obs = (1000 s + i, 0.5 i)``, ``action = 1000 s + i``,
``params = (i, s, -i)``, core state before ``(s, i, 1)`` and after ``(s, i, 2)``.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from learner.state.trajectories import TrajectoryBuilder, UnrollQueue, Unrolls

T = 5
H = 3  # core state size when a core is used


def make_builder(
    core_state_sizes: tuple[int, ...] = (), initial_capacity: int = 64, **options: Any
) -> TrajectoryBuilder:
    return TrajectoryBuilder(
        unroll_length=T,
        obs_shape=(2,),
        obs_dtype=np.float32,
        action_shape=(),
        action_dtype=np.int64,
        param_size=3,
        core_state_sizes=core_state_sizes,
        initial_capacity=initial_capacity,
        **options,
    )


@dataclass(frozen=True)
class Frame:
    """What the actor sends with one observation: the outcome of the previous action."""

    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


def episodes(*specs: tuple[int, str], step_reward: float = 1.0) -> list[Frame]:
    """Frames for episodes given as ``(steps, "term" | "trunc" | "open")``.

    Step ``k`` of an episode earns ``step_reward * k``, so returns are easy to predict.
    """
    frames: list[Frame] = []
    for steps, ending in specs:
        frames.append(Frame())  # the reset observation
        for k in range(1, steps + 1):
            last = k == steps
            frames.append(
                Frame(
                    reward=step_reward * k,
                    terminated=last and ending == "term",
                    truncated=last and ending == "trunc",
                )
            )
    return frames


def obs_of(slot: int, i: int) -> np.ndarray:
    return np.array([1000 * slot + i, 0.5 * i], np.float32)


def params_of(slot: int, i: int) -> np.ndarray:
    return np.array([i, slot, -i], np.float32)


def state_of(slot: int, i: int, which: float) -> np.ndarray:
    return np.array([slot, i, which], np.float32)


def single_unrolls(unrolls: Unrolls) -> list[Unrolls]:
    out = []
    rest = unrolls
    while len(rest):
        head, rest = rest.split(1)
        out.append(head)
    return out


@dataclass
class Driver:
    """Feeds scripted frames to a builder one batch at a time and files what comes out."""

    builder: TrajectoryBuilder
    streams: dict[int, list[Frame]]
    count: dict[int, int] = field(default_factory=dict)
    unrolls: dict[int, list[Unrolls]] = field(default_factory=dict)
    emitted_at: dict[int, list[int]] = field(default_factory=dict)
    finished: dict[int, list[tuple[int, float, int]]] = field(default_factory=dict)
    ticks: int = 0

    def tick(self, slots: list[int]) -> None:
        slot_B = np.array(slots, dtype=np.int64)
        index_B = [self.count.get(s, 0) for s in slots]
        frames = [self.streams[s][i] for s, i in zip(slots, index_B, strict=True)]
        terminated_B = np.array([f.terminated for f in frames])
        truncated_B = np.array([f.truncated for f in frames])
        first_B = self.builder.first_flags(slot_B)
        with_state = bool(self.builder.core_state_SH)
        states = (
            (
                (np.stack([state_of(s, i, 1.0) for s, i in zip(slots, index_B, strict=True)]),),
                (np.stack([state_of(s, i, 2.0) for s, i in zip(slots, index_B, strict=True)]),),
            )
            if with_state
            else ((), ())
        )
        unrolls, done = self.builder.record(
            slot_B,
            np.stack([obs_of(s, i) for s, i in zip(slots, index_B, strict=True)]),
            np.array([f.reward for f in frames], np.float32),
            terminated_B,
            truncated_B,
            first_B,
            np.array([1000 * s + i for s, i in zip(slots, index_B, strict=True)], np.int64),
            np.stack([params_of(s, i) for s, i in zip(slots, index_B, strict=True)]),
            states[0],
            states[1],
            learner_step=100 + self.ticks,
        )
        self.ticks += 1
        if unrolls is not None:
            for one in single_unrolls(unrolls):
                slot = int(one.obs[0, 0, 0]) // 1000
                self.unrolls.setdefault(slot, []).append(one)
                self.emitted_at.setdefault(slot, []).append(self.count[slot])
        done_slots = [s for s, f in zip(slots, frames, strict=True) if f.done]
        if done is None:
            assert not done_slots
        else:
            assert len(done.returns) == len(done.lengths) == len(done_slots)
            for s, ret, length in zip(done_slots, done.returns, done.lengths, strict=True):
                self.finished.setdefault(s, []).append((self.count[s], float(ret), int(length)))
        for s, i in zip(slots, index_B, strict=True):
            self.count[s] = i + 1

    def run(self, schedule: list[list[int]]) -> None:
        for slots in schedule:
            self.tick(slots)


def expected_rows(slot: int, n: int) -> np.ndarray:
    """Frame indices held by unroll ``n`` of a slot: ``nT .. nT + T``."""
    return np.arange(n * T, n * T + T + 1)


# ---------------------------------------------------------------- unroll boundaries


def test_unrolls_emitted_on_frame_T_plus_1_then_every_T() -> None:
    builder = make_builder()
    a, b, c = (int(i) for i in builder.allocate(3))
    streams = {s: episodes((40, "open")) for s in (a, b, c)}
    driver = Driver(builder, streams)
    # staggered: b joins 2 batches late, c 7 late and skips some batches
    schedule = [[a], [a], [a, b], [a, b], [a, b], [a, b], [a, b], [a, b, c]]
    schedule += [[a, b, c] if t % 3 else [a, b] for t in range(20)]
    driver.run(schedule)

    for s in (a, b, c):
        n_frames = driver.count[s]
        # frame index i (the slot's (i+1)-th frame) closes an unroll when i = T, 2T, 3T, ...
        assert driver.emitted_at[s] == list(range(T, n_frames, T))
        assert len(driver.unrolls[s]) == (n_frames - 1) // T
        for n, unroll in enumerate(driver.unrolls[s]):
            assert len(unroll) == 1
            assert unroll.obs.shape == (1, T + 1, 2)
            assert unroll.action.shape == (1, T + 1)
            assert unroll.policy_params.shape == (1, T + 1, 3)
            rows = expected_rows(s, n)
            np.testing.assert_array_equal(unroll.obs[0, :, 0], 1000 * s + rows)
            np.testing.assert_array_equal(unroll.obs[0, :, 1], 0.5 * rows)
            np.testing.assert_array_equal(unroll.action[0], 1000 * s + rows)
            np.testing.assert_array_equal(
                unroll.policy_params[0], np.stack([params_of(s, i) for i in rows])
            )


def test_no_unroll_before_T_plus_1_frames() -> None:
    builder = make_builder()
    (slot,) = (int(i) for i in builder.allocate(1))
    driver = Driver(builder, {slot: episodes((20, "open"))})
    driver.run([[slot]] * T)
    assert driver.unrolls == {}
    driver.tick([slot])
    assert len(driver.unrolls[slot]) == 1
    driver.run([[slot]] * (T - 1))
    assert len(driver.unrolls[slot]) == 1
    driver.tick([slot])
    assert len(driver.unrolls[slot]) == 2


def test_several_slots_completing_in_one_batch_come_out_together() -> None:
    builder = make_builder()
    slots = [int(i) for i in builder.allocate(4)]
    streams = {s: episodes((20, "open")) for s in slots}
    driver = Driver(builder, streams)
    driver.run([slots] * T)
    # one batch: all four reach row T at once, in batch order
    slot_B = np.array(slots[::-1])
    unrolls, _ = builder.record(
        slot_B,
        np.stack([obs_of(s, T) for s in slot_B]),
        np.zeros(4, np.float32),
        np.zeros(4, bool),
        np.zeros(4, bool),
        np.zeros(4, bool),
        np.zeros(4, np.int64),
        np.zeros((4, 3), np.float32),
        (),
        (),
        learner_step=0,
    )
    assert unrolls is not None
    assert len(unrolls) == 4
    np.testing.assert_array_equal(unrolls.obs[:, 0, 0], 1000 * slot_B)
    np.testing.assert_array_equal(unrolls.obs[:, T, 0], 1000 * slot_B + T)


def test_overlap_frame_last_row_equals_next_first_row() -> None:
    builder = make_builder(core_state_sizes=(H,))
    a, b = (int(i) for i in builder.allocate(2))
    streams = {
        a: episodes((3, "term"), (4, "trunc"), (30, "open")),
        b: episodes((2, "trunc"), (5, "term"), (30, "open")),
    }
    driver = Driver(builder, streams)
    driver.run([[a, b]] * (4 * T + 1))
    for s in (a, b):
        got = driver.unrolls[s]
        assert len(got) == 4
        for prev, nxt in itertools.pairwise(got):
            for name in (
                "obs",
                "action",
                "policy_params",
                "first",
                "reward",
                "terminated",
                "truncated",
            ):
                np.testing.assert_array_equal(
                    getattr(prev, name)[0, T], getattr(nxt, name)[0, 0], err_msg=name
                )


def expected_running_returns(stream: list[Frame], discount: float) -> list[float]:
    """Per frame: the discounted sum of its episode's rewards up to it, summed term by term
    from the episode's reset frame (the frame after a done one, or the first)."""
    sums = []
    start = 0
    for i in range(len(stream)):
        if i and stream[i - 1].done:
            start = i
        sums.append(sum(discount ** (i - m) * stream[m].reward for m in range(start, i + 1)))
    return sums


def test_running_returns_follow_each_slots_episodes_across_unrolls() -> None:
    """With a return discount every row keeps its episode's discounted reward sum so far,
    carried from unroll to unroll (with and without overlap), restarted at every reset."""
    discount = 0.9
    for overlap in (0, 2):
        builder = make_builder(overlap=overlap, return_discount=discount)
        a, b = (int(i) for i in builder.allocate(2))
        streams = {
            a: episodes((3, "term"), (7, "trunc"), (30, "open")),
            b: episodes((12, "trunc"), (2, "term"), (30, "open")),
        }
        driver = Driver(builder, streams)
        driver.run([[a, b]] * (4 * T + 1))
        for s in (a, b):
            expected = expected_running_returns(streams[s], discount)
            assert len(driver.unrolls[s]) >= 4
            for one in driver.unrolls[s]:
                assert one.running_return is not None
                frames = one.obs[0, :, 0].astype(int) - 1000 * s
                np.testing.assert_allclose(
                    one.running_return[0], [expected[i] for i in frames], rtol=1e-6,
                    err_msg=f"overlap {overlap}, slot {s}, frames {frames}",
                )  # fmt: skip


def test_without_a_return_discount_no_running_return_is_kept() -> None:
    builder = make_builder()
    (a,) = (int(i) for i in builder.allocate(1))
    driver = Driver(builder, {a: episodes((30, "open"))})
    driver.run([[a]] * (T + 1))
    assert driver.unrolls[a][0].running_return is None
    assert builder.empty_unrolls(2).running_return is None


def test_emitted_unrolls_are_copies_not_views_of_the_slot_buffers() -> None:
    builder = make_builder()
    (slot,) = (int(i) for i in builder.allocate(1))
    driver = Driver(builder, {slot: episodes((40, "open"))})
    driver.run([[slot]] * (3 * T + 1))
    first, second, third = driver.unrolls[slot]
    np.testing.assert_array_equal(first.obs[0, :, 0], 1000 * slot + expected_rows(slot, 0))
    np.testing.assert_array_equal(second.obs[0, :, 0], 1000 * slot + expected_rows(slot, 1))
    np.testing.assert_array_equal(third.obs[0, :, 0], 1000 * slot + expected_rows(slot, 2))


# ---------------------------------------------------------------- flags and episodes


def _frames_of(driver: Driver, slot: int, name: str) -> np.ndarray:
    """A per-frame field of a slot stitched from its unrolls (dropping the overlap rows)."""
    parts = [getattr(u, name)[0, :T] for u in driver.unrolls[slot]]
    return np.concatenate(parts)


def test_terminated_and_truncated_stored_on_the_frame_that_carried_them() -> None:
    builder = make_builder()
    a, b = (int(i) for i in builder.allocate(2))
    streams = {
        a: episodes((3, "term"), (4, "trunc"), (2, "term"), (30, "open")),
        b: episodes((6, "trunc"), (1, "term"), (30, "open")),
    }
    driver = Driver(builder, streams)
    driver.run([[a, b]] * (4 * T + 1))
    n = 4 * T
    for s in (a, b):
        script = streams[s][:n]
        np.testing.assert_array_equal(
            _frames_of(driver, s, "terminated"), [f.terminated for f in script]
        )
        np.testing.assert_array_equal(
            _frames_of(driver, s, "truncated"), [f.truncated for f in script]
        )
        np.testing.assert_array_equal(
            _frames_of(driver, s, "reward"), np.array([f.reward for f in script], np.float32)
        )
    # spot checks against the script: slot a terminates at frame 3, truncates at frame 8
    term_a, trunc_a = _frames_of(driver, a, "terminated"), _frames_of(driver, a, "truncated")
    assert term_a[3] and not trunc_a[3]
    assert trunc_a[8] and not term_a[8]
    assert term_a.sum() == 2 and trunc_a.sum() == 1


def test_first_on_slot_start_and_after_done_frames() -> None:
    builder = make_builder()
    a, b = (int(i) for i in builder.allocate(2))
    streams = {
        a: episodes((3, "term"), (4, "trunc"), (2, "term"), (30, "open")),
        b: episodes((1, "trunc"), (1, "term"), (30, "open")),
    }
    driver = Driver(builder, streams)
    driver.run([[a, b]] * (4 * T + 1))
    for s in (a, b):
        script = streams[s][: 4 * T]
        expected = [i == 0 or script[i - 1].done for i in range(len(script))]
        np.testing.assert_array_equal(_frames_of(driver, s, "first"), expected)
    # slot a: reset frames are 0, 4 (after term at 3), 9 (after trunc at 8), 12
    assert np.flatnonzero(_frames_of(driver, a, "first")).tolist() == [0, 4, 9, 12]


def test_first_flags_reads_the_next_frames_first_before_recording() -> None:
    builder = make_builder()
    (slot,) = (int(i) for i in builder.allocate(1))
    slot_B = np.array([slot])
    assert builder.first_flags(slot_B).tolist() == [True]
    driver = Driver(builder, {slot: episodes((2, "term"), (5, "open"))})
    driver.tick([slot])  # reset frame
    assert builder.first_flags(slot_B).tolist() == [False]
    driver.tick([slot])  # step 1
    driver.tick([slot])  # step 2, terminated
    assert builder.first_flags(slot_B).tolist() == [True]
    driver.tick([slot])  # reset frame
    assert builder.first_flags(slot_B).tolist() == [False]


def test_episode_returns_reported_on_the_done_frame() -> None:
    builder = make_builder()
    a, b = (int(i) for i in builder.allocate(2))
    streams = {
        a: episodes((3, "term"), (4, "trunc"), (2, "term"), (30, "open")),
        b: episodes((6, "trunc"), (1, "term"), (30, "open")),
    }
    driver = Driver(builder, streams)
    driver.run([[a, b]] * 20)
    # (frame index of the done frame, return = 1 + 2 + ... + steps)
    assert [(i, r) for i, r, _ in driver.finished[a]] == [(3, 6.0), (8, 10.0), (11, 3.0)]
    assert [(i, r) for i, r, _ in driver.finished[b]] == [(6, 21.0), (8, 1.0)]


def test_episode_lengths_after_the_first_episode() -> None:
    builder = make_builder()
    a, b = (int(i) for i in builder.allocate(2))
    streams = {
        a: episodes((3, "term"), (4, "trunc"), (2, "term"), (30, "open")),
        b: episodes((6, "trunc"), (1, "term"), (30, "open")),
    }
    driver = Driver(builder, streams)
    driver.run([[a, b]] * 20)
    # the reset frame counts as step 0: an episode of L steps has length L
    assert [length for _, _, length in driver.finished[a][1:]] == [4, 2]
    assert [length for _, _, length in driver.finished[b][1:]] == [1]


def test_first_episode_length_counts_like_later_episodes() -> None:
    builder = make_builder()
    (slot,) = (int(i) for i in builder.allocate(1))
    driver = Driver(builder, {slot: episodes((3, "term"), (3, "term"), (5, "open"))})
    driver.run([[slot]] * 9)
    assert [length for _, _, length in driver.finished[slot]] == [3, 3]


def test_truncated_episode_without_later_reset_reports_nothing_until_done() -> None:
    builder = make_builder()
    (slot,) = (int(i) for i in builder.allocate(1))
    driver = Driver(builder, {slot: episodes((30, "open"))})
    driver.run([[slot]] * 12)
    assert driver.finished == {}


# ---------------------------------------------------------------- core state and steps


def test_core_state_is_the_state_before_row_0() -> None:
    builder = make_builder(core_state_sizes=(H,))
    a, b = (int(i) for i in builder.allocate(2))
    streams = {
        a: episodes((3, "term"), (30, "open")),
        b: episodes((30, "open")),
    }
    driver = Driver(builder, streams)
    driver.run([[a], [a, b], [a, b], [a], [a, b]] + [[a, b]] * (3 * T))
    for s in (a, b):
        assert len(driver.unrolls[s]) >= 2
        for n, unroll in enumerate(driver.unrolls[s]):
            assert len(unroll.core_state) == 1
            assert unroll.core_state[0].shape == (1, H)
            np.testing.assert_array_equal(unroll.core_state[0][0], state_of(s, n * T, 1.0))
        # the running state is the state after the slot's latest frame
        last = driver.count[s] - 1
        np.testing.assert_array_equal(builder.core_state_SH[0][s], state_of(s, last, 2.0))


def test_no_core_state_gives_empty_tuple() -> None:
    builder = make_builder()
    (slot,) = (int(i) for i in builder.allocate(1))
    driver = Driver(builder, {slot: episodes((30, "open"))})
    driver.run([[slot]] * (T + 1))
    assert driver.unrolls[slot][0].core_state == ()


def test_acted_step_is_the_learner_step_of_each_row() -> None:
    """Every row keeps the step of the weights that acted on it; the overlap row too."""
    builder = make_builder()
    (slot,) = (int(i) for i in builder.allocate(1))
    driver = Driver(builder, {slot: episodes((30, "open"))})
    driver.run([[slot]] * (3 * T + 1))  # learner_step = 100 + tick = 100 + frame index
    got = [u.acted_step[0].tolist() for u in driver.unrolls[slot]]
    assert got == [[100 + n * T + r for r in range(T + 1)] for n in range(3)]
    assert driver.unrolls[slot][0].acted_step.dtype == np.int64


# ---------------------------------------------------------------- slot management


def test_allocate_gives_distinct_fresh_slots_and_release_reports_frames_lost() -> None:
    builder = make_builder(initial_capacity=8)
    ids = builder.allocate(3)
    assert ids.dtype == np.int64
    assert len(set(ids.tolist())) == 3
    assert builder.slots_in_use == 3
    a, b, c = (int(i) for i in ids)
    driver = Driver(builder, {s: episodes((40, "open")) for s in (a, b, c)})
    driver.run([[a, b]] * 3)
    assert builder.release(np.array([a])) == 3  # three frames, no unroll yet
    assert builder.release(np.array([c])) == 0  # never recorded
    assert builder.slots_in_use == 1

    # b completes an unroll, then records 2 more frames: row 0 (the overlap frame,
    # whose action no unroll has trained on yet) and the 2 new frames are lost.
    driver.run([[b]] * (T + 1 - 3 + 2))  # frames 3..7; frame 5 closes the unroll
    assert len(driver.unrolls[b]) == 1
    assert builder.release(np.array([b])) == 3
    assert builder.slots_in_use == 0


def test_released_slots_are_reused_and_reset() -> None:
    builder = make_builder(core_state_sizes=(H,), initial_capacity=4)
    a, b = (int(i) for i in builder.allocate(2))
    old = Driver(builder, {a: episodes((2, "term"), (30, "open")), b: episodes((30, "open"))})
    old.run([[a, b]] * 7)  # a is mid-episode, mid-unroll, with non-zero core state
    assert builder.release(np.array([a])) == 7 - T

    capacity = builder.capacity
    (again,) = (int(i) for i in builder.allocate(1))
    assert again == a  # the released slot is reused
    assert builder.capacity == capacity
    np.testing.assert_array_equal(builder.core_state_SH[0][again], np.zeros(H))
    assert builder.first_flags(np.array([again])).tolist() == [True]

    # a new connection on the reused slot: nothing of the old run leaks in
    new = Driver(builder, {again: episodes((3, "term"), (30, "open"))})
    new.run([[again]] * (T + 1))
    (unroll,) = new.unrolls[again]
    np.testing.assert_array_equal(unroll.obs[0, :, 0], 1000 * again + np.arange(T + 1))
    assert unroll.first[0].tolist() == [True, False, False, False, True, False]
    np.testing.assert_array_equal(unroll.core_state[0][0], state_of(again, 0, 1.0))
    assert [r for _, r, _ in new.finished[again]] == [6.0]
    # the other slot was untouched
    old.run([[b]] * 4)
    assert len(old.unrolls[b]) == 2
    np.testing.assert_array_equal(old.unrolls[b][1].obs[0, :, 0], 1000 * b + expected_rows(b, 1))


def test_growing_past_initial_capacity_keeps_slot_data() -> None:
    builder = make_builder(core_state_sizes=(H,), initial_capacity=2)
    a, b = (int(i) for i in builder.allocate(2))
    streams = {a: episodes((4, "term"), (30, "open")), b: episodes((30, "open"))}
    driver = Driver(builder, streams)
    driver.run([[a, b]] * (T + 3))  # each slot is 2 frames into its second unroll

    more = [int(i) for i in builder.allocate(5)]
    assert builder.capacity >= 7
    assert builder.slots_in_use == 7
    assert len(set(more) | {a, b}) == 7
    for s in more:
        streams[s] = episodes((30, "open"))

    driver.run([[a, b, *more]] * (2 * T))
    for s in (a, b):
        assert len(driver.unrolls[s]) == 3
        for n, unroll in enumerate(driver.unrolls[s]):
            np.testing.assert_array_equal(unroll.obs[0, :, 0], 1000 * s + expected_rows(s, n))
            np.testing.assert_array_equal(unroll.action[0], 1000 * s + expected_rows(s, n))
            np.testing.assert_array_equal(unroll.core_state[0][0], state_of(s, n * T, 1.0))
            np.testing.assert_array_equal(unroll.acted_step[0], 100 + n * T + np.arange(T + 1))
    # the episode in progress during the growth is reported whole
    assert [(i, r) for i, r, _ in driver.finished[a]] == [(4, 10.0)]
    for s in more:
        assert len(driver.unrolls[s]) == 1
        np.testing.assert_array_equal(
            driver.unrolls[s][0].obs[0, :, 0], 1000 * s + np.arange(T + 1)
        )


def test_allocate_from_zero_capacity() -> None:
    builder = make_builder(initial_capacity=0)
    assert builder.capacity == 0
    ids = builder.allocate(3)
    assert builder.capacity >= 3
    assert sorted(ids.tolist()) == [0, 1, 2]


# ---------------------------------------------------------------- Unrolls


def synthetic(n: int, tag: int, with_state: bool = True) -> Unrolls:
    """``n`` unrolls whose every value starts with ``tag`` so their origin shows."""
    ids = tag + np.arange(n)
    rows = np.arange(T + 1)
    return Unrolls(
        obs=(ids[:, None, None] + np.zeros((n, T + 1, 2))).astype(np.float32),
        first=np.zeros((n, T + 1), bool),
        reward=(ids[:, None] + rows).astype(np.float32),
        terminated=np.zeros((n, T + 1), bool),
        truncated=np.zeros((n, T + 1), bool),
        action=(ids[:, None] + rows).astype(np.int64),
        policy_params=np.repeat(ids[:, None, None], 3, axis=2).repeat(T + 1, axis=1).astype("f4"),
        core_state=(np.repeat(ids[:, None], H, axis=1).astype(np.float32),) if with_state else (),
        acted_step=ids.astype(np.int64),
    )


def test_unrolls_concat_and_split() -> None:
    parts = [synthetic(2, 10), synthetic(3, 20), synthetic(1, 30)]
    merged = Unrolls.concat(parts)
    order = [10, 11, 20, 21, 22, 30]
    assert len(merged) == 6
    assert merged.acted_step.tolist() == order
    assert merged.obs.shape == (6, T + 1, 2)
    assert merged.obs[:, 0, 0].tolist() == order
    assert merged.action[:, 0].tolist() == order
    assert merged.policy_params[:, 0, 0].tolist() == order
    assert merged.core_state[0][:, 0].tolist() == order

    head, tail = merged.split(4)
    assert (len(head), len(tail)) == (4, 2)
    assert head.acted_step.tolist() == order[:4]
    assert tail.acted_step.tolist() == order[4:]
    assert head.core_state[0][:, 0].tolist() == order[:4]
    assert tail.reward[:, 0].tolist() == order[4:]
    for name in ("first", "terminated", "truncated"):
        assert getattr(head, name).shape == (4, T + 1)

    all_of, none = merged.split(6)
    assert (len(all_of), len(none)) == (6, 0)
    assert none.obs.shape == (0, T + 1, 2)
    nothing, everything = merged.split(0)
    assert (len(nothing), len(everything)) == (0, 6)


def test_unrolls_concat_single_part_and_no_core_state() -> None:
    one = synthetic(2, 5, with_state=False)
    assert Unrolls.concat([one]) is one
    merged = Unrolls.concat([one, synthetic(1, 9, with_state=False)])
    assert merged.core_state == ()
    assert merged.acted_step.tolist() == [5, 6, 9]
    head, tail = merged.split(1)
    assert head.core_state == () and tail.core_state == ()


# ---------------------------------------------------------------- UnrollQueue


def test_queue_get_returns_exactly_n_across_puts_in_order() -> None:
    queue = UnrollQueue(max_unrolls=16)
    assert queue.put(synthetic(2, 10))
    assert queue.put(synthetic(3, 20))
    assert queue.put(synthetic(1, 30))
    assert len(queue) == 6

    got = queue.get(4, timeout=0.5)
    assert got is not None
    assert len(got) == 4
    assert got.acted_step.tolist() == [10, 11, 20, 21]
    assert len(queue) == 2

    got = queue.get(2, timeout=0.5)
    assert got is not None
    assert got.acted_step.tolist() == [22, 30]
    assert got.core_state[0][:, 0].tolist() == [22, 30]
    assert len(queue) == 0


def test_queue_get_times_out_with_none_when_not_enough() -> None:
    queue = UnrollQueue(max_unrolls=16)
    queue.put(synthetic(2, 0))
    started = time.perf_counter()
    assert queue.get(3, timeout=0.1) is None
    elapsed = time.perf_counter() - started
    assert 0.08 <= elapsed < 1.0
    assert len(queue) == 2  # nothing was taken
    got = queue.get(2, timeout=0.1)
    assert got is not None and got.acted_step.tolist() == [0, 1]


def test_queue_get_waits_for_a_later_put() -> None:
    queue = UnrollQueue(max_unrolls=16)
    result: list[Unrolls | None] = []
    getter = threading.Thread(target=lambda: result.append(queue.get(3, timeout=1.5)))
    getter.start()
    queue.put(synthetic(2, 0))
    time.sleep(0.05)
    assert getter.is_alive()
    queue.put(synthetic(2, 2))
    getter.join(timeout=1.0)
    assert not getter.is_alive()
    assert result[0] is not None
    assert result[0].acted_step.tolist() == [0, 1, 2]
    assert len(queue) == 1


def test_queue_put_blocks_when_full_until_a_get() -> None:
    queue = UnrollQueue(max_unrolls=2)
    assert queue.put(synthetic(1, 0))
    assert queue.put(synthetic(1, 1))
    assert not queue.has_room()
    started = time.perf_counter()
    assert queue.put(synthetic(1, 99), timeout=0.1) is False
    assert time.perf_counter() - started >= 0.08
    assert len(queue) == 2

    done: list[bool] = []
    putter = threading.Thread(target=lambda: done.append(queue.put(synthetic(1, 2), timeout=1.5)))
    putter.start()
    time.sleep(0.1)
    assert putter.is_alive()  # blocked: the queue is full
    got = queue.get(1, timeout=0.5)
    putter.join(timeout=1.0)
    assert not putter.is_alive()
    assert done == [True]
    assert got is not None and got.acted_step.tolist() == [0]
    rest = queue.get(2, timeout=0.5)
    assert rest is not None and rest.acted_step.tolist() == [1, 2]


def test_queue_close_wakes_blocked_get_and_put() -> None:
    empty = UnrollQueue(max_unrolls=2)
    full = UnrollQueue(max_unrolls=1)
    full.put(synthetic(1, 0))
    got: list[Unrolls | None] = []
    put: list[bool] = []
    getter = threading.Thread(target=lambda: got.append(empty.get(1, timeout=1.5)))
    putter = threading.Thread(target=lambda: put.append(full.put(synthetic(1, 1), timeout=1.5)))
    getter.start()
    putter.start()
    time.sleep(0.05)
    assert getter.is_alive() and putter.is_alive()

    started = time.perf_counter()
    empty.close()
    full.close()
    getter.join(timeout=1.0)
    putter.join(timeout=1.0)
    assert not getter.is_alive() and not putter.is_alive()
    assert time.perf_counter() - started < 0.5  # woken, not timed out
    assert got == [None]
    assert put == [False]
    assert len(full) == 1

    # after close: put refuses, get of more than is left returns at once
    assert empty.put(synthetic(1, 5), timeout=0.5) is False
    started = time.perf_counter()
    assert empty.get(1, timeout=1.0) is None
    assert time.perf_counter() - started < 0.5
