"""The peers benchmark's own logic: the 100-episode rule, steady rates, the driver-to-runner
result line, the table, and how the runner reports a peer that fails. No peer is
installed or run here; the drivers' subprocess handling runs on tiny Python scripts."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.peers import __main__ as peers
from benchmarks.peers import report, venvs
from benchmarks.peers.measure import (
    PROGRESS_PREFIX,
    RESULT_PREFIX,
    ReturnWindow,
    parse_result,
    steady_rate,
    task_outcome,
)
from benchmarks.peers.seedrl_driver import (
    first_solved,
    frame_samples,
    measured_span,
    stopped_by,
)


def test_window_waits_for_100_episodes() -> None:
    window = ReturnWindow(475.0)
    assert window.mean is None
    assert not window.add([500.0] * 99)
    assert window.add([500.0])
    assert window.episodes == 100


def test_window_holds_only_the_last_100() -> None:
    window = ReturnWindow(475.0)
    assert not window.add([0.0] * 50 + [500.0] * 90)  # the last 100: 10 zeros, 90 x 500
    assert window.mean == pytest.approx(450.0)
    assert window.add([500.0] * 10)  # the zeros leave the window
    assert window.mean == 500.0
    assert not window.add([0.0] * 6)  # 94 x 500 / 100 = 470


def test_window_target_is_inclusive() -> None:
    assert ReturnWindow(475.0).add([475.0] * 100)
    with pytest.raises(ValueError):
        ReturnWindow(475.0, size=0)


def test_steady_rate_leaves_out_the_warmup() -> None:
    samples = [(0.0, 0.0), (5.0, 100.0), (10.0, 1100.0), (20.0, 3100.0)]
    assert steady_rate(samples, 10.0) == pytest.approx(200.0)
    assert steady_rate(samples, 0.0) == pytest.approx(155.0)


def test_steady_rate_needs_two_samples_after_warmup() -> None:
    assert steady_rate([], 0.0) is None
    assert steady_rate([(0.0, 0.0), (30.0, 1000.0)], 10.0) is None
    assert steady_rate([(0.0, 0.0), (1.0, 10.0), (1.0, 20.0)], 0.5) is None


def test_result_line_round_trip(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.peers.measure import emit_result

    emit_result({"frames": 5})
    emit_result({"frames": 7, "reached": True})
    out = "noise\n" + capsys.readouterr().out + f"{RESULT_PREFIX}{{broken\nmore noise\n"
    assert parse_result(out) == {"frames": 7, "reached": True}
    assert parse_result("no result here\n") is None
    assert parse_result(RESULT_PREFIX + "[1, 2]\n") is None


def _record(episodes: int, mean: float | None, frames: int, elapsed: float) -> dict[str, Any]:
    return {"episodes": episodes, "episode_return_mean": mean, "frames": frames,
            "elapsed_s": elapsed, "time": 1000.0 + elapsed}  # fmt: skip


def test_seedrl_solved_record_needs_100_episodes() -> None:
    records = [
        _record(0, None, 0, 2.0),
        _record(60, 490.0, 1000, 4.0),  # a high mean of too few episodes
        _record(150, 400.0, 2000, 6.0),
        _record(200, 476.0, 3000, 8.0),
        _record(250, 480.0, 4000, 10.0),
    ]
    assert first_solved(records, 475.0) == records[3]
    assert first_solved(records[:3], 475.0) is None


def test_seedrl_frame_samples_start_when_frames_do() -> None:
    records = [_record(0, None, 0, 2.0), _record(0, None, 0, 4.0), _record(3, 9.0, 500, 6.0)]
    assert frame_samples(records) == [(4.0, 0.0), (6.0, 500.0)]
    assert frame_samples(records[:2]) == []


def test_seedrl_rate_leaves_out_the_records_of_its_stop() -> None:
    samples = [(2.0, 0.0), (4.0, 100.0), (6.0, 200.0), (8.0, 200.0), (9.0, 200.0)]
    assert measured_span(samples, 6.0) == samples[:3]
    assert measured_span(samples, None) == samples[:-1]


def test_seedrl_stop_reasons_in_common_words() -> None:
    solved = "mean return of the last 100 episodes reached 475.0"
    assert stopped_by(solved, True) == "target"
    assert stopped_by("reached 2000000 frames", False) == "frame cap"
    assert stopped_by("reached 120 s", False) == "wall cap"
    assert stopped_by("signal SIGINT", False) == "measured"
    assert stopped_by("trainer failed", False) == "trainer failed"


def _fixture() -> dict[str, Any]:
    # fmt: off
    return {
        "schema": report.SCHEMA,
        "date": "2030-01-02 03:04 UTC",
        "wall_time_s": 330.0,
        "machine": {"cpu_model": "Test CPU", "cpus": 2, "cpus_usable": 1,
                    "platform": "Linux", "python": "3.11.7"},
        "settings": {"target": 475.0, "cartpole_wall_cap_s": 120.0, "atari_warmup_s": 15.0,
                     "note": "a test run"},
        "results": [
            {"peer": "seedrl", "system": "seedrl V-trace", "task": "cartpole", "status": "ok",
             "reached": True, "launch_to_target_s": 12.5, "train_to_target_s": 10.0,
             "frames_to_target": 400_000, "episodes": 3000, "stopped_by": "target",
             "summary": "2 actors × 32 envs", "versions": {"seedrl": "0.1.0"}},
            {"peer": "sb3", "system": "stable-baselines3 PPO", "task": "cartpole",
             "status": "ok", "reached": False, "return_mean100": 301.26, "frames": 100_000,
             "stopped_by": "frame cap", "versions": {"stable-baselines3": "2.9.2"}},
            {"peer": "sample-factory", "system": "Sample Factory APPO", "task": "cartpole",
             "status": "failed", "reason": "install: pip install exited with 1 | see log"},
            {"peer": "seedrl", "system": "seedrl V-trace", "task": "atari", "status": "ok",
             "agent_steps_per_s": 650.0, "frame_skip": 4, "measured_s": 30.2,
             "startup_s": 6.0, "versions": {"seedrl": "0.1.0"}},
            {"peer": "sample-factory", "system": "Sample Factory APPO", "task": "atari",
             "status": "ok", "agent_steps_per_s": None, "frame_skip": 4, "measured_s": 90.0},
        ],
    }
    # fmt: on


def _cells(block: str, system: str, heading: str) -> list[str]:
    section = block[block.index(heading) :]
    line = next(x for x in section.splitlines() if x.startswith(f"| {system} |"))
    return [c.strip() for c in line.strip("|").split(" | ")]


def test_table_renders_each_outcome() -> None:
    block = report.render(_fixture())
    assert "2030-01-02 03:04 UTC" in block and "pinned to 1" in block and "a test run" in block
    assert "seedrl V-trace: seedrl 0.1.0" in block
    seedrl = _cells(block, "seedrl V-trace", "CartPole-v1")
    assert seedrl[2:7] == ["reached 475", "12.5", "10.0", "400,000", "40,000"]
    sb3 = _cells(block, "stable-baselines3 PPO", "CartPole-v1")
    assert sb3[2] == "not reached (mean 301.3 at the end)" and sb3[3] == "—"
    failed = _cells(block, "Sample Factory APPO", "CartPole-v1")
    assert failed[2] == "failed: install: pip install exited with 1 \\| see log"
    atari = _cells(block, "seedrl V-trace", "Atari Pong")
    assert atari[2:7] == ["measured", "650", "2,600", "30", "6"]
    sf = _cells(block, "Sample Factory APPO", "Atari Pong")
    assert sf[2:6] == ["too short to measure", "—", "—", "—"]


def test_table_refuses_another_schema() -> None:
    with pytest.raises(ValueError, match="seedrl-peers/1"):
        report.render({**_fixture(), "schema": "seedrl-bench/1"})


def test_table_command_replaces_only_its_block(tmp_path: Path) -> None:
    fixture = tmp_path / "peers.json"
    fixture.write_text(json.dumps(_fixture()))
    page = tmp_path / "page.md"
    page.write_text(f"# Title\n{report.BEGIN}\nold rows\n{report.END}\nafter\n")
    assert peers.main(["table", str(fixture), "--update", str(page)]) == 0
    text = page.read_text()
    assert "old rows" not in text and text.startswith("# Title\n") and text.endswith("after\n")
    assert report.render(_fixture()) in text


def _task(peer: str, task: str) -> peers.Task:
    return next(t for t in peers.TASKS if t.peer == peer and t.task == task)


def test_driver_arguments() -> None:
    caps = peers.Caps(cartpole_wall_cap_s=100.0, atari_warmup_s=10.0, atari_measure_s=20.0)
    sb3 = peers.driver_args(_task("sb3", "cartpole"), caps, Path("w"), 1.5)
    assert sb3[0].startswith("--launched-at=") and "--wall-cap-s=100.0" in sb3
    sf = peers.driver_args(_task("sample-factory", "atari"), caps, Path("w"), 1.5)
    assert sf[0] == "atari" and "--train-dir=w" in sf and "--measure-s=20.0" in sf
    assert f"--wall-cap-s={10.0 + 20.0 + caps.grace_s}" in sf
    assert peers.time_limit(_task("seedrl", "cartpole"), caps) == 100.0 + caps.grace_s


def test_run_driver_echoes_progress_and_keeps_the_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = (
        f"print({PROGRESS_PREFIX + 'halfway'!r}); "
        f"print({RESULT_PREFIX + json.dumps({'frames': 3})!r}); "
        f"print('library chatter\\n' * {peers.TAIL_LINES + 5})"
    )
    log = tmp_path / "d.log"
    run = peers.run_driver([sys.executable, "-c", script], {}, log, 60.0, "fake")
    assert run.code == 0 and run.result == {"frames": 3}  # though it left the tail
    assert "fake: halfway" in capsys.readouterr().out
    assert "library chatter" in log.read_text()


def test_run_driver_stops_a_stuck_driver(tmp_path: Path) -> None:
    script = "import time\nprint('started', flush=True)\ntime.sleep(20)\nprint('finished')"
    run = peers.run_driver([sys.executable, "-c", script], {}, tmp_path / "d.log", 1.0, "stuck")
    assert run.code is None and run.tail[0] == "started" and "finished" not in run.tail
    assert run.result is None
    assert peers.failure_reason(run.code, run.tail, 1.0) == "stopped after 1 s without a result"


def test_failure_reason_names_the_last_line() -> None:
    tail = ["Traceback (most recent call last):", "ImportError: no module x", ""]
    assert peers.failure_reason(1, tail, 9.0) == "exited with 1: ImportError: no module x"
    assert peers.failure_reason(3, [], 9.0) == "exited with 3 and printed nothing"


def test_a_peer_that_cannot_install_is_a_failed_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempts = []

    def refuse(name: str, root: Path, log: Path | None = None) -> venvs.Venv:
        attempts.append(name)
        raise venvs.VenvError("pip install exited with 1 (see the log)")

    monkeypatch.setattr(venvs, "ensure", refuse)
    monkeypatch.setattr(peers, "FAILED_INSTALLS", {})
    row = peers.run_task(_task("sb3", "cartpole"), peers.Caps(), tmp_path, tmp_path)
    assert row["status"] == "failed"
    assert row["reason"] == "install: pip install exited with 1 (see the log)"
    # The peer's next task in the same run is not built again.
    again = peers.run_task(_task("pufferlib", "atari"), peers.Caps(), tmp_path, tmp_path)
    assert again["reason"].startswith("install: ") and attempts == ["sb3", "pufferlib"]
    peers.run_task(_task("pufferlib", "cartpole"), peers.Caps(), tmp_path, tmp_path)
    assert attempts == ["sb3", "pufferlib"]


def test_each_run_starts_in_an_empty_directory(tmp_path: Path) -> None:
    old = tmp_path / "seedrl-cartpole"
    old.mkdir()
    (old / "metrics.jsonl").write_text('{"frames": 1}\n')
    assert peers.fresh_dir(old) == old and not old.exists()
    assert not peers.fresh_dir(tmp_path / "never-made").exists()


def test_venv_dir_follows_the_pins(tmp_path: Path) -> None:
    a = venvs.venv_dir(tmp_path, "sb3", ("x==1", "y==2"))
    assert a == venvs.venv_dir(tmp_path, "sb3", ("y==2", "x==1"))
    assert a != venvs.venv_dir(tmp_path, "sb3", ("x==1", "y==3"))
    assert venvs.read_stamp(a) is None
    a.mkdir()
    (a / venvs.STAMP).write_text(json.dumps({"versions": {"x": "1"}}))
    assert venvs.read_stamp(a) == {"versions": {"x": "1"}}


BUILD_FAILURE = """\
Collecting pufferlib==3.0.0
  Preparing metadata (pyproject.toml): started
  error: subprocess-exited-with-error
      Downloading Raylib raylib-5.5_webassembly
      Traceback (most recent call last):
        File "/usr/lib/python3.11/socket.py", line 962, in getaddrinfo
      socket.gaierror: [Errno -2] Name or service not known
      During handling of the above exception, another exception occurred:
      urllib.error.URLError: <urlopen error [Errno -2] Name or service not known>
  note: This error originates from a subprocess, and is likely not a problem with pip.
error: metadata-generation-failed
"""


def test_an_install_failure_names_the_error_of_the_build() -> None:
    assert venvs.first_error(BUILD_FAILURE) == (
        "urllib.error.URLError: <urlopen error [Errno -2] Name or service not known>"
    )
    assert venvs.first_error("ERROR: No matching distribution found for x==9\n") == (
        "ERROR: No matching distribution found for x==9"
    )
    assert venvs.first_error("all fine\n") is None


def test_a_package_built_after_the_pins_fails_with_its_build_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Torch first, then the package that compiles against it; a failed build's row says
    what failed, and earlier attempts in the same log do not count."""
    calls: list[list[str]] = []

    def fake_run(cmd: list[str], stdout: Any = None, **kwargs: Any) -> Any:
        calls.append(cmd)
        if "--no-build-isolation" in cmd:
            stdout.write(BUILD_FAILURE)
            stdout.flush()
            raise venvs.subprocess.CalledProcessError(1, cmd)
        return venvs.subprocess.CompletedProcess(cmd, 0, stdout="")

    monkeypatch.setattr(venvs.subprocess, "run", fake_run)
    monkeypatch.setattr(venvs, "PINS", {"p": ("torch==2.13.0",)})
    monkeypatch.setattr(venvs, "BUILT_AFTER", {"p": ("lib==3.0.0",)})
    log = tmp_path / "p-install.log"
    log.write_text("ERROR: an older attempt's failure\n")
    with pytest.raises(venvs.VenvError) as failure:
        venvs.ensure("p", tmp_path, log)
    assert str(failure.value) == (
        "pip install --no-build-isolation lib==3.0.0 exited with 1: urllib.error.URLError: "
        "<urlopen error [Errno -2] Name or service not known> (see the log)"
    )
    pins, later = calls[1], calls[2]
    assert pins[-1] == "torch==2.13.0" and "--no-build-isolation" not in pins
    assert later[-2:] == ["--no-build-isolation", "lib==3.0.0"]


def test_merge_keeps_the_rows_not_run_again_with_their_date(tmp_path: Path) -> None:
    out = tmp_path / "peers.json"
    out.write_text(json.dumps(_fixture()))
    kept = peers.earlier_rows(out, [_task("sample-factory", "cartpole")], peers.Caps(seed=0))
    assert [(r["peer"], r["task"]) for r in kept] == [
        ("seedrl", "cartpole"), ("sb3", "cartpole"), ("seedrl", "atari"),
        ("sample-factory", "atari"),
    ]  # fmt: skip
    assert {r["date"] for r in kept} == {"2030-01-02 03:04 UTC"}
    merged = {**_fixture(), "date": "2031-05-06 07:08 UTC", "results": kept}
    assert "Kept from earlier runs on this machine: " in report.render(merged)
    assert "seedrl V-trace cartpole (2030-01-02 03:04 UTC)" in report.render(merged)


def test_task_outcome_is_time_to_target_for_cartpole_and_steady_rate_for_pong() -> None:
    found = {"reached_at": 130.0, "frames": 40_000}
    assert task_outcome("cartpole", found, 100.0, 110.0, [], 5.0) == {
        "reached": True, "frames_to_target": 40_000,
        "launch_to_target_s": 30.0, "train_to_target_s": 20.0,
    }  # fmt: skip
    missed = task_outcome("cartpole", {}, 100.0, 110.0, [], 5.0)
    assert missed == {
        "reached": False, "frames_to_target": None,
        "launch_to_target_s": None, "train_to_target_s": None,
    }  # fmt: skip
    samples = [(110.0, 0.0), (120.0, 1000.0), (130.0, 3000.0)]
    pong = task_outcome("pong", {}, 100.0, 110.0, samples, 10.0)
    assert pong == {"agent_steps_per_s": pytest.approx(200.0), "measured_s": 10.0}
    assert task_outcome("pong", {}, 100.0, 110.0, [], 10.0)["measured_s"] == 0.0


def test_the_structured_suite_pairs_seedrl_and_sb3_on_every_env() -> None:
    from benchmarks.learning.suites import SUITES

    tasks = peers.suite_tasks("structured")
    envs = [spec.env for spec in SUITES["structured"].envs]
    assert [(t.peer, t.env) for t in tasks] == [(p, e) for e in envs for p in ("seedrl", "sb3")]
    assert {t.task for t in tasks} == {"structured"}
    assert {t.venv for t in tasks if t.peer == "sb3"} == {"sb3"}
    assert len({t.name for t in tasks}) == len(tasks)  # each its own log and run directory
    assert peers.suite_tasks("default") == peers.TASKS
    with pytest.raises(ValueError, match="unknown peers suite"):
        peers.suite_tasks("structure")


def test_structured_drivers_get_the_same_env_wall_cap_and_number_of_envs() -> None:
    caps = peers.Caps(structured_wall_cap_s=77.0)
    seedrl, sb3 = peers.suite_tasks("structured")[:2]
    ours = peers.driver_args(seedrl, caps, Path("w"), 1.5)
    theirs = peers.driver_args(sb3, caps, Path("w"), 1.5)
    assert ours[0] == "structured" and "--logdir=w" in ours
    for args in (ours, theirs):
        assert f"--env={seedrl.env}" in args and "--wall-cap-s=77.0" in args
    assert "--num-actors=2" in ours and "--envs-per-actor=16" in ours
    assert "--num-envs=32" in theirs
    assert peers.time_limit(sb3, caps) == 77.0 + caps.grace_s


def test_sb3_reads_dict_observations_as_they_are_and_flattens_tuples() -> None:
    from benchmarks.learning import structured
    from benchmarks.peers import sb3_driver

    dict_env, tuple_env = structured.lit_cell(), structured.lit_cell_tuple()
    assert sb3_driver.sb3_wrapper(dict_env.observation_space) is None
    assert sb3_driver.policy_for(dict_env.observation_space) == "MultiInputPolicy"
    wrapper = sb3_driver.sb3_wrapper(tuple_env.observation_space)
    flat = wrapper(tuple_env).observation_space
    assert sb3_driver.policy_for(flat) == "MlpPolicy" and flat.shape == (49 + 4 + 3,)
    assert sb3_driver.env_factory(structured.env_id("register"))().action_space.n == 5
    with pytest.raises(SystemExit, match="module:callable"):
        sb3_driver.env_factory("CartPole-v1")


def test_the_structured_table_has_a_row_per_system_and_env_with_its_levels() -> None:
    env = "benchmarks.learning.structured:lit_cell"
    rows = [
        {"peer": "seedrl", "system": "seedrl V-trace", "task": "structured", "env": env,
         "status": "ok", "return_mean100": 1.9, "frames": 3_900_000, "wall_s": 300.0,
         "startup_s": 10.0, "random_level": 10 / 49, "upper_level": 10.0,
         "stopped_by": "wall cap", "summary": "2 actors × 16 envs"},
        {"peer": "sb3", "system": "stable-baselines3 PPO", "task": "structured", "env": env,
         "status": "failed", "reason": "install: no network", "random_level": 10 / 49,
         "upper_level": 10.0},
    ]  # fmt: skip
    doc = {**_fixture(), "settings": {"structured_wall_cap_s": 300.0}, "results": rows}
    block = report.render(doc)
    assert "after 300 s from launch" in block and "CartPole-v1 to a mean" not in block
    heading = "structured learning suite"
    ours = _cells(block, "lit_cell", heading)
    assert ours[1:] == ["seedrl V-trace", "0", "300", "2 actors × 16 envs", "trained", "1.90",
                        "0.204", "10", "3,900,000", "13,448", "10", "wall cap"]  # fmt: skip
    section = block[block.index(heading) :]
    theirs = next(x for x in section.splitlines() if "stable-baselines3 PPO" in x)
    assert "failed: install: no network" in theirs and "| 0.204 | 10 |" in theirs


def test_merge_tells_structured_rows_apart_by_their_env_and_seed(tmp_path: Path) -> None:
    seedrl_lit, _, seedrl_tuple, _ = peers.suite_tasks("structured")[:4]
    out = tmp_path / "peers.json"
    rows = [
        {"peer": "seedrl", "task": "structured", "env": t.env} for t in (seedrl_lit, seedrl_tuple)
    ]  # rows from before seeds were recorded: seed 0
    rows.append({"peer": "seedrl", "task": "structured", "env": seedrl_lit.env,
                 "settings": {"seed": 1}})  # fmt: skip
    out.write_text(json.dumps({**_fixture(), "results": rows}))
    kept = peers.earlier_rows(out, [seedrl_lit], peers.Caps(seed=0))
    assert [(r["env"], report.row_seed(r)) for r in kept] == [
        (seedrl_tuple.env, 0), (seedrl_lit.env, 1)
    ]  # fmt: skip
    kept = peers.earlier_rows(out, [seedrl_lit], peers.Caps(seed=1))
    assert [(r["env"], report.row_seed(r)) for r in kept] == [
        (seedrl_lit.env, 0), (seedrl_tuple.env, 0)
    ]  # fmt: skip


def test_merge_keeps_a_structured_row_of_another_wall_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A longer budget at the same seed is a row beside the 300 s one, not in its place;
    rows from before the cap was recorded ran 300 s, and every row records its own."""
    seedrl_lit, sb3_lit = peers.suite_tasks("structured")[:2]

    def refuse(name: str, root: Path, log: Path | None = None) -> venvs.Venv:
        raise venvs.VenvError("no network")

    monkeypatch.setattr(venvs, "ensure", refuse)
    monkeypatch.setattr(peers, "FAILED_INSTALLS", {})
    failed = peers.run_task(sb3_lit, peers.Caps(structured_wall_cap_s=900.0), tmp_path, tmp_path)
    assert failed["status"] == "failed" and report.row_wall_cap(failed) == 900.0
    out = tmp_path / "peers.json"
    rows = [
        {"peer": "seedrl", "task": "structured", "env": seedrl_lit.env},
        {"peer": "seedrl", "task": "structured", "env": seedrl_lit.env, "wall_cap_s": 900.0},
    ]
    out.write_text(json.dumps({**_fixture(), "results": rows}))
    longer = peers.earlier_rows(out, [seedrl_lit], peers.Caps(structured_wall_cap_s=900.0))
    assert [report.row_wall_cap(r) for r in longer] == [300.0]
    shorter = peers.earlier_rows(out, [seedrl_lit], peers.Caps())
    assert [report.row_wall_cap(r) for r in shorter] == [900.0]


def test_the_seeds_table_averages_each_system_over_its_seeds_and_says_who_leads() -> None:
    def row(system: str, env: str, seed: int, mean: float) -> dict[str, Any]:
        return {
            "system": system, "task": "structured", "status": "ok", "return_mean100": mean,
            "env": f"benchmarks.learning.structured:{env}", "settings": {"seed": seed},
        }  # fmt: skip

    ours, theirs = "seedrl V-trace", "stable-baselines3 PPO"
    rows = [  # a peer's row first: seedrl's column still comes first
        row(theirs, "lit_cell", 1, 7.0), row(ours, "lit_cell", 1, 8.0),
        row(theirs, "lit_cell", 0, 6.5), row(ours, "lit_cell", 0, 6.0),
        row(theirs, "register", 0, 0.2), row(ours, "register", 0, 0.3),
        {**row(theirs, "register", 1, 9.0), "status": "failed"},
    ]  # fmt: skip
    table = report.structured_seeds(rows)
    assert table[0] == (
        f"| env | {ours}: mean (seeds: each) | {theirs}: mean (seeds: each) | seedrl at or above |"
    )
    assert table[2] == "| lit_cell | 7.00 (2: 6.00, 8.00) | 6.75 (2: 6.50, 7.00) | yes |"
    assert table[3] == "| register | 0.30 (1: 0.30) | 0.20 (1: 0.20) | yes |"
    rows[1]["return_mean100"] = 7.0
    assert report.structured_seeds(rows)[2].endswith("| no, by 0.25 |")
    assert report.structured_seeds([r for r in rows if r["settings"]["seed"] == 0]) == []
    longer = [{**r, "wall_cap_s": 900.0, "return_mean100": r["return_mean100"] + 1} for r in rows]
    table = report.structured_seeds(rows + longer)  # each budget averaged on its own
    behind = " | no, by 0.25 |"
    assert table[2] == f"| lit_cell at 300 s | 6.50 (2: 6.00, 7.00) | 6.75 (2: 6.50, 7.00){behind}"
    assert table[4] == f"| lit_cell at 900 s | 7.50 (2: 7.00, 8.00) | 7.75 (2: 7.50, 8.00){behind}"


def test_the_seedrl_curve_is_in_seconds_from_launch() -> None:
    from benchmarks.peers.seedrl_driver import return_curve

    records = [{"time": 1000.0, "frames": 0}, {"time": 1005.0, "frames": 5000,
               "episode_return_mean": 0.25}, {"time": 1006.0}]  # fmt: skip
    assert return_curve(records, -998.0) == [[2.0, 0, None], [7.0, 5000, 0.25]]


def test_sac_rates_leave_out_the_warmup_for_steps_and_updates_alike() -> None:
    from benchmarks.peers.measure import update_rates

    # (seconds, env steps, updates): 100 steps/s and 400 updates/s after the warm-up
    samples = [(0.0, 5000.0, 0.0), (10.0, 5500.0, 2000.0), (20.0, 6500.0, 6000.0)]
    assert update_rates(samples, 10.0) == {
        "env_steps_per_s": pytest.approx(100.0),
        "updates_per_s": pytest.approx(400.0),
        "measured_s": 10.0,
    }
    short = update_rates(samples[:1], 10.0)
    assert short["updates_per_s"] is None and short["measured_s"] == 0.0


def test_seedrl_sac_samples_start_at_the_record_before_its_first_update() -> None:
    from benchmarks.peers.seedrl_driver import update_samples

    records: list[dict[str, Any]] = [
        {"elapsed_s": 1.0, "frames": 0, "learner_steps": 0},
        {"elapsed_s": 3.0, "frames": 2000, "learner_steps": 0},
        {"elapsed_s": 5.0, "frames": 5200, "learner_steps": 0},
        {"elapsed_s": 7.0, "frames": 5600, "learner_steps": 300},
        {"status": "stopped"},
    ]
    assert update_samples(records) == [(5.0, 5200.0, 0.0), (7.0, 5600.0, 300.0)]
    assert update_samples(records[:3]) == []


def test_the_sac_rows_pair_seedrl_and_the_loop_on_one_robot_with_one_window() -> None:
    caps = peers.Caps(sac_warmup_s=7.0, sac_measure_s=11.0)
    sac = [t for t in peers.TASKS if t.task == "sac"]
    assert [t.peer for t in sac] == ["seedrl", "sac-loop"]
    assert {t.venv for t in sac} == {None} and {t.env for t in sac} == {peers.SAC_ENV}
    for task in sac:
        args = peers.driver_args(task, caps, Path("w"), 1.5)
        assert args[0] == "sac" and "--logdir=w" in args and f"--env={peers.SAC_ENV}" in args
        assert "--warmup-s=7.0" in args and "--measure-s=11.0" in args
        assert f"--wall-cap-s={7.0 + 11.0 + caps.grace_s}" in args
    row = {"status": "ok", "task": "sac", "updates_per_s": 80.0, "env_steps_per_s": 320.0}
    assert peers.summary(row) == "80 updates/s, 320 env steps/s"


def test_a_sac_row_names_its_robot_without_the_structured_levels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commands = []

    def driver(cmd: list[str], env: dict[str, str], log: Path, limit: float, label: str):
        commands.append(cmd)
        return peers.DriverRun(0, [], {"updates_per_s": 50.0, "env_steps_per_s": 200.0})

    monkeypatch.setattr(peers, "run_driver", driver)
    for task in (t for t in peers.TASKS if t.task == "sac"):
        row = peers.run_task(task, peers.Caps(), tmp_path, tmp_path)
        assert row["status"] == "ok" and row["env"] == peers.SAC_ENV, row
        assert "random_level" not in row and row["updates_per_s"] == 50.0
    assert [c[2] for c in commands] == [
        "benchmarks.peers.seedrl_driver",
        "benchmarks.peers.sac_loop_driver",
    ]


def test_the_sac_table_shows_both_rates_and_updates_per_env_step() -> None:
    doc = _fixture()
    doc["settings"]["sac_warmup_s"] = 20.0
    doc["results"] = [
        {"peer": "seedrl", "system": "seedrl SAC", "task": "sac", "status": "ok",
         "env": "HalfCheetah-v5", "updates_per_s": 150.0, "env_steps_per_s": 600.0,
         "transitions_per_update": 256, "measured_s": 60.4, "startup_s": 9.0},
        {"peer": "sac-loop", "system": "single-process SAC loop", "task": "sac",
         "status": "ok", "env": "HalfCheetah-v5", "updates_per_s": None,
         "env_steps_per_s": None, "startup_s": 4.0},
    ]  # fmt: skip
    block = report.render(doc)
    assert "after 20 s of warm-up from the first update" in block
    rows = [line for line in block.splitlines() if line.startswith("| HalfCheetah-v5 |")]
    ours, loop = ([c.strip() for c in r.strip("|").split(" | ")] for r in rows)
    assert ours[1:] == ["seedrl SAC", "—", "measured", "150", "600", "0.25", "256", "60", "9"]
    assert loop[3:] == ["too short to measure", "—", "—", "—", "—", "—", "4"]


def test_the_sac_loops_squashed_log_probability_is_torch_distributions() -> None:
    """The peer's actor samples a tanh-squashed Gaussian scaled to the bounds; its
    log-probability is that of torch's transformed distribution at the same sample."""
    import numpy as np
    import torch
    from torch.distributions import AffineTransform, Normal, TanhTransform, TransformedDistribution

    from benchmarks.peers.sac_loop_driver import LoopSettings, _build

    low, high = np.array([-2.0, 0.0], np.float32), np.array([2.0, 3.0], np.float32)
    s = LoopSettings(hidden=8)
    actor, _, _ = _build(3, 2, low, high, s)
    obs = torch.randn(5, 3)
    torch.manual_seed(1)
    action, log_prob = actor(obs)
    mean, raw = actor.body(obs).chunk(2, dim=-1)
    log_std = s.log_std_min + 0.5 * (s.log_std_max - s.log_std_min) * (torch.tanh(raw) + 1)
    scale, bias = torch.tensor([2.0, 1.5]), torch.tensor([0.0, 1.5])
    dist = TransformedDistribution(
        Normal(mean, log_std.exp()), [TanhTransform(), AffineTransform(bias, scale)]
    )
    expected = dist.log_prob(action).sum(-1)  # small init: no sample near a bound
    assert torch.all(action >= torch.tensor(low)) and torch.all(action <= torch.tensor(high))
    assert torch.allclose(log_prob, expected, atol=1e-4)


def test_the_sac_loop_updates_once_per_step_after_it_starts_and_the_actor_on_its_cadence() -> None:
    """A short real run on Pendulum: one critic update for every step past
    ``learning_starts``, and the actor's optimizer ``policy_frequency`` steps on every
    ``policy_frequency``-th update (CleanRL's delayed policy updates)."""
    import time

    from benchmarks.peers import sac_loop_driver as loop_driver

    steps_taken: list[int] = []
    original = loop_driver.SACLoop.update

    def counted(self: loop_driver.SACLoop) -> None:
        before = float(self.pi_opt.state_dict()["state"].get(0, {}).get("step", 0))
        original(self)
        after = float(self.pi_opt.state_dict()["state"][0]["step"])  # a tensor Adam updates
        steps_taken.append(int(after - before))

    settings = loop_driver.LoopSettings(buffer_size=500, batch_size=16, learning_starts=40,
                                        hidden=16, policy_frequency=3)  # fmt: skip
    loop_driver.SACLoop.update = counted  # type: ignore[method-assign]
    try:
        out = loop_driver.run("Pendulum-v1", settings, time.monotonic(), 60.0, 0.0, 1.0, 0, "cpu")
    finally:
        loop_driver.SACLoop.update = original  # type: ignore[method-assign]
    assert out["stopped_by"] == "measured"
    assert out["updates"] == out["frames"] - 40 == len(steps_taken) > 3
    assert steps_taken == [3 if i % 3 == 0 else 0 for i in range(len(steps_taken))]
    assert out["transitions_per_update"] == 16 and out["updates_per_s"] is not None


def test_envs_picks_structured_tasks_by_short_id_and_an_unknown_one_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert {t.short_env for t in peers.suite_tasks("structured")} == {
        "lit_cell", "lit_cell_tuple", "lit_cell_masked", "combination_lock", "register"
    }  # fmt: skip
    with pytest.raises(SystemExit) as stop:
        peers.main(["run", "--suite", "structured", "--envs", "lit_cell,lit_cel"])
    assert stop.value.code == 2
    assert "--envs: no lit_cel in the structured suite" in capsys.readouterr().err
