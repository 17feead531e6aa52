"""One load-generator measurement: a server process, S synthetic streams, one window.

The server is the learner (``inference``: ``--no-train``; ``system``: training;
``phases``: training with ``--time-phases``) or the echo server (``echo``: the learner's
own handler with zero actions, the transport floor). The synthetic actors run in this
process, one thread per connection, or in ``--generators`` processes. Every stream is
admitted before any sends a frame. Over a window that opens after a warm-up, it reads
the CPU of the server's processes by role from ``/proc`` (:mod:`benchmarks.bench.roles`:
the model process, its main thread apart, each serving-tier frontend, the trainer and
other children) and their memory at the window's end, the frames the server counted and
the steps it trained from its ``metrics.jsonl``, and the replies and round trips from
the streams.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from benchmarks.bench.fleet import stop_process
from benchmarks.bench.roles import read_tree, role_cpu, role_memory
from benchmarks.loadgen.generators import GeneratorProcesses
from benchmarks.loadgen.synthetic import SyntheticActors, Tape, record_tape
from learner.state.stats import SERVING_PHASES
from seedrl.metrics import read_metrics
from seedrl.proto import seedrl_pb2 as pb
from seedrl.proto import seedrl_pb2_grpc as pb_grpc
from seedrl.transport import free_port, local_target

MODES = ("echo", "inference", "system", "phases")
MIN_ROUND_TRIPS = 50
"""A window lasts --measure-s, and longer (up to MAX_STRETCH times) until the average
stream has made this many round trips."""
MAX_STRETCH = 4
METRICS_INTERVAL_S = 0.5


@dataclass
class Settings:
    env: str
    streams: int
    envs: int
    connections: int
    warmup_s: float
    measure_s: float
    connect_timeout_s: float
    transport: str
    learner_args: tuple[str, ...]
    tape_steps: int
    workdir: Path
    preset: str | None = None
    device: str = "cpu"
    generators: int = 1
    """Processes the streams are split over (1: this process)."""


def server_command(mode: str, port: int, logdir: Path, s: Settings) -> list[str]:
    tcp_only = ["--no-local-socket"] if s.transport == "tcp" else []
    common = [
        "--env", s.env, "--bind", "127.0.0.1", "--port", str(port), "--logdir", str(logdir),
        "--log-interval-s", str(METRICS_INTERVAL_S), "--max-actors", str(max(s.streams, 1)),
        *tcp_only,
    ]  # fmt: skip
    if mode == "echo":  # no model: a preset's model and training settings mean nothing here
        return [sys.executable, "-m", "benchmarks.echo", *common, *s.learner_args]
    return [
        sys.executable, "-m", "learner", *common, "--progress", "off", "--no-tensorboard",
        *(["--preset", s.preset] if s.preset else []),
        "--checkpoint-interval-s", "1e9", "--device", s.device,
        *(["--no-train"] if mode == "inference" else []),
        *(["--time-phases"] if mode == "phases" else []), *s.learner_args,
    ]  # fmt: skip


def learner_info(target: str, timeout: float, proc: subprocess.Popen[Any]) -> pb.LearnerInfo:
    """GetInfo, retried until the server answers (or ``timeout``, or it exits)."""
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.LearnerStub(channel)
        while True:
            try:
                return stub.GetInfo(pb.GetInfoRequest(), timeout=2)
            except grpc.RpcError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the server did not answer GetInfo") from None
                time.sleep(0.2)


def connection_targets(
    dialled: str, info: pb.LearnerInfo, s: Settings, proc: subprocess.Popen[Any]
) -> list[str]:
    """Where each of the run's connections dials, as that many actor processes would: the
    same-host socket a GetInfo of its own is offered (a serving tier's frontends offer
    theirs in turn), or ``dialled`` over TCP."""
    if s.transport == "tcp" or local_target(info.local_address, dialled) is None:
        return [dialled]
    offers = [info] + [
        learner_info(dialled, s.connect_timeout_s, proc) for _ in range(s.connections - 1)
    ]
    return [local_target(offer.local_address, dialled) or dialled for offer in offers]


def measure(mode: str, s: Settings, tapes: dict[str, Tape]) -> dict[str, Any]:
    """One window of ``mode`` behind S synthetic streams: its row of numbers."""
    logdir = s.workdir / f"{mode}-{time.monotonic_ns()}"
    logdir.mkdir(parents=True)
    port = free_port()
    log_path = logdir / "server.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            server_command(mode, port, logdir, s), stdout=log_file, stderr=subprocess.STDOUT
        )
        actors: SyntheticActors | GeneratorProcesses | None = None
        try:
            dialled = f"127.0.0.1:{port}"
            info = learner_info(dialled, s.connect_timeout_s, proc)
            targets = connection_targets(dialled, info, s, proc)
            tape_key = f"{info.env.env_id}/{info.frame_stack}"
            if tape_key not in tapes:  # recorded once per env and frame layout
                tapes[tape_key] = record_tape(info, s.tape_steps)
            if s.generators > 1:
                actors = GeneratorProcesses(
                    targets, info, tapes[tape_key], s.streams, s.envs, s.connections,
                    s.generators,
                )  # fmt: skip
            else:
                actors = SyntheticActors(
                    targets, info, tapes[tape_key], s.streams, s.envs, s.connections
                )
            actors.start()
            _until_steady(actors, mode, logdir, s, proc)
            time.sleep(s.warmup_s)
            return _window(actors, mode, logdir, s, proc)
        except RuntimeError as exc:
            tail = log_path.read_text(errors="replace")[-600:]
            raise RuntimeError(f"{mode}: {exc}; server said: {tail}") from None
        finally:
            if actors is not None:
                actors.stop()
            stop_process(proc)


def _until_steady(
    actors: SyntheticActors | GeneratorProcesses,
    mode: str,
    logdir: Path,
    s: Settings,
    proc: subprocess.Popen[Any],
) -> None:
    """Every stream admitted (then released to send frames) and, when training, the
    trainer stepping."""
    deadline = time.monotonic() + s.connect_timeout_s
    released = False
    while time.monotonic() < deadline:
        if actors.errors:
            raise RuntimeError(actors.errors[0])
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        connected = actors.connected
        if not released and connected == s.streams:
            actors.release()
            released = True
        records = read_metrics(logdir)
        trains = mode in ("system", "phases")
        stepping = not trains or (records and records[-1].get("learner_steps", 0) > 0)
        if released and records and stepping:
            return
        time.sleep(0.2)
    raise RuntimeError(f"not steady within {s.connect_timeout_s} s ({actors.connected} streams in)")


def _window(
    actors: SyntheticActors | GeneratorProcesses,
    mode: str,
    logdir: Path,
    s: Settings,
    proc: subprocess.Popen[Any],
) -> dict[str, Any]:
    pid = proc.pid
    actors.open_window()
    t0, tree0, gen0 = time.time(), read_tree(pid), actors.cpu_seconds()
    time.sleep(s.measure_s)
    wanted = MIN_ROUND_TRIPS * s.streams
    stretch_until = time.monotonic() + s.measure_s * (MAX_STRETCH - 1)
    while actors.replies < wanted and time.monotonic() < stretch_until:
        time.sleep(0.1)
    t1, tree1, gen1 = time.time(), read_tree(pid), actors.cpu_seconds()
    replies = actors.replies
    p50, p99 = actors.rtt_percentiles_ms()
    memory = role_memory(tree1)
    time.sleep(METRICS_INTERVAL_S + 0.2)  # a metrics record past the window's end
    if actors.errors:
        raise RuntimeError(actors.errors[0])
    wall = t1 - t0
    answered = replies * s.envs
    if answered == 0:
        raise RuntimeError("no frame was answered in the window")
    per_frame = 1e6 / answered
    cpu = role_cpu(tree0, tree1)
    serving_cpu, main_cpu = cpu.model, cpu.model_main_thread
    row: dict[str, Any] = {
        # Wall-clock bounds, so that samples taken beside the run (a GPU's utilisation)
        # can be matched to this window.
        "window_start": t0,
        "window_end": t1,
        "window_s": wall,
        "frames_answered": answered,
        "fps_answered": answered / wall,
        "rtt_p50_ms": p50,
        "rtt_p99_ms": p99,
        "learner_cpu_cores": serving_cpu / wall,
        # The headline: CPU per frame holds up on a shared machine far better than frames/s.
        "learner_cpu_us_per_frame": serving_cpu * per_frame,
        "learner_loop_thread_us_per_frame": main_cpu * per_frame,
        "learner_other_threads_us_per_frame": (serving_cpu - main_cpu) * per_frame,
        # The model's other children: the trainer process (and the resource tracker).
        "trainer_cpu_us_per_frame": cpu.others * per_frame,
        # The whole learner: every process of it, the generators not among them.
        "host_cpu_us_per_frame": cpu.host * per_frame,
        "host_cpu_cores": cpu.host / wall,
        "generator_cpu_us_per_frame": (gen1 - gen0) * per_frame,
        "generators": s.generators,
        **memory,
    }
    if cpu.frontends:  # --serving-processes: the learner process runs the model, these serve
        fe_cpu = sum(cpu.frontends)
        row["frontend_cpu_us_per_frame"] = fe_cpu * per_frame
        row["frontend_cpu_us_per_frame_each"] = [c * per_frame for c in cpu.frontends]
        # What one core of frontends carries: frames answered per frontend CPU second.
        row["fps_per_frontend_core"] = answered / fe_cpu if fe_cpu > 0 else None
    row.update(_learner_window(logdir, t0, t1))
    if mode == "phases" and row.get("phase_s"):
        taken = max(row["frames_taken"], 1)
        phases = {k: v / taken * 1e6 for k, v in row.pop("phase_s").items()}
        phases["loop_rest"] = row["learner_loop_thread_us_per_frame"] - sum(phases.values())
        phases["other_threads"] = row["learner_other_threads_us_per_frame"]
        row["phases_us_per_frame"] = phases
    row.pop("phase_s", None)
    return row


def _learner_window(logdir: Path, t0: float, t1: float) -> dict[str, Any]:
    """Frames taken, steps trained, batch size and phase seconds from the server's records."""
    records = read_metrics(logdir)
    window = [r for r in records if t0 - METRICS_INTERVAL_S <= r["time"] <= t1 + METRICS_INTERVAL_S]
    if len(window) < 2:
        raise RuntimeError(f"only {len(window)} metrics records in the window")
    first, last = window[0], window[-1]
    dt = max(last["elapsed_s"] - first["elapsed_s"], 1e-9)
    config = _config(logdir)
    frames_per_step = config.get("batch_size", 0) * config.get("unroll_length", 0)
    steps = last.get("learner_steps", 0) - first.get("learner_steps", 0)
    batches = [r["inference_batch_mean"] for r in window[1:] if r.get("inference_batch_mean")]
    out: dict[str, Any] = {
        "frames_taken": last["frames"] - first["frames"],
        "fps_taken": (last["frames"] - first["frames"]) / dt,
        "trained_fps": steps * frames_per_step / dt if frames_per_step else None,
        "learner_steps_per_s": steps / dt,
        "inference_batch_mean": sum(batches) / len(batches) if batches else None,
        "trainer_wait_share": _mean(window[1:], "trainer_wait_share"),
        "learner_rss_mb": last.get("learner_rss_mb"),
    }
    phase_keys = [f"phase_s/{p}" for p in SERVING_PHASES]
    if all(k in last for k in phase_keys):
        out["phase_s"] = {p: last[f"phase_s/{p}"] - first[f"phase_s/{p}"] for p in SERVING_PHASES}
    return out


def _config(logdir: Path) -> dict[str, Any]:
    with contextlib.suppress(OSError, ValueError):
        return dict(json.loads((logdir / "config.json").read_text()))
    return {}


def _mean(records: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in records if r.get(key) is not None]
    return sum(values) / len(values) if values else None
