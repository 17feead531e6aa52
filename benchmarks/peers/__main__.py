"""``python -m benchmarks.peers``: seedrl beside stable-baselines3 PPO and Sample Factory
APPO, and seedrl's SAC beside a single-process SAC loop, on the same machine in the same
run, one system at a time.

    python -m benchmarks.peers run [--out benchmarks/results/peers.json] [--only sb3,...]
        [--suite default|structured]
    python -m benchmarks.peers table benchmarks/results/peers.json [--update docs/performance.md]

``run`` builds each peer's virtual environment on first use (``benchmarks.peers.venvs``),
runs every system's driver as a child process under a hard time limit, echoes their
progress and writes the JSON after every system, so an interrupted run reports what it
has. A peer that fails to install or to run is recorded as failed, with the reason, and
the run goes on. ``table`` renders the JSON (``benchmarks.peers.report``).

``--suite structured`` runs, instead of CartPole and Atari, every env of the learning
benchmark's ``structured`` suite with seedrl's defaults beside SB3 PPO's, each for the
same wall time at the same number of envs.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.peers import report, venvs
from benchmarks.peers.measure import PROGRESS_PREFIX, RESULT_PREFIX, parse_result
from benchmarks.results_table import write_block

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = Path("benchmarks/results/peers.json")
TAIL_LINES = 40
"""Output lines kept per driver for the failure reason (the whole output goes to its log)."""
PIPE_CLOSE_S = 30.0
"""How long after stopping a driver its output may still take to end."""
KEY_PACKAGES = (
    "stable-baselines3",
    "sample-factory",
    "pufferlib",
    "torch",
    "gymnasium",
    "numpy",
    "ale-py",
)


@dataclass(frozen=True)
class Caps:
    """How long each system may run, so that the whole run always ends."""

    target: float = 475.0
    """Mean return over the last 100 training episodes that counts as solved."""
    cartpole_wall_cap_s: float = 120.0
    """CartPole: give up this long after launching the system's process."""
    cartpole_frame_cap: int = 2_000_000
    """CartPole: give up after this many frames (SB3 stops at the zoo's 1e5 timesteps)."""
    atari_warmup_s: float = 15.0
    """Atari: seconds after the first frames that are left out of the rate."""
    atari_measure_s: float = 30.0
    """Atari: seconds over which the steady rate is measured."""
    grace_s: float = 90.0
    """Atari start-up allowance, and how long past its cap a driver may take to stop."""
    structured_wall_cap_s: float = 300.0
    """Structured suite: each system trains this long from launching its process."""
    sac_warmup_s: float = 20.0
    """SAC: seconds after the first update that are left out of the rates."""
    sac_measure_s: float = 60.0
    """SAC: seconds over which the update and env-step rates are measured."""
    seed: int = 0


@dataclass(frozen=True)
class Task:
    peer: str
    system: str
    task: str
    venv: str | None
    """The peer's environment in ``venvs.PINS``; None: seedrl's own interpreter."""
    module: str
    env: str = ""
    """The env id of a structured or SAC task (empty for CartPole and Atari)."""

    @property
    def short_env(self) -> str:
        """The env id without its module (``lit_cell`` for a structured suite's env)."""
        return report.short_env(self.env)

    @property
    def name(self) -> str:
        """The row's log and run directory name."""
        return f"{self.peer}-{self.task}" + (f"-{self.short_env}" if self.env else "")


SAC_ENV = "HalfCheetah-v5"
"""The robot SAC's throughput is measured on (the ``mujoco-sac`` preset's own env)."""
TASKS = (
    Task("seedrl", "seedrl V-trace", "cartpole", None, "benchmarks.peers.seedrl_driver"),
    Task("sb3", "stable-baselines3 PPO", "cartpole", "sb3", "benchmarks.peers.sb3_driver"),
    Task("sample-factory", "Sample Factory APPO", "cartpole", "sample-factory",
         "benchmarks.peers.sf_driver"),
    Task("seedrl", "seedrl V-trace", "atari", None, "benchmarks.peers.seedrl_driver"),
    Task("sample-factory", "Sample Factory APPO", "atari", "sample-factory",
         "benchmarks.peers.sf_driver"),
    Task("pufferlib", "PufferLib PPO", "cartpole", "pufferlib", "benchmarks.peers.puffer_driver"),
    Task("pufferlib", "PufferLib PPO", "atari", "pufferlib", "benchmarks.peers.puffer_driver"),
    Task("seedrl", "seedrl SAC", "sac", None, "benchmarks.peers.seedrl_driver", SAC_ENV),
    Task("sac-loop", "single-process SAC loop", "sac", None, "benchmarks.peers.sac_loop_driver",
         SAC_ENV),
)  # fmt: skip


def structured_tasks() -> tuple[Task, ...]:
    """seedrl's defaults and SB3 PPO's on every env of the ``structured`` learning suite."""
    from benchmarks.learning.suites import SUITES

    return tuple(
        task
        for spec in SUITES["structured"].envs
        for task in (
            Task("seedrl", "seedrl V-trace", "structured", None,
                 "benchmarks.peers.seedrl_driver", spec.env),
            Task("sb3", "stable-baselines3 PPO", "structured", "sb3",
                 "benchmarks.peers.sb3_driver", spec.env),
        )
    )  # fmt: skip


PEER_SUITES = ("default", "structured")
"""``--suite``: CartPole and Atari (``TASKS``), or the structured learning suite."""


def suite_tasks(name: str) -> tuple[Task, ...]:
    if name == "structured":
        return structured_tasks()
    if name == "default":
        return TASKS
    raise ValueError(f"unknown peers suite {name!r}; known: {', '.join(PEER_SUITES)}")


def structured_shape() -> tuple[int, int]:
    """The structured suite's actors and envs each: SB3 steps as many envs in all."""
    from benchmarks.learning.suites import SUITES

    suite = SUITES["structured"]
    return suite.num_actors, suite.envs_per_actor


def structured_levels(env: str) -> dict[str, float]:
    """The env's random and upper levels, which its table rows are read between."""
    from benchmarks.learning.structured import levels_of

    levels = levels_of(env)
    return {"random_level": levels.random, "upper_level": levels.upper}


def driver_args(task: Task, caps: Caps, workdir: Path, launched_at: float) -> list[str]:
    """The driver's command-line arguments for this task under these caps."""
    args = [f"--launched-at={launched_at!r}", f"--seed={caps.seed}"]
    if task.peer in ("seedrl", "sac-loop"):
        args.append(f"--logdir={workdir}")
    elif task.peer == "sample-factory":
        args.append(f"--train-dir={workdir}")
    elif task.peer == "pufferlib":
        args.append(f"--data-dir={workdir}")
    if task.task == "structured":
        actors, each = structured_shape()
        args += [f"--env={task.env}", f"--wall-cap-s={caps.structured_wall_cap_s}"]
        if task.peer == "sb3":
            return [*args, f"--num-envs={actors * each}"]
        return [task.task, *args, f"--num-actors={actors}", f"--envs-per-actor={each}"]
    if task.task == "sac":
        args += [f"--env={task.env}", f"--warmup-s={caps.sac_warmup_s}",
                 f"--measure-s={caps.sac_measure_s}",
                 f"--wall-cap-s={wall_cap(task, caps)}"]  # fmt: skip
        return [task.task, *args]
    if task.task == "cartpole":
        args += [f"--target={caps.target}", f"--wall-cap-s={caps.cartpole_wall_cap_s}"]
        if task.peer != "sb3":
            args.append(f"--frame-cap={caps.cartpole_frame_cap}")
        return [task.task, *args] if task.peer != "sb3" else args
    args += [f"--warmup-s={caps.atari_warmup_s}", f"--measure-s={caps.atari_measure_s}",
             f"--wall-cap-s={wall_cap(task, caps)}"]  # fmt: skip
    return [task.task, *args]


def wall_cap(task: Task, caps: Caps) -> float:
    """Seconds from launch after which the driver ends training itself (Atari and SAC:
    the measured span plus ``grace_s`` for its start-up)."""
    if task.task == "cartpole":
        return caps.cartpole_wall_cap_s
    if task.task == "structured":
        return caps.structured_wall_cap_s
    if task.task == "sac":
        return caps.sac_warmup_s + caps.sac_measure_s + caps.grace_s
    return caps.atari_warmup_s + caps.atari_measure_s + caps.grace_s


def time_limit(task: Task, caps: Caps) -> float:
    """Seconds from launch after which the runner stops the driver, whatever it is doing."""
    return wall_cap(task, caps) + caps.grace_s


@dataclass
class DriverRun:
    code: int | None
    """The exit code; None when the driver was stopped at its time limit."""
    tail: list[str]
    """The last lines of its output (all of it is in the log)."""
    result: dict[str, Any] | None
    """Its result line, wherever in the output it came."""


def run_driver(
    cmd: list[str], env: dict[str, str], log: Path, limit_s: float, label: str
) -> DriverRun:
    """Run one driver with its output in ``log`` and its progress lines echoed, stopping
    it (and all it started) at ``limit_s``."""
    lines: queue.Queue[str | None] = queue.Queue()
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, errors="replace", start_new_session=True,
        )  # fmt: skip
        assert proc.stdout is not None
        stdout = proc.stdout

        def pump() -> None:
            for line in stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + limit_s
        tail: list[str] = []
        results: list[str] = []
        killed = False
        try:
            while True:
                try:
                    line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
                except queue.Empty:
                    line = ""
                if line is None:
                    break
                if line:
                    out.write(line)
                    tail = [*tail[-(TAIL_LINES - 1) :], line.rstrip("\n")]
                    if line.startswith(RESULT_PREFIX):
                        results.append(line)
                    if line.startswith(PROGRESS_PREFIX):
                        print(f"  {label}: {line[len(PROGRESS_PREFIX) :].rstrip()}", flush=True)
                if time.monotonic() >= deadline and not killed:
                    _stop_group(proc)
                    killed = True
                if killed and time.monotonic() >= deadline + PIPE_CLOSE_S:
                    break  # something outside its session still holds the pipe open
        except BaseException:  # Ctrl-C or SIGTERM: the driver has its own session
            _stop_group(proc)
            raise
        code = proc.wait()
    return DriverRun(None if killed else code, tail, parse_result("".join(results)))


def _stop_group(proc: subprocess.Popen[str]) -> None:
    """End the driver and every process it started (its own session)."""
    for sig, wait_s in ((signal.SIGINT, 15.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def failure_reason(code: int | None, tail: list[str], limit_s: float) -> str:
    """One line that says why a driver produced no result."""
    if code is None:
        return f"stopped after {limit_s:.0f} s without a result"
    last = next((line.strip() for line in reversed(tail) if line.strip()), "")
    return f"exited with {code}" + (f": {last[:200]}" if last else " and printed nothing")


FAILED_INSTALLS: dict[str, str] = {}
"""This run's environments that failed to build, with the reason: a peer's second task
gets the reason rather than a second build of many minutes."""


def run_task(task: Task, caps: Caps, out_dir: Path, venv_root: Path) -> dict[str, Any]:
    """One system's row: its driver's result, or why there is none."""
    name = task.name
    row: dict[str, Any] = {"peer": task.peer, "system": task.system, "task": task.task}
    if task.env:
        row["env"] = task.env
    if task.task == "structured":
        row.update(structured_levels(task.env), wall_cap_s=caps.structured_wall_cap_s)
    log = out_dir / f"{name}.log"
    row["log"] = str(log)
    if task.venv is None:
        python = sys.executable
        row["versions"] = seedrl_versions()
    else:
        started = time.monotonic()
        path = venvs.venv_dir(venv_root, task.venv, venvs.PINS[task.venv])
        if venvs.read_stamp(path) is None:
            print(f"  building {path} (first run only, a few minutes)", flush=True)
        if task.venv in FAILED_INSTALLS:  # the same build again would fail the same way
            return {**row, "status": "failed", "reason": FAILED_INSTALLS[task.venv]}
        try:
            venv = venvs.ensure(task.venv, venv_root, out_dir / f"{task.venv}-install.log")
        except (venvs.VenvError, OSError, subprocess.SubprocessError) as exc:
            FAILED_INSTALLS[task.venv] = f"install: {exc}"
            return {**row, "status": "failed", "reason": FAILED_INSTALLS[task.venv]}
        if time.monotonic() - started > 1.0:
            print(f"  built it in {time.monotonic() - started:.0f} s", flush=True)
        python = str(venv.python)
        row["versions"] = {k: v for k, v in venv.versions.items() if k in KEY_PACKAGES}
    workdir = fresh_dir(out_dir / name)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    limit = time_limit(task, caps)
    launched = time.monotonic()
    cmd = [python, "-m", task.module, *driver_args(task, caps, workdir, launched)]
    run = run_driver(cmd, env, log, limit, name)
    row["command_s"] = time.monotonic() - launched
    if run.result is None:
        return {**row, "status": "failed", "reason": failure_reason(run.code, run.tail, limit)}
    return {**row, **run.result, "status": "ok", "exit_code": run.code}


def fresh_dir(path: Path) -> Path:
    """``path``, emptied: a run directory left by an earlier run would mix its records in
    (seedrl appends to ``metrics.jsonl``)."""
    if path.exists():
        shutil.rmtree(path)
    return path


def seedrl_versions() -> dict[str, str]:
    from importlib import metadata

    found = {}
    for dist in ("seedrl", *KEY_PACKAGES):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return found


def machine() -> dict[str, Any]:
    from benchmarks.bench.report import machine_info

    return {**machine_info(), "cpus_usable": len(os.sched_getaffinity(0))}


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, _interrupt)  # so the running driver is stopped too
    caps = Caps(
        cartpole_wall_cap_s=args.cartpole_wall_cap_s,
        atari_warmup_s=args.atari_warmup_s,
        atari_measure_s=args.atari_measure_s,
        grace_s=args.grace_s,
        structured_wall_cap_s=args.structured_wall_cap_s,
        sac_warmup_s=args.sac_warmup_s,
        sac_measure_s=args.sac_measure_s,
        seed=args.seed,
    )
    only = {p for p in args.only.split(",") if p}
    tasks_wanted = {t for t in args.tasks.split(",") if t}
    envs_wanted = {e for e in args.envs.split(",") if e}
    tasks = [
        t for t in suite_tasks(args.suite)
        if (not only or t.peer in only) and (not tasks_wanted or t.task in tasks_wanted)
        and (not envs_wanted or t.short_env in envs_wanted)
    ]  # fmt: skip
    out = Path(args.out)
    out_dir = Path(args.workdir)
    out_dir.mkdir(parents=True, exist_ok=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    doc: dict[str, Any] = {
        "schema": report.SCHEMA,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(),
        "settings": {**asdict(caps), "note": args.note},
        "results": [],
    }
    kept = earlier_rows(out, tasks, caps) if args.merge else []
    for i, task in enumerate(tasks, 1):
        where = f"{task.task} {task.env}" if task.env else task.task
        print(f"[{i}/{len(tasks)}] {task.system}, {where}", flush=True)
        row = run_task(task, caps, out_dir, Path(args.venv_root).expanduser())
        row["date"] = doc["date"]
        doc["results"].append(row)
        doc["results"] = [*kept, *[r for r in doc["results"] if r not in kept]]
        doc["wall_time_s"] = time.monotonic() - started
        out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        print(f"  {task.name}: {summary(row)}", flush=True)
    print(f"wrote {out} ({doc.get('wall_time_s', 0) / 60:.1f} min)")
    return 0


def earlier_rows(out: Path, tasks: list[Task], caps: Caps) -> list[dict[str, Any]]:
    """The rows of ``out`` that this run does not redo (other systems, tasks, seeds or, for
    the structured suite, wall caps), each keeping the date it was measured on: ``--merge``
    adds a system, a seed or a longer budget to a committed run."""
    if not out.exists():
        return []
    old = json.loads(out.read_text())
    cap = caps.structured_wall_cap_s
    redone = {(t.peer, t.task, t.env, caps.seed, cap if t.task == "structured" else None)
              for t in tasks}  # fmt: skip

    def key(row: dict[str, Any]) -> tuple[Any, ...]:
        task = row.get("task")
        row_cap = report.row_wall_cap(row) if task == "structured" else None
        return (row.get("peer"), task, row.get("env", ""), report.row_seed(row), row_cap)

    return [
        {**row, "date": row.get("date", old.get("date"))}
        for row in old.get("results", [])
        if key(row) not in redone
    ]


def summary(row: dict[str, Any]) -> str:
    if row["status"] != "ok":
        return f"failed: {row['reason']}"
    if row["task"] == "atari":
        rate = row.get("agent_steps_per_s")
        return "too short to measure" if rate is None else f"{rate:,.0f} agent steps/s"
    if row["task"] == "sac":
        rates = (row.get("updates_per_s"), row.get("env_steps_per_s"))
        if None in rates:
            return "too short to measure"
        return f"{rates[0]:,.0f} updates/s, {rates[1]:,.0f} env steps/s"
    if row["task"] == "structured":
        mean = row.get("return_mean100")
        return (f"mean-100 return {'-' if mean is None else f'{mean:.2f}'} after "
                f"{row.get('frames', 0):,} frames, {row.get('wall_s', 0):.0f} s")  # fmt: skip
    if row.get("reached"):
        return (f"target in {row['launch_to_target_s']:.1f} s from launch, "
                f"{row['frames_to_target']:,} frames")  # fmt: skip
    return f"not reached ({row.get('stopped_by')}), {row.get('frames', 0):,} frames"


def table(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    doc = json.loads(Path(args.peers_json).read_text())
    try:
        block = report.render(doc)
    except ValueError as exc:
        parser.error(str(exc))
    write_block(block, args.update, parser, report.BEGIN, report.END)
    return 0


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run seedrl and the peers, write the JSON")
    r.add_argument("--out", default=str(DEFAULT_OUT))
    r.add_argument("--workdir", default="runs/peers", help="logs and run directories")
    r.add_argument("--venv-root", default=str(venvs.DEFAULT_ROOT))
    r.add_argument("--only", default="",
                   help="peers to run: seedrl,sb3,sample-factory,pufferlib,sac-loop")  # fmt: skip
    r.add_argument("--merge", action="store_true",
                   help="keep --out's rows of the systems and tasks not run now")  # fmt: skip
    r.add_argument("--suite", choices=PEER_SUITES, default="default",
                   help="default: CartPole and Atari; structured: the structured learning "
                   "suite's envs, seedrl's and SB3 PPO's defaults")  # fmt: skip
    r.add_argument("--tasks", default="", help="cartpole,atari,sac (default all)")
    r.add_argument("--envs", default="",
                   help="structured and sac: the envs to run, by id without its module "
                   "(lit_cell,register; default all)")  # fmt: skip
    r.add_argument("--cartpole-wall-cap-s", type=_positive, default=Caps.cartpole_wall_cap_s)
    r.add_argument("--atari-warmup-s", type=_positive, default=Caps.atari_warmup_s)
    r.add_argument("--atari-measure-s", type=_positive, default=Caps.atari_measure_s)
    r.add_argument(
        "--grace-s",
        type=_positive,
        default=Caps.grace_s,
        help="Atari start-up allowance, and the time a driver gets to stop",
    )
    r.add_argument("--structured-wall-cap-s", type=_positive, default=Caps.structured_wall_cap_s,
                   help="structured suite: seconds each system trains from launch")  # fmt: skip
    r.add_argument("--sac-warmup-s", type=_positive, default=Caps.sac_warmup_s)
    r.add_argument("--sac-measure-s", type=_positive, default=Caps.sac_measure_s)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--note", default="", help="a line printed above the tables")
    t = sub.add_parser("table", help="render the JSON as docs/performance.md's peers block")
    t.add_argument("peers_json")
    t.add_argument("--update", metavar="PAGE", help="replace the block in this Markdown page")
    args = parser.parse_args(argv)
    if args.command == "run":
        known = {t.short_env for t in suite_tasks(args.suite) if t.env}
        unknown = sorted({e for e in args.envs.split(",") if e} - known)
        if unknown:
            parser.error(f"--envs: no {', '.join(unknown)} in the {args.suite} suite")
        return run(args)
    return table(args, parser)


if __name__ == "__main__":
    sys.exit(main())
