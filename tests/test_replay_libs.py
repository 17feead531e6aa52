"""The replay-library benchmark's own logic: the seedrl driver samples as the replay does,
and the table renders timings and failures. The libraries themselves are not installed
here (``python -m benchmarks.replay_libs run`` builds their environment)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.replay_libs import __main__ as replay_libs
from benchmarks.replay_libs.driver import Seedrl, measure


def test_the_seedrl_driver_samples_in_proportion_to_priority_to_the_alpha() -> None:
    impl = Seedrl(4, seed=1)
    impl.add(4)
    priority = np.array([0.5, 1.0, 2.0, 4.0])
    impl.update(np.arange(4), priority)
    draws = np.concatenate([impl.sample(1000) for _ in range(20)])
    expected = priority**0.9 / (priority**0.9).sum()
    np.testing.assert_allclose(np.bincount(draws, minlength=4) / len(draws), expected, atol=0.01)
    impl.add(1)  # the ring wraps: slot 0 again, at the max priority seen (4)
    assert impl.priority[0] == 4.0


def test_measure_reports_each_operation() -> None:
    result = measure(Seedrl(300, seed=0), 300, add=4, batch=8, rounds=5, seed=0)
    assert set(result) == {"add_us", "sample_us", "update_us", "step_us"}
    assert result["step_us"] == pytest.approx(
        result["add_us"] + result["sample_us"] + result["update_us"]
    )


def test_table_renders_timings_and_failures() -> None:
    result = {
        "schema": replay_libs.SCHEMA, "date": "2030-01-02", "machine": "x86_64, 2 CPUs",
        "load": 3.0, "batch": 64, "add": 16, "rounds": 100,
        "versions": {"cpprb": "11.0.0", "torchrl": "0.14.1", "torch": "2.13.0"},
        "rows": [
            {"preset": "minatar-r2d2", "impl": "seedrl", "library": "numpy 2.4.6",
             "capacity": 9677, "add_us": 200.0, "sample_us": 150.25, "update_us": 300.0,
             "step_us": 650.25},
            {"preset": "minatar-r2d2", "impl": "torchrl", "capacity": 9677,
             "error": "RuntimeError: does not load"},
        ],
    }  # fmt: skip
    block = replay_libs.markdown(result)
    assert "| minatar-r2d2 (9,677 sequences) | numpy 2.4.6 | 200.0 | 150.2 | 300.0 | 650.2 |" in (
        block
    )
    assert "| torchrl | failed: RuntimeError: does not load |" in block
    with pytest.raises(ValueError, match="seedrl-replay-libs/1"):
        replay_libs.markdown({**result, "schema": "other"})
