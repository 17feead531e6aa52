"""The GPU check: everything the learner's accelerator path should show, in one short run.

``bash benchmarks/gpu_check.sh`` (which installs carried wheels first) or
``python benchmarks/gpu_check.py --out DIR``. Steps, each bounded in time and each run
whatever the others did, against an overall budget (later steps shrink or skip to fit):

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

Without CUDA the CUDA-only parts skip with a line saying so; the rest runs (a dry run).
Writes ``summary.json`` (every step's result), ``check.log``, ``timings.jsonl`` and the
two bench JSONs.
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


def run(cmd: list[str], timeout: float, log: Log, cwd: Path = ROOT) -> tuple[int, str]:
    """Run ``cmd`` within ``timeout`` s; (exit code or 124 on timeout, combined output).

    The command gets its own process group, and a timeout ends the whole group: a bench
    killed alone left its learner and actors running, and loading the host, long after.
    """
    log(f"$ {' '.join(cmd)}  (<= {timeout:.0f} s)")
    proc = subprocess.Popen(
        cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=os.environ.copy(), start_new_session=True,
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
        self.samples: list[tuple[float, float]] = []
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
                self.samples.append((util, mem))

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(5)
        if self._thread is not None:
            self._thread.join(2)

    def summary(self) -> dict[str, Any] | None:
        if not self.samples:
            return None
        utils = [u for u, _ in self.samples]
        return {
            "samples": len(utils),
            "util_mean": statistics.fmean(utils),
            "util_max": max(utils),
            "util_busy_mean": statistics.fmean([u for u in utils if u > 0] or [0.0]),
            "memory_mib_max": max(m for _, m in self.samples),
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
    parser.add_argument("--budget-s", type=float, default=470.0, help="whole run, seconds")
    parser.add_argument("--short", action="store_true", help="dry run: every step much shorter")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = Log(out / "check.log")
    budget = Budget(args.budget_s)
    cuda = cuda_available()
    scale = 0.25 if args.short else 1.0
    summary: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    def save() -> None:
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")

    def guarded(name: str, fn: Callable[[], Any]) -> None:
        began = time.monotonic()
        try:
            summary[name] = fn()
        except Exception as exc:  # one failing step must not stop the others
            log(f"{name}: failed: {type(exc).__name__}: {exc}")
            summary[name] = {"error": f"{type(exc).__name__}: {exc}"}
        log(f"{name}: done in {time.monotonic() - began:.0f} s, {budget.left():.0f} s left")
        save()

    guarded("info", lambda: step_info(log))
    if not cuda:
        log("no CUDA: the CUDA-only steps (GPU timings, cuda training rows) skip; CPU rows run")
    guarded("tests", lambda: step_tests(log, budget.allow(45, 370)))

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

    timings = out / "timings.jsonl"
    guarded("timings", lambda: step_timings(log, budget.allow(100, 90), args.short, timings))
    guarded("bench_atari", lambda: step_bench(
        log, ["--device", "auto", "--preset", "atari", "--sweep", "4x8", *BENCH_MODES],
        out / "bench_atari.json", budget.allow(60, 45)))  # fmt: skip
    guarded("bench_cartpole", lambda: step_bench(
        log, ["--device", "auto", "--sweep", "2x8", *BENCH_MODES], out / "bench_cartpole.json",
        budget.allow(45, 0)))  # fmt: skip
    summary["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    save()
    log(f"wrote {out}/summary.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
