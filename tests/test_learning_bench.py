"""The learning benchmark (benchmarks/learning): its bookkeeping, and the short CI
variant that guards learning on pixels: MinAtar Breakout must beat a random policy."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support import ROOT

from benchmarks.learning import report
from benchmarks.learning.__main__ import main, parse_overrides, run_plan
from benchmarks.learning.runner import (
    RUN_FILE,
    find_env,
    finished_run,
    random_return,
    run_overrides,
)
from benchmarks.learning.suites import SUITES
from seedrl import envs
from seedrl.config import LearnerConfig
from seedrl.metrics import read_metrics


def write_metrics(logdir: Path, records: list[dict]) -> None:
    logdir.mkdir(parents=True, exist_ok=True)
    with open(logdir / "metrics.jsonl", "w") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")


def test_a_resumed_run_adds_up_its_segments_wall_time(tmp_path):
    """A resumed learner's clock restarts at 0; the curve keeps counting from the first."""
    write_metrics(tmp_path, [
        {"elapsed_s": 0.0, "frames": 0, "episode_return_mean": None},
        {"elapsed_s": 10.0, "frames": 100, "episode_return_mean": 1.0},
        {"elapsed_s": 20.0, "frames": 200, "episode_return_mean": 2.0},
        {"elapsed_s": 1.0, "frames": 200, "episode_return_mean": 2.0},
        {"elapsed_s": 11.0, "frames": 300, "episode_return_mean": 5.0},
    ])  # fmt: skip
    assert report.curve(tmp_path) == [(100, 10.0, 1.0), (200, 20.0, 2.0), (200, 21.0, 2.0),
                                      (300, 31.0, 5.0)]  # fmt: skip
    assert report.wall_time_s(tmp_path) == 31.0


def test_run_summary_records_the_first_crossing_of_each_threshold(tmp_path):
    spec = SUITES["minatar"].envs[1]  # Breakout: thresholds 8.8 and 17.5
    write_metrics(tmp_path, [
        {"elapsed_s": 5.0, "frames": 1000, "episode_return_mean": 3.0},
        {"elapsed_s": 9.0, "frames": 2000, "episode_return_mean": 9.0},
        {"elapsed_s": 13.0, "frames": 3000, "episode_return_mean": 8.0},
        {"elapsed_s": 17.0, "frames": 4000, "episode_return_mean": 10.0},
    ])  # fmt: skip
    run = {"seed": 0, "frames": 4000, "budget_frames": 4000, "train_return_mean100": 10.0,
           "eval": {"mean": 7.5, "std": 1.0, "episodes": 4, "greedy": False, "truncated": 0,
                    "returns": [6.5, 7.5, 7.5, 8.5], "lengths": [1, 2, 3, 4]}}  # fmt: skip
    (tmp_path / RUN_FILE).write_text(json.dumps(run))
    summary = report.run_summary(spec, tmp_path)
    assert summary is not None
    assert summary["thresholds"] == {"8.8": {"frames": 2000, "wall_time_s": 9.0}, "17.5": None}
    assert summary["frames_per_s"] == pytest.approx(4000 / 17.0, abs=0.1)
    assert finished_run(tmp_path, 4000) is not None
    assert finished_run(tmp_path, 5000) is None  # a bigger budget extends the run


DEFAULT_RATE = LearnerConfig().learning_rate
"""What a run's saved config holds for the rate when no --set overrode it."""


def _finished_run(
    logdir: Path,
    seed: int,
    records: list[dict],
    overrides: dict | None = None,
    eval_mean: float = 9.0,
) -> None:
    """A finished run's files (its evaluation scored ``eval_mean``); its config has the
    default rate unless overridden."""
    write_metrics(logdir, records)
    run = {"seed": seed, "frames": records[-1]["frames"], "budget_frames": records[-1]["frames"],
           "train_return_mean100": records[-1]["episode_return_mean"],
           "eval": {"mean": eval_mean, "std": 1.0, "episodes": 2, "greedy": False, "truncated": 0,
                    "returns": [8.0, 10.0], "lengths": [5, 5]},
           "overrides": overrides or {}}  # fmt: skip
    (logdir / RUN_FILE).write_text(json.dumps(run))
    config = {
        "env": "MinAtar/Breakout-v1",
        "seed": seed,
        "learning_rate": DEFAULT_RATE,
        "entropy_cost": 0.001,
        **run["overrides"],
    }
    (logdir / "config.json").write_text(json.dumps(config))
    (logdir / "checkpoint.pt").write_bytes(b"weights")


def test_archived_runs_are_small_and_summarise_as_the_runs_themselves(tmp_path):
    """``archive`` keeps a finished run's summary (thresholds, wall time over resumed
    segments, final return) from a few hundred records and no checkpoint; an unfinished run
    stays behind; runs archived from two directories add up to one summary."""
    suite, spec = SUITES["minatar"], SUITES["minatar"].envs[1]  # Breakout: 8.8 and 17.5
    first, second, results = tmp_path / "host-a", tmp_path / "host-b", tmp_path / "results"
    segment = [{"elapsed_s": 0.5 * i, "frames": 100 * i, "episode_return_mean": 10.0 * i / 3000}
               for i in range(1, 3001)]  # fmt: skip
    resumed = [{**r, "elapsed_s": r["elapsed_s"] - 1000.0} for r in segment[2000:]]
    _finished_run(first / spec.name / "seed0", 0, segment[:2000] + resumed)
    write_metrics(first / spec.name / "seed1", segment[:10])  # unfinished
    (first / spec.name / "random.json").write_text(json.dumps({"mean": 0.5, "std": 0.1}))
    report.write_summary(suite, first)
    _finished_run(second / spec.name / "seed2", 2, segment)

    assert report.archive(suite, tmp_path / "nothing-finished", results) == []
    assert report.archive(suite, first, results) == [results / spec.name / "seed0"]
    report.archive(suite, second, results)

    kept = results / spec.name / "seed0"
    assert sorted(p.name for p in kept.iterdir()) == ["config.json", "metrics.jsonl", "run.json"]
    assert len(report.read_metrics(kept)) <= report.ARCHIVE_POINTS + 10
    assert report.run_summary(spec, kept) == report.run_summary(spec, first / spec.name / "seed0")
    summary = json.loads((results / report.SUMMARY_FILE).read_text())
    breakout = summary["envs"][1]
    assert [r["seed"] for r in breakout["runs"]] == [0, 2]
    assert breakout["random"] == {"mean": 0.5, "std": 0.1}
    assert breakout["runs"][0]["thresholds"]["8.8"] == {"frames": 264_000, "wall_time_s": 1320.0}

    sweep = tmp_path / "sweep"
    _finished_run(sweep / spec.name / "seed1", 1, segment[:10])  # fits, but goes with seed3
    _finished_run(sweep / spec.name / "seed3", 3, segment[:10], {"learning_rate": 4 * DEFAULT_RATE})
    with pytest.raises(ValueError, match="its own --results"):
        report.archive(suite, sweep, results)
    assert not (results / spec.name / "seed1").exists()  # refused: nothing was copied

    # An override that restates the rate the others ran at is the same configuration.
    restated = tmp_path / "restated"
    _finished_run(restated / spec.name / "seed4", 4, segment[:10], {"learning_rate": DEFAULT_RATE})
    assert report.archive(suite, restated, results) == [results / spec.name / "seed4"]

    # A default changed since the others ran is another configuration, though no --set says
    # so; where a run was hosted (its port, its log folder) is not.
    moved = tmp_path / "moved"
    _finished_run(moved / spec.name / "seed5", 5, segment[:10])
    config = json.loads((moved / spec.name / "seed5" / "config.json").read_text())
    hosted = {**config, "port": 4321, "logdir": "/elsewhere", "total_frames": 10**9}
    (moved / spec.name / "seed5" / "config.json").write_text(json.dumps(hosted))
    assert report.archive(suite, moved, results) == [results / spec.name / "seed5"]
    retuned = tmp_path / "retuned"
    _finished_run(retuned / spec.name / "seed6", 6, segment[:10])
    config["entropy_cost"] = 0.5  # a field no run here overrode
    (retuned / spec.name / "seed6" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=re.escape("differ in {'entropy_cost': (0.5, 0.001)")):
        report.archive(suite, retuned, results)

    doc = tmp_path / "docs" / "learning.md"
    assert main(["table", "--out", str(results), "--doc", str(doc)]) == 0
    assert "| MinAtar/Breakout-v1 | 4 |" in doc.read_text()  # seeds 0, 2, 4 and 5
    assert (doc.parent / "learning" / f"{spec.name}.png").exists()
    assert not (results / "curves").exists()  # the committed archive holds no PNG copies
    elsewhere = tmp_path / "curves-elsewhere"
    assert main(["table", "--out", str(results), "--curves-dir", str(elsewhere)]) == 0
    assert (elsewhere / f"{spec.name}.png").exists()
    assert not (results / "curves").exists()  # --curves-dir holds without --doc too


def test_a_partial_run_and_its_shortfall_are_said_in_the_table(tmp_path):
    """A MuJoCo run stopped at 300 k of the suite's 1 M frames is labelled partial with its
    share, and an evaluate score below CleanRL's says by how much; the zoo's figure is
    listed for scale without deciding the verdict."""
    suite = SUITES["mujoco"]
    cheetah = find_env(suite, "HalfCheetah-v5")
    for seed, score in ((0, 700.0), (1, 900.0)):
        seed_dir = tmp_path / cheetah.name / f"seed{seed}"
        records = [
            {"elapsed_s": float(i), "frames": 30_000 * i, "episode_return_mean": 500.0}
            for i in range(1, 11)
        ]
        _finished_run(seed_dir, seed, records, eval_mean=score)

    summary = report.write_summary(suite, tmp_path)
    table = report.markdown_table(summary)
    row = next(r for r in table.splitlines() if r.startswith("| HalfCheetah-v5 | 2 |"))
    assert "0.30 M (**partial**: 30 % of the suite's 1.00 M)" in row
    # mean of seeds 800 against CleanRL's 1442.64: short by 642.64, 55 % of it
    assert "| no (short by 642.6, 55 % of it) |" in row
    assert "| HalfCheetah-v5 (another source, for scale) | 5819.1 |" in table


def test_a_shortfall_on_returns_of_a_few_units_keeps_their_decimals(tmp_path):
    """MiniGrid's returns lie in [0, 1]: 0.959 against the zoo's 0.964 is a few steps per
    episode, and must not read as "short by 0.0"."""
    suite = SUITES["minigrid"]
    doorkey = find_env(suite, "MiniGrid-DoorKey-5x5-v0")
    seed_dir = tmp_path / doorkey.name / "seed0"
    records = [
        {"elapsed_s": float(i), "frames": 10_000 * i, "episode_return_mean": 0.9}
        for i in range(1, 11)
    ]
    _finished_run(seed_dir, 0, records, eval_mean=0.959)

    table = report.markdown_table(report.write_summary(suite, tmp_path))
    row = next(r for r in table.splitlines() if r.startswith("| MiniGrid-DoorKey-5x5-v0 | 1 |"))
    assert "| no (short by 0.005, 99 % of it) |" in row


def test_same_setting_figures_are_listed_for_scale_and_the_verdict_stays_the_references(
    tmp_path,
):
    """Atari's target comes from an easier setting than ours (no sticky actions, a life
    ends the episode); the figures published under our setting are listed beside it, but
    a score between the two does not meet the target."""
    suite = SUITES["atari"]
    pong = suite.envs[0]
    seed_dir = tmp_path / pong.name / "seed0"
    records = [{"elapsed_s": float(i), "frames": 1000 * i, "episode_return_mean": 19.0}
               for i in range(1, 11)]  # fmt: skip
    # evaluate 19.5: above Dopamine's Rainbow under sticky actions, below the zoo
    _finished_run(seed_dir, 0, records, eval_mean=19.5)

    summary = report.write_summary(suite, tmp_path)
    assert summary["envs"][0]["meets_reference"] is False
    rows = [row.split(" | ")[:2] for row in report.markdown_table(summary).splitlines()
            if row.startswith("| ALE/Pong-v5") and "emulator frames" not in row]  # fmt: skip
    assert rows == [
        ["| ALE/Pong-v5", "20.99"],
        ["| ALE/Pong-v5 (same setting as ours, for scale)", "10"],
        ["| ALE/Pong-v5 (same setting as ours, for scale)", "19.3"],
    ]


def test_a_later_host_runs_the_seeds_after_the_first_ones():
    breakout = SUITES["minatar"].envs[1]
    assert [seed for _, seed, _ in run_plan(SUITES["minatar"], [breakout], 2, 3)] == [2, 3, 4]
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--suite", "minatar", "--first-seed", "-1"])
    assert exit_info.value.code == 2


def test_a_negative_stop_after_exits_2():
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--suite", "minatar", "--stop-after", "-1"])
    assert exit_info.value.code == 2


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["run", "--suite", "minatar", "--envs", "Pacman"], "--envs 'Pacman'"),
        (["table", "--out", "no-such-dir"], "--out no-such-dir"),
        (["archive", "--out", "no-such-dir"], "--out no-such-dir"),
    ],
)
def test_a_bad_flag_value_exits_2_with_one_line_naming_it(args, named, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and named in lines[0], lines


def test_the_doc_keeps_its_prose_and_one_block_per_suite(tmp_path):
    doc = tmp_path / "learning.md"
    doc.write_text("# Learning\n\nProse that stays.\n")
    report.update_doc(doc, "minatar", "table one\n")
    report.update_doc(doc, "classic", "classic table\n")
    report.update_doc(doc, "minatar", "table two\n")
    text = doc.read_text()
    assert "Prose that stays." in text and "classic table" in text
    assert "table two" in text and "table one" not in text
    assert text.count("<!-- bench-learning:minatar:start -->") == 1


def test_overrides_are_learner_config_fields():
    assert parse_overrides(["lambda=0.95", "batch-size=16"]) == {"lambda_": 0.95, "batch_size": 16}
    with pytest.raises(ValueError, match="LearnerConfig"):
        parse_overrides(["no_such_field=1"])


def test_override_values_are_read_as_the_learners_flags_read_them():
    """A tuple field from comma-separated items (it reached the config as the string
    "128,128" and the run died in a range check), a boolean from a word, none for off."""
    assert parse_overrides(["hidden_sizes=128,128", "mirror=yes", "fixed_opponent_share=none"]) == {
        "hidden_sizes": (128, 128),
        "mirror": True,
        "fixed_opponent_share": None,
    }
    with pytest.raises(ValueError, match="batch_size='many'"):
        parse_overrides(["batch_size=many"])


def test_rows_of_one_env_id_are_told_apart_by_their_variant():
    """The masked MiniGrid row: its own run directory and table name, its kwargs given to
    the learner, and a random baseline that plays only allowed actions (the env raises on
    a masked one)."""
    for suite in SUITES.values():
        names = [spec.name for spec in suite.envs]
        assert len(set(names)) == len(names), suite.name
    suite = SUITES["minigrid"]
    plain = find_env(suite, "MiniGrid-DoorKey-5x5-v0")
    masked = find_env(suite, "MiniGrid-DoorKey-5x5-v0-action_mask")
    assert plain.env_kwargs == {} and "env_kwargs" not in run_overrides(plain, None)
    assert masked.title == "MiniGrid-DoorKey-5x5-v0 (action_mask)"
    assert run_overrides(masked, None)["env_kwargs"] == {"action_mask": True}
    pytest.importorskip("minigrid")
    assert 0.0 <= random_return(masked, episodes=2)["mean"] <= 1.0


def test_a_run_trains_to_its_budget_whatever_the_presets_target():
    """Pendulum's preset stops at a target return; a benchmark run must not (it would be
    left unfinished), unless the command line asks for a target itself."""
    pendulum = find_env(SUITES["classic"], "Pendulum-v1")
    config = learner_config_for(pendulum, run_overrides(pendulum, None))
    assert config.target_return is None
    asked = run_overrides(pendulum, {"target_return": -200.0})
    assert learner_config_for(pendulum, asked).target_return == -200.0


@pytest.mark.parametrize("suite", ["minatar", "atari"])
def test_an_agents_suite_is_the_same_envs_on_that_agents_presets(suite):
    """SUITE=minatar AGENT=r2d2 holds R2D2 to V-trace's envs, budgets and references."""
    vtrace, r2d2 = SUITES[suite], SUITES[f"{suite}-r2d2"]
    assert [s.env for s in r2d2.envs] == [s.env for s in vtrace.envs]
    # Its curves go to their own folder: the same env names must not replace V-trace's.
    assert (vtrace.curves_folder, r2d2.curves_folder) == ("", f"{suite}-r2d2")
    for theirs, ours in zip(vtrace.envs, r2d2.envs, strict=True):
        assert ours.frames == theirs.frames and ours.thresholds == theirs.thresholds
        assert ours.reference == theirs.reference
        config = learner_config_for(ours, run_overrides(ours, None))
        assert config.agent == "r2d2" and config.lstm
        assert config.env.split("/")[0] == ours.env.split("/")[0]  # the family's own preset


def test_the_make_target_maps_agent_to_the_suites_twin():
    def suite_of(*assignments: str) -> str:
        done = subprocess.run(
            ["make", "-n", "bench-learning", *assignments], cwd=ROOT, capture_output=True,
            text=True, check=True,
        )  # fmt: skip
        return done.stdout.split("--suite ")[1].split()[0]

    assert suite_of("SUITE=minatar") == "minatar"
    assert suite_of("SUITE=minatar", "AGENT=r2d2") == "minatar-r2d2"
    assert suite_of("SUITE=classic", "AGENT=r2d2") == "classic-r2d2"
    assert suite_of("SUITE=classic-r2d2", "AGENT=r2d2") == "classic-r2d2"


def learner_config_for(spec, overrides):
    """The LearnerConfig the run would train with: its preset, then the run's fields."""
    from seedrl.config import LearnerConfig
    from seedrl.presets import build_config, load_preset

    return build_config(LearnerConfig, overrides, load_preset(spec.preset))


def run_bench(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """The harness as users run it."""
    cmd = [sys.executable, "-m", "benchmarks.learning", *args]
    return run_in_own_session(cmd, timeout, {**os.environ, "PYTHONPATH": str(ROOT)})


def run_in_own_session(
    cmd: list[str], timeout: float, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """``cmd`` in its own session, so that every process it started (runner, learner,
    actors) ends with the test even on a timeout."""
    proc = subprocess.Popen(
        cmd, cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True, env=env,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


LEARN_FRAMES = 250_000
"""Enough for the minatar preset to leave random play well behind."""
PIPELINE_FRAMES = 20_000
"""Enough for a checkpoint, a curve and an evaluation: the harness's path, not learning."""


def _breakout_bench(tmp_path: Path, frames: int, episodes: int) -> tuple[list[str], dict]:
    """One seed of MinAtar Breakout through the benchmark itself: its args and summary."""
    out = tmp_path / "bench"
    args = ["run", "--suite", "minatar", "--envs", "Breakout", "--seeds", "1",
            "--frames", str(frames), "--eval-episodes", str(episodes), "--out", str(out),
            "--set", "max_seconds=150", "--set", "checkpoint_interval_s=600"]  # fmt: skip
    first = run_bench(args, timeout=240)
    assert first.returncode == 0, first.stdout
    summary = json.loads((out / report.SUMMARY_FILE).read_text())
    (breakout,) = [e for e in summary["envs"] if e["runs"]]
    (run,) = breakout["runs"]
    assert run["frames"] >= frames and run["eval"]["episodes"] == episodes
    assert breakout["random"]["mean"] < 1.0, f"random Breakout scores under 1: {breakout}"
    return args, breakout


@pytest.mark.long
def test_the_benchmark_runs_keeps_and_tables_a_minatar_run(tmp_path):
    """A tiny Breakout run through the harness: trained, evaluated, plotted, kept on a
    second call, and rendered into the docs table."""
    pytest.importorskip("minatar")
    args, _ = _breakout_bench(tmp_path, PIPELINE_FRAMES, 5)
    out = tmp_path / "bench"
    assert (out / "curves" / "MinAtar-Breakout-v1.png").stat().st_size > 0
    again = run_bench(args, timeout=120)  # resumable: the finished run is kept as it is
    assert again.returncode == 0 and "already finished, kept" in again.stdout, again.stdout
    doc = tmp_path / "docs" / "learning.md"
    table = run_bench(["table", "--out", str(out), "--doc", str(doc)], timeout=120)
    assert table.returncode == 0, table.stdout
    text = doc.read_text()
    assert "| MinAtar/Breakout-v1 | 1 |" in text and "Young & Tian 2019" in text
    assert (doc.parent / "learning" / "MinAtar-Breakout-v1.png").exists()


@pytest.mark.long
def test_the_benchmark_trains_and_tables_a_self_play_run(tmp_path):
    """A tiny Connect Four run through the harness: the preset's self-play trained, the
    final policy's games against both scripted players in both seats, the table and the
    yardstick's curve in the docs."""
    pytest.importorskip("pettingzoo")
    out = tmp_path / "bench"
    args = ["run", "--suite", "selfplay", "--seeds", "1", "--frames", str(PIPELINE_FRAMES),
            "--eval-episodes", "2", "--num-actors", "1", "--envs-per-actor", "16",
            "--out", str(out), "--set", "checkpoint_interval_s=600"]  # fmt: skip
    done = run_bench(args, timeout=240)
    assert done.returncode == 0, done.stdout
    assert "vs random" in done.stdout and "vs heuristic" in done.stdout, done.stdout
    (spec,) = SUITES["selfplay"].envs
    run = json.loads((out / spec.name / "seed0" / RUN_FILE).read_text())
    assert run["frames"] >= PIPELINE_FRAMES and run["eval"] is None
    best = (out / spec.name / "seed0" / "checkpoint-best.pt").exists()
    assert run["matches_of"] == ("best" if best else "final")
    assert ("final_matches" in run) == best
    assert [m["opponent"] for m in run["matches"]] == ["random", "heuristic"]
    assert all(report.result_games(s) == 2 for m in run["matches"] for s in m["seats"].values())
    doc = tmp_path / "docs" / "learning.md"
    table = run_bench(["table", "--out", str(out), "--doc", str(doc)], timeout=120)
    assert table.returncode == 0, table.stdout
    assert "| pettingzoo.classic.connect_four_v3 | 1x16 | 0 |" in doc.read_text()
    assert (doc.parent / "learning" / f"{spec.name}.png").exists()


@pytest.mark.slow
def test_minatar_breakout_learns_well_above_a_random_policy(tmp_path):
    """Learning on pixels on a tiny budget, scored with evaluate against the random
    policy the harness measures."""
    pytest.importorskip("minatar")
    _, breakout = _breakout_bench(tmp_path, LEARN_FRAMES, 30)
    random_mean = breakout["random"]["mean"]
    trained = breakout["runs"][0]["eval"]["mean"]
    assert trained >= max(3 * random_mean, random_mean + 1.0), (trained, random_mean)
    curve = tmp_path / "bench" / "curves" / "MinAtar-Breakout-v1.png"
    assert curve.stat().st_size > 5_000


def run_leg(
    results: Path, seconds: float, out: Path, flags: list[str], parallel_envs: str = ""
) -> subprocess.CompletedProcess[str]:
    """``benchmarks/gpu_leg.sh`` as a lent host runs it, with the packages installed here."""
    (out / "no-wheels").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(out),
           "WHEELS": str(out / "no-wheels"), "PARALLEL_ENVS": parallel_envs}  # fmt: skip
    cmd = ["bash", "benchmarks/gpu_leg.sh", str(results), str(seconds), *flags]
    return run_in_own_session(cmd, seconds + 150, env)


def unpack_relay(out: Path, results: Path) -> None:
    """What the next lease is carried: the parts a leg left under $OUT, put back together."""
    parts = sorted(out.glob("relay.tar.*"))
    assert parts, sorted(out.iterdir())
    results.mkdir(parents=True)
    data = b"".join(part.read_bytes() for part in parts)
    subprocess.run(["tar", "-xzf", "-", "-C", str(results)], input=data, check=True)


@pytest.mark.long
def test_a_run_goes_on_over_several_leases_of_a_host(tmp_path):
    """A run longer than a lease: ``--stop-after`` checkpoints it and exits 130, the
    results directory travels out and back in, and the next leg resumes where it stopped.
    The first leg trains two envs side by side, as a GPU host's leg does."""
    pytest.importorskip("minatar")
    flags = ["--suite", "minatar", "--envs", "Breakout", "--seeds", "1", "--eval-episodes", "3",
             "--set", "checkpoint_interval_s=600"]  # fmt: skip
    # The lease has room for start-up on a loaded 2-core host (at 25 s a leg beside a long
    # benchmark run stopped before its first frame, at 45 s two legs beside a soak and a
    # test worker did, and at 70 s two legs beside the other test worker's long runs did).
    first = run_leg(tmp_path / "lease1", 100, tmp_path / "out1", [*flags, "--frames", "50000000"],
                    parallel_envs="Breakout,Freeway")  # fmt: skip
    assert first.returncode == 130, first.stdout
    for game in ("Breakout", "Freeway"):
        line = f"[{game}] [1/1] MinAtar/{game}-v1 seed 0: --stop-after reached"
        assert line in first.stdout, first.stdout
    carried = tmp_path / "carried"
    unpack_relay(tmp_path / "out1", carried)
    assert json.loads((carried / "summary.json").read_text())["suite"] == "minatar"
    assert (carried / "MinAtar-Freeway-v1" / "seed0" / "checkpoint.pt").exists()
    seed0 = carried / "MinAtar-Breakout-v1" / "seed0"
    assert (seed0 / "checkpoint.pt").exists() and not (seed0 / RUN_FILE).exists()
    stopped_at = int(read_metrics(seed0)[-1]["frames"])
    assert stopped_at > 0

    budget = stopped_at + 20_000
    second = run_leg(carried, 120, tmp_path / "out2", [*flags, "--frames", str(budget)])
    assert second.returncode == 0, second.stdout
    records = read_metrics(seed0)
    resumed = next(i for i in range(1, len(records))
                   if records[i]["elapsed_s"] < records[i - 1]["elapsed_s"])  # fmt: skip
    assert records[resumed]["frames"] >= stopped_at, records[resumed - 1 : resumed + 1]
    assert json.loads((seed0 / RUN_FILE).read_text())["frames"] >= budget


def test_a_run_the_hard_limit_kills_is_a_leg_to_go_on_and_its_relay_is_packed(tmp_path):
    """A run that outlives its grace (here one that ignores Ctrl-C and TERM) is killed at
    the leg's hard limit; the leg still packs the relay and says "go on" (130), since the
    next leg resumes from the run's last checkpoint, not "failed"."""
    stubborn = tmp_path / "python"
    stubborn.write_text(
        "#!/usr/bin/env bash\ntrap '' INT TERM\nmkdir -p \"$5\"/MinAtar-Breakout-v1\n"
        'echo kept > "$5"/MinAtar-Breakout-v1/metrics.jsonl\nwhile :; do sleep 0.2; done\n'
    )  # arguments: -m benchmarks.learning run --out RESULTS ...
    stubborn.chmod(0o755)
    results, out = tmp_path / "results", tmp_path / "out"
    (out / "no-wheels").mkdir(parents=True)
    env = {**os.environ, "PYTHON": str(stubborn), "OUT": str(out),
           "WHEELS": str(out / "no-wheels"), "LEG_GRACE_S": "1"}  # fmt: skip
    done = run_in_own_session(["bash", "benchmarks/gpu_leg.sh", str(results), "1"], 60, env)
    assert done.returncode == 130, done.stdout
    assert "was killed; the next leg goes on from its last checkpoint" in done.stdout
    unpack_relay(out, tmp_path / "carried")
    kept = tmp_path / "carried" / "MinAtar-Breakout-v1" / "metrics.jsonl"
    assert kept.read_text() == "kept\n"


class FirePolicy:
    """Stands in for a trained Policy: presses FIRE then moves at random, seeded."""

    def __init__(self, env_id: str, env_kwargs: dict) -> None:
        self.env_id, self.env_kwargs, self.greedy = env_id, env_kwargs, False
        self._rng = np.random.default_rng(0)

    def reset(self) -> None:
        self._rng = np.random.default_rng(0)

    def act(self, obs) -> int:
        return int(self._rng.integers(0, 4))


def test_evaluate_scores_atari_over_full_games_not_lives():
    """A policy trained with episodic_life still gets scored over all five Breakout lives."""
    pytest.importorskip("ale_py")
    from learner.tools.evaluate import evaluate

    kwargs = {"episodic_life": True, "noop_max": 0}
    full = evaluate(FirePolicy("ALE/Breakout-v5", kwargs), episodes=2, seed=3)  # type: ignore[arg-type]
    env = envs.make_env("ALE/Breakout-v5", kwargs)  # what training saw: one life an episode
    try:
        env.reset(seed=3)
        policy, steps, done = FirePolicy("ALE/Breakout-v5", kwargs), 0, False
        while not done:
            _, _, terminated, truncated, _ = env.step(policy.act(None))
            steps, done = steps + 1, terminated or truncated
    finally:
        env.close()
    assert min(full.lengths) > 2 * steps, (full.lengths, steps)
    assert full.truncated == 0 and not full.greedy
    assert full.std == pytest.approx(float(np.std(full.returns)))
    assert "over 2 full episodes (sampled" in full.summary()


def test_a_long_run_suite_runs_every_seed_at_every_actor_shape():
    suite = SUITES["classic-long"]
    cartpole, _, breakout = suite.envs
    plan = run_plan(suite, suite.envs, 0, 2)
    assert [(s.env, seed, shape) for s, seed, shape in plan[:4]] == [
        ("CartPole-v1", 0, (2, 32)), ("CartPole-v1", 0, (16, 4)), ("CartPole-v1", 0, (64, 1)),
        ("CartPole-v1", 1, (2, 32)),
    ]  # fmt: skip
    assert len(plan) == 2 * 3 * 2 + 2  # MinAtar at one shape
    assert suite.run_name(1, (16, 4)) == "seed1-16x4"
    assert SUITES["classic"].run_name(1, (2, 16)) == "seed1"
    # The classic envs train as an open-ended run does; MinAtar keeps its preset's plan.
    assert run_overrides(cartpole, None)["lr_schedule"] == "inverse_sqrt"
    assert learner_config_for(breakout, run_overrides(breakout, None)).lr_schedule == "auto"
    assert cartpole.frames == breakout.frames == 4 * SUITES["minatar"].envs[1].frames


def test_the_stability_table_reports_what_each_run_kept_after_solving(tmp_path):
    """Best, lowest after first reaching 475 and final mean-100 per run; a run holds while
    the lowest stays above the floor half way from random (22) to solved (248.5)."""
    suite = SUITES["classic-long"]
    spec = suite.envs[0]
    out = tmp_path / "long"
    climb = [22.0, 200.0, 480.0, 500.0]
    falls = {"seed0-2x32": [*climb, 300.0, 499.0], "seed0-16x4": [*climb, 120.0, 490.0]}
    for name, returns in falls.items():
        records = [{"elapsed_s": float(i), "frames": 1000 * (i + 1), "episode_return_mean": r}
                   for i, r in enumerate(returns)]  # fmt: skip
        _finished_run(out / spec.name / name, 0, records)
        run = json.loads((out / spec.name / name / RUN_FILE).read_text())
        actors = [int(n) for n in name.split("-")[1].split("x")]
        (out / spec.name / name / RUN_FILE).write_text(json.dumps({**run, "actors": actors}))
    write_metrics(out / spec.name / "seed0-64x1", [])  # unfinished: not tabled
    (out / spec.name / "random.json").write_text(json.dumps({"mean": 22.0, "std": 1.0}))
    summary = report.write_summary(suite, out)
    runs = summary["envs"][0]["runs"]
    assert [(r["run"], r["best_return_mean100"], r["lowest_after_solved"]) for r in runs] == [
        ("seed0-16x4", 500.0, 120.0), ("seed0-2x32", 500.0, 300.0),
    ]  # fmt: skip
    table = report.markdown_table(summary)
    assert "| CartPole-v1 | 2x32 | 0 | 6 k | 3 k | 500.0 | 300.0 | 499.0 | 248.5 | yes |" in table
    assert (
        "| CartPole-v1 | 16x4 | 0 | 6 k | 3 k | 500.0 | 120.0 | 490.0 | 248.5 | **no** |" in table
    )

    # A thinned archive keeps the lowest point after solving, so the verdict survives it.
    long_fall = [{"elapsed_s": float(i), "frames": 1000 * (i + 1),
                  "episode_return_mean": 480.0 - (i == 1234) * 400.0}
                 for i in range(5000)]  # fmt: skip
    _finished_run(out / spec.name / "seed1-2x32", 1, long_fall)
    results = tmp_path / "results"
    report.archive(suite, out, results)
    kept = results / spec.name / "seed1-2x32"
    assert len(report.read_metrics(kept)) <= report.ARCHIVE_POINTS + 10
    assert report.run_summary(spec, kept)["lowest_after_solved"] == 80.0


def _match(opponent: str, first: tuple[int, int, int], second: tuple[int, int, int]) -> dict:
    """An arena match record: (wins, draws, losses) of the policy in each seat."""

    def seat(wins: int, draws: int, losses: int) -> dict:
        n = wins + draws + losses
        return {"wins": wins, "draws": draws, "losses": losses, "cut": 0,
                "win": wins / n, "draw": draws / n, "loss": losses / n}  # fmt: skip

    return {"opponent": opponent, "seats": {"first": seat(*first), "second": seat(*second)}}


def test_a_two_player_run_is_judged_by_its_win_rates_in_both_seats_within_its_time(tmp_path):
    """Connect Four's verdict: at least 99 % against random and 80 % against the heuristic
    in each seat, in a run that trained within 30 minutes; the curve is the yardstick."""
    suite = SUITES["selfplay"]
    (spec,) = suite.envs
    assert spec.opponents == {"random": 0.99, "heuristic": 0.80} and spec.wall_budget_s == 1800
    # The budget stops the run; the rate follows the preset's plan for a time-limited one.
    assert run_overrides(spec, None)["lr_schedule"] == "inverse_sqrt"
    out = tmp_path / "selfplay"
    runs = {  # seed: (wall seconds at the end, the matches)
        0: (1790.0, [_match("random", (198, 0, 2), (199, 1, 0)),
                     _match("heuristic", (160, 0, 40), (161, 2, 37))]),
        1: (1790.0, [_match("random", (200, 0, 0), (197, 0, 3)),
                     _match("heuristic", (170, 0, 30), (159, 0, 41))]),
        2: (1810.0, [_match("random", (200, 0, 0), (200, 0, 0)),
                     _match("heuristic", (190, 0, 10), (190, 0, 10))]),
    }  # fmt: skip
    for seed, (wall, matches) in runs.items():
        logdir = out / spec.name / f"seed{seed}"
        write_metrics(logdir, [
            {"elapsed_s": 10.0, "frames": 1000, "episode_return_mean": 0.1,
             "selfplay_yardstick": None, "learner_steps": 10, "elo_learner": 1000.0},
            {"elapsed_s": wall / 2, "frames": 2000, "episode_return_mean": 0.3,
             "selfplay_yardstick": 0.55, "learner_steps": 20, "elo_learner": 1100.0,
             "elo_snapshot_1": 1050.0, "elo_heuristic": 1200.0},
            {"elapsed_s": wall, "frames": 3000, "episode_return_mean": 0.2,
             "selfplay_yardstick": 0.85, "learner_steps": 30, "elo_learner": 1300.0,
             "elo_snapshot_1": 1060.0, "elo_snapshot_2": 1250.0, "elo_heuristic": 1150.0,
             "learning_rate_scale": 0.5},
        ])  # fmt: skip
        run = {"seed": seed, "frames": 3000, "budget_frames": 3000, "actors": [2, 256],
               "train_return_mean100": 0.2, "eval": None, "matches": matches,
               "learner_steps": 40, "episodes": 300}  # fmt: skip
        if seed == 0:  # its best checkpoint played; the final weights' games beside them
            run |= {"matches_of": "best", "best_frames": 2500, "final_matches": [
                _match("random", (190, 0, 10), (180, 0, 20)),
                _match("heuristic", (100, 0, 100), (50, 0, 150))]}  # fmt: skip
        (logdir / RUN_FILE).write_text(json.dumps(run))
    summary = report.write_summary(suite, out)
    (env,) = summary["envs"]
    verdicts = [(r["seed"], r["meets_targets"], r["short_of"], r["in_time"]) for r in env["runs"]]
    assert verdicts == [
        (0, True, [], True),
        (1, False, ["random second", "heuristic second"], True),  # 98.5 % and 79.5 %
        (2, False, [], False),  # every score met, but in 30 min 10 s
    ]
    assert env["meets_reference"] is False
    assert env["runs"][0]["thresholds"] == {
        "0.5": {"frames": 2000, "wall_time_s": 895.0},
        "0.8": {"frames": 3000, "wall_time_s": 1790.0},
    }
    table = report.markdown_table(summary)
    assert (
        "| pettingzoo.classic.connect_four_v3 | 2x256 | 0 | 3 k | 29.8 min | 40 | 300 "
        "| best (at 2 k) | 99.0 % / 99.5 % | 80.0 % / 80.5 % | 95.0 / 90.0; 50.0 / 25.0 "
        "| 3 k (29.8 min) | yes |" in table
    )
    assert "as first and as second player within 30 minutes. Games a seat: 200." in table
    assert (
        "| final | 100.0 % / 98.5 % | 85.0 % / 79.5 % | as played | 3 k (29.8 min) "
        "| no (random second, heuristic second) |" in table
    )
    assert "| no (over the wall budget) |" in table

    # The archive keeps the yardstick, so the verdict and the curve read off it are the
    # run's, and the players' ratings for their plot, one a run.
    results = tmp_path / "results"
    report.archive(suite, out, results)
    kept = report.run_summary(spec, results / spec.name / "seed0")
    assert kept["thresholds"] == env["runs"][0]["thresholds"] and kept["meets_targets"]
    assert report.curve(results / spec.name / "seed0", spec.curve_metric)[-1][2] == 0.85
    last = report.read_metrics(results / spec.name / "seed0")[-1]
    assert "learning_rate_scale" not in last
    assert {k: v for k, v in last.items() if k.startswith(("elo_", "learner_"))} == {
        "learner_steps": 30, "elo_learner": 1300.0, "elo_snapshot_1": 1060.0,
        "elo_snapshot_2": 1250.0, "elo_heuristic": 1150.0,
    }  # fmt: skip
    paths = report.plot_curves(suite, results)
    assert [p.name for p in paths] == [f"{spec.name}.png"] + [
        report.ratings_png(spec.name, f"seed{seed}") for seed in runs
    ]
    assert all(p.stat().st_size > 0 for p in paths)
    table = report.markdown_table(report.write_summary(suite, results), "curves")
    assert f"(curves/{report.ratings_png(spec.name, 'seed2')})" in table


def test_a_match_plays_each_opponent_in_both_seats_on_the_same_games():
    """The final policy's games: every scripted opponent, as first and as second player,
    the games of each seat seeded alike; here the heuristic itself plays random."""
    pytest.importorskip("pettingzoo")
    from benchmarks.learning.runner import matches
    from learner.league import arena, opponents

    (spec,) = SUITES["selfplay"].envs
    policy = arena.ScriptedPlayer(opponents.build("heuristic", spec.env, 7))
    played = matches(spec, policy, games=20, seed=3)
    assert [m["opponent"] for m in played] == ["random", "heuristic"]
    for match in played:
        assert [report.result_games(s) for s in match["seats"].values()] == [20, 20]
    against_random = played[0]["seats"]
    # Win if it can, block if it must: it beats a random player in most games of each seat.
    assert against_random["first"]["wins"] >= 15 and against_random["second"]["wins"] >= 15
    again = matches(spec, arena.ScriptedPlayer(opponents.build("heuristic", spec.env, 7)),
                    games=20, seed=3)  # fmt: skip
    assert again == played


def test_hosting_fields_are_learner_fields():
    """Each field the archive lets differ between seeds names a real learner setting (a
    renamed one would silently be compared again, or a typo never exempt anything)."""
    names = {field.name for field in dataclasses.fields(LearnerConfig)}
    assert names >= report.HOSTING_FIELDS, sorted(report.HOSTING_FIELDS - names)


def test_the_sac_twin_of_mujoco_is_held_to_sacs_published_returns():
    """CleanRL's sac_continuous_action at 1 M steps decides the verdict (the zoo's SAC
    where CleanRL has no run, Ant); PPO's reference stays beside it and as a threshold."""
    ppo, sac = SUITES["mujoco"], SUITES["mujoco-sac"]
    cheetah, ant = find_env(sac, "HalfCheetah-v5"), find_env(sac, "Ant-v5")
    assert cheetah.preset == "mujoco-sac" and cheetah.frames == 1_000_000
    assert cheetah.reference is not None and cheetah.reference.value == 9634.89
    assert cheetah.reference.url.endswith("cleanrl/blob/master/docs/benchmark/sac.md")
    assert ant.reference is not None and ant.reference.value == 4615.791
    for spec in sac.envs:
        ppo_reference = find_env(ppo, spec.env).reference
        assert ppo_reference in spec.others and ppo_reference is not None
        assert spec.reference is not None and "SAC" in spec.reference.label
        assert {ppo_reference.value, spec.reference.value} <= set(spec.thresholds)
    assert cheetah.thresholds == (1000.0, 1442.64, 5000.0, 9634.89)  # the host's 300 k target
