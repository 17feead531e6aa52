"""A collapsed policy is flagged in the metrics and on the progress line, and logged once
per collapse (``learner.collapse``)."""

from __future__ import annotations

import logging
import math
import statistics

from learner.collapse import ENTROPY_FLAG, PREMATURE_FLAG, RETURN_FLAG, CollapseWatch
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


def _spread(returns: list[float]) -> float:
    return statistics.stdev(returns)


def _premature_run(
    watch: CollapseWatch, steps: list[tuple[float, float, float, float]], first: float
) -> tuple[list[int], list[int]]:
    """Feed (entropy, mean, best, spread) records; the flags and how many messages each
    record raised."""
    flags, logged = [], []
    for i, (entropy, mean, best, spread) in enumerate(steps):
        record = _record(i * 100_000, entropy=entropy, mean=mean)
        messages = watch.check(record, first, best, spread / 10, spread)
        flags.append(record[PREMATURE_FLAG])
        logged.append(len([m for m in messages if m.startswith("premature")]))
        marked = "PREMATURE? entropy" in progress_line(record)
        assert marked == bool(record[PREMATURE_FLAG])
    return flags, logged


def test_a_policy_that_settles_before_its_return_moves_is_flagged_once(caplog):
    """The issue's shape: a MultiDiscrete([7, 7]) policy (maximum entropy ln 49, the heads'
    log sizes added) whose entropy fell to 0.46 (12%) while its best window rose from a
    random 0.2 to 0.5, with the episodes' returns spread by 0.68."""
    from learner.agents.models import MultiCategoricalHead

    head = MultiCategoricalHead((7, 7), (2,), "int64", masked=False)
    assert math.isclose(head.max_entropy or 0.0, math.log(49))
    window = [0.0] * 60 + [1.0] * 30 + [2.0] * 10  # mean 0.5
    spread = _spread(window)
    assert math.isclose(spread, 0.6742, abs_tol=1e-4)
    watch = CollapseWatch(head.max_entropy)
    steps = [(3.85, 0.2, 0.2, 0.45), (2.0, 0.3, 0.3, 0.55), (0.9, 0.45, 0.45, 0.6)]
    steps += [(0.46, 0.5, 0.5, spread), (0.46, 0.5, 0.5, spread)]
    with caplog.at_level(logging.WARNING, logger="learner.collapse"):
        flags, logged = _premature_run(watch, steps, first=0.2)
    assert flags == [0, 0, 1, 1, 1]  # 0.9 of 3.89 is 23%
    assert logged == [0, 0, 1, 0, 0]
    assert "premature determinism? entropy 0.9 is 23.1% of its maximum 3.89" in caplog.text
    # The issue's own mean of 1.9 is flagged when whole episodes are right or wrong (0 or 10:
    # a spread of 3.9); see the next test for the same mean out of independent steps.
    whole = [10.0] * 19 + [0.0] * 81
    flags, _ = _premature_run(
        CollapseWatch(head.max_entropy),
        [(3.85, 0.2, 0.2, 0.45), (0.46, 1.9, 1.9, _spread(whole))],
        0.2,
    )
    assert flags == [0, 1]


def test_a_return_that_rises_past_its_spread_is_no_premature_determinism():
    """The same mean of 1.9 out of ten independent steps each right one time in five is 1.4
    spreads (1.24) above 0.2: a gain, not flagged; nor is a CartPole run whose entropy falls
    as its return rises (its windows out of a demo run: means and spreads of the returns)."""
    steps = [(3.85, 0.2, 0.2, 0.45), (0.46, 1.9, 1.9, math.sqrt(10 * 0.19 * 0.81))]
    assert _premature_run(CollapseWatch(math.log(49)), steps, 0.2) == ([0, 0], [0, 0])
    windows = [(19.62, 8.18), (24.68, 13.07), (32.46, 17.99), (62.5, 31.9), (217.8, 83.29)]
    windows += [(266.48, 39.11), (324.37, 81.53), (472.82, 55.71)]
    fractions = [0.99, 0.9, 0.7, 0.3, 0.2, 0.15, 0.12, 0.1]
    steps = [(f * LN2, m, m, s) for f, (m, s) in zip(fractions, windows, strict=True)]
    assert _premature_run(CollapseWatch(LN2), steps, 19.62) == ([0] * 8, [0] * 8)


def test_a_policy_already_settled_at_its_first_window_had_no_start_to_measure_from():
    """A masked MiniGrid run learned within its first hundred episodes: its first full
    window had 22% of the maximum entropy and a mean of 0.82; its later dip is no sign."""
    steps = [(0.43, 0.82, 0.82, 0.3), (0.3, 0.72, 0.82, 0.4), (0.17, 0.96, 0.96, 0.02)]
    watch = CollapseWatch(math.log(7))
    assert _premature_run(watch, steps, 0.82) == ([0, 0, 0], [0, 0, 0])


def test_premature_determinism_is_not_watched_without_an_entropy_maximum_or_a_return():
    stuck = [(4.0, 0.2, 0.2, 0.45), (0.1, 0.2, 0.2, 0.45)]  # would be flagged (2.6% of ln 49)
    assert _premature_run(CollapseWatch(math.log(49)), stuck, 0.2)[0] == [0, 1]
    assert _premature_run(CollapseWatch(None), stuck, 0.2)[0] == [0, 0]  # a Gaussian policy
    self_play = CollapseWatch(math.log(49), watch_return=False)
    assert _premature_run(self_play, stuck, 0.2)[0] == [0, 0]
    record = _record(0, entropy=0.1, mean=0.2)  # before the window is full: no spread yet
    CollapseWatch(math.log(49)).check(record, 0.2, 0.2, 0.05, None)
    assert record[PREMATURE_FLAG] == 0


def test_premature_determinism_rearms_only_with_margin():
    """Flagged below 25% of the maximum; cleared above 35%, or once the best window gained
    more than 1.5 spreads; then flagged (and logged) again."""
    top = math.log(49)
    steps = [(0.9 * top, 0.2, 0.2, 1.0), (0.2 * top, 0.3, 0.3, 1.0), (0.3 * top, 0.3, 0.3, 1.0)]
    steps += [(0.36 * top, 0.3, 0.3, 1.0), (0.2 * top, 0.4, 0.4, 1.0)]
    steps += [(0.2 * top, 1.2, 1.2, 1.0), (0.2 * top, 1.6, 1.8, 1.0), (0.2 * top, 1.0, 1.8, 1.0)]
    steps += [(0.2 * top, 1.0, 1.8, 1.7)]  # a wider spread: 1.6 is within it
    flags, logged = _premature_run(CollapseWatch(top), steps, 0.2)
    assert flags == [0, 1, 1, 0, 1, 1, 0, 0, 1]
    assert logged == [0, 1, 0, 0, 1, 0, 0, 0, 1]


def test_the_spread_is_the_full_windows_standard_deviation():
    stats = LearnerStats()
    stats.returns.extend([0.0, 10.0] * 49)
    assert stats.return_spread is None
    stats.returns.extend([0.0, 10.0])
    assert math.isclose(stats.return_spread or 0.0, _spread([0.0, 10.0] * 50))
    assert tensorboard_tag(PREMATURE_FLAG) == "collapse/premature_determinism"
