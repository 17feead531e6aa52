"""A collapsed policy is flagged in the metrics and on the progress line, and logged once
per collapse (``learner.collapse``)."""

from __future__ import annotations

import logging
import math
import statistics

from learner.collapse import ENTROPY_FLAG, RETURN_FLAG, CollapseWatch
from learner.metrics import tensorboard_tag
from learner.progress import progress_line
from learner.state.stats import LearnerStats

LN2 = math.log(2)


def _record(frames: int, entropy: float | None = 0.5, mean: float | None = 490.0) -> dict:
    record = {
        "frames": frames, "fps": 1000.0, "episodes": 10, "episode_return_mean": mean,
        "actors_connected": 1, "inference_batch_mean": 4.0, "learner_steps": 3,
    }  # fmt: skip
    if entropy is not None:
        record["entropy"] = entropy
    return record


def test_low_entropy_is_flagged_while_it_lasts_and_logged_once(caplog):
    watch = CollapseWatch(max_entropy=LN2)
    # 1% of ln 2 is 0.00693; the flag clears only above 2% (0.0139).
    entropies = [0.5, 0.006, 0.001, 1e-6, 0.01, 0.2, 0.005]
    flags, logged = [], []
    with caplog.at_level(logging.WARNING, logger="learner.collapse"):
        for i, entropy in enumerate(entropies):
            record = _record(i * 1000, entropy=entropy)
            logged.append(len(watch.check(record, 20.0, 500.0)))
            flags.append(record[ENTROPY_FLAG])
            assert math.isclose(record["entropy_fraction"], entropy / LN2)
            assert ("COLLAPSE? entropy" in progress_line(record)) == bool(record[ENTROPY_FLAG])
    assert flags == [0, 1, 1, 1, 1, 0, 1]
    assert logged == [0, 1, 0, 0, 0, 0, 1]
    assert len(caplog.records) == 2
    assert "entropy 0.006 is 0.87% of its maximum 0.693 (flagged below 1%)" in caplog.text


def test_a_return_that_lost_half_the_gain_is_flagged_once():
    """From a first full window of 20 to a best of 500, the line is at 260; the flag clears
    above 380 (three quarters of the gain)."""
    watch = CollapseWatch(max_entropy=LN2)
    means = [300.0, 261.0, 259.0, 30.0, 370.0, 381.0, 100.0]
    flags, logged = [], []
    for i, mean in enumerate(means):
        record = _record(i * 1000, mean=mean)
        messages = watch.check(record, 20.0, 500.0)
        logged.append(len(messages))
        flags.append(record[RETURN_FLAG])
        assert ("return fell from best" in progress_line(record)) == bool(record[RETURN_FLAG])
        if messages:
            assert f"mean return {mean:.1f} lost more than half" in messages[0]
    assert flags == [0, 0, 1, 1, 1, 0, 1]
    assert logged == [0, 0, 1, 0, 0, 0, 1]


def test_negative_returns_read_the_same_way():
    """Acrobot: from -500 to a best of -100, more than half of the gain is lost below -300."""
    watch = CollapseWatch(max_entropy=math.log(3))
    flags = []
    for mean in (-290.0, -310.0):
        record = _record(0, mean=mean)
        watch.check(record, -500.0, -100.0)
        flags.append(record[RETURN_FLAG])
    assert flags == [0, 1]


def test_self_play_watches_the_entropy_but_not_the_return():
    """Against a pool that gets stronger the return falls as play improves."""
    watch = CollapseWatch(max_entropy=math.log(7), watch_return=False)
    flags = []
    for entropy, mean in ((1.0, 0.6), (1.0, -0.9), (0.001, -0.9)):
        record = _record(0, entropy=entropy, mean=mean)
        watch.check(record, -1.0, 0.6)
        flags.append((record[ENTROPY_FLAG], record[RETURN_FLAG]))
    assert flags == [(0, 0), (0, 0), (1, 0)]


def test_nothing_is_flagged_before_there_is_something_to_lose():
    watch = CollapseWatch(max_entropy=None)  # a Gaussian policy: no entropy maximum
    for first, best in ((None, None), (20.0, None), (20.0, 20.0)):
        record = _record(0, entropy=-3.0, mean=1.0)
        assert watch.check(record, first, best) == []
        assert record[ENTROPY_FLAG] == record[RETURN_FLAG] == 0
        assert "entropy_fraction" not in record
        assert "COLLAPSE?" not in progress_line(record)


def test_a_run_still_at_its_floor_has_no_gain_to_lose():
    """Pong before it learns: windows of -21s with one -20 in five drift between -20.9 and
    -20.7. The window's standard error is sqrt(0.16 * 100 / 99) / 10 = 0.0402 (a Bernoulli
    spread of 0.4), so a drift of 0.1 is 2.5 errors, not the 4 a gain must exceed."""
    returns = [-20.0] * 20 + [-21.0] * 80
    error = statistics.stdev(returns) / math.sqrt(len(returns))
    assert math.isclose(error, math.sqrt(0.16 * 100 / 99) / 10)
    stats = LearnerStats()
    stats.returns.extend(returns)
    assert math.isclose(stats.return_error, error)
    at_floor, learned = CollapseWatch(max_entropy=LN2), CollapseWatch(max_entropy=LN2)
    record = _record(0, mean=-20.8)
    assert at_floor.check(record, -20.7, -20.6, error) == []
    assert record[RETURN_FLAG] == 0
    # The same fall from a best 5 errors above the first window is a loss of what was gained.
    record = _record(0, mean=-20.9)
    assert learned.check(record, -20.7, -20.7 + 5 * error, error) != []
    assert record[RETURN_FLAG] == 1


def test_the_flags_have_their_own_tensorboard_group():
    assert tensorboard_tag(ENTROPY_FLAG) == "collapse/entropy_low"
    assert tensorboard_tag(RETURN_FLAG) == "collapse/return_drop"
    assert tensorboard_tag("episode_return_best") == "episode/return_best"
    assert tensorboard_tag("entropy_fraction") == "learner/entropy_fraction"
