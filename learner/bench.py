"""``make bench``: the system measured against its own limits, side by side.

For every point of a sweep of N actor processes x K envs per actor, four modes run back
to back (so their ratios hold on a noisy, shared machine):

- ``ideal``: the same N*K envs and the same model stepped in ONE process, no network
  (vector env step -> batched forward -> sample), the limit of the machine;
- ``echo``: the real actor processes against ``learner.echo`` (answers without a
  model), the transport limit of the topology;
- ``inference``: the real learner with ``--no-train``;
- ``system``: the real learner, training.

The N actor processes are started once per point, by one ``python -m actors`` launcher
(so they are forked or exec'd as a user's would be), and stay up while the servers behind
the address change (they reconnect with a short backoff), so all three networked modes
measure the very same actors. Throughput, batch sizes, waits and learner RSS come from
the server's ``metrics.jsonl`` over a measuring window that starts after a warm-up once
all N actors are connected; step latency comes from the actors themselves
(``$SEEDRL_ACTOR_STATS_DIR``, see :mod:`actors.latency`); CPU and actor RSS from
``/proc``. After the sweep, focus rounds (:func:`focus_plan`) measure again what the
targets read, each pair back to back: the best point beside a fresh one-process ideal,
and 64x1 and 256x1 against echo. The table is printed and everything is written to
``bench.json``, with pass/fail columns against the speed targets (targets live here,
never in tests).

``python -m learner.bench ideal --envs E --seconds S`` is the ideal worker (JSON on stdout).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from seedrl.config import PIN_CPUS_MODES, ActorConfig
from seedrl.timing import process_rss_mb

SCHEMA = "seedrl-bench/1"
MODES = ("ideal", "echo", "inference", "system")


@dataclass(frozen=True, order=True)
class Point:
    """One sweep point: N actor processes x K envs each; ``batch`` unrolls per training
    step when set (``NxKbB``), else the learner's default."""

    n: int
    k: int
    batch: int = 0

    @property
    def label(self) -> str:
        return f"{self.n}x{self.k}" + (f"b{self.batch}" if self.batch else "")


DEFAULT_SWEEP = (
    *(Point(n, k) for n in (1, 4, 16, 64) for k in (1, 8, 32)),
    Point(256, 1),  # no collapse from 64 to 256 single-env actors (a target)
    # Throughput points: few actors with many envs each, and a training batch of 128
    # unrolls (the default 16 is tuned for sample efficiency; per step the trainer's
    # cost is mostly fixed, so 128 trains ~2.5x more frames per CPU second).
    Point(2, 256, 128),
    Point(1, 512, 128),
)
IDEAL_REFERENCE_ENVS = 64
"""The machine's limit the best-configuration target compares against: ONE process
stepping a 64-env vector env with the learner's batched forward pass and sampling
(``seedrl.policy.inference_policy``, default backend). The issue measured ~63 k
frames/s with torch; since inference runs the MLP in numpy, so does the ideal, and on
this VM it went from ~315 k to ~870 k frames/s, bound by the env's own step.
Per point, system/ideal compares with the same N*K envs instead; with hundreds of envs
in one numpy-vectorised CartPole the in-process ideal runs away (~500 k frames/s), a
bound no multi-process system approaches, so it is reported but not the target."""
FOCUS_POINTS = (Point(64, 1), Point(256, 1))
"""The points the two ratio targets read. Windows swing with the machine's phases (64 x
K=1 echo: 12k and 24k frames/s within minutes on 2026-11-25, same build), so
``--focus-repeats`` rounds measure their echo and system modes again after the sweep,
each pair back to back, and the sweep's best point beside a fresh one-process ideal."""
FOCUS_MODES = ("echo", "system")
DEFAULT_FOCUS_REPEATS = 2
FOCUS_TARGETS = frozenset({"system_over_echo_64x1", "system_256x1_over_64x1"})
"""The targets every focus round judges; it judges the best configuration too when it
re-measured the sweep's best point (the others need the whole sweep)."""
QUICK_SWEEP = (Point(1, 4), Point(2, 8))
"""--quick: two small points with short windows (``make bench-quick``, the CI smoke run)."""
CLK_TCK = os.sysconf("SC_CLK_TCK")
MIN_ROUND_TRIPS = 100
"""A measuring window lasts --measure-s, and longer until the average stream has made this
many round trips: 3 s of 256 single-env actors is ~20 round trips each, too few to
average out who the two cores happened to run (windows moved ±25 % on 2026-11-24)."""
MAX_STRETCH = 4
"""...but never more than this many times --measure-s."""


@dataclass(frozen=True)
class Target:
    """One speed/memory target from the performance issue, checked on the results."""

    name: str
    description: str
    threshold: float
    higher_is_better: bool = True


BEST_TARGET = "best_system_over_ideal"
TARGETS = (
    Target(
        BEST_TARGET,
        f"best system fps / ideal fps with {IDEAL_REFERENCE_ENVS} envs (training on)",
        0.5,
    ),
    Target("system_over_echo_64x1", "64 single-env actors: system fps / echo fps", 0.9),
    Target("actor_rss_mb_max", "largest actor RSS (MB)", 60.0, higher_is_better=False),
    Target(
        "learner_rss_mb_per_actor",
        "learner RSS growth per connected actor, 64x1 vs 1x1, system (MB)",
        1.0,
        higher_is_better=False,
    ),
    Target("system_256x1_over_64x1", "system fps at 256x1 / at 64x1 (no collapse)", 0.8),
)


# ---------------------------------------------------------------------- ideal worker


def run_ideal(env_id: str, num_envs: int, seconds: float, warmup_s: float, threads: int) -> dict:
    """Step ``num_envs`` envs with the learner's model in this process; frames/s after warm-up."""
    import numpy as np
    import torch

    from learner.allocator import keep_freed_memory
    from seedrl import envs
    from seedrl.config import LearnerConfig
    from seedrl.models import action_head, build_model
    from seedrl.policy import inference_policy, set_compute_threads

    keep_freed_memory()
    set_compute_threads(threads)
    cfg = LearnerConfig()
    spec = envs.describe_env(env_id)
    head = action_head(spec.action_space)
    model = build_model(spec.observation_space, head, cfg.model, cfg.hidden_sizes, 0)
    policy = inference_policy(model, head, torch.device("cpu"), cfg.inference_backend, cfg.seed)
    vec = envs.make_vector_env(env_id, {}, num_envs)
    obs_dtype = np.dtype(spec.observation_space.dtype)
    obs_KO, _ = vec.reset(seed=0)
    first_K = np.ones(num_envs, dtype=np.bool_)
    frames, t0 = 0, time.perf_counter()
    measured_from, measured_frames, cpu_from = None, 0, 0.0
    while True:
        now = time.perf_counter()
        if measured_from is None and now - t0 >= warmup_s:
            measured_from, measured_frames, cpu_from = now, frames, time.process_time()
        if now - t0 >= warmup_s + seconds:
            break
        action_K, _, _ = policy(np.asarray(obs_KO, dtype=obs_dtype), first_K, ())
        obs_KO, *_ = vec.step(action_K)
        frames += num_envs
    wall = time.perf_counter() - (measured_from or t0)
    cpu = time.process_time() - cpu_from
    vec.close()
    measured = max(frames - measured_frames, 1)
    return {
        "fps": measured / max(wall, 1e-9),
        "seconds": wall,
        "cpu_us_per_frame": cpu / measured * 1e6,
    }


# ---------------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of a live process and its live children (the learner's trainer process)."""
    return sum(split_cpu_seconds(pid))


def split_cpu_seconds(pid: int) -> tuple[float, float]:
    """(the process's own, its live children's) CPU seconds: for the learner, serving and
    training (the trainer process is its child)."""
    return cpu_seconds(pid), sum(cpu_seconds(child) for child in child_pids(pid))


def child_pids(pid: int) -> list[int]:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    children: list[int] = []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                children.extend(int(c) for c in f.read().split())
        except OSError:
            continue
    return children


def shared_aware_mb(pid: int) -> tuple[float, float] | None:
    """(USS, PSS) in MB: the memory only this process holds, and its proportional share.

    RSS counts every shared-library page a process maps in full, and how many the kernel
    maps depends on the page cache; USS leaves shared pages out, PSS divides each page by
    the processes mapping it, so N actors on one host cost the sum of their PSS.
    """
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return None
    kb = sum(int(fields[k].split()[0]) for k in ("Private_Clean", "Private_Dirty") if k in fields)
    pss_kb = int(fields["Pss"].split()[0]) if "Pss" in fields else kb
    return kb / 1024, pss_kb / 1024


def stop_process(proc: subprocess.Popen[Any], grace: float = 10.0) -> None:
    """SIGTERM, a bounded wait, then SIGKILL."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


class ActorFleet:
    """N actors started as ``python -m actors`` starts them (one launcher, the same flags),
    outliving the servers of a point."""

    def __init__(
        self,
        address: str,
        n: int,
        k: int,
        groups: int,
        stats_dir: Path,
        extra: Sequence[str],
        pin_cpus: str,
    ) -> None:
        self.groups = groups
        self.stats_dir = stats_dir
        stats_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "SEEDRL_ACTOR_STATS_DIR": str(stats_dir)}
        self.launcher = subprocess.Popen(
            self.command(address, n, k, groups, pin_cpus, extra),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    @staticmethod
    def command(
        address: str, n: int, k: int, groups: int, pin_cpus: str, extra: Sequence[str]
    ) -> list[str]:
        return [
            sys.executable, "-m", "actors", "--learner", address, "--num-actors", str(n),
            "--envs-per-actor", str(k), "--first-index", "0", "--env-groups", str(groups),
            "--max-backoff-s", "0.3", "--pin-cpus", pin_cpus, *extra,
        ]  # fmt: skip

    def actor_pids(self) -> list[int]:
        """The live actor processes (the launcher's children)."""
        return child_pids(self.launcher.pid)

    def cpu_seconds(self) -> float:
        """CPU of the live actors and of the launcher (which sleeps between polls)."""
        return tree_cpu_seconds(self.launcher.pid)

    def rss_mb(self) -> list[float]:
        return [rss for rss in map(process_rss_mb, self.actor_pids()) if rss > 0]

    def shared_aware_mb(self) -> list[tuple[float, float]]:
        """(USS, PSS) of every live actor."""
        found = (shared_aware_mb(pid) for pid in self.actor_pids())
        return [x for x in found if x is not None]

    def stream_records(self) -> list[dict[str, Any]]:
        """Every per-stream record the actors have flushed so far."""
        records = []
        for path in sorted(self.stats_dir.glob("actor-*.jsonl")):
            records += [json.loads(line) for line in path.read_text().splitlines() if line]
        return records

    def stop(self) -> None:
        """The launcher stops its actors (SIGTERM, then SIGKILL after its grace period)."""
        stop_process(self.launcher, grace=15.0)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            records.append(json.loads(line))
    return records


def wait_for(predicate: Any, timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


# ---------------------------------------------------------------------- one measurement


@dataclass
class Settings:
    env: str
    warmup_s: float
    measure_s: float
    connect_timeout_s: float
    transport: str
    learner_args: tuple[str, ...]
    actor_args: tuple[str, ...]
    torch_threads: int
    workdir: Path
    env_groups: int = 1
    pin_cpus: str = ActorConfig.pin_cpus


def server_command(
    mode: str, address_bind: str, port: int, logdir: Path, s: Settings, batch: int = 0
) -> list:
    # --transport tcp: loopback TCP only; auto leaves the same-host unix socket on (default).
    tcp_only = ["--no-local-socket"] if s.transport == "tcp" else []
    if mode == "echo":
        return [
            sys.executable, "-m", "learner.echo", "--env", s.env, "--bind", address_bind,
            "--port", str(port), "--logdir", str(logdir), "--log-interval-s", "0.5",
            *tcp_only,
        ]  # fmt: skip
    return [
        sys.executable, "-m", "learner", "--env", s.env, "--bind", address_bind,
        "--port", str(port), "--logdir", str(logdir), "--log-interval-s", "0.5",
        "--progress", "off", "--no-tensorboard", "--checkpoint-interval-s", "1e9",
        "--torch-threads", str(s.torch_threads),
        *(["--no-train"] if mode == "inference" else []),
        *(["--batch-size", str(batch)] if batch else []), *tcp_only, *s.learner_args,
    ]  # fmt: skip


def measure_server(mode: str, point: Point, fleet: ActorFleet, bind: str, port: int,
                   s: Settings) -> dict[str, Any]:  # fmt: skip
    """Run one server mode behind the fleet's address; return its row of numbers."""
    n, k = point.n, point.k
    logdir = s.workdir / f"{point.label}-{mode}-{time.monotonic_ns()}"
    streams_before = len(fleet.stream_records())
    log_path = logdir.with_suffix(".log")
    logdir.mkdir(parents=True)
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            server_command(mode, bind, port, logdir, s, point.batch),
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
        try:
            metrics = logdir / "metrics.jsonl"

            def steady() -> bool:
                """Every stream is in and, when training, the trainer (process) has stepped."""
                records = read_metrics(metrics)
                streams = n * fleet.groups
                if not records or records[-1].get("actors_connected", 0) < streams:
                    return False
                return mode != "system" or records[-1].get("learner_steps", 0) > 0

            if not wait_for(steady, s.connect_timeout_s):
                tail = log_path.read_text(errors="replace")[-400:]
                raise RuntimeError(
                    f"{mode}: not steady in time ({n} actors connected, trainer stepping); "
                    f"server said {tail}"
                )
            time.sleep(s.warmup_s)
            t0, cpu0, acpu0 = time.time(), split_cpu_seconds(proc.pid), fleet.cpu_seconds()
            frames0 = _last_frames(metrics)
            time.sleep(s.measure_s)
            # Many slow streams: stretch the window until the average stream has made
            # MIN_ROUND_TRIPS round trips (256 x K=1 makes ~6/s each on 2 cores).
            wanted = frames0 + MIN_ROUND_TRIPS * n * k * fleet.groups
            wait_for(lambda: _last_frames(metrics) >= wanted, s.measure_s * (MAX_STRETCH - 1), 0.25)
            t1, cpu1, acpu1 = time.time(), split_cpu_seconds(proc.pid), fleet.cpu_seconds()
            actor_rss, actor_uss_pss = fleet.rss_mb(), fleet.shared_aware_mb()
            time.sleep(0.6)  # one more metrics record covering the window's end
        finally:
            stop_process(proc)
    window = [r for r in read_metrics(metrics) if t0 <= r["time"] <= t1 + 0.55]
    if len(window) < 2:
        raise RuntimeError(f"{mode}: only {len(window)} metrics records in the window")
    first, last = window[0], window[-1]
    dt = last["elapsed_s"] - first["elapsed_s"]
    fps = (last["frames"] - first["frames"]) / max(dt, 1e-9)
    inner = window[1:]
    wall = t1 - t0
    serving_cpu = (cpu1[0] - cpu0[0]) / wall
    training_cpu = (cpu1[1] - cpu0[1]) / wall
    learner_cpu = serving_cpu + training_cpu
    actors_cpu = (acpu1 - acpu0) / wall
    per_frame = 1e6 / max(fps, 1e-9)
    row: dict[str, Any] = {
        "fps": fps,
        "round_trips_per_s": fps / k,
        "inference_batch_mean": _mean(inner, "inference_batch_mean"),
        "learner_cpu": learner_cpu,
        "actors_cpu": actors_cpu,
        "learner_cpu_share": learner_cpu / max(learner_cpu + actors_cpu, 1e-9),
        # CPU seconds per frame hold up under a loaded machine far better than frames/s.
        "cpu_us_per_frame": (learner_cpu + actors_cpu) * per_frame,
        "learner_cpu_us_per_frame": learner_cpu * per_frame,
        # Where the machine's CPU per frame goes: the three roles, summing to the above.
        "actors_cpu_us_per_frame": actors_cpu * per_frame,
        "serving_cpu_us_per_frame": serving_cpu * per_frame,
        "training_cpu_us_per_frame": training_cpu * per_frame,
        "learner_rss_mb": last.get("learner_rss_mb"),
        "actor_processes": len(actor_rss),
        "actor_rss_mb_max": max(actor_rss) if actor_rss else None,
        "actor_rss_mb_mean": statistics.fmean(actor_rss) if actor_rss else None,
        "actor_uss_mb_max": max(u for u, _ in actor_uss_pss) if actor_uss_pss else None,
        "actor_pss_mb_max": max(p for _, p in actor_uss_pss) if actor_uss_pss else None,
        "learner_steps_per_s": _mean(inner, "learner_steps_per_s"),
        "trainer_wait_share": _mean(inner, "trainer_wait_share"),
        "inference_wait_share": _mean(inner, "inference_wait_share"),
        "actors_connected": last.get("actors_connected"),
    }
    slices = [
        (b["frames"] - a["frames"]) / max(b["elapsed_s"] - a["elapsed_s"], 1e-9)
        for a, b in itertools.pairwise(window)
    ]
    row["window_s"] = wall
    if len(slices) >= 2 and statistics.fmean(slices) > 0:
        row["fps_cv"] = statistics.stdev(slices) / statistics.fmean(slices)
    # The actors flush one record per stream when the server goes away.
    wait_for(lambda: len(fleet.stream_records()) >= streams_before + n * fleet.groups, 10.0)
    streams = fleet.stream_records()[streams_before:]
    if streams:
        row["rtt_p50_ms"] = statistics.median(r["rtt_p50_ms"] for r in streams)
        row["rtt_p99_ms"] = max(r["rtt_p99_ms"] for r in streams)
    shutil.rmtree(logdir, ignore_errors=True)
    return row


def _last_frames(metrics: Path) -> int:
    records = read_metrics(metrics)
    return int(records[-1]["frames"]) if records else 0


def _mean(records: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in records if r.get(key) is not None]
    return statistics.fmean(values) if values else None


def measure_ideal(num_envs: int, s: Settings) -> dict[str, Any]:
    cmd = [
        sys.executable, "-m", "learner.bench", "ideal", "--env", s.env, "--envs", str(num_envs),
        "--seconds", str(s.measure_s), "--warmup-s", str(min(s.warmup_s, 1.0)),
        "--torch-threads", str(s.torch_threads),
    ]  # fmt: skip
    timeout = 60 + 2 * (s.warmup_s + s.measure_s)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return {
        "fps": result["fps"],
        "round_trips_per_s": None,
        "cpu_us_per_frame": result["cpu_us_per_frame"],
    }


@contextlib.contextmanager
def point_address(transport: str, workdir: Path) -> Iterator[tuple[str, str, int]]:
    """(actor address, server --bind, server --port) for one sweep point."""
    if transport == "unix":
        path = workdir / f"s{time.monotonic_ns() % 10**9}.sock"
        yield f"unix:{path}", f"unix:{path}", 0
        with contextlib.suppress(OSError):
            path.unlink()
    else:
        port = free_port()
        yield f"127.0.0.1:{port}", "127.0.0.1", port


def run_point(point: Point, modes: Sequence[str], repeat: int, s: Settings, log: Any):
    """Every mode of one N x K point, back to back; yields result rows."""
    n, k = point.n, point.k
    base = {"point": point.label, "n": n, "k": k, "batch": point.batch, "repeat": repeat}
    if "ideal" in modes:
        try:
            row = measure_ideal(n * k, s)
        except (subprocess.SubprocessError, ValueError, IndexError) as exc:
            row = {"error": f"ideal failed: {exc}"}
        log(point, "ideal", row)
        yield {**base, "mode": "ideal", **row}
    networked = [m for m in modes if m != "ideal"]
    if not networked:
        return
    with point_address(s.transport, s.workdir) as (address, bind, port):
        groups = s.env_groups if k % s.env_groups == 0 else 1
        stats_dir = s.workdir / f"actors-{point.label}-{repeat}"
        fleet = ActorFleet(address, n, k, groups, stats_dir, s.actor_args, s.pin_cpus)
        try:
            for mode in networked:
                try:
                    row = measure_server(mode, point, fleet, bind, port, s)
                except (RuntimeError, OSError, KeyError) as exc:
                    row = {"error": str(exc)}
                log(point, mode, row)
                yield {**base, "mode": mode, **row}
        finally:
            fleet.stop()


# ---------------------------------------------------------------------- summary


def summarize(
    rows: list[dict[str, Any]],
    ideal_reference_fps: float | None = None,
    reference_runs: Sequence[float | None] = (),
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per-point medians over repeats (with the ratios) and the target checks.

    ``ideal_reference_fps`` is the one-process limit with IDEAL_REFERENCE_ENVS envs; when
    absent, the ideal of a sweep point with that many envs stands in for it. With two or
    more repeats each target also carries its value in every repeat (``runs``, judged
    with that repeat's reference from ``reference_runs``) and whether they all agree
    with the verdict (``steady``): one short window at 64 x K=1 can swing by a third.
    Rows marked ``focus`` (the extra rounds, :func:`focus_plan`) add to their points'
    medians; a focus round judges :data:`FOCUS_TARGETS`, and the best configuration
    only when its own best point is the sweep's.
    """
    table, targets = _summarize_once(rows, ideal_reference_fps)
    repeats = sorted({int(r.get("repeat", 0)) for r in rows})
    if len(repeats) < 2:
        return table, targets
    in_focus = {int(r.get("repeat", 0)) for r in rows if r.get("focus")}
    best_point = next((t.get("point") for t in targets if t["name"] == BEST_TARGET), None)
    per_repeat = []
    for repeat in repeats:
        reference = reference_runs[repeat] if repeat < len(reference_runs) else None
        reference = reference if reference is not None else ideal_reference_fps
        subset = [r for r in rows if int(r.get("repeat", 0)) == repeat]
        checks = _summarize_once(subset, reference)[1]
        values = {t["name"]: t["value"] for t in checks}
        if repeat in in_focus:
            in_round = set(FOCUS_TARGETS)
            if any(t["name"] == BEST_TARGET and t.get("point") == best_point for t in checks):
                in_round.add(BEST_TARGET)
            values = {name: v for name, v in values.items() if name in in_round}
        per_repeat.append(values)
    for target in targets:
        runs = [values[target["name"]] for values in per_repeat if target["name"] in values]
        if all(v is None for v in runs):
            continue
        target["runs"] = runs
        threshold, higher = target["target"], target["comparison"] == ">="
        judged = [(v >= threshold if higher else v <= threshold) for v in runs if v is not None]
        target["steady"] = (
            all(j == target["pass"] for j in judged) if judged and target["pass"] is not None
            else None
        )  # fmt: skip
    return table, targets


def _summarize_once(
    rows: list[dict[str, Any]], ideal_reference_fps: float | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    points: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row.get("error") or row.get("fps") is None:
            continue
        label = _label(row)
        point = points.setdefault(
            label, {"point": label, "n": row["n"], "k": row["k"], "batch": row.get("batch", 0)}
        )
        point.setdefault(f"{row['mode']}_fps_runs", []).append(row["fps"])
    for point in points.values():
        for mode in MODES:
            runs = point.pop(f"{mode}_fps_runs", None)
            point[f"{mode}_fps"] = statistics.median(runs) if runs else None
        point["system_over_ideal"] = _ratio(point["system_fps"], point["ideal_fps"])
        point["system_over_echo"] = _ratio(point["system_fps"], point["echo_fps"])
        point["inference_over_echo"] = _ratio(point["inference_fps"], point["echo_fps"])
        # Load-robust companion of system/ideal: ideal CPU per frame / system CPU per frame.
        point["system_cpu_efficiency"] = _ratio(
            _median_field(rows, point["point"], "ideal", "cpu_us_per_frame"),
            _median_field(rows, point["point"], "system", "cpu_us_per_frame"),
        )
        point["system_extra_us_per_frame"] = _extra_cost(rows, point["point"])
    table = sorted(points.values(), key=lambda p: (p["batch"], p["n"], p["k"]))

    def fps(label: str, mode: str) -> float | None:
        return points.get(label, {}).get(f"{mode}_fps")

    system = [(p["system_fps"], p["point"]) for p in table if p["system_fps"]]
    best_fps, best_point = max(system, default=(None, None))
    if ideal_reference_fps is None:
        same_envs = [p["ideal_fps"] for p in table if p["n"] * p["k"] == IDEAL_REFERENCE_ENVS]
        ideal_reference_fps = max((x for x in same_envs if x), default=None)
    actor_rss = [r["actor_rss_mb_max"] for r in rows if r.get("actor_rss_mb_max")]
    rss_64 = _median_field(rows, "64x1", "system", "learner_rss_mb")
    rss_1 = _median_field(rows, "1x1", "system", "learner_rss_mb")
    values = {
        BEST_TARGET: _ratio(best_fps, ideal_reference_fps),
        "system_over_echo_64x1": _ratio(fps("64x1", "system"), fps("64x1", "echo")),
        "actor_rss_mb_max": max(actor_rss, default=None),
        "learner_rss_mb_per_actor": (
            (rss_64 - rss_1) / 63 if rss_64 is not None and rss_1 is not None else None
        ),
        "system_256x1_over_64x1": _ratio(fps("256x1", "system"), fps("64x1", "system")),
    }
    where = {BEST_TARGET: best_point}
    targets = []
    for t in TARGETS:
        value = values[t.name]
        passed = None
        if value is not None:
            passed = value >= t.threshold if t.higher_is_better else value <= t.threshold
        targets.append(
            {
                "name": t.name,
                "description": t.description,
                "value": value,
                "target": t.threshold,
                "comparison": ">=" if t.higher_is_better else "<=",
                "pass": passed,
                **({"point": where[t.name]} if where.get(t.name) else {}),
            }
        )
    return table, targets


COST_ROLES = ("actors", "serving", "training")
"""Who spends the machine's CPU per frame: actor processes, the learner process (serving
and inference), its trainer process."""


def _extra_cost(rows: list[dict[str, Any]], label: str) -> dict[str, float] | None:
    """What the system mode costs per frame beyond echo, per role (µs, medians).

    The learner earns system/echo only by adding little to the transport; this says
    where it adds: the actors' own cost (it moves with latency and batching), serving
    (decode, batching, inference, replies) or training.
    """
    extra = {}
    for role in COST_ROLES:
        key = f"{role}_cpu_us_per_frame"
        system = _median_field(rows, label, "system", key)
        echo = _median_field(rows, label, "echo", key)
        if system is None or echo is None:
            return None
        extra[role] = system - echo
    return extra


def _label(row: dict[str, Any]) -> str:
    return str(row.get("point") or Point(row["n"], row["k"], row.get("batch", 0)).label)


def _median_field(rows: list[dict[str, Any]], label: str, mode: str, key: str) -> float | None:
    values = [
        r[key] for r in rows if _label(r) == label and r["mode"] == mode and r.get(key) is not None
    ]
    return statistics.median(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def machine_info() -> dict[str, Any]:
    versions = {}
    for dist in ("torch", "grpcio", "gymnasium", "numpy"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[dist] = metadata.version(dist)
    cpu_model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_model": cpu_model,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "versions": versions,
    }


def _format_extra(extra: dict[str, float] | None) -> str:
    if not extra:
        return "-"
    return "/".join(f"{extra[role]:+.0f}" for role in COST_ROLES)


def print_report(table: list[dict[str, Any]], rows: list[dict[str, Any]], targets: list) -> None:
    from rich.console import Console
    from rich.table import Table

    def f(value: Any, fmt: str = "{:,.0f}") -> str:
        return "-" if value is None else fmt.format(value)

    def med(label: str, mode: str, key: str) -> float | None:
        return _median_field(rows, label, mode, key)

    console = Console(width=max(Console().width, 180))
    t = Table(title="seedrl bench: frames/s (medians over repeats)")
    for col in ("NxK[bB]", "ideal", "echo", "inference", "system", "sys/ideal", "sys/echo",
                "cpu µs/frame i/e/s", "batch", "rtt p50/p99 ms", "learner cpu", "steps/s",
                "trainer wait", "inf wait", "RSS learner/actor MB", "actor procs",
                "+µs a/s/t"):  # fmt: skip
        t.add_column(col, justify="right", no_wrap=col.startswith("+µs"))
    for p in table:
        pt = p["point"]
        p50, p99 = med(pt, "system", "rtt_p50_ms"), med(pt, "system", "rtt_p99_ms")
        t.add_row(
            pt, f(p["ideal_fps"]), f(p["echo_fps"]), f(p["inference_fps"]),
            f(p["system_fps"]), f(p["system_over_ideal"], "{:.2f}"),
            f(p["system_over_echo"], "{:.2f}"),
            "/".join(f(med(pt, m, "cpu_us_per_frame")) for m in ("ideal", "echo", "system")),
            f(med(pt, "system", "inference_batch_mean"),
            "{:.1f}"), f"{f(p50, '{:.1f}')}/{f(p99, '{:.1f}')}",
            f(med(pt, "system", "learner_cpu"), "{:.2f}"),
            f(med(pt, "system", "learner_steps_per_s"), "{:.1f}"),
            f(med(pt, "system", "trainer_wait_share"), "{:.0%}"),
            f(med(pt, "system", "inference_wait_share"), "{:.0%}"),
            f"{f(med(pt, 'system', 'learner_rss_mb'))}/"
            f"{f(med(pt, 'system', 'actor_rss_mb_max'))}",
            f(med(pt, "system", "actor_processes")),
            _format_extra(p.get("system_extra_us_per_frame")),
        )  # fmt: skip
    console.print(t)
    console.print(
        "NxK: N actors (one stream each) x K envs, in the launcher's actor processes "
        "(actor procs); bB: B unrolls per training step; +µs: machine CPU per frame the "
        "system spends beyond echo, in actors / serving (learner process) / training "
        "(trainer process)"
    )
    tt = Table(title="targets: value over the repeats' medians (each repeat's own)")
    for col in ("target", "value", "wanted", "pass"):
        tt.add_column(col)
    for target in targets:
        verdict = {True: "[green]PASS", False: "[red]FAIL", None: "[yellow]n/a"}[target["pass"]]
        if target.get("steady") is False:
            verdict += "[yellow] (repeats disagree)"
        value = f(target["value"], "{:.2f}")
        if target.get("runs"):
            value += " (" + " / ".join(f(v, "{:.2f}") for v in target["runs"]) + ")"
        tt.add_row(
            target["description"] + (f" [{target['point']}]" if target.get("point") else ""),
            value, f"{target['comparison']} {target['target']}", verdict,
        )  # fmt: skip
    console.print(tt)
    for row in rows:
        if row.get("error"):
            console.print(f"[red]{_label(row)} {row['mode']}: {row['error']}")


# ---------------------------------------------------------------------- entry points


def parse_sweep(text: str) -> tuple[Point, ...]:
    """``"1x1,4x8,2x256b128"`` -> Point(1, 1), Point(4, 8), Point(2, 256, batch=128)."""
    points = []
    for part in text.replace(" ", "").lower().split(","):
        if not part:
            continue
        match = re.fullmatch(r"([1-9][0-9]*)x([1-9][0-9]*)(?:b([1-9][0-9]*))?", part)
        if not match:
            raise argparse.ArgumentTypeError(
                f"sweep points look like 4x8 (or 2x256b128 for a training batch), got {part!r}"
            )
        n, k, batch = match.groups()
        points.append(Point(int(n), int(k), int(batch or 0)))
    return tuple(points)


def focus_plan(
    sweep: Sequence[Point], modes: Sequence[str], best: Point | None
) -> list[tuple[Point, tuple[str, ...]]]:
    """(point, modes) of one focus round: the sweep's best point in system mode (the
    round also measures a one-process ideal beside it), then the focus points the sweep
    has in the focus modes asked for."""
    plan: list[tuple[Point, tuple[str, ...]]] = []
    if best is not None and best not in FOCUS_POINTS and "system" in modes:
        plan.append((best, ("system",)))
    wanted = tuple(m for m in FOCUS_MODES if m in modes)
    if wanted:
        plan += [(p, wanted) for p in sweep if p in FOCUS_POINTS]
    return plan


def measure_reference(settings: Settings) -> float | None:
    """The best-configuration target's limit: one process with IDEAL_REFERENCE_ENVS envs."""
    with contextlib.suppress(subprocess.SubprocessError, ValueError, IndexError):
        return float(measure_ideal(IDEAL_REFERENCE_ENVS, settings)["fps"])
    return None


def sweep_best_point(rows: list[dict[str, Any]]) -> Point | None:
    """The point whose median system frames/s is highest (the best configuration)."""
    table = _summarize_once(rows, None)[0]
    best = max((p for p in table if p["system_fps"]), key=lambda p: p["system_fps"], default=None)
    return None if best is None else Point(best["n"], best["k"], best["batch"])


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    sweep = args.sweep or (QUICK_SWEEP if args.quick else DEFAULT_SWEEP)
    warmup = args.warmup_s if args.warmup_s is not None else (0.5 if args.quick else 1.5)
    measure = args.measure_s if args.measure_s is not None else (1.5 if args.quick else 3.0)
    workdir = Path(tempfile.mkdtemp(prefix="seedrl-bench-"))
    settings = Settings(
        env=args.env,
        warmup_s=warmup,
        measure_s=measure,
        connect_timeout_s=args.connect_timeout_s,
        transport=args.transport,
        learner_args=tuple(args.learner_args.split()),
        actor_args=tuple(args.actor_args.split()),
        torch_threads=args.torch_threads,
        workdir=workdir,
        env_groups=args.env_groups,
        pin_cpus=args.pin_cpus,
    )
    started = time.time()
    load_before = os.getloadavg()

    def log(point: Point, mode: str, row: dict[str, Any]) -> None:
        if args.verbose:
            shown = row.get("error") or (
                f"{row.get('fps', 0):,.0f} frames/s, "
                f"{row.get('cpu_us_per_frame') or 0:.0f} cpu µs/frame"
            )
            elapsed = time.time() - started
            print(f"  [{elapsed:5.0f} s] {point.label:>10} {mode:<9} {shown}", file=sys.stderr,
                  flush=True)  # fmt: skip

    rows: list[dict[str, Any]] = []
    references: list[float | None] = []  # one per repeat (None: not measured)
    try:
        for repeat in range(args.repeats):
            references.append(measure_reference(settings) if "ideal" in args.modes else None)
            for point in sweep:
                rows += run_point(point, args.modes, repeat, settings, log)
        best = sweep_best_point(rows)
        plan = focus_plan(sweep, args.modes, best)
        judges_best = "ideal" in args.modes and any(
            point == best and "system" in modes for point, modes in plan
        )
        rounds = args.focus_repeats if plan else 0
        for repeat in range(args.repeats, args.repeats + rounds):
            # The one-process limit, measured right before the best point it judges.
            references.append(measure_reference(settings) if judges_best else None)
            for point, modes in plan:
                focus_rows = run_point(point, modes, repeat, settings, log)
                rows += ({**row, "focus": True} for row in focus_rows)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    measured = [x for x in references if x is not None]
    reference = statistics.median(measured) if measured else None
    table, targets = summarize(rows, reference, references)
    return {
        "schema": SCHEMA,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "wall_time_s": time.time() - started,
        "machine": machine_info(),
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "settings": {
            "env": settings.env,
            "sweep": [point.label for point in sweep],
            "modes": list(args.modes),
            "repeats": args.repeats,
            "focus_repeats": args.focus_repeats,
            "warmup_s": warmup,
            "measure_s": measure,
            "transport": settings.transport,
            "torch_threads": settings.torch_threads,
            "env_groups": settings.env_groups,
            "pin_cpus": settings.pin_cpus,
            "learner_args": list(settings.learner_args),
            "actor_args": list(settings.actor_args),
        },
        "ideal_reference": {"envs": IDEAL_REFERENCE_ENVS, "fps": reference, "runs": measured},
        "results": rows,
        "points": table,
        "targets": targets,
    }


def ideal_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m learner.bench ideal")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--envs", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--warmup-s", type=float, default=1.0)
    parser.add_argument("--torch-threads", type=int, default=1)
    a = parser.parse_args(argv)
    print(json.dumps(run_ideal(a.env, a.envs, a.seconds, a.warmup_s, a.torch_threads)))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["ideal"]:
        return ideal_main(args_list[1:])
    parser = argparse.ArgumentParser(
        prog="python -m learner.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="CI smoke: 2 small points, short")
    parser.add_argument("--sweep", type=parse_sweep, help="points N x K, e.g. 1x1,64x1,256x1")
    parser.add_argument("--modes", type=lambda t: tuple(t.split(",")), default=MODES,
                        help="comma list of ideal,echo,inference,system")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=1, help="sweeps, interleaved; medians")
    parser.add_argument(
        "--focus-repeats",
        type=int,
        help="rounds after the sweep that measure again, back to back, 64x1 and 256x1 (echo, "
        "system) and the best point beside a one-process ideal (default 2; 0 with --quick)",
    )
    parser.add_argument("--warmup-s", type=float, help="after all actors connect (default 1.5)")
    parser.add_argument("--measure-s", type=float, help="measuring window per mode (default 3)")
    parser.add_argument("--connect-timeout-s", type=float, default=120.0)
    parser.add_argument(
        "--transport",
        choices=("auto", "tcp", "unix"),
        default="auto",
        help="auto: actors dial 127.0.0.1 and use the same-host unix socket the servers "
        "offer (the default deployment); tcp: loopback TCP only; unix: bind a unix path",
    )
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument(
        "--env-groups", type=int, default=1, help="actor --env-groups G where G divides K"
    )
    parser.add_argument(
        "--pin-cpus",
        choices=PIN_CPUS_MODES,
        default=ActorConfig.pin_cpus,
        help="actors' CPUs as `python -m actors --pin-cpus` gives them (on: one each, "
        "round robin; auto: so when N is a multiple of the CPUs; default: %(default)s)",
    )
    parser.add_argument("--learner-args", default="", help="extra learner flags, one string")
    parser.add_argument("--actor-args", default="", help="extra actor flags, one string")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--out", default="bench.json")
    parser.add_argument("--verbose", "-v", action="store_true", help="a line per measurement")
    args = parser.parse_args(args_list)
    if args.focus_repeats is None:
        args.focus_repeats = 0 if args.quick else DEFAULT_FOCUS_REPEATS
    if args.repeats < 1 or args.focus_repeats < 0:
        parser.error("--repeats must be >= 1 and --focus-repeats >= 0")
    unknown = set(args.modes) - set(MODES)
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}; choose from {MODES}")
    report = run_bench(args)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print_report(report["points"], report["results"], report["targets"])
    print(f"wrote {args.out} ({report['wall_time_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
