"""The docs' results table is rendered from a bench.json, medians and all."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.results_table import BEGIN, END, render, table_rows, update_page

ROOT = Path(__file__).resolve().parent.parent


def _row(point: str, mode: str, repeat: int, fps: float, cpu: float, **extra: float) -> dict:
    n, k = (int(x) for x in point.split("x"))
    return {"point": point, "n": n, "k": k, "batch": 0, "mode": mode, "repeat": repeat,
            "fps": fps, "cpu_us_per_frame": cpu, **extra}  # fmt: skip


def _report() -> dict:
    system = {"inference_batch_mean": 63.4, "rtt_p50_ms": 2.4, "rtt_p99_ms": 6.7,
              "trainer_wait_share": 0.9, "learner_steps_per_s": 19.0, "actor_processes": 8,
              "actor_rss_mb_max": 49.2}  # fmt: skip
    rows = [
        _row("64x1", "echo", 0, 36000, 50, serving_cpu_us_per_frame=24.0),
        _row("64x1", "echo", 1, 35000, 52, serving_cpu_us_per_frame=26.0),
        _row("64x1", "inference", 0, 30000, 60, serving_cpu_us_per_frame=29.0),
        _row("64x1", "system", 0, 24000, 68, serving_cpu_us_per_frame=33.0, **system),
        _row("64x1", "system", 1, 25000, 70, serving_cpu_us_per_frame=35.0, **system),
        _row("64x1", "ideal_train", 0, 90000, 11, training_us_per_frame=1.25),
        _row("64x1", "ideal_train", 1, 80000, 12, training_us_per_frame=1.75),
        _row("1x1", "echo", 0, 15000, 85, serving_cpu_us_per_frame=30.0),
        {**_row("1x1", "system", 0, 0, 0), "fps": None, "error": "no frames"},
    ]
    return {
        "schema": "seedrl-bench/1",
        "date": "2030-01-02T03:04:05+0000",
        "wall_time_s": 600.0,
        "machine": {
            "cpu_model": "Test CPU",
            "cpus": 2,
            "platform": "Linux",
            "python": "3.11",
            "versions": {"torch": "2.13.0"},
        },
        "settings": {
            "env": "CartPole-v1",
            "sweep": ["1x1", "64x1"],
            "modes": ["echo", "system"],
            "repeats": 2,
            "focus_repeats": 0,
            "measure_s": 3.0,
            "transport": "auto",
            "learner_args": [],
            "actor_args": [],
        },
        "ideal_reference": {"envs": 64, "fps": None, "runs": []},
        "results": rows,
        "points": [
            {
                "point": "1x1",
                "echo_fps": 15000,
                "system_fps": None,
                "system_over_echo": None,
                "system_extra_us_per_frame": None,
            },
            {
                "point": "64x1",
                "ideal_fps": None,
                "echo_fps": 35500,
                "inference_fps": None,
                "system_fps": 24500,
                "system_over_ideal": None,
                "system_over_echo": 0.69,
                "system_extra_us_per_frame": {"actors": 4.2, "serving": 11.0, "training": 3.0},
            },
        ],
        "targets": [
            {
                "name": "system_over_echo_64x1",
                "description": "system/echo at 64 x 1",
                "value": 0.69,
                "target": 0.9,
                "comparison": ">=",
                "pass": False,
                "runs": [0.67, 0.71],
                "steady": True,
            },
        ],
    }


def test_cells_are_medians_over_repeats_in_the_report_order() -> None:
    rows = table_rows(_report())
    assert [r[0] for r in rows] == ["1x1", "64x1"]
    one, sixty_four = rows
    assert one[4] == "—" and one[7] == "85 / —"  # a failed measurement stays visible
    assert sixty_four[2:7] == ["35,500", "—", "24,500", "—", "0.69"]
    assert sixty_four[7] == "51 / 69"
    # The learner process beyond echo (25 µs, the median of 24 and 26), then training.
    assert sixty_four[8:10] == ["+4.0 / +9.0", "1.50"]
    assert one[8:10] == ["— / —", "—"]  # echo, but no learner row; no training measured
    assert sixty_four[10:16] == ["63.4", "2.4/6.7", "90%", "19.0", "8", "49"]
    assert sixty_four[16] == "+4/+11/+3"


def test_the_block_names_machine_date_settings_and_targets() -> None:
    block = render(_report())
    assert "Measured 2030-01-02T03:04:05+0000 on Test CPU (2 CPUs, Linux)" in block
    assert "torch 2.13.0" in block and "sweep 1x1,64x1" in block and "2 repeat(s)" in block
    assert "| 64x1 | — | 35,500 |" in block
    assert "- system/echo at 64 x 1: **0.69 [0.67 / 0.71]**, wanted >= 0.9: not met" in block


def test_update_replaces_only_the_marked_block(tmp_path: Path) -> None:
    page = f"# Perf\n\nintro\n\n{BEGIN}\nold table\n{END}\n\nafter\n"
    new = update_page(page, "new table\n")
    assert new == f"# Perf\n\nintro\n\n{BEGIN}\nnew table\n{END}\n\nafter\n"
    with pytest.raises(ValueError, match="markers"):
        update_page("no markers here", "x")


def test_command_updates_a_page(tmp_path: Path) -> None:
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(_report()))
    page = tmp_path / "performance.md"
    page.write_text(f"{BEGIN}\n{END}\n")
    subprocess.run(
        [sys.executable, "benchmarks/results_table.py", str(bench), "--update", str(page)],
        cwd=ROOT, check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    assert page.read_text() == f"{BEGIN}\n{render(_report())}{END}\n"


def test_the_performance_page_has_the_markers() -> None:
    text = (ROOT / "docs" / "performance.md").read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1 and text.index(BEGIN) < text.index(END)


def test_a_named_block_is_written_between_its_own_markers(tmp_path: Path) -> None:
    """One table per benchmark: the Atari bench's block leaves the CartPole one alone."""
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(_report()))
    page = tmp_path / "performance.md"
    atari = ("<!-- bench-atari:begin -->", "<!-- bench-atari:end -->")
    page.write_text(f"{BEGIN}\nkept\n{END}\n{atari[0]}\n{atari[1]}\n")
    subprocess.run(
        [sys.executable, "benchmarks/results_table.py", str(bench), "--update", str(page),
         "--block", "bench-atari"],
        cwd=ROOT, check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    assert page.read_text() == f"{BEGIN}\nkept\n{END}\n{atari[0]}\n{render(_report())}{atari[1]}\n"
