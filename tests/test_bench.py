"""``make bench`` smoke run (schema and sane values, never speed) and its pure helpers."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from support import ROOT

from actors.roundtrip import RoundTripStats, percentiles
from benchmarks.bench.measure import GRPC_PREFIX_BYTES, wire_bytes_per_step
from benchmarks.bench.plan import MODES, Point, parse_sweep, targets_for
from benchmarks.bench.report import summarize
from seedrl import codec, envs
from seedrl.proto import seedrl_pb2 as pb


@pytest.mark.long
def test_quick_bench_writes_a_sane_bench_json(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable, "-m", "learner", "bench", "--quick", "--sweep", "2x4b8",
        "--warmup-s", "0.3", "--measure-s", "1", "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    assert report["schema"] == "seedrl-bench/1"
    assert report["settings"]["sweep"] == ["2x4b8"]
    assert report["settings"]["focus_repeats"] == 0  # --quick: no focus rounds
    assert {row["batch"] for row in report["results"]} == {8}
    assert report["machine"]["cpus"] >= 1
    assert report["machine"]["device"]["name"] in ("cpu", "cuda")
    assert report["ideal_reference"]["envs"] == 64
    assert report["ideal_reference"]["fps"] > 0
    rows = {row["mode"]: row for row in report["results"]}
    assert set(rows) == set(MODES)
    for mode, row in rows.items():
        assert "error" not in row, row
        assert row["fps"] > 0, (mode, row)
        assert row["cpu_us_per_frame"] > 0, (mode, row)
    for mode in ("echo", "inference", "system"):
        row = rows[mode]
        assert row["round_trips_per_s"] == pytest.approx(row["fps"] / 4)
        assert row["actors_connected"] == 2
        assert 0 < row["rtt_p50_ms"] <= row["rtt_p99_ms"]
        assert 0 < row["actor_rss_mb_max"] < 500
        assert 0 < row["actor_uss_mb_max"] <= row["actor_pss_mb_max"] <= row["actor_rss_mb_max"]
        assert row["learner_rss_mb"] > 0
        assert row["learner_cpu"] > 0
        roles = [row[f"{role}_cpu_us_per_frame"] for role in ("actors", "serving", "training")]
        assert sum(roles) == pytest.approx(row["cpu_us_per_frame"]), (mode, row)
        assert row["serving_cpu_us_per_frame"] + row["training_cpu_us_per_frame"] == (
            pytest.approx(row["learner_cpu_us_per_frame"])
        )
        assert row["window_s"] >= 1.0  # --measure-s; it may stretch, never shrink
        assert row["fps_cv"] >= 0
    assert rows["ideal_train"]["train_step_ms"] > 0, "the ideal with training must train"
    assert rows["ideal_train"]["training_us_per_frame"] > 0
    for mode in ("echo", "inference", "system"):
        assert rows[mode]["wire_bytes_per_step"] == wire_bytes_per_step("CartPole-v1", 4, True)
        assert rows[mode]["wire_mb_per_s"] == pytest.approx(
            rows[mode]["wire_bytes_per_step"] * rows[mode]["fps"] / 1e6
        )
    assert rows["system"]["inference_batch_mean"] >= 1
    assert rows["system"]["learner_steps_per_s"] > 0, "the system mode must train"
    assert 0 <= rows["system"]["trainer_wait_share"] <= 1.5
    assert rows["inference"]["learner_steps_per_s"] == 0
    # Only the system mode has a trainer process; its CPU is the training share.
    assert rows["system"]["training_cpu_us_per_frame"] > 0
    assert rows["echo"]["training_cpu_us_per_frame"] == 0
    assert rows["inference"]["training_cpu_us_per_frame"] == 0
    (point,) = report["points"]
    assert point["system_over_ideal"] == pytest.approx(point["system_fps"] / point["ideal_fps"])
    assert point["system_over_echo"] == pytest.approx(point["system_fps"] / point["echo_fps"])
    assert point["system_over_ideal_train"] == pytest.approx(
        point["system_fps"] / point["ideal_train_fps"]
    )
    assert point["system_cpu_efficiency"] > 0
    assert set(point["system_extra_us_per_frame"]) == {"actors", "serving", "training"}
    assert [t["name"] for t in report["targets"]] == [t.name for t in targets_for("CartPole-v1")]
    assert set(point["serving_beyond_echo_us_per_frame"]) == {"inference", "system"}
    assert point["training_us_per_frame"] == rows["ideal_train"]["training_us_per_frame"]
    assert "seedrl bench" in done.stdout


@pytest.mark.long
def test_bench_counts_serving_frontends_as_serving_not_training(tmp_path):
    """With --serving-processes the learner's children include its frontends: their CPU is
    serving's, and training keeps only the trainer's (it read both as training once). The
    inference mode has no trainer, so its training share must be nothing at all."""
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable, "-m", "learner", "bench", "--quick", "--sweep", "2x4b8",
        "--modes", "inference", "--warmup-s", "0.3", "--measure-s", "1", "--out", str(out),
        "--learner-args", "--serving-processes 1",
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    (row,) = [r for r in json.loads(out.read_text())["results"] if r["mode"] == "inference"]
    assert "error" not in row, row
    assert row["frontends"] == 1
    frontends = row["frontends_cpu_us_per_frame"]
    assert frontends > 0, row  # a frontend pays every message: never nothing
    assert row["serving_cpu_us_per_frame"] > frontends, row  # the model process's share too
    assert row["training_cpu_us_per_frame"] == 0, row
    roles = [row[f"{role}_cpu_us_per_frame"] for role in ("actors", "serving", "training")]
    assert sum(roles) == pytest.approx(row["cpu_us_per_frame"]), row


def test_parse_sweep():
    assert parse_sweep("1x1, 64X32,256x1,2x256b128") == (
        Point(1, 1),
        Point(64, 32),
        Point(256, 1),
        Point(2, 256, batch=128),
    )
    assert [p.label for p in parse_sweep("2x8,2x256b128")] == ["2x8", "2x256b128"]
    for bad in ("4", "0x1", "ax2", "4x-1", "2x8b0", "2x8b"):
        with pytest.raises(Exception, match="sweep points"):
            parse_sweep(bad)


def test_summarize_medians_ratios_and_targets():
    def row(n, k, mode, fps, repeat=0, **extra):
        return {"n": n, "k": k, "mode": mode, "fps": fps, "repeat": repeat, **extra}

    rows = [
        row(64, 1, "ideal", 1000.0),
        row(64, 1, "echo", 100.0, actor_rss_mb_max=40.0),
        row(64, 1, "system", 95.0, learner_rss_mb=363.0),
        row(64, 1, "system", 80.0, repeat=1, learner_rss_mb=363.0),
        row(64, 1, "system", 99.0, repeat=2, learner_rss_mb=363.0),
        row(1, 1, "system", 50.0, learner_rss_mb=300.0, actor_rss_mb_max=70.0),
        row(256, 1, "system", 10.0),
        row(256, 1, "echo", 0.0, error="did not connect"),
        # A throughput point with a training batch of 128 is a point of its own.
        row(1, 512, "system", 120.0, point="1x512b128", batch=128),
        row(1, 512, "system", 60.0, point="1x512"),
    ]
    points, targets = summarize(rows)
    by_point = {(p["n"], p["k"]): p for p in points if not p["batch"]}
    assert by_point[(64, 1)]["system_fps"] == 95.0  # the median of three repeats
    assert by_point[(64, 1)]["system_over_echo"] == pytest.approx(0.95)
    assert by_point[(64, 1)]["system_over_ideal"] == pytest.approx(0.095)
    assert by_point[(256, 1)]["echo_fps"] is None
    checks = {t["name"]: t for t in targets}
    assert "system_over_echo_64x1" not in checks  # retired: reported per point only
    assert checks["best_system_over_ideal"]["pass"] is False
    assert checks["actor_rss_mb_max"]["value"] == 70.0
    assert checks["actor_rss_mb_max"]["pass"] is False
    assert checks["learner_rss_mb_per_actor"]["value"] == pytest.approx(1.0)
    assert checks["learner_rss_mb_per_actor"]["pass"] is True
    assert checks["system_256x1_over_64x1"]["pass"] is False
    assert {p["point"]: p["system_fps"] for p in points if p["k"] == 512} == {
        "1x512b128": 120.0,
        "1x512": 60.0,
    }
    # With a measured one-process reference (64 envs) the best system point is judged by it.
    _, targets = summarize(rows, ideal_reference_fps=150.0)
    best = next(t for t in targets if t["name"] == "best_system_over_ideal")
    assert best["value"] == pytest.approx(120.0 / 150.0)
    assert best["point"] == "1x512b128"
    assert best["pass"] is True
    # Repeats 1 and 2 measured only 64x1: each repeat's best point, judged the same way.
    assert best["runs"] == pytest.approx([120.0 / 150.0, 80.0 / 150.0, 99.0 / 150.0])
    assert best["steady"] is True  # every repeat clears 0.5


def test_the_cost_beyond_echo_is_split_by_role():
    def row(mode, repeat, actors, serving, training):
        return {
            "n": 64, "k": 1, "mode": mode, "fps": 100.0, "repeat": repeat,
            "actors_cpu_us_per_frame": actors, "serving_cpu_us_per_frame": serving,
            "training_cpu_us_per_frame": training,
        }  # fmt: skip

    rows = [
        row("echo", 0, 35.0, 24.0, 0.0),
        row("echo", 1, 37.0, 26.0, 0.0),
        row("system", 0, 40.0, 36.0, 9.0),
        row("system", 1, 44.0, 34.0, 11.0),
        {"n": 1, "k": 1, "mode": "system", "fps": 10.0, "serving_cpu_us_per_frame": 5.0},
    ]
    points = {p["point"]: p for p in summarize(rows)[0]}
    # Medians per mode, then system minus echo.
    assert points["64x1"]["system_extra_us_per_frame"] == pytest.approx(
        {"actors": 6.0, "serving": 10.0, "training": 10.0}
    )
    assert points["1x1"]["system_extra_us_per_frame"] is None  # no echo row to compare


def test_the_learners_own_cost_per_frame_is_reported_and_judged():
    def row(point, mode, repeat=0, batch=0, **extra):
        n, k = (int(x) for x in point.split("b")[0].split("x"))
        return {"point": point, "n": n, "k": k, "batch": batch, "mode": mode, "fps": 100.0,
                "repeat": repeat, **extra}  # fmt: skip

    rows = [
        row("64x1", "echo", serving_cpu_us_per_frame=24.0),
        row("64x1", "echo", 1, serving_cpu_us_per_frame=26.0),
        row("64x1", "inference", serving_cpu_us_per_frame=29.0),
        row("64x1", "system", serving_cpu_us_per_frame=33.0),
        row("64x1", "system", 1, serving_cpu_us_per_frame=35.0),
        row("64x1", "ideal_train", training_us_per_frame=1.2, train_step_ms=1.5),
        row("4x8", "ideal_train", training_us_per_frame=1.4, train_step_ms=1.8),
        # Another batch is another training cost: not the default batch's target.
        row("1x512b128", "ideal_train", batch=128, training_us_per_frame=0.5),
    ]
    points, targets = summarize(rows, env="CartPole-v1")
    by_point = {p["point"]: p for p in points}
    # The learner process's CPU per frame minus echo's (medians: 25), per mode.
    assert by_point["64x1"]["serving_beyond_echo_us_per_frame"] == pytest.approx(
        {"inference": 4.0, "system": 9.0}
    )
    assert by_point["4x8"]["serving_beyond_echo_us_per_frame"] is None  # no echo there
    assert by_point["64x1"]["training_us_per_frame"] == 1.2
    assert by_point["64x1"]["train_step_ms"] == 1.5
    checks = {t["name"]: t for t in targets}
    assert checks["serving_us_per_frame_64x1"]["value"] == pytest.approx(9.0)
    assert checks["serving_us_per_frame_64x1"]["pass"] is False  # wanted <= 5
    assert checks["training_us_per_frame"]["value"] == pytest.approx(1.3)  # 1.2 and 1.4
    assert checks["training_us_per_frame"]["pass"] is True  # wanted <= 1.5
    assert "system_over_ideal_train" not in checks  # an Atari target


def test_atari_benches_are_judged_against_the_ideal_with_training():
    def row(point, mode, fps):
        n, k = (int(x) for x in point.split("x"))
        return {"point": point, "n": n, "k": k, "mode": mode, "fps": fps}

    rows = [
        row("1x16", "system", 500.0),
        row("1x16", "ideal_train", 520.0),
        row("2x16", "system", 600.0),
        row("2x16", "ideal_train", 700.0),
    ]
    _, targets = summarize(rows, env="ALE/Pong-v5")
    checks = {t["name"]: t for t in targets}
    assert set(checks) == {t.name for t in targets_for("ALE/Pong-v5")}
    assert "training_us_per_frame" not in checks  # CartPole's MLP budget
    atari = checks["system_over_ideal_train"]
    assert atari["point"] == "2x16"  # the best system point, against its own ideal
    assert atari["value"] == pytest.approx(600.0 / 700.0)
    assert atari["pass"] is False


def test_targets_carry_each_repeats_value_and_whether_they_agree():
    def row(n, k, mode, fps, repeat, **extra):
        return {"n": n, "k": k, "mode": mode, "fps": fps, "repeat": repeat, **extra}

    rows = [
        row(64, 1, "echo", 100.0, 0, actor_rss_mb_max=50.0),
        row(64, 1, "system", 95.0, 0),
        row(256, 1, "system", 90.0, 0),
        row(64, 1, "echo", 100.0, 1, actor_rss_mb_max=51.0),
        row(64, 1, "system", 150.0, 1),  # the fast regime: 256/64 falls to 0.6
        row(256, 1, "system", 90.0, 1),
        row(64, 1, "echo", 100.0, 2, actor_rss_mb_max=52.0),
        row(64, 1, "system", 96.0, 2),
        row(256, 1, "system", 91.0, 2),
    ]
    _, targets = summarize(rows, None, [None, None, None])
    checks = {t["name"]: t for t in targets}
    collapse = checks["system_256x1_over_64x1"]
    assert collapse["value"] == pytest.approx(90.0 / 96.0)  # medians: 90 / 96
    assert collapse["runs"] == pytest.approx([90 / 95, 0.6, 91 / 96])
    assert collapse["pass"] is True and collapse["steady"] is False
    rss = checks["actor_rss_mb_max"]
    assert rss["runs"] == [50.0, 51.0, 52.0] and rss["steady"] is True
    assert "runs" not in checks["learner_rss_mb_per_actor"]  # no 1x1 point at all


def test_round_trip_stats_flush_one_line_per_stream(tmp_path):
    stats = RoundTripStats(capacity=8, directory=str(tmp_path))
    stats.flush("a-0", 4)  # nothing recorded: nothing written
    assert not list(tmp_path.iterdir())
    for ms in range(1, 21):  # more than the ring holds: the recent 8 remain
        stats.record(ms / 1e3)
    stats.flush("a-0", 4)
    stats.record(0.005)
    stats.flush("a-0", 4)
    lines = [json.loads(x) for x in stats.path.read_text().splitlines()]
    assert [x["round_trips"] for x in lines] == [20, 1]
    assert lines[0]["frames"] == 80
    assert lines[0]["rtt_p50_ms"] == pytest.approx(16.5)
    assert lines[0]["rtt_p50_ms"] <= lines[0]["rtt_p99_ms"] <= 20.0
    assert lines[1]["rtt_p50_ms"] == pytest.approx(5.0)
    with pytest.raises(ValueError):
        RoundTripStats(capacity=6)


@pytest.mark.parametrize("n", [1, 2, 7, 100])
def test_percentiles_match_numpy(n):
    values = np.random.default_rng(n).exponential(size=n)
    qs = (0, 50, 99, 100)
    assert percentiles(values, qs) == pytest.approx(np.percentile(values, qs))


def test_flushing_round_trip_stats_imports_no_numpy_ma(tmp_path):
    """An actor flushes at every reconnect; numpy.ma would add ~1 MB to its RSS."""
    code = (
        "import sys; from actors.roundtrip import RoundTripStats\n"
        f"s = RoundTripStats(directory={str(tmp_path)!r})\n"
        "s.record(0.001); s.record(0.002); s.flush('a', 1)\n"
        "assert 'numpy.ma' not in sys.modules, 'numpy.ma imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    assert (tmp_path / next(tmp_path.iterdir()).name).read_text().count("rtt_p50_ms") == 1


def test_focus_rounds_add_to_the_medians_and_judge_what_they_measured():
    def row(n, k, mode, fps, repeat, **extra):
        return {"n": n, "k": k, "mode": mode, "fps": fps, "repeat": repeat, **extra}

    best = {"point": "1x512b128", "batch": 128}
    rows = [
        row(64, 1, "ideal", 1000.0, 0),
        row(64, 1, "echo", 100.0, 0, actor_rss_mb_max=47.0),
        row(64, 1, "system", 70.0, 0),
        row(256, 1, "system", 50.0, 0),
        row(1, 512, "system", 600.0, 0, **best),
        # Focus rounds, each a repeat of its own: the best point beside a fresh ideal
        # (round 1 only), then 64x1 and 256x1, echo and system.
        row(1, 512, "system", 480.0, 1, focus=True, **best),
        row(64, 1, "echo", 100.0, 1, focus=True, actor_rss_mb_max=48.0),
        row(64, 1, "system", 95.0, 1, focus=True),
        row(256, 1, "system", 80.0, 1, focus=True),
        row(64, 1, "echo", 100.0, 2, focus=True),
        row(64, 1, "system", 92.0, 2, focus=True),
        row(256, 1, "system", 76.0, 2, focus=True),
    ]
    points, targets = summarize(rows, 1100.0, [1200.0, 1000.0, None])
    by_point = {p["point"]: p for p in points}
    assert by_point["64x1"]["system_fps"] == 92.0  # the median of 70, 95 and 92
    assert by_point["256x1"]["system_fps"] == 76.0
    assert by_point["1x512b128"]["system_fps"] == 540.0
    checks = {t["name"]: t for t in targets}
    collapse = checks["system_256x1_over_64x1"]
    assert collapse["value"] == pytest.approx(76 / 92)
    assert collapse["runs"] == pytest.approx([50 / 70, 80 / 95, 76 / 92])
    assert collapse["pass"] is True and collapse["steady"] is False
    assert by_point["64x1"]["system_over_echo"] == pytest.approx(0.92)
    # Round 1 re-measured the best point beside its own ideal; round 2 did not, and its
    # fastest point (64x1) must not stand in for the best configuration.
    best_check = checks["best_system_over_ideal"]
    assert best_check["point"] == "1x512b128"
    assert best_check["value"] == pytest.approx(540.0 / 1100.0)
    assert best_check["runs"] == pytest.approx([600.0 / 1200.0, 480.0 / 1000.0])
    # Other targets count every measurement, but only the sweep's repeats judge them.
    assert checks["actor_rss_mb_max"]["value"] == 48.0
    assert checks["actor_rss_mb_max"]["runs"] == [47.0]


def test_a_focus_round_remeasures_the_best_point_and_the_ratio_points():
    from benchmarks.bench.plan import DEFAULT_SWEEP, focus_plan
    from benchmarks.bench.report import sweep_best_point

    both = ("echo", "system")
    best = Point(1, 512, 128)
    assert focus_plan(DEFAULT_SWEEP, MODES, best) == [
        (best, ("system",)),
        (Point(64, 1), both),
        (Point(256, 1), both),
    ]
    assert focus_plan((Point(64, 1), Point(4, 8)), ("system",), Point(64, 1)) == [
        (Point(64, 1), ("system",))  # the best point is a focus point: measured once
    ]
    assert focus_plan((Point(4, 8),), ("echo",), Point(4, 8)) == []
    assert focus_plan(DEFAULT_SWEEP, ("ideal", "inference"), best) == []
    assert focus_plan(DEFAULT_SWEEP, ("echo",), None) == [
        (Point(64, 1), ("echo",)),
        (Point(256, 1), ("echo",)),
    ]

    def row(point, n, k, batch, fps):
        return {"point": point, "n": n, "k": k, "batch": batch, "mode": "system", "fps": fps}

    rows = [row("64x1", 64, 1, 0, 10.0), row("1x512b128", 1, 512, 128, 600.0)]
    rows.append({**row("2x256b128", 2, 256, 128, 0.0), "error": "did not connect"})
    assert sweep_best_point(rows) == best
    assert sweep_best_point([]) is None


def test_a_point_with_a_training_batch_starts_the_learner_with_it(tmp_path):
    from benchmarks.bench.measure import Settings, server_command

    settings = Settings(
        env="CartPole-v1", warmup_s=1, measure_s=1, connect_timeout_s=1, transport="tcp",
        learner_args=("--seed", "3"), actor_args=(), torch_threads=1, workdir=tmp_path,
    )  # fmt: skip
    command = server_command("system", "127.0.0.1", 1234, tmp_path, settings, batch=128)
    assert command[command.index("--batch-size") + 1] == "128"
    assert command[-2:] == ["--seed", "3"]  # the user's learner flags still win
    assert "--batch-size" not in server_command("system", "127.0.0.1", 1234, tmp_path, settings)
    assert "--batch-size" not in server_command("echo", "127.0.0.1", 1234, tmp_path, settings, 128)


def test_preset_and_device_reach_the_learner_and_the_ideal(tmp_path):
    from benchmarks.bench.measure import Settings, measure_ideal, server_command

    settings = Settings(
        env="ALE/Pong-v5", warmup_s=0.2, measure_s=0.5, connect_timeout_s=1, transport="tcp",
        learner_args=(), actor_args=(), torch_threads=1, workdir=tmp_path,
        preset="atari", device="cpu",
    )  # fmt: skip
    command = server_command("system", "127.0.0.1", 1234, tmp_path, settings)
    assert command[command.index("--preset") + 1] == "atari"
    assert command[command.index("--device") + 1] == "cpu"
    assert "--preset" not in server_command("echo", "127.0.0.1", 1234, tmp_path, settings)
    # The ideal steps Pong with the preset's CNN on the asked device.
    assert measure_ideal(2, settings)["fps"] > 0


def test_the_default_sweep_measures_every_target():
    """A plain `make bench` must be able to judge each target, not print n/a."""
    from benchmarks.bench.plan import DEFAULT_SWEEP, IDEAL_REFERENCE_ENVS

    labels = {p.label for p in DEFAULT_SWEEP}
    assert {"1x1", "64x1", "256x1"} <= labels  # RSS per actor, system/echo, no collapse
    assert any(p.n * p.k == IDEAL_REFERENCE_ENVS for p in DEFAULT_SWEEP)
    for n in (1, 4, 16, 64):  # the minimum sweep
        for k in (1, 8, 32):
            assert f"{n}x{k}" in labels


@pytest.mark.parametrize(
    ("env", "frame_once", "sent_shape"),
    [
        ("CartPole-v1", True, (4,)),
        ("ALE/Pong-v5", True, (84, 84)),
        ("ALE/Pong-v5", False, (4, 84, 84)),
    ],
)
def test_wire_bytes_per_step_are_the_messages_sizes(env, frame_once, sent_shape):
    """What a stream sends and receives per round trip, built here without the templates."""
    if needed := envs.family_of(env).requires:
        pytest.importorskip(needed)
    k = 3
    spec = envs.describe_env(env)
    obs = np.zeros((k, *sent_shape), np.dtype(spec.observation_space.dtype))
    frame = pb.ActorMessage(
        frame=pb.Frame(
            observations=codec.encode_tensor(obs),
            rewards=codec.encode_tensor(np.zeros(k, np.float32)),
            terminated=codec.encode_tensor(np.zeros(k, np.bool_)),
            truncated=codec.encode_tensor(np.zeros(k, np.bool_)),
        )
    )
    reply = pb.LearnerMessage(
        actions=pb.Actions(actions=codec.encode_tensor(np.zeros(k, np.int64)))
    )
    expected = (frame.ByteSize() + reply.ByteSize() + 2 * GRPC_PREFIX_BYTES) / k
    assert wire_bytes_per_step(env, k, frame_once) == expected
