"""One measurement: a server mode behind a fleet's address, or the one-process ideal.

Throughput, batch sizes, waits and learner RSS come from the server's ``metrics.jsonl``
over a window that starts after a warm-up once all N actors are connected; step latency
from the actors' per-stream round-trip records (``--stats-dir``); CPU and actor memory
from ``/proc``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.bench.fleet import ActorFleet, stop_process, wait_for
from benchmarks.bench.plan import IDEAL_REFERENCE_ENVS, Point
from benchmarks.bench.roles import read_tree, role_cpu
from seedrl.config import ActorConfig
from seedrl.metrics import read_metrics
from seedrl.transport import free_port

MIN_ROUND_TRIPS = 100
"""A measuring window lasts --measure-s, and longer until the average stream has made this
many round trips: 3 s of 256 single-env actors is ~20 round trips each, too few to
average out who the two cores happened to run (windows moved ±25 % on 2026-11-24)."""
MAX_STRETCH = 4
"""...but never more than this many times --measure-s."""


# ---------------------------------------------------------------------- ideal worker


def run_ideal(
    env_id: str,
    num_envs: int,
    seconds: float,
    warmup_s: float,
    threads: int,
    preset: str | None = None,
    device_name: str = "cpu",
    learner_args: Sequence[str] = (),
    train: bool = False,
) -> dict:
    """Step ``num_envs`` envs with the learner's model in this process; frames/s after warm-up.

    The model, its device, frame stacking and (with ``train``) the training batch are the
    learner's for ``preset``, ``device_name`` and ``learner_args``. With ``train`` every
    finished batch of unrolls is trained on in line, as the learner's trainer would: the
    limit of a machine that does all three jobs in one process.
    """
    import numpy as np

    from learner.agents.models import resolve_precision
    from learner.agents.policy import inference_policy
    from learner.parts import build_learner, make_trainer
    from seedrl import envs
    from seedrl.cli import parse_config
    from seedrl.config import LearnerConfig

    argv = [
        "--env", env_id, "--torch-threads", str(threads), "--device", device_name,
        *(["--preset", preset] if preset else []), *learner_args,
    ]  # fmt: skip
    cfg = parse_config(LearnerConfig, argv, "ideal", "ideal", presets=True)
    learner = build_learner(cfg)
    builder, queue = learner.builder, learner.queue
    precision = resolve_precision(cfg.precision, learner.device)
    policy = inference_policy(
        learner.model, learner.head, learner.device, cfg.inference_backend, cfg.seed, precision
    )
    trainer = make_trainer(learner) if train else None
    vec = envs.make_vector_env(env_id, cfg.env_kwargs, num_envs)
    stacked = builder.frame_stack > 1
    slots = builder.allocate(num_envs)
    obs_KO, _ = vec.reset(seed=0)
    reward_K = np.zeros(num_envs, np.float32)
    terminated_K = truncated_K = np.zeros(num_envs, np.bool_)
    frames, t0 = 0, time.perf_counter()
    measured_from, measured_frames, cpu_from = None, 0, 0.0
    train_s, train_steps, trained_frames = 0.0, 0, 0
    while True:
        now = time.perf_counter()
        if measured_from is None and now - t0 >= warmup_s:
            measured_from, measured_frames, cpu_from = now, frames, time.process_time()
            train_s, train_steps, trained_frames = 0.0, 0, 0
        if now - t0 >= warmup_s + seconds:
            break
        first_K = builder.first_flags(slots)
        frame_KF = np.asarray(obs_KO[:, -1] if stacked else obs_KO, builder.obs_dtype)
        x_KO = builder.stack_frames(slots, frame_KF, first_K) if stacked else frame_KF
        before = tuple(s[slots] for s in builder.core_state_SH)
        action_K, params_KP, after = policy(x_KO, first_K, before)
        if trainer is None:
            for store, state in zip(builder.core_state_SH, after, strict=True):
                store[slots] = state
        else:
            unrolls, _ = builder.record(
                slots, frame_KF, reward_K, terminated_K, truncated_K, first_K, action_K,
                params_KP, before, after, learner.step_counter.value,
            )  # fmt: skip
            if unrolls is not None:
                queue.put(unrolls)
            while len(queue) >= cfg.batch_size:
                batch = queue.get(cfg.batch_size, timeout=0)
                assert batch is not None
                started = time.perf_counter()
                trainer.train_step(batch)
                train_s += time.perf_counter() - started
                train_steps += 1
                trained_frames += cfg.batch_size * cfg.unroll_length
        obs_KO, reward, terminated, truncated, _ = vec.step(action_K)
        reward_K = np.asarray(reward, np.float32)
        terminated_K, truncated_K = np.asarray(terminated), np.asarray(truncated)
        frames += num_envs
    wall = time.perf_counter() - (measured_from or t0)
    cpu = time.process_time() - cpu_from
    vec.close()
    measured = max(frames - measured_frames, 1)
    result: dict[str, float | None] = {
        "fps": measured / max(wall, 1e-9),
        "seconds": wall,
        "cpu_us_per_frame": cpu / measured * 1e6,
    }
    if train:
        result["train_steps"] = train_steps
        result["train_step_ms"] = train_s / train_steps * 1e3 if train_steps else None
        result["training_us_per_frame"] = train_s / trained_frames * 1e6 if train_steps else None
    return result


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
    preset: str | None = None
    device: str = "auto"

    @property
    def frame_once(self) -> bool:
        """Whether the servers let stacked-frame actors send the newest frame only."""
        return "--no-frame-once" not in self.learner_args


GRPC_PREFIX_BYTES = 5
"""gRPC's length prefix on every message (HTTP/2 frame headers are not counted)."""


def wire_bytes_per_step(env_id: str, num_envs: int, frame_once: bool) -> float:
    """gRPC message bytes per agent step, frame and reply: what one K-env stream moves
    per round trip, over K. Exact: the actor and learner build their messages from these
    templates."""
    import numpy as np

    from seedrl import codec, envs

    spec = envs.describe_env(env_id)
    obs_shape = codec.spec_shape(spec.observation_space)
    if frame_once and envs.frame_stack(env_id, {}) > 1:
        obs_shape = obs_shape[1:]
    obs_dtype = np.dtype(spec.observation_space.dtype)
    frame = codec.frame_template(*codec.frame_layouts(num_envs, obs_dtype, obs_shape))
    discrete = spec.action_space.kind == "discrete"
    act_dtype = np.dtype(np.int64 if discrete else np.float32)
    act_shape = (num_envs, *codec.spec_shape(spec.action_space))
    reply = codec.actions_template(act_dtype, act_shape)
    return (frame.size + reply.size + 2 * GRPC_PREFIX_BYTES) / num_envs


def server_command(
    mode: str, address_bind: str, port: int, logdir: Path, s: Settings, batch: int = 0
) -> list:
    # --transport tcp: loopback TCP only; auto leaves the same-host unix socket on (default).
    tcp_only = ["--no-local-socket"] if s.transport == "tcp" else []
    if mode == "echo":
        return [
            sys.executable, "-m", "benchmarks.echo", "--env", s.env, "--bind", address_bind,
            "--port", str(port), "--logdir", str(logdir), "--log-interval-s", "0.5",
            *tcp_only, *(["--no-frame-once"] if not s.frame_once else []),
        ]  # fmt: skip
    return [
        sys.executable, "-m", "learner", "--env", s.env, "--bind", address_bind,
        "--port", str(port), "--logdir", str(logdir), "--log-interval-s", "0.5",
        "--progress", "off", "--no-tensorboard", "--checkpoint-interval-s", "1e9",
        "--torch-threads", str(s.torch_threads), "--device", s.device,
        *(["--preset", s.preset] if s.preset else []),
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

            def steady() -> bool:
                """Every stream is in and, when training, the trainer (process) has stepped."""
                records = read_metrics(logdir)
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
            t0, tree0, acpu0 = time.time(), read_tree(proc.pid), fleet.cpu_seconds()
            frames0 = _last_frames(logdir)
            time.sleep(s.measure_s)
            # Many slow streams: stretch the window until the average stream has made
            # MIN_ROUND_TRIPS round trips (256 x K=1 makes ~6/s each on 2 cores).
            wanted = frames0 + MIN_ROUND_TRIPS * n * k * fleet.groups
            wait_for(lambda: _last_frames(logdir) >= wanted, s.measure_s * (MAX_STRETCH - 1), 0.25)
            t1, tree1, acpu1 = time.time(), read_tree(proc.pid), fleet.cpu_seconds()
            actor_rss, actor_uss_pss = fleet.rss_mb(), fleet.shared_aware_mb()
            time.sleep(0.6)  # one more metrics record covering the window's end
        finally:
            stop_process(proc)
    window = [r for r in read_metrics(logdir) if t0 <= r["time"] <= t1 + 0.55]
    if len(window) < 2:
        raise RuntimeError(f"{mode}: only {len(window)} metrics records in the window")
    first, last = window[0], window[-1]
    dt = last["elapsed_s"] - first["elapsed_s"]
    fps = (last["frames"] - first["frames"]) / max(dt, 1e-9)
    inner = window[1:]
    wall = t1 - t0
    # Serving is the model process and its frontends (--serving-processes), training the
    # other children (the trainer process): the tier's frontends are the learner's
    # children too, and counting them by their names keeps them out of training.
    cpu = role_cpu(tree0, tree1)
    frontends_cpu = sum(cpu.frontends) / wall
    serving_cpu = cpu.model / wall + frontends_cpu
    training_cpu = cpu.others / wall
    learner_cpu = serving_cpu + training_cpu
    actors_cpu = (acpu1 - acpu0) / wall
    per_frame = 1e6 / max(fps, 1e-9)
    wire_bytes = wire_bytes_per_step(s.env, k, s.frame_once)
    row: dict[str, Any] = {
        "fps": fps,
        "wire_bytes_per_step": wire_bytes,
        "wire_mb_per_s": wire_bytes * fps / 1e6,
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
        "frontends": len(cpu.frontends),
        "frontends_cpu_us_per_frame": frontends_cpu * per_frame,
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


def _last_frames(logdir: Path) -> int:
    records = read_metrics(logdir)
    return int(records[-1]["frames"]) if records else 0


def _mean(records: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in records if r.get(key) is not None]
    return statistics.fmean(values) if values else None


def measure_ideal(
    num_envs: int, s: Settings, train: bool = False, batch: int = 0
) -> dict[str, Any]:
    learner_args = [*s.learner_args, *(["--batch-size", str(batch)] if batch else [])]
    cmd = [
        sys.executable, "-m", "benchmarks.bench", "ideal", "--env", s.env, "--envs", str(num_envs),
        "--seconds", str(s.measure_s), "--warmup-s", str(min(s.warmup_s, 1.0)),
        "--torch-threads", str(s.torch_threads), "--device", s.device,
        *(["--preset", s.preset] if s.preset else []),
        "--learner-args", " ".join(learner_args), *(["--train"] if train else []),
    ]  # fmt: skip
    timeout = 60 + 2 * (s.warmup_s + s.measure_s)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    row = {
        "fps": result["fps"],
        "round_trips_per_s": None,
        "cpu_us_per_frame": result["cpu_us_per_frame"],
    }
    if train:
        row |= {key: result.get(key) for key in ("train_step_ms", "training_us_per_frame")}
    return row


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
    if "ideal_train" in modes:
        try:
            row = measure_ideal(n * k, s, train=True, batch=point.batch)
        except (subprocess.SubprocessError, ValueError, IndexError) as exc:
            row = {"error": f"ideal with training failed: {exc}"}
        log(point, "ideal_train", row)
        yield {**base, "mode": "ideal_train", **row}
    networked = [m for m in modes if not m.startswith("ideal")]
    if not networked:
        return
    with point_address(s.transport, s.workdir) as (address, bind, port):
        groups = s.env_groups if k % s.env_groups == 0 else 1
        stats_dir = s.workdir / f"actors-{point.label}-{repeat}"
        from seedrl.envs import env_module

        # The bench chose the env, so its actors may build it, a module:callable one too.
        allow = ("--allow-env-module", s.env) if env_module(s.env) else ()
        actor_args = (*allow, *s.actor_args)
        fleet = ActorFleet(address, n, k, groups, stats_dir, actor_args, s.pin_cpus)
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


def measure_reference(settings: Settings) -> float | None:
    """The best-configuration target's limit: one process with IDEAL_REFERENCE_ENVS envs."""
    with contextlib.suppress(subprocess.SubprocessError, ValueError, IndexError):
        return float(measure_ideal(IDEAL_REFERENCE_ENVS, settings)["fps"])
    return None
