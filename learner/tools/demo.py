"""``python -m learner demo``: one learner and local actors train CartPole-v1 until solved.

Starts the learner (live progress on this terminal) and an actor launcher as two OS
processes on loopback, waits until the mean return of the last 100 episodes reaches the
target, lets both stop cleanly, then renders the learning curve. The learner trains with
the ``cartpole`` preset: raw rewards and the values tuned to solve CartPole in few updates.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from learner.tools.local_actors import start_local_actors, stop_local_actors
from learner.tools.plot import plot_run
from seedrl.config import ActorConfig
from seedrl.transport import free_port


def wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 120.0) -> bool:
    """True once something accepts TCP connections on loopback ``port`` (False if ``proc`` died)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.2)
    return False


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m learner demo", description=__doc__)
    parser.add_argument("--logdir", default="runs/demo")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--target-return", type=float, default=475.0)
    parser.add_argument("--max-seconds", type=float, default=900.0)
    parser.add_argument("--num-actors", type=int, default=2)
    parser.add_argument("--envs-per-actor", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "learner_args", nargs=argparse.REMAINDER, help="extra learner flags after --"
    )
    args = parser.parse_args(argv)
    logdir = Path(args.logdir)
    if logdir.exists() and any(logdir.iterdir()):
        logdir = logdir.with_name(f"{logdir.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    logdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    port = free_port()
    extra = [a for a in args.learner_args if a != "--"]
    learner_cmd = [
        sys.executable, "-m", "learner", "--preset", "cartpole", "--env", args.env,
        "--port", str(port),
        "--logdir", str(logdir), "--target-return", str(args.target_return),
        "--max-seconds", str(args.max_seconds), "--seed", str(args.seed), *extra,
    ]  # fmt: skip
    actor_config = ActorConfig(
        learner=f"127.0.0.1:{port}",
        num_actors=args.num_actors,
        envs_per_actor=args.envs_per_actor,
        seed=args.seed,
        allow_env_module=(args.env,),  # this host chose the env: its actors may build it
    )
    print(
        f"seedrl demo: {args.env}, {args.num_actors} actors x {args.envs_per_actor} envs, "
        f"logs in {logdir}"
    )
    learner = subprocess.Popen(learner_cmd)
    if not wait_for_port(port, learner):
        learner.terminate()
        print("seedrl demo: the learner did not start listening", file=sys.stderr)
        return learner.wait() or 1
    actors = start_local_actors(actor_config, logdir / "actors.log")
    try:
        learner_code = learner.wait()
    except KeyboardInterrupt:
        learner.terminate()
        learner_code = learner.wait()
    stop_local_actors(actors)
    if learner_code != 0:
        print(f"seedrl demo: learner exited with {learner_code}", file=sys.stderr)
        return learner_code
    png = plot_run(logdir)
    result = json.loads((logdir / "result.json").read_text())
    verdict = "SOLVED" if result["solved"] else "not solved"
    print(
        f"seedrl demo: {verdict} {args.env} in {result['wall_time_s']:.1f} s and "
        f"{result['frames']:,} frames (mean return {result['episode_return_mean']:.1f}).\n"
        f"  metrics: {logdir / 'metrics.jsonl'}\n  TensorBoard: {logdir} "
        f"(make tensorboard LOGDIR={logdir})\n  checkpoint: {logdir / 'checkpoint.pt'}\n"
        f"  learning curve: {png}"
    )
    return 0 if result["solved"] else 1
