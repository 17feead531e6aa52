"""The Python API for notebooks and scripts: ``learner.train(...)`` -> a trained policy.

It runs the same learner as ``python -m learner`` in this process (so the model is
loaded straight from the final checkpoint afterwards) and the same actor launcher as
``python -m actors`` as a child process on loopback. It lives on the learner side
because it runs the learner (``seedrl/`` is what both sides share and imports neither);
importing it stays free of torch, which loads inside ``train``.

Example (CartPole to a mean return of 200, then use the policy)::

    import learner

    result = learner.train("CartPole-v1", target_return=200, max_seconds=300,
                          num_actors=2, envs_per_actor=16)
    print(result.episode_return_mean, result.logdir)
    env = result.policy.make_env()
    obs, _ = env.reset(seed=0)
    result.policy.reset()
    obs, reward, terminated, truncated, _ = env.step(result.policy.act(obs))
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from learner.tools.local_actors import start_local_actors, stop_local_actors
from seedrl.config import ActorConfig, LearnerConfig
from seedrl.metrics import RunResult
from seedrl.presets import build_config, load_preset

if TYPE_CHECKING:  # the real import loads torch, so it waits until train() has trained
    from learner.agents.trained_policy import Policy


@dataclass
class TrainResult(RunResult):
    """What ``learner.train`` returns: the run summary, where its files are, the policy."""

    logdir: Path
    checkpoint: Path
    policy: Policy
    """The policy loaded from the final checkpoint (``.act(obs)``)."""
    best_checkpoint: Path | None = None
    """checkpoint-best.pt, the best mean-100 return of the run (``Policy.load`` it), when
    the run kept one: a run that went on past its best may end with a worse policy."""

    def metrics(self) -> list[dict[str, Any]]:
        """The run's metrics.jsonl records (for plotting in a notebook)."""
        from seedrl.metrics import read_metrics

        return read_metrics(self.logdir)


def train(
    env: str = "CartPole-v1",
    *,
    total_frames: int | None = None,
    num_actors: int = 2,
    envs_per_actor: int = 8,
    preset: str | None = None,
    logdir: str | os.PathLike[str] | None = None,
    greedy: bool = True,
    **learner_overrides: Any,
) -> TrainResult:
    """Train a policy with a local learner and ``num_actors`` actor processes.

    ``learner_overrides`` are :class:`~seedrl.config.LearnerConfig` fields
    (``target_return=475``, ``max_seconds=120``, ``lstm=True``, ``env_kwargs={...}``);
    a ``preset`` supplies defaults below them. Stops at ``total_frames`` (by default the
    preset's budget, if it plans one), the target return or ``max_seconds``, whichever
    comes first; at least one must be set.
    """
    config = train_config(env, total_frames, preset, logdir, learner_overrides)

    from seedrl.transport import run_event_loop

    def run_learner() -> Any:
        return run_event_loop(_train(config, num_actors, envs_per_actor), config.uvloop)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        run = run_learner()  # a script: signals (Ctrl-C) stop the learner cleanly
    else:
        run = _run_in_thread(run_learner)  # a notebook: its event loop is already running

    from learner.agents.trained_policy import Policy

    checkpoint = config.checkpoint_path
    best = config.best_checkpoint_path
    return TrainResult(
        **dataclasses.asdict(run),
        logdir=Path(config.logdir),
        checkpoint=checkpoint,
        policy=Policy.load(checkpoint, greedy=greedy),
        best_checkpoint=best if best.is_file() else None,
    )


def train_config(
    env: str,
    total_frames: int | None,
    preset: str | None,
    logdir: str | os.PathLike[str] | None,
    overrides: dict[str, Any],
) -> LearnerConfig:
    """The learner config ``train`` runs: the preset, then these arguments; a fresh
    ``runs/ENV-TIME`` logdir unless one is given."""
    base = load_preset(preset) if preset else {}
    fields: dict[str, Any] = {"env": env, "port": 0, "progress": "off", **overrides}
    if total_frames is not None:  # else the preset's budget (a schedule may be planned to it)
        fields["total_frames"] = total_frames
    if preset and env == "CartPole-v1" and "env" in base:
        fields["env"] = base["env"]  # the preset's env unless one was asked for
    if logdir is None:
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", str(fields["env"])).strip("-")
        logdir = Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    fields["logdir"] = str(logdir)
    config = build_config(LearnerConfig, fields, base)
    if not (config.total_frames or config.target_return is not None or config.max_seconds):
        raise ValueError("set total_frames, target_return or max_seconds, or training never stops")
    return config


def _run_in_thread(run: Callable[[], Any]) -> Any:
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = run()
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="seedrl-train", daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


async def _train(config: LearnerConfig, num_actors: int, envs_per_actor: int) -> Any:
    """Serve until done; the actor launcher starts once the learner listens."""
    from learner.run import serve

    loop = asyncio.get_running_loop()
    ready: asyncio.Future[int] = loop.create_future()
    learner = asyncio.create_task(serve(config, ready=ready), name="learner")
    waiting: set[asyncio.Future[Any]] = {learner, ready}
    await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    if not ready.done():
        return learner.result()  # serve failed before listening: raise its error
    actor_config = ActorConfig(
        learner=f"127.0.0.1:{ready.result()}",
        num_actors=num_actors,
        envs_per_actor=envs_per_actor,
        seed=config.seed,
        auth_token=config.auth_token,
        auth_token_file=config.auth_token_file,
        allow_env_module=(config.env,),  # this process chose the env: its actors may build it
    )
    actors = start_local_actors(actor_config, Path(config.logdir) / "actors.log")
    try:
        return await learner
    finally:
        await asyncio.to_thread(stop_local_actors, actors)
