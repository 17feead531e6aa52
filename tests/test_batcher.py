"""DynamicBatcher: many streams' requests -> one process() call, closed on size, streams or time.

pytest-asyncio is not a dependency: every async test is a sync test around ``asyncio.run``
with an ``asyncio.wait_for`` bound, so nothing can hang the suite.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from learner.serving.batcher import BatcherClosed, DynamicBatcher, PendingRequest

TEST_BOUND_S = 1.8  # every test's event loop finishes within this


def run(main: Callable[[], Awaitable[Any]], bound_s: float = TEST_BOUND_S) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(main(), bound_s)

    return asyncio.run(bounded())


def answer(stream: int, obs: np.ndarray) -> np.ndarray:
    """The stand-in policy: a known function of the observation and the stream."""
    return obs * 2 + stream


class StandIn:
    """A deterministic ``process``: records every batch and answers ``answer(stream, obs)``.

    Payloads are ``(stream, obs_K)``; an ``obs_K`` whose first value is ``fail_value``
    makes the whole batch raise after answering the requests before it.
    """

    def __init__(self, delay_s: float = 0.0, fail_value: int | None = None) -> None:
        self.delay_s = delay_s
        self.fail_value = fail_value
        self.batches: list[list[tuple[int, np.ndarray]]] = []

    @property
    def batch_sizes(self) -> list[int]:
        return [len(b) for b in self.batches]

    async def __call__(self, batch: list[PendingRequest]) -> None:
        self.batches.append([r.payload for r in batch])
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        for request in batch:
            stream, obs = request.payload
            if self.fail_value is not None and obs[0] == self.fail_value:
                raise RuntimeError(f"policy failed on stream {stream}")
            if not request.future.done():
                request.future.set_result(answer(stream, obs))


@contextlib.asynccontextmanager
async def serving(batcher: DynamicBatcher) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(batcher.run())
    try:
        yield task
    finally:
        batcher.close()
        await asyncio.wait_for(task, 1.0)


def obs_for(stream: int, step: int, k: int = 1) -> np.ndarray:
    return np.full(k, stream * 1000 + step, dtype=np.int64) + np.arange(k)


# ---------------------------------------------------------------- correctness under load


def test_concurrent_actors_get_their_own_answers_and_requests_are_batched() -> None:
    num_actors, steps = 32, 50
    process = StandIn()

    async def actor(batcher: DynamicBatcher, stream: int, rng: random.Random) -> list[bool]:
        k = 1 + stream % 3  # streams carry different numbers of envs
        ok = []
        for step in range(steps):
            obs = obs_for(stream, step, k)
            got = await batcher.submit((stream, obs), num_frames=k)
            ok.append(got.shape == (k,) and np.array_equal(got, answer(stream, obs)))
            await asyncio.sleep(rng.uniform(0.0, 0.002))
        return ok

    async def main() -> list[list[bool]]:
        batcher = DynamicBatcher(process, max_frames=24, timeout_s=0.002)
        batcher.open_streams = num_actors
        async with serving(batcher):
            return await asyncio.gather(
                *(actor(batcher, s, random.Random(s)) for s in range(num_actors))
            )

    results = run(main)
    assert [all(r) for r in results] == [True] * num_actors
    assert all(len(r) == steps for r in results)

    # every request was processed exactly once
    seen = sorted((s, int(o[0])) for batch in process.batches for s, o in batch)
    assert seen == sorted((s, s * 1000 + t) for s in range(num_actors) for t in range(steps))

    sizes = process.batch_sizes
    assert max(sizes) > 1
    assert sum(sizes) / len(sizes) > 1
    assert len(sizes) < num_actors * steps


def test_counters_track_batches_and_frames() -> None:
    process = StandIn()

    async def main() -> DynamicBatcher:
        batcher = DynamicBatcher(process, max_frames=5, timeout_s=5.0)
        async with serving(batcher):
            await asyncio.gather(
                batcher.submit((0, obs_for(0, 0, 2)), 2),
                batcher.submit((1, obs_for(1, 0, 3)), 3),
            )
        return batcher

    batcher = run(main)
    assert batcher.batches == 1
    assert batcher.frames == 5
    assert process.batch_sizes == [2]


# ---------------------------------------------------------------- when a batch closes


def test_batch_closes_at_max_frames_without_waiting_for_timeout() -> None:
    process = StandIn()

    async def main() -> float:
        batcher = DynamicBatcher(process, max_frames=4, timeout_s=5.0)
        async with serving(batcher):
            started = time.perf_counter()
            # two streams of 2 envs each reach max_frames=4
            first = asyncio.create_task(batcher.submit((0, obs_for(0, 0, 2)), 2))
            await asyncio.sleep(0.05)
            assert not first.done()  # 2 of 4 frames: the batch stays open
            second = batcher.submit((1, obs_for(1, 0, 2)), 2)
            a0, a1 = await asyncio.gather(first, second)
            np.testing.assert_array_equal(a0, answer(0, obs_for(0, 0, 2)))
            np.testing.assert_array_equal(a1, answer(1, obs_for(1, 0, 2)))
            return time.perf_counter() - started

    elapsed = run(main)
    assert elapsed < 0.5
    assert process.batch_sizes == [2]


def test_batch_closes_when_every_open_stream_is_pending() -> None:
    process = StandIn()

    async def main() -> list[float]:
        batcher = DynamicBatcher(process, max_frames=100, timeout_s=5.0)
        batcher.open_streams = 1
        latencies = []
        async with serving(batcher):
            for step in range(5):
                started = time.perf_counter()
                got = await batcher.submit((0, obs_for(0, step)), 1)
                latencies.append(time.perf_counter() - started)
                np.testing.assert_array_equal(got, answer(0, obs_for(0, step)))
        return latencies

    latencies = run(main)
    assert max(latencies) < 0.5  # far below the 5 s timeout
    assert process.batch_sizes == [1] * 5


def test_batch_waits_for_all_open_streams_then_closes_at_once() -> None:
    process = StandIn()

    async def main() -> float:
        batcher = DynamicBatcher(process, max_frames=100, timeout_s=5.0)
        batcher.open_streams = 3
        async with serving(batcher):
            early = [asyncio.create_task(batcher.submit((s, obs_for(s, 0)), 1)) for s in range(2)]
            await asyncio.sleep(0.05)
            assert not any(t.done() for t in early)  # 2 of 3 streams pending: still open
            started = time.perf_counter()
            await asyncio.gather(*early, batcher.submit((2, obs_for(2, 0)), 1))
            return time.perf_counter() - started

    assert run(main) < 0.5
    assert process.batch_sizes == [3]


def test_batch_closes_on_timeout_when_a_stream_never_submits() -> None:
    process = StandIn()
    timeout_s = 0.2

    async def main() -> float:
        batcher = DynamicBatcher(process, max_frames=100, timeout_s=timeout_s)
        batcher.open_streams = 2  # stream 1 is connected but silent
        async with serving(batcher):
            started = time.perf_counter()
            got = await batcher.submit((0, obs_for(0, 0)), 1)
            np.testing.assert_array_equal(got, answer(0, obs_for(0, 0)))
            return time.perf_counter() - started

    elapsed = run(main)
    assert 0.8 * timeout_s <= elapsed < timeout_s + 0.5
    assert process.batch_sizes == [1]


def test_quorum_closes_without_waiting_for_stragglers() -> None:
    """With 20 streams open and a 0.9 quorum, 18 pending requests close the batch at once;
    the two silent streams cost nobody the (long) timeout."""
    process = StandIn()

    async def main() -> float:
        batcher = DynamicBatcher(process, max_frames=100, timeout_s=5.0, quorum=0.9)
        batcher.open_streams = 20
        async with serving(batcher):
            started = time.perf_counter()
            got = await asyncio.gather(*(batcher.submit((s, obs_for(s, 0)), 1) for s in range(18)))
            for s, actions in enumerate(got):
                np.testing.assert_array_equal(actions, answer(s, obs_for(s, 0)))
            return time.perf_counter() - started

    assert run(main) < 1.0
    assert process.batch_sizes == [18]


@pytest.mark.parametrize(
    ("open_streams", "pending", "at_once"),
    [(2, 1, False), (9, 8, False), (10, 9, True), (64, 57, False), (64, 58, True)],
)
def test_quorum_rounds_up_so_few_streams_all_count(
    open_streams: int, pending: int, at_once: bool
) -> None:
    """0.9 of the open streams, rounded up: up to 9 streams every one must be pending."""
    process = StandIn()
    timeout_s = 0.3

    async def main() -> float:
        batcher = DynamicBatcher(process, max_frames=1000, timeout_s=timeout_s, quorum=0.9)
        batcher.open_streams = open_streams
        async with serving(batcher):
            started = time.perf_counter()
            await asyncio.gather(*(batcher.submit((s, obs_for(s, 0)), 1) for s in range(pending)))
            return time.perf_counter() - started

    elapsed = run(main)
    if at_once:
        assert elapsed < 0.5 * timeout_s
    else:
        assert elapsed >= 0.8 * timeout_s
    assert process.batch_sizes == [pending]


@pytest.mark.parametrize("quorum", [0.0, -0.5, 1.5])
def test_quorum_outside_zero_one_is_refused(quorum: float) -> None:
    with pytest.raises(ValueError, match="quorum"):
        DynamicBatcher(StandIn(), max_frames=10, timeout_s=1.0, quorum=quorum)


def test_timeout_applies_without_open_streams_and_below_max_frames() -> None:
    process = StandIn()
    timeout_s = 0.1

    async def main() -> float:
        batcher = DynamicBatcher(process, max_frames=4, timeout_s=timeout_s)
        async with serving(batcher):
            started = time.perf_counter()
            await asyncio.gather(*(batcher.submit((s, obs_for(s, 0)), 1) for s in range(3)))
            return time.perf_counter() - started

    elapsed = run(main)
    assert 0.8 * timeout_s <= elapsed < timeout_s + 0.5
    assert process.batch_sizes == [3]


# ---------------------------------------------------------------- failures


def test_failing_process_fails_only_its_batch_and_batcher_keeps_serving() -> None:
    process = StandIn(fail_value=-1)

    async def main() -> None:
        batcher = DynamicBatcher(process, max_frames=100, timeout_s=5.0)
        batcher.open_streams = 1
        async with serving(batcher) as task:
            bad = np.array([-1])
            with pytest.raises(RuntimeError, match="policy failed on stream 0"):
                await batcher.submit((0, bad), 1)
            assert not task.done()
            for step in range(3):
                got = await batcher.submit((0, obs_for(0, step)), 1)
                np.testing.assert_array_equal(got, answer(0, obs_for(0, step)))

    run(main)
    assert process.batch_sizes == [1, 1, 1, 1]


def test_failing_process_keeps_answers_already_given_in_that_batch() -> None:
    process = StandIn(fail_value=-1)

    async def main() -> None:
        batcher = DynamicBatcher(process, max_frames=100, timeout_s=5.0)
        batcher.open_streams = 3
        async with serving(batcher):
            results = await asyncio.gather(
                batcher.submit((0, obs_for(0, 0)), 1),
                batcher.submit((1, np.array([-1])), 1),
                batcher.submit((2, obs_for(2, 0)), 1),
                return_exceptions=True,
            )
            np.testing.assert_array_equal(results[0], answer(0, obs_for(0, 0)))
            assert isinstance(results[1], RuntimeError)
            assert isinstance(results[2], RuntimeError)  # same batch, not yet answered
            batcher.open_streams = 1
            got = await batcher.submit((0, obs_for(0, 1)), 1)
            np.testing.assert_array_equal(got, answer(0, obs_for(0, 1)))

    run(main)


def test_close_fails_pending_and_later_submits() -> None:
    process = StandIn()

    async def main() -> None:
        batcher = DynamicBatcher(process, max_frames=100, timeout_s=5.0)
        batcher.open_streams = 2
        task = asyncio.create_task(batcher.run())
        pending = asyncio.create_task(batcher.submit((0, obs_for(0, 0)), 1))
        await asyncio.sleep(0.05)
        assert not pending.done()

        batcher.close()
        with pytest.raises(BatcherClosed):
            await asyncio.wait_for(pending, 0.5)
        await asyncio.wait_for(task, 0.5)  # the loop ends
        with pytest.raises(BatcherClosed):
            await asyncio.wait_for(batcher.submit((1, obs_for(1, 0)), 1), 0.5)

    run(main)
    assert process.batches == []


def test_close_before_run_starts_ends_run_immediately() -> None:
    async def main() -> None:
        batcher = DynamicBatcher(StandIn(), max_frames=4, timeout_s=5.0)
        pending = asyncio.create_task(batcher.submit((0, obs_for(0, 0)), 1))
        await asyncio.sleep(0)
        batcher.close()
        await asyncio.wait_for(batcher.run(), 0.5)
        with pytest.raises(BatcherClosed):
            await asyncio.wait_for(pending, 0.5)

    run(main)


def test_close_during_process_lets_the_batch_in_flight_finish() -> None:
    process = StandIn(delay_s=0.1)

    async def main() -> None:
        batcher = DynamicBatcher(process, max_frames=100, timeout_s=5.0)
        batcher.open_streams = 1
        task = asyncio.create_task(batcher.run())
        in_flight = asyncio.create_task(batcher.submit((0, obs_for(0, 0)), 1))
        await asyncio.sleep(0.03)  # the batch is inside process()
        assert process.batch_sizes == [1]
        batcher.close()
        got = await asyncio.wait_for(in_flight, 0.5)
        np.testing.assert_array_equal(got, answer(0, obs_for(0, 0)))
        await asyncio.wait_for(task, 0.5)

    run(main)


def test_cancelled_submit_does_not_break_the_batcher() -> None:
    process = StandIn()

    async def main() -> None:
        batcher = DynamicBatcher(process, max_frames=100, timeout_s=0.1)
        batcher.open_streams = 2
        async with serving(batcher) as task:
            doomed = asyncio.create_task(batcher.submit((0, obs_for(0, 0)), 1))
            await asyncio.sleep(0.02)
            doomed.cancel()
            with pytest.raises(asyncio.CancelledError):
                await doomed
            await asyncio.sleep(0.15)  # let the batch holding only the cancelled one close
            assert not task.done()

            # both streams keep being served afterwards
            for step in range(1, 4):
                got = await asyncio.gather(
                    batcher.submit((0, obs_for(0, step)), 1),
                    batcher.submit((1, obs_for(1, step)), 1),
                )
                np.testing.assert_array_equal(got[0], answer(0, obs_for(0, step)))
                np.testing.assert_array_equal(got[1], answer(1, obs_for(1, step)))

    run(main)
    # the cancelled request never reached process()
    assert all(int(o[0]) != 0 for batch in process.batches for s, o in batch if s == 0)
    assert sum(process.batch_sizes) == 6


def test_cancel_while_process_runs_does_not_affect_others() -> None:
    process = StandIn(delay_s=0.05)

    async def main() -> None:
        batcher = DynamicBatcher(process, max_frames=100, timeout_s=5.0)
        batcher.open_streams = 2
        async with serving(batcher) as task:
            doomed = asyncio.create_task(batcher.submit((0, obs_for(0, 0)), 1))
            other = asyncio.create_task(batcher.submit((1, obs_for(1, 0)), 1))
            await asyncio.sleep(0.02)  # both are inside process() now
            doomed.cancel()
            got = await asyncio.wait_for(other, 0.5)
            np.testing.assert_array_equal(got, answer(1, obs_for(1, 0)))
            assert doomed.cancelled()
            assert not task.done()
            batcher.open_streams = 1
            got = await batcher.submit((1, obs_for(1, 1)), 1)
            np.testing.assert_array_equal(got, answer(1, obs_for(1, 1)))

    run(main)
