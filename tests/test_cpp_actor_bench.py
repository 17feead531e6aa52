"""The C++-beside-Python benchmark's table: medians over repeats, the ratio, failures."""

from __future__ import annotations

import pytest

from benchmarks import cpp_actor


def _row(actor: str, k: int, mode: str, repeat: int, fps: float, cpu: float) -> dict:
    return {
        "actor": actor,
        "k": k,
        "mode": mode,
        "repeat": repeat,
        "fps": fps,
        "round_trips_per_s": fps / k,
        "actor_cpu_us_per_frame": cpu,
        "actor_cpu": 0.5,
        "server_cpu_us_per_frame": 10.0,
        "actor_rss_mb": 16.0,
        "actor_pss_mb": 11.0,
    }


def _doc(results: list[dict]) -> dict:
    return {
        "schema": cpp_actor.SCHEMA,
        "date": "2026-01-01 00:00 UTC",
        "machine": {"cpu_model": "Test CPU", "cpus": 2, "platform": "Linux", "python": "3.11",
                    "versions": {"grpcio": "1"}, "cpp": {"libgrpc++": "1.51.1"}},
        "settings": {"envs": [1, 32], "modes": ["echo"], "repeats": 3, "warmup_s": 2,
                     "measure_s": 5},
        "load_average": {"before": [1.0, 1.0, 1.0], "after": [2.0, 2.0, 2.0]},
        "wall_time_s": 120,
        "results": results,
    }  # fmt: skip


def test_rows_are_medians_over_repeats_with_the_cpp_over_python_ratio():
    rows = [_row("python", 1, "echo", r, fps, 150.0) for r, fps in enumerate((900, 1000, 5000))]
    rows += [_row("cpp", 1, "echo", r, fps, 70.0) for r, fps in enumerate((1500, 2000, 100))]
    text = cpp_actor.render(_doc(rows))
    assert "| echo | 1 | Python | 1,000 | — | 1,000 | 150.0 |" in text
    assert "| echo | 1 | C++ | 1,500 | 1.50 | 1,500 | 70.0 |" in text
    assert "load average 1.0 before and 2.0 after" in text
    assert "libgrpc++ 1.51.1" in text


def test_a_failed_measurement_is_named_and_left_out_of_the_medians():
    rows = [
        _row("python", 32, "echo", 0, 60000, 9.0),
        _row("cpp", 32, "echo", 0, 90000, 2.0),
        {"actor": "cpp", "k": 32, "mode": "echo", "repeat": 1, "error": "did not connect"},
    ]
    text = cpp_actor.render(_doc(rows))
    assert "| echo | 32 | C++ | 90,000 | 1.50 |" in text
    assert "1 measurement(s) failed: echo cpp K=32: did not connect" in text


def test_another_schema_is_refused():
    with pytest.raises(ValueError, match="not a seedrl-cpp-actor/1 report"):
        cpp_actor.render({"schema": "seedrl-bench/1"})


def test_the_committed_results_render():
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / cpp_actor.DEFAULT_OUT
    text = cpp_actor.render(json.loads(path.read_text()))
    page = (path.parents[2] / "docs" / "performance.md").read_text()
    assert text in page, (
        "docs/performance.md's C++ actor block is stale: make bench-cpp-actor-table"
    )
