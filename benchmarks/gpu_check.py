"""The GPU check: what only a lent GPU host can measure, in one run of one lease.

``bash benchmarks/gpu_check.sh`` (which installs carried wheels first; its header has the
lease's exact call and how its results come into the docs here) or ``python
benchmarks/gpu_check.py --out DIR``. Steps, in this order, each bounded in time and each run
whatever the others did, against an overall budget (later steps shrink or skip to fit);
``--steps`` names those to run, by default ``info,loadgen,legs,tables``, the run the
project owes a GPU host:

- ``loadgen``: ``benchmarks.loadgen`` against the learner on CUDA: CartPole 1024 x 1 and
  Atari Pong 64 x 1 with the Nature CNN and with the ResNet, each inference only
  (``--no-train``) and training, the learner's and its trainer's CPU per frame, GPU
  utilisation sampled over each window (its JSONs: ``loadgen-NAME-MODE.json``);
- ``legs``: R2D2 on the five MinAtar games (``minatar-r2d2``) of seed 0 side by side to
  the suite's budget and its greedy evaluations, on from the carried relay directory
  (``--relay``), through ``benchmarks/gpu_leg.sh``; then seed 1, once seed 0 finished,
  with what is left; the relay goes back as ``relay.tar.NN``;
- ``tables``: docs/performance.md's GPU load-generator block and docs/learning.md's
  ``minatar-r2d2`` table regenerated from those into copies under ``DIR/docs/``.

The budget split (``GPU_SPLIT``): the load generator first, the legs the rest less what
stopping a leg and the tables take. Before anything, the sizes of what was carried (the
wheels and the relay) are said, and beyond the device tool's carry limit the run stops
(``--carry-check`` says them alone, to run before a lease). The accelerator check, run
once on an H200 (docs/performance.md's GPU table), is ``--steps
info,tests,train,timings,bench``:

1. ``info``: nvidia-smi, torch/CUDA versions, the GPU;
2. ``tests``: the pytest tests that take CUDA (device trainer, bf16, pinned staging);
3. ``train``: short Atari (ALE/Pong-v5) and CartPole trainings with local actors: the
   device-resident trainer on CUDA, the process trainer on CUDA, and the process trainer
   on the CPU (the speed-up's baseline), plus Pong with IMPALA's ResNet on the
   device-resident trainer (the network a GPU learner is for); GPU utilisation sampled
   with nvidia-smi;
4. ``timings``: forward-pass and training-step times of the CartPole MLP, the Atari CNN
   and the Atari ResNet, on the GPU (fp32, bf16; the thread trainer from pageable memory
   and the device trainer from pinned buffers) and on the CPU, and the weight hand-off of
   either mode;
5. ``bench``: ``benchmarks.bench --quick`` for one Atari and one CartPole point in the
   modes a GPU changes (inference alone, the whole system), device shown.

Without CUDA the CUDA-only parts skip with a line saying so; the rest runs. ``--dry-run``
(``--short``) runs every step at toy size (tests/test_gpu_check.py). Writes
``summary.json`` (every step's result, rewritten after each, so a run cut short keeps what
finished), ``check.log`` and the steps' files.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CUDA_TESTS = ["tests/test_device_trainer.py"]
BENCH_MODES = ["--modes", "inference,system"]
"""The bench modes a GPU changes; the env-only ones (ideal, echo) would not fit the budget."""


class Budget:
    """The overall time budget: a step gets at most what is left minus what later steps need."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def allow(self, wanted: float, reserve: float = 0.0) -> float:
        """Seconds this step may take (0: skip it)."""
        return max(0.0, min(wanted, self.left() - reserve))


class Log:
    def __init__(self, path: Path) -> None:
        self.file = path.open("a")

    def __call__(self, text: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {text}"
        print(line, flush=True)
        self.file.write(line + "\n")
        self.file.flush()


def run(
    cmd: list[str], timeout: float, log: Log, cwd: Path = ROOT, env: dict[str, str] | None = None
) -> tuple[int, str]:
    """Run ``cmd`` within ``timeout`` s; (exit code or 124 on timeout, combined output).

    The command gets its own process group, and a timeout ends the whole group: a bench
    killed alone left its learner and actors running, and loading the host, long after.
    """
    log(f"$ {' '.join(cmd)}  (<= {timeout:.0f} s)")
    proc = subprocess.Popen(
        cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **(env or {})}, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out + err
    except subprocess.TimeoutExpired:
        end_group(proc)
        out, err = proc.communicate()  # what it printed so far says how far it got
        return 124, out + err


def end_group(proc: subprocess.Popen[str], grace_s: float = 5.0) -> None:
    """SIGTERM to ``proc``'s process group (learners checkpoint and stop), SIGKILL to
    whatever of it is left after ``grace_s``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


class GpuSampler:
    """``nvidia-smi`` utilisation and memory every 250 ms while the block runs."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float, float]] = []  # (wall time, util %, MiB)
        self._proc: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> GpuSampler:
        if shutil.which("nvidia-smi") is None:
            return self
        self._proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used",
             "--format=csv,noheader,nounits", "-lms", "250"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            with contextlib.suppress(ValueError):
                util, mem = (float(x) for x in line.split(",")[:2])
                self.samples.append((time.time(), util, mem))

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(5)
        if self._thread is not None:
            self._thread.join(2)

    def summary(self, start: float = 0.0, end: float = float("inf")) -> dict[str, Any] | None:
        """Utilisation and memory over the samples taken between wall times ``start`` and
        ``end`` (all of them by default); None without any."""
        taken = [(u, m) for t, u, m in self.samples if start <= t <= end]
        if not taken:
            return None
        utils = [u for u, _ in taken]
        return {
            "samples": len(utils),
            "util_mean": statistics.fmean(utils),
            "util_max": max(utils),
            "util_busy_mean": statistics.fmean([u for u in utils if u > 0] or [0.0]),
            "memory_mib_max": max(m for _, m in taken),
        }


# ---------------------------------------------------------------------- steps


def step_info(log: Log) -> dict[str, Any]:
    info: dict[str, Any] = {"python": sys.version.split()[0], "cpus": os.cpu_count()}
    if shutil.which("nvidia-smi"):
        code, out = run(["nvidia-smi"], 20, log)
        log(out.strip())
        code, out = run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
             "--format=csv,noheader"], 20, log,
        )  # fmt: skip
        info["nvidia_smi"] = out.strip()
    else:
        log("nvidia-smi: not found (no NVIDIA driver here)")
    code, out = run(
        [sys.executable, "-c",
         "import json, torch, grpc, google.protobuf as pb, gymnasium, numpy;"
         "import importlib.util as u;"
         "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda,"
         " 'cuda_available': torch.cuda.is_available(),"
         " 'gpu': torch.cuda.get_device_name() if torch.cuda.is_available() else None,"
         " 'grpcio': grpc.__version__, 'protobuf': pb.__version__,"
         " 'gymnasium': gymnasium.__version__, 'numpy': numpy.__version__,"
         " 'ale_py': bool(u.find_spec('ale_py'))}))"],
        60, log,
    )  # fmt: skip
    log(out.strip())
    with contextlib.suppress(ValueError, IndexError):
        info.update(json.loads(out.strip().splitlines()[-1]))
    info["rc"] = code
    return info


def step_tests(log: Log, timeout: float) -> dict[str, Any]:
    if timeout <= 0:
        log("tests: skipped: not enough of the budget left")
        return {"skipped": "budget"}
    if not cuda_available():
        log("tests: no CUDA here; the CUDA tests would skip (CI runs the CPU ones)")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "-k", "cuda"]
    cmd += CUDA_TESTS
    code, out = run(cmd, timeout, log)
    log(out.strip()[-3000:])
    tail = out.strip().splitlines()[-1] if out.strip() else ""
    return {"rc": code, "summary": tail}


def step_timings(log: Log, timeout: float, short: bool, rows: Path) -> dict[str, Any]:
    """The timings worker in a child; its rows land in ``rows`` one by one (a timeout keeps
    those already measured)."""
    if timeout <= 0:
        log("timings: skipped: not enough of the budget left")
        return {"skipped": "budget"}
    cmd = [sys.executable, str(Path(__file__)), "timings", str(rows)]
    code, out = run([*cmd, *(["--short"] if short else [])], timeout, log)
    log(out.strip()[-3000:])
    return {"rc": code, "rows": _records(rows)}


def train_run(
    name: str, preset: str, device: str, trainer: str, seconds: float, actors: tuple[int, int],
    log: Log, model: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """A learner with local actors, stopped ``seconds`` after its first frames arrived.

    Frames/s is read off the learner's metrics over that window (start-up excluded), with
    learner steps/s, batch sizes, waits and the GPU's utilisation meanwhile.
    """
    logdir = Path(tempfile.mkdtemp(prefix=f"seedrl-gpu-{name}-"))
    port = free_port()
    learner_cmd = [
        sys.executable, "-m", "learner", "--preset", preset, "--device", device,
        "--trainer", trainer, "--port", str(port), "--bind", "127.0.0.1",
        "--logdir", str(logdir), "--progress", "off", "--no-tensorboard",
        "--log-interval-s", "1", "--checkpoint-interval-s", "1e9", "--torch-threads", "4",
        *(["--model", model] if model else []),
    ]  # fmt: skip
    actor_cmd = [
        sys.executable, "-m", "actors", "--learner", f"127.0.0.1:{port}",
        "--num-actors", str(actors[0]), "--envs-per-actor", str(actors[1]),
    ]  # fmt: skip
    log(f"train {name}: {' '.join(learner_cmd[3:])}; actors {actors[0]} x {actors[1]}")
    result: dict[str, Any] = {
        "preset": preset, "device": device, "trainer": trainer,
        "actors": f"{actors[0]}x{actors[1]}", "window_s": seconds, "model": model or "preset",
    }  # fmt: skip
    learner_log = logdir.with_suffix(".learner.log")
    metrics = logdir / "metrics.jsonl"
    began = time.monotonic()
    with learner_log.open("wb") as lf:
        learner = subprocess.Popen(learner_cmd, cwd=ROOT, stdout=lf, stderr=subprocess.STDOUT)
        actor: subprocess.Popen[bytes] | None = None
        try:
            if not _wait(lambda: b"listening on" in learner_log.read_bytes(), 60, learner):
                raise RuntimeError("the learner did not start listening")
            result["learner_start_s"] = time.monotonic() - began
            actor = subprocess.Popen(
                actor_cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            if not _wait(lambda: _frames(metrics) > 0, 60, learner):
                raise RuntimeError("no frames within 60 s of the actors' start")
            with GpuSampler() as gpu:
                _wait(lambda: False, seconds, learner)
            result["gpu"] = gpu.summary()
            learner.send_signal(signal.SIGTERM)  # checkpoints and writes result.json
            result["rc"] = learner.wait(timeout=60)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            result["error"] = str(exc)
            learner.kill()
            learner.wait(10)
        finally:
            for proc in (learner, actor):
                if proc is not None and proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(15)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait(5)
    output = learner_log.read_text(errors="replace")
    result["listening"] = next((x for x in output.splitlines() if "listening on" in x), "")
    records = _records(metrics)
    live = [r for r in records if r.get("frames", 0) > 0]
    window = live[2:] if len(live) > 4 else live  # the first seconds still warm up
    if len(window) >= 2:
        first, last = window[0], window[-1]
        span = max(last["time"] - first["time"], 1e-9)
        result["fps"] = (last["frames"] - first["frames"]) / span
        result["learner_steps_per_s"] = (last["learner_steps"] - first["learner_steps"]) / span
        result["measured_s"] = span
        keys = (
            "inference_batch_mean", "inference_batches_per_s", "trainer_wait_share",
            "inference_wait_share", "policy_lag", "queue_unrolls", "learner_rss_mb",
        )  # fmt: skip
        for key in keys:
            values = [r[key] for r in window if isinstance(r.get(key), int | float)]
            if values:
                result[key] = statistics.fmean(values)
        result["frames"] = last["frames"]
        result["episode_return_mean"] = last.get("episode_return_mean")
    if result.get("rc") != 0:
        result["learner_tail"] = output[-2000:]
    log(f"train {name}: " + json.dumps({k: v for k, v in result.items() if k != "learner_tail"}))
    shutil.rmtree(logdir, ignore_errors=True)
    learner_log.unlink(missing_ok=True)
    return result


def _wait(condition: Callable[[], bool], timeout: float, proc: subprocess.Popen[bytes]) -> bool:
    """Poll ``condition`` until true (True), ``timeout`` passes or ``proc`` exits (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if condition():
                return True
        if proc.poll() is not None:
            raise RuntimeError(f"the learner exited with code {proc.returncode}")
        time.sleep(0.25)
    return False


def _records(path: Path) -> list[dict[str, Any]]:
    records = []
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                records.append(json.loads(line))
    return records


def _frames(path: Path) -> int:
    records = _records(path)
    return int(records[-1].get("frames", 0)) if records else 0


def step_bench(log: Log, args: list[str], out: Path, timeout: float) -> dict[str, Any]:
    if timeout < 20:
        log(f"bench {out.name}: skipped: not enough of the budget left")
        return {"skipped": "budget"}
    cmd = [sys.executable, "-m", "benchmarks.bench", "--quick", "-v", *args, "--out", str(out)]
    code, text = run(cmd, timeout, log)
    log(text.strip()[-4000:])
    result: dict[str, Any] = {"rc": code, "out": out.name}
    with contextlib.suppress(OSError, ValueError):
        report = json.loads(out.read_text())
        result["device"] = report["machine"].get("device")
        result["points"] = report["points"]
    return result


# ---------------------------------------------------------------------- the owed GPU run

CARRY_LIMIT_BYTES = 64 * 2**20
"""What the device tool carries to a lent host beside the checkout, all paths together."""
R2D2_SUITE = "minatar-r2d2"
DEFAULT_RELAY = f"runs/relay/{R2D2_SUITE}"
LOADGEN_MODES = ("inference", "system")
"""Inference alone (``--no-train``) and the learner training while it serves."""


@dataclass(frozen=True)
class LoadgenConfig:
    name: str
    env: str
    preset: str | None
    model: str | None
    """The learner's ``--model`` (None: the preset's own, ``torso``)."""
    torso: str
    streams: int
    dry_modes: tuple[str, ...]
    """What the dry run measures of it: between them every flag the GPU run passes, in as
    few learner start-ups (the dry run's main cost) as cover them."""


LOADGEN_CONFIGS = (
    LoadgenConfig("cartpole", "CartPole-v1", None, None, "mlp", 1024, ("system",)),
    LoadgenConfig("atari-cnn", "ALE/Pong-v5", "atari", None, "cnn", 64, ()),
    LoadgenConfig("atari-resnet", "ALE/Pong-v5", "atari", "resnet", "resnet", 64, ("inference",)),
)
DRY_STREAMS = 2


@dataclass(frozen=True)
class Split:
    """How the budget is shared: the load generator first, the R2D2 legs the rest less
    what stopping a leg (checkpoint, relay parts) and the tables need after it."""

    loadgen_s: float
    leg_stop_s: float
    tables_s: float
    min_leg_s: float
    games: tuple[str, ...]
    leg_flags: tuple[str, ...]


GPU_SPLIT = Split(
    loadgen_s=180, leg_stop_s=60, tables_s=40, min_leg_s=60,
    games=("Breakout", "Asterix", "Freeway", "Seaquest", "SpaceInvaders"), leg_flags=(),
)  # fmt: skip
DRY_SPLIT = Split(
    loadgen_s=90, leg_stop_s=30, tables_s=30, min_leg_s=30, games=("Breakout",),
    leg_flags=("--frames", "3000", "--eval-episodes", "1", "--num-actors", "1",
               "--envs-per-actor", "4", "--set", "checkpoint_interval_s=600"),
)  # fmt: skip


def carry_sizes(paths: list[Path]) -> dict[str, int]:
    """Bytes under each path (0 where it is absent)."""
    sizes = {}
    for path in paths:
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        sizes[str(path)] = sum(p.stat().st_size for p in files)
    return sizes


def check_carry(paths: list[Path], log: Callable[[str], None]) -> dict[str, Any]:
    """The carried paths' sizes, said; ``refused`` when together beyond the carry limit."""
    sizes = carry_sizes(paths)
    total = sum(sizes.values())
    parts = ", ".join(f"{p} {n / 2**20:.1f} MiB" for p, n in sizes.items())
    limit = CARRY_LIMIT_BYTES / 2**20
    log(f"carry: {parts}; {total / 2**20:.1f} MiB of the {limit:.0f} MiB the device tool carries")
    result: dict[str, Any] = {"bytes": sizes, "total_bytes": total}
    result["limit_bytes"] = CARRY_LIMIT_BYTES
    if total > CARRY_LIMIT_BYTES:
        result["refused"] = f"{total / 2**20:.1f} MiB is beyond the {limit:.0f} MiB carry limit"
        log(f"carry: refused: {result['refused']}")
    return result


def step_loadgen(
    log: Log, out: Path, seconds: float, dry: bool, cuda: bool, save: Callable[[], None],
    results: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """``benchmarks.loadgen`` against the learner on the GPU for each config, its JSON
    under ``out``, each row with the GPU's utilisation over its own window, into
    ``results`` config by config."""
    deadline = time.monotonic() + seconds
    streams = DRY_STREAMS if dry else None
    if shutil.which("nvidia-smi") is None:
        log("loadgen: no nvidia-smi here: GPU utilisation is not sampled")
    todo = [c for c in LOADGEN_CONFIGS if not dry or c.dry_modes]
    for config in LOADGEN_CONFIGS:
        modes = config.dry_modes if dry else LOADGEN_MODES
        if not modes:
            log(f"loadgen {config.name}: skipped: the dry run measures the other configs")
            results[config.name] = {**config_record(config, streams or config.streams, cuda),
                                    "skipped": "dry run"}  # fmt: skip
            continue
        left = deadline - time.monotonic()
        timeout = left / max(1, len(todo))
        todo.remove(config)
        if timeout < 20:
            log(f"loadgen {config.name}: skipped: not enough of the budget left")
            results[config.name] = {**config_record(config, streams or config.streams, cuda),
                                    "skipped": "budget"}  # fmt: skip
            save()
            continue
        results[config.name] = loadgen_one(log, out, config, modes, timeout, dry, cuda)
        save()
    return results


def config_record(config: LoadgenConfig, streams: int, cuda: bool) -> dict[str, Any]:
    return {
        "env": config.env, "preset": config.preset, "model": config.torso,
        "streams": streams, "envs": 1, "device": "cuda" if cuda else "cpu",
    }  # fmt: skip


def loadgen_one(
    log: Log, out: Path, config: LoadgenConfig, modes: tuple[str, ...], timeout: float,
    dry: bool, cuda: bool,
) -> dict[str, Any]:  # fmt: skip
    """One config, one ``benchmarks.loadgen`` call per mode (the generator writes its JSON
    at the end, so a mode that runs out of time loses only itself)."""
    streams = DRY_STREAMS if dry else config.streams
    deadline = time.monotonic() + timeout
    result = {**config_record(config, streams, cuda), "modes": list(modes)}
    rows: list[dict[str, Any]] = []
    result["rows"], result["rc"], result["out"] = rows, {}, []
    for index, mode in enumerate(modes):
        left = (deadline - time.monotonic()) / (len(modes) - index)
        if left < 15:
            log(f"loadgen {config.name} {mode}: skipped: not enough of the budget left")
            rows.append({"mode": mode, "error": "skipped: not enough of the budget left"})
            continue
        path = out / f"loadgen-{config.name}-{mode}.json"
        cmd = [
            sys.executable, "-m", "benchmarks.loadgen", "--env", config.env,
            "--streams", str(streams), "--envs", "1", "--modes", mode, "--repeats", "1",
            "--device", result["device"], "--out", str(path),
            *(["--preset", config.preset] if config.preset else []),
            *(["--learner-args", f"--model {config.model}"] if config.model else []),
            *(["--warmup-s", "0.5", "--measure-s", "1", "--tape-steps", "64"] if dry else []),
            "--connect-timeout-s", f"{max(10.0, left - 5):.0f}",
        ]  # fmt: skip
        with GpuSampler() as gpu:
            code, text = run(cmd, left, log)
        log(text.strip()[-2000:])
        result["rc"][mode] = code
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            rows.append({"mode": mode, "error": f"exit {code}, no result JSON: {exc}"})
            continue
        result["out"].append(path.name)
        result["machine"] = {k: report["machine"].get(k) for k in ("cpu_model", "cpus")}
        for row in report["results"]:
            window = (row.pop("window_start", None), row.pop("window_end", None))
            gpu_seen = gpu.summary(*window) if None not in window else None
            rows.append({**row, "gpu": gpu_seen})
    return result


def unpack_relay(relay: Path, log: Log) -> list[str]:
    """Relay parts carried as they came back (``relay.tar.NN``, compressed, so a relay too
    big to carry unpacked still fits) put together in ``relay``; the parts' names."""
    parts = sorted(relay.glob("relay.tar.*"))
    if not parts:
        return []
    data = b"".join(p.read_bytes() for p in parts)
    subprocess.run(["tar", "-xzf", "-", "-C", str(relay)], input=data, check=True)
    for part in parts:
        part.unlink()
    log(f"legs: unpacked {len(parts)} relay parts into {relay}")
    return [p.name for p in parts]


def step_leg(
    log: Log, out: Path, relay: Path, seed: int, seconds: float, split: Split
) -> dict[str, Any]:
    """One ``benchmarks/gpu_leg.sh`` leg: the split's games of ``seed`` side by side in
    ``relay`` for ``seconds``, its relay parts left under ``out``."""
    if seconds < split.min_leg_s:
        log(f"legs seed {seed}: skipped: not enough of the budget left ({seconds:.0f} s)")
        return {"skipped": "budget", "seconds_left": seconds}
    flags = ["--suite", R2D2_SUITE, "--first-seed", str(seed), "--seeds", "1", *split.leg_flags]
    no_wheels = tempfile.mkdtemp(prefix="seedrl-no-wheels-")  # installed once, by gpu_check.sh
    env = {
        "OUT": str(out), "PYTHON": sys.executable, "WHEELS": no_wheels,
        "PARALLEL_ENVS": ",".join(split.games),
        # What is left of the stop's share after the runs' grace packs the relay.
        "LEG_GRACE_S": f"{max(10.0, split.leg_stop_s - 15):.0f}",
    }  # fmt: skip
    cmd = ["bash", "benchmarks/gpu_leg.sh", str(relay), f"{seconds:.0f}", *flags]
    code, text = run(cmd, seconds + 2 * split.leg_stop_s, log, env=env)
    os.rmdir(no_wheels)
    log(text.strip()[-4000:])
    said = [line for line in text.splitlines() if ": done in " in line or "reached" in line]
    status = {0: "finished", 130: "to go on"}.get(code, "failed")
    return {
        "seed": seed, "games": list(split.games), "seconds": seconds, "rc": code,
        "status": status, "said": said, "runs": run_states(relay, seed, split.games),
        "relay_parts": {p.name: p.stat().st_size for p in sorted(out.glob("relay.tar.*"))},
    }  # fmt: skip


def run_states(relay: Path, seed: int, games: tuple[str, ...]) -> dict[str, Any]:
    """Where each game's run of ``seed`` stands: frames, training return, its greedy
    evaluation once finished."""
    from benchmarks.learning.suites import SUITES

    suite = SUITES[R2D2_SUITE]
    states: dict[str, Any] = {}
    for spec in suite.envs:
        if not any(game in spec.name for game in games):
            continue
        logdir = relay / spec.name / suite.run_name(seed, suite.shapes_of(spec)[0])
        records = _records(logdir / "metrics.jsonl")
        last = records[-1] if records else {}
        state: dict[str, Any] = {
            "frames": last.get("frames", 0), "target_frames": spec.frames,
            "train_return_mean": last.get("episode_return_mean"),
            "checkpoint": (logdir / "checkpoint.pt").exists(),
        }  # fmt: skip
        with contextlib.suppress(OSError, ValueError):
            done = json.loads((logdir / "run.json").read_text())
            state["eval"] = done.get("eval")
            state["frames"] = done.get("frames", state["frames"])
        states[spec.name] = state
    return states


def step_tables(log: Log, out: Path, relay: Path) -> dict[str, Any]:
    """The GPU block of docs/performance.md and the R2D2 MinAtar table of
    docs/learning.md regenerated into copies under ``out/docs`` (a lent host's checkout
    does not come back; ``out`` does)."""
    docs = out / "docs"
    docs.mkdir(exist_ok=True)
    result: dict[str, Any] = {}
    perf = docs / "performance.md"
    shutil.copyfile(ROOT / "docs" / "performance.md", perf)
    before = perf.read_text()
    cmd = [sys.executable, "-m", "benchmarks.gpu_table", str(out / "summary.json"),
           "--update", str(perf)]  # fmt: skip
    code, text = run(cmd, 60, log)
    log(text.strip()[-1000:])
    result["performance"] = {"rc": code, "changed": perf.read_text() != before}
    learning = docs / "learning.md"
    shutil.copyfile(ROOT / "docs" / "learning.md", learning)
    if not (relay / "summary.json").exists():
        log(f"tables: no {R2D2_SUITE} results in {relay}: docs/learning.md not regenerated")
        result["learning"] = {"skipped": f"no results in {relay}"}
        return result
    before = learning.read_text()
    cmd = [sys.executable, "-m", "benchmarks.learning", "table", "--out", str(relay),
           "--doc", str(learning)]  # fmt: skip
    code, text = run(cmd, 90, log)
    log(text.strip()[-1000:])
    curves = sorted(str(p.relative_to(docs)) for p in (docs / "learning").rglob("*.png"))
    result["learning"] = {"rc": code, "changed": learning.read_text() != before, "curves": curves}
    return result


# ---------------------------------------------------------------------- timings worker


def _median_time(fn: Callable[[], object], sync: Callable[[], None], n: int, cap_s: float):
    """Median seconds of ``fn`` over up to ``n`` calls after one warm-up, within ``cap_s``."""
    fn()
    sync()
    times: list[float] = []
    began = time.perf_counter()
    while len(times) < n and time.perf_counter() - began < cap_s:
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, len(times)


def timings_main(rows_path: Path, short: bool) -> None:
    """Forward and training-step times (ms) per preset, device, precision and trainer,
    appended to ``rows_path`` as JSON lines as each is measured."""
    import torch

    torch.set_num_threads(4)
    cap = 0.5 if short else 1.0
    devices = ["cuda", "cpu"] if torch.cuda.is_available() else ["cpu"]
    for preset, model in (("cartpole", None), ("atari", None), ("atari", "resnet")):
        for device in devices:
            # bf16 on the CPU too: CPUs with native bf16 instructions train the CNNs
            # faster in it, while the GPU at these batch sizes does not.
            for precision in ("fp32", "bf16"):
                try:
                    row = _time_one(preset, device, precision, cap, model)
                except Exception as exc:  # the other rows still count
                    row = {"preset": preset, "model": model, "device": device,
                           "precision": precision,
                           "error": f"{type(exc).__name__}: {exc}"}  # fmt: skip
                with rows_path.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(json.dumps(row), flush=True)


def _time_one(
    preset: str, device: str, precision: str, cap: float, model: str | None = None
) -> dict[str, Any]:
    import numpy as np
    import torch

    from learner.agents.policy import inference_policy
    from learner.parts import build_learner, make_trainer
    from learner.training.device_host import DeviceHost
    from seedrl.config import LearnerConfig
    from seedrl.presets import load_preset

    sync: Callable[[], None] = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    logdir = tempfile.mkdtemp(prefix="seedrl-gpu-timings-")
    settings = {**load_preset(preset), "device": device, "precision": precision}
    if model:
        settings["model"] = model
    config = LearnerConfig(**{**settings, "logdir": logdir, "trainer": "thread"})
    learner = build_learner(config)
    builder, head = learner.builder, learner.head
    rng = np.random.default_rng(0)
    row: dict[str, Any] = {
        "preset": preset, "model": learner.model.spec.torso, "device": device,
        "precision": precision,
    }  # fmt: skip
    policy = inference_policy(learner.model, head, learner.device, "auto", 0, precision)
    for b in (64, 256):
        obs = rng.integers(0, 255, (b, *builder.obs_shape)).astype(builder.obs_dtype)
        first = np.zeros(b, bool)

        def forward(obs: np.ndarray = obs, first: np.ndarray = first) -> object:
            return policy(obs, first, ())

        row[f"forward_b{b}_ms"], _ = _median_time(forward, sync, 200, cap)
    unrolls = builder.empty_unrolls(config.batch_size)
    unrolls.obs[...] = rng.integers(0, 255, unrolls.obs.shape).astype(unrolls.obs.dtype)
    unrolls.reward[...] = rng.normal(size=unrolls.reward.shape)
    unrolls.first[...] = rng.random(unrolls.first.shape) < 0.01
    trainer = make_trainer(learner)
    ms, n = _median_time(lambda: trainer.train_step(unrolls), sync, 50, cap)
    row["train_step_thread_ms"], row["train_steps_timed"] = ms, n
    if device == "cuda":
        resident = DeviceHost(learner.trainer_parts(), learner.queue, builder)
        twin = resident.inference_model
        row["train_step_device_ms"], _ = _median_time(
            lambda: resident.train(unrolls, updates=1), sync, 50, cap
        )

        def handoff() -> None:
            resident._published += 1  # a new step to hand over, without training one
            resident.refresh_weights()

        row["handoff_device_ms"], _ = _median_time(handoff, sync, 200, cap)
        live = list(learner.model.state_dict().values())
        host = [t.detach().cpu().share_memory_() for t in live]
        inferred = list(twin.state_dict().values())

        def through_host() -> None:  # what the process trainer and its parent do per step
            for h, t in zip(host, live, strict=True):
                h.copy_(t)
            for i, h in zip(inferred, host, strict=True):
                i.copy_(h)

        row["handoff_host_ms"], _ = _median_time(through_host, sync, 200, cap)
    row["params"] = sum(p.numel() for p in learner.model.parameters())
    row["batch"] = f"{config.batch_size}x{config.unroll_length + 1}"
    shutil.rmtree(logdir, ignore_errors=True)
    return row


# ---------------------------------------------------------------------- main


STEPS = ("info", "tests", "train", "timings", "bench", "loadgen", "legs", "tables")
DEFAULT_STEPS = "info,loadgen,legs,tables"
"""What the project owes a GPU host; the accelerator check (``info,tests,train,timings,
bench``, its table in docs/performance.md) ran on the H200 and is named to run again."""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["timings"]:
        timings_main(Path(argv[1]), "--short" in argv)
        return 0
    parser = argparse.ArgumentParser(
        prog="benchmarks/gpu_check.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", default=os.environ.get("OUT") or "gpu-check-out")
    parser.add_argument(
        "--budget-s", type=float, default=None,
        help="whole run, seconds (default 550, dry run 180)",
    )  # fmt: skip
    parser.add_argument(
        "--steps", default=DEFAULT_STEPS, help=f"comma-separated, in this order, of {STEPS}"
    )
    parser.add_argument(
        "--dry-run", "--short", dest="dry_run", action="store_true",
        help="every step at toy size, on the CPU too (CUDA-only parts skip, saying so)",
    )  # fmt: skip
    parser.add_argument(
        "--relay", default=DEFAULT_RELAY,
        help=f"the {R2D2_SUITE} results directory the legs go on from (carried; relay.tar.NN "
        "parts in it are unpacked first)",
    )  # fmt: skip
    parser.add_argument("--wheels", default=os.environ.get("WHEELS") or ".whl")
    parser.add_argument(
        "--carry-check", action="store_true",
        help="only say the size of the wheels and the relay; exit 2 beyond the carry limit",
    )  # fmt: skip
    args = parser.parse_args(argv)
    steps = [x for x in args.steps.split(",") if x]
    unknown = sorted(set(steps) - set(STEPS))
    if unknown or not steps:
        parser.error(f"--steps: unknown {unknown}; choose from {', '.join(STEPS)}")
    relay = Path(args.relay).resolve()
    carried = [Path(args.wheels), relay]
    if args.carry_check:
        return 2 if check_carry(carried, print).get("refused") else 0
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    log = Log(out / "check.log")
    budget_s = args.budget_s or (180.0 if args.dry_run else 550.0)
    budget = Budget(budget_s)
    cuda = cuda_available()
    split = DRY_SPLIT if args.dry_run else GPU_SPLIT
    summary: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "steps": steps, "dry_run": args.dry_run, "budget_s": budget_s,
    }  # fmt: skip

    def save() -> None:
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")

    def guarded(name: str, fn: Callable[[], Any]) -> None:
        began = time.monotonic()
        try:
            summary[name] = fn()
        except Exception as exc:  # one failing step must not stop the others
            log(f"{name}: failed: {type(exc).__name__}: {exc}")
            partial = summary.get(name)  # what the step recorded before it failed stays
            error = f"{type(exc).__name__}: {exc}"
            summary[name] = (
                {**partial, "error": error} if isinstance(partial, dict) else {"error": error}
            )
        log(f"{name}: done in {time.monotonic() - began:.0f} s, {budget.left():.0f} s left")
        save()

    summary["carry"] = check_carry(carried, log)
    save()
    if summary["carry"].get("refused"):
        return 2
    if "info" in steps:
        guarded("info", lambda: step_info(log))
    if not cuda:
        log("no CUDA: the CUDA-only parts (GPU timings and training rows, GPU utilisation) "
            "skip; the rest runs on the CPU")  # fmt: skip
    scale = 0.25 if args.dry_run else 1.0
    if "tests" in steps:
        guarded("tests", lambda: step_tests(log, budget.allow(45, 370)))
    if "train" in steps:
        train_step(log, budget, cuda, scale, summary, save, guarded)
    if "timings" in steps:
        timings = out / "timings.jsonl"
        guarded("timings", lambda: step_timings(log, budget.allow(100, 90), args.dry_run, timings))
    if "bench" in steps:
        guarded("bench_atari", lambda: step_bench(
            log, ["--device", "auto", "--preset", "atari", "--sweep", "4x8", *BENCH_MODES],
            out / "bench_atari.json", budget.allow(60, 45)))  # fmt: skip
        guarded("bench_cartpole", lambda: step_bench(
            log, ["--device", "auto", "--sweep", "2x8", *BENCH_MODES],
            out / "bench_cartpole.json", budget.allow(45, 0)))  # fmt: skip
    tables_s = split.tables_s if "tables" in steps else 0.0
    if "loadgen" in steps:
        loadgen: dict[str, Any] = {}
        summary["loadgen"] = loadgen
        seconds = budget.allow(split.loadgen_s, tables_s)
        guarded("loadgen", lambda: step_loadgen(log, out, seconds, args.dry_run, cuda, save,
                                                loadgen))  # fmt: skip
    if "legs" in steps:
        legs: dict[str, Any] = {}
        summary["legs"] = legs

        def all_legs() -> dict[str, Any]:
            legs["relay"] = str(relay)
            legs["unpacked"] = unpack_relay(relay, log)
            for seed in (0, 1):
                if seed and legs["seed0"].get("rc") != 0:
                    log("legs seed 1: skipped: seed 0 has not finished")
                    legs["seed1"] = {"skipped": "seed 0 has not finished"}
                    break
                seconds = budget.left() - split.leg_stop_s - tables_s
                legs[f"seed{seed}"] = step_leg(log, out, relay, seed, seconds, split)
                save()
            return legs

        guarded("legs", all_legs)
    summary["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    save()
    if "tables" in steps:
        guarded("tables", lambda: step_tables(log, out, relay))
    log(f"wrote {out}/summary.json")
    return 0


def train_step(
    log: Log, budget: Budget, cuda: bool, scale: float, summary: dict[str, Any],
    save: Callable[[], None], guarded: Callable[[str, Callable[[], Any]], None],
) -> None:  # fmt: skip
    """The short trainings with local actors, each row saved as it finishes."""
    cpus = os.cpu_count() or 2
    atari_actors = (max(1, min(12, cpus - 4)), 8)
    cartpole_actors = (max(1, min(8, cpus - 4)), 16)
    rows = ("device", "cuda"), ("process", "cuda"), ("process", "cpu")
    # (name, preset, device, trainer, window s, actors x envs, model other than the preset's)
    runs: list[tuple[str, str, str, str, float, tuple[int, int], str | None]]
    runs = [(f"atari-{t}-{d}", "atari", d, t, 15 * scale, atari_actors, None) for t, d in rows]
    runs.append(("atari-resnet-device-cuda", "atari", "cuda", "device", 15 * scale,
                 atari_actors, "resnet"))  # fmt: skip
    runs += [
        (f"cartpole-{t}-{d}", "cartpole", d, t, 6 * scale, cartpole_actors, None) for t, d in rows
    ]
    train: dict[str, Any] = {}
    summary["train"] = train
    for name, preset, device, trainer, seconds, actors, model in runs:
        if device == "cuda" and not cuda:
            log(f"train {name}: skipped: no CUDA device")
            train[name] = {"skipped": "no CUDA device"}
            continue
        if budget.allow(seconds + 30, 190) < seconds + 30:
            log(f"train {name}: skipped: not enough of the budget left")
            train[name] = {"skipped": "budget"}
            continue

        def one(name=name, preset=preset, device=device, trainer=trainer,
                seconds=seconds, actors=actors, model=model) -> dict[str, Any]:  # fmt: skip
            return train_run(name, preset, device, trainer, seconds, actors, log, model)

        guarded(f"train.{name}", one)
        train[name] = summary.pop(f"train.{name}")
        save()


if __name__ == "__main__":
    sys.exit(main())
