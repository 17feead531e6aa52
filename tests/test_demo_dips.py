"""The demo-dips benchmark's reading of a curve: where a fall starts and ends, what a
halving is, and its table (``benchmarks/learning/demo_dips.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.learning import demo_dips


def _curve(values: list[float]) -> list[tuple[int, float]]:
    return [(1000 * (i + 1), v) for i, v in enumerate(values)]


def test_a_climb_that_falls_to_half_after_passing_200_is_a_halving() -> None:
    fall = demo_dips.deepest_fall(_curve([20, 150, 368, 300, 184, 350, 480]), 475)
    assert fall == demo_dips.Fall(368, 184) and fall.halved


def test_a_fall_short_of_half_is_not_a_halving() -> None:
    fall = demo_dips.deepest_fall(_curve([20, 250, 400, 201, 480]), 475)
    assert fall == demo_dips.Fall(400, 201) and not fall.halved


def test_only_the_stretch_between_passing_200_and_solving_counts() -> None:
    # A fall before 200 (190 -> 20) and one after solving (480 -> 100) are not read.
    fall = demo_dips.deepest_fall(_curve([190, 20, 210, 300, 280, 480, 100]), 475)
    assert fall == demo_dips.Fall(300, 280) and not fall.halved
    assert demo_dips.deepest_fall(_curve([10, 150, 199]), 475) is None
    straight = demo_dips.deepest_fall(_curve([100, 250, 480]), 475)
    assert straight == demo_dips.Fall(250, 250)


def test_the_deepest_relative_fall_is_kept_not_the_last() -> None:
    fall = demo_dips.deepest_fall(_curve([400, 190, 420, 400, 460, 300, 490]), 475)
    assert fall == demo_dips.Fall(400, 190)


def test_read_curve_keeps_records_with_a_return(tmp_path: Path) -> None:
    records = [
        {"frames": 100, "episode_return_mean": None},
        {"frames": 200, "episode_return_mean": 21.5},
        {"status": "stopped"},
        {"frames": 300, "episode_return_mean": 40.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert demo_dips.read_curve(tmp_path) == [(200, 21.5), (300, 40.0)]


def _run(seed: int, solved: bool, frames: int, seconds: float, halved: bool) -> dict:
    return {"seed": seed, "solved": solved, "frames": frames, "wall_time_s": seconds,
            "halved": halved}  # fmt: skip


def test_the_table_counts_halvings_and_takes_medians_with_unsolved_as_never() -> None:
    doc = {
        "schema": demo_dips.SCHEMA,
        "rows": [
            {
                "label": "today", "learner_args": [], "date": "2026-12-03",
                "machine": "x86_64, 2 cores",
                "runs": [_run(0, True, 300_000, 9.0, True), _run(1, True, 500_000, 12.0, False),
                         _run(2, False, 9_000_000, 300.0, True)],
            },
            {
                "label": "bounded", "learner_args": ["--max-update-kl", "0.02"],
                "date": "2026-12-03", "machine": "x86_64, 2 cores",
                "runs": [_run(0, False, 1, 1.0, False), _run(1, False, 1, 1.0, False)],
            },
        ],
    }  # fmt: skip
    lines = demo_dips.render_table(doc).splitlines()
    assert lines[2].startswith("| today: `none` | 3 | 2 | 2 | 500,000 | 12.0 | 300,000-500,000 |")
    assert lines[3].startswith(
        "| bounded: `--max-update-kl 0.02` | 2 | 0 | 0 | never | never | - |"
    )


def test_the_table_replaces_only_its_block(tmp_path: Path) -> None:
    data = tmp_path / "d.json"
    data.write_text(json.dumps({"schema": demo_dips.SCHEMA, "rows": []}))
    doc = tmp_path / "doc.md"
    doc.write_text(f"before\n{demo_dips.TABLE_START}\nold\n{demo_dips.TABLE_END}\nafter\n")
    assert demo_dips.main(["table", str(data), "--update", str(doc)]) == 0
    text = doc.read_text()
    assert "old" not in text and text.startswith("before\n") and text.endswith("after\n")
    assert "| settings" in text
    (tmp_path / "bare.md").write_text("no block\n")
    with pytest.raises(SystemExit):
        demo_dips.main(["table", str(data), "--update", str(tmp_path / "bare.md")])
