"""The load generator's pure parts at scale: streams split over generator processes, the
learner's CPU and memory by process role read from a /proc tree made on disk, and the
tier's rows in the rendered table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT

from benchmarks.bench.procfs import CLK_TCK, stat_cpu_seconds
from benchmarks.bench.roles import read_tree, role_cpu, role_memory
from benchmarks.loadgen.generators import split_streams
from benchmarks.loadgen.table import render
from learner.serving.slots import PROCESS_NAME


@pytest.mark.parametrize(
    ("streams", "connections", "generators"),
    [(4096, 8, 4), (4096, 8, 3), (10, 3, 4), (5, 8, 5), (64, 8, 1), (7, 1, 7)],
)
def test_streams_split_over_generators_exactly_once(streams, connections, generators):
    split = split_streams(streams, connections, generators)
    assert len(split) == generators
    numbers = [i for indices, _ in split for i in indices]
    assert numbers == list(range(streams)), "every stream once, in contiguous runs"
    sizes = [len(indices) for indices, _ in split]
    assert max(sizes) - min(sizes) <= 1
    shares = [share for _, share in split]
    assert all(1 <= share <= size for share, size in zip(shares, sizes, strict=True))
    if connections >= generators and all(s >= connections for s in sizes):
        assert sum(shares) == connections


@pytest.mark.parametrize(("streams", "generators"), [(4, 5), (4, 0)])
def test_a_split_with_more_generators_than_streams_is_refused(streams, generators):
    with pytest.raises(ValueError, match="cannot split"):
        split_streams(streams, 8, generators)


def _stat(pid: int, name: str, utime: int, stime: int) -> str:
    return f"{pid} ({name}) S " + " ".join(["0"] * 10) + f" {utime} {stime} 0 0 20 0\n"


def _process(proc: Path, pid: int, name: str, ticks: tuple[int, int], **files: str) -> None:
    d = proc / str(pid)
    (d / "task" / str(pid)).mkdir(parents=True, exist_ok=True)
    (d / "stat").write_text(_stat(pid, name, *ticks))
    (d / "comm").write_text(name + "\n")
    (d / "task" / str(pid) / "stat").write_text(_stat(pid, name, *ticks))
    for file, text in files.items():
        (d / file).write_text(text)


def _learner(proc: Path, model: tuple[int, int], main: tuple[int, int], kids: dict) -> None:
    """Model pid 100 (main thread 100, a second thread 105 that started the children)."""
    _process(proc, 100, "python", model, status="VmRSS:\t  409600 kB\n",
             smaps_rollup="Rss: 409600 kB\nPss:  204800 kB\n")  # fmt: skip
    (proc / "100" / "task" / "100" / "stat").write_text(_stat(100, "python", *main))
    (proc / "100" / "task" / "100" / "children").write_text("")
    (proc / "100" / "task" / "105").mkdir(exist_ok=True)
    (proc / "100" / "task" / "105" / "children").write_text(" ".join(map(str, kids)) + "\n")
    for pid, (name, ticks, rss_kb, pss_kb) in kids.items():
        files = {"status": f"Name:\t{name}\nVmRSS:\t{rss_kb} kB\n"}
        if pss_kb is not None:
            files["smaps_rollup"] = f"Rss: {rss_kb} kB\nPss: {pss_kb} kB\n"
        _process(proc, pid, name, ticks, **files)


def test_cpu_by_role_from_two_readings_of_a_proc_tree(tmp_path):
    """The model's own CPU and its main thread's, each frontend by its name's index, the
    trainer and other children apart, and a frontend restarted between the readings
    counted from its start."""
    fe0, fe1 = f"{PROCESS_NAME}0", f"{PROCESS_NAME}1"
    before, after = tmp_path / "before", tmp_path / "after"
    _learner(before, (1000, 500), (700, 300), {
        101: (fe0, (200, 100), 1, 1), 102: (fe1, (50, 50), 1, 1),
        103: ("python", (4000, 0), 1, 1),
    })  # fmt: skip
    # Between the readings frontend 1 died and came back as pid 104.
    _learner(after, (1300, 600), (900, 350), {
        101: (fe0, (300, 150), 1, 1), 104: (fe1, (20, 10), 1, 1),
        103: ("python", (4500, 100), 1, 1),
    })  # fmt: skip
    cpu = role_cpu(read_tree(100, before), read_tree(100, after))
    tick = 1 / CLK_TCK
    assert cpu.model == pytest.approx(400 * tick)
    assert cpu.model_main_thread == pytest.approx(250 * tick)
    assert cpu.frontends == pytest.approx([150 * tick, 30 * tick])
    assert cpu.others == pytest.approx(600 * tick)
    assert cpu.host == pytest.approx((400 + 150 + 30 + 600) * tick)


def test_memory_by_role_and_a_pss_that_cannot_be_read(tmp_path):
    fe0, fe1 = f"{PROCESS_NAME}0", f"{PROCESS_NAME}1"
    _learner(tmp_path, (1, 1), (1, 1), {
        102: (fe1, (1, 1), 2048, 1024), 101: (fe0, (1, 1), 1024, 512),
        103: ("python", (1, 1), 3072, 2048),
    })  # fmt: skip
    memory = role_memory(read_tree(100, tmp_path), tmp_path)
    assert memory["model_rss_mb"] == 400 and memory["model_pss_mb"] == 200
    assert memory["frontend_rss_mb_each"] == [1, 2], "ordered by frontend index, not pid"
    assert memory["frontends_rss_mb"] == 3 and memory["others_rss_mb"] == 3
    assert memory["host_rss_mb"] == 406 and memory["host_pss_mb"] == 200 + 0.5 + 1 + 2

    (tmp_path / "103" / "smaps_rollup").unlink()  # a sandbox that hides smaps_rollup
    memory = role_memory(read_tree(100, tmp_path), tmp_path)
    assert memory["others_pss_mb"] is None and memory["host_pss_mb"] is None
    assert memory["host_rss_mb"] == 406


def test_a_process_name_with_spaces_and_parentheses_parses():
    assert stat_cpu_seconds(_stat(7, "a) (b c", 30, 12)) == pytest.approx(42 / CLK_TCK)


def _row(mode: str, tier: int, model: float, fe: list[float] | None) -> dict:
    row = {
        "mode": mode, "repeat": 0, "serving_processes": tier, "generators": 2,
        "learner_cpu_us_per_frame": model, "learner_loop_thread_us_per_frame": model / 2,
        "learner_other_threads_us_per_frame": model / 2, "trainer_cpu_us_per_frame": 8.0,
        "generator_cpu_us_per_frame": 50.0, "fps_answered": 1000.0, "fps_taken": 1000.0,
        "trained_fps": 900.0, "rtt_p50_ms": 1.0, "rtt_p99_ms": 9.0,
        "inference_batch_mean": 60.0, "host_cpu_us_per_frame": model + sum(fe or []) + 8,
        "model_rss_mb": 400.0, "others_rss_mb": 300.0, "host_pss_mb": 650.0,
    }  # fmt: skip
    if fe:
        row |= {
            "frontend_cpu_us_per_frame": sum(fe), "frontend_cpu_us_per_frame_each": fe,
            "fps_per_frontend_core": 1e6 / sum(fe), "frontends_rss_mb": 200.0,
            "frontend_rss_mb_each": [100.0, 100.0],
        }  # fmt: skip
    return row


def test_the_table_lists_the_tier_rows_by_role_and_its_target():
    result = {
        "date": "d", "wall_time_s": 60.0, "machine": {"cpus": 2},
        "settings": {
            "env": "CartPole-v1", "streams": 64, "envs": 1, "repeats": 1,
            "modes": ["system"], "measure_s": 4.0, "connections": 8, "transport": "tcp",
            "serving_processes": "0,2", "generators": 2,
        },
        "results": [_row("system@2", 2, 4.0, [40.0, 60.0]), _row("system", 0, 100.0, None)],
    }  # fmt: skip
    text = render([result])
    assert "--serving-processes 0,2 --generators 2`" in text
    lines = text.splitlines()
    main = [line for line in lines if line.startswith("| CartPole-v1, 64 × 1 | system")]
    assert [line.split(" | ")[1] for line in main] == ["system", "system@2"] * 2
    role = main[-1].split(" | ")
    assert role[3] == "**4.0**" and role[4] == "100.0 (40.0 / 60.0)"
    assert role[5] == "112.0" and role[6] == "10,000"
    assert role[9] == "400 / 200 (100 / 100) / 300"
    assert main[-2].split(" | ")[4] == "—", "no frontends at N = 0"
    assert "model process CPU per frame with 2 frontend(s)" in text
    assert "**4.0**, wanted <= 5: met" in text


@pytest.mark.long
def test_a_tiny_tier_run_from_two_generators_reports_every_role(tmp_path):
    """Streams split over two generator processes, all admitted before any frame, served
    by one frontend: the frontend's CPU and memory are apart from the model's, and the
    generators' CPU is counted though it ran in other processes."""
    out = tmp_path / "loadgen.json"
    cmd = [
        sys.executable, "-m", "benchmarks.loadgen", "--streams", "4", "--envs", "1",
        "--generators", "2", "--serving-processes", "1", "--modes", "inference",
        "--repeats", "1", "--warmup-s", "0.3", "--measure-s", "1", "--tape-steps", "64",
        "--transport", "tcp", "--connect-timeout-s", "300", "--out", str(out),
    ]  # fmt: skip
    # A learner, its trainer and a frontend each import torch: on a loaded host their
    # start alone has taken more than the default two minutes.
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=480)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["settings"]["generators"] == 2
    (row,) = result["results"]
    assert "error" not in row, row
    assert row["mode"] == "inference@1" and row["frames_answered"] > 0
    assert len(row["frontend_cpu_us_per_frame_each"]) == 1
    assert row["frontend_cpu_us_per_frame"] > 0 and row["fps_per_frontend_core"] > 0
    # The host's figure is one sum scaled once, the roles' are each scaled apart: with an
    # idle trainer they are equal but for the last bit, so the bound allows rounding.
    assert row["host_cpu_us_per_frame"] >= (
        row["learner_cpu_us_per_frame"] + row["frontend_cpu_us_per_frame"] - 1e-9
    )
    assert row["generator_cpu_us_per_frame"] > 0
    assert len(row["frontend_rss_mb_each"]) == 1 and row["model_rss_mb"] > 0
    assert row["host_rss_mb"] > row["model_rss_mb"] + row["frontends_rss_mb"] - 1e-9


@pytest.mark.parametrize("generators", ["0", "3"])
def test_more_generators_than_streams_is_a_bad_flag(generators):
    cmd = [sys.executable, "-m", "benchmarks.loadgen", "--streams", "2", "--generators", generators]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "python -m benchmarks.loadgen: error: --generators must be between 1 and --streams "
        f"(2), not {generators}"
    ]


def test_the_tiers_atari_target_is_beyond_its_own_timed_forward_pass():
    """With a phases@N row the model's cost beyond its forward pass is read off that row
    (same process, same run), not the one-process row's forward pass."""
    timed = _row("phases@2", 2, 700.0, [100.0, 100.0])
    timed["phases_us_per_frame"] = {"forward": 600.0, "batch_assembly": 20.0}
    one = _row("phases", 0, 1000.0, None)
    one["phases_us_per_frame"] = {"forward": 900.0, "batch_assembly": 30.0}
    result = {
        "date": "d", "wall_time_s": 60.0, "machine": {"cpus": 2},
        "settings": {
            "env": "ALE/Pong-v5", "streams": 16, "envs": 1, "repeats": 1,
            "modes": ["phases", "system"], "measure_s": 4.0, "connections": 8,
            "transport": "tcp", "serving_processes": "0,2",
        },
        "results": [one, timed, _row("system@2", 2, 650.0, [100.0, 100.0])],
    }  # fmt: skip
    text = render([result])
    assert "with `--serving-processes 2`, ALE/Pong-v5 16 × 1" in text
    assert "beyond the forward pass 100.0." in text
    assert "(phases@2; µs): **100.0**, wanted <= 15: not met" in text
