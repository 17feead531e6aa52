"""``python -m learner serve --checkpoint PATH``: a trained policy served to actors, untrained.

The learner's own serving tier (the same server, auth, TLS, health, metrics and batched
inference as training, :func:`learner.run.serve`), run as a learner whose weights and
observation statistics come from a checkpoint and stay as they are: no trainer, nothing
written to the checkpoint or beside it (the metrics go to their own ``--logdir``). Actors
are unchanged: they learn the checkpoint's env from ``GetInfo``, so a checkpoint serves
only the env (and spaces) it was trained on.

A population's checkpoint (``--population``) serves its best member, ``--member N``
another, chosen as ``evaluate`` chooses. A self-play checkpoint serves the learning policy
in every seat unless ``--opponent pool`` serves its opponent pool as training did (the
frozen snapshots and fixed opponents).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from learner.parts import SELF_PLAY_KEY, Learner
from learner.population.pbt import add_member_argument, member_checkpoint
from learner.state import checkpoint
from learner.training.hosts import TrainerHost
from seedrl import codec, envs
from seedrl.cli import ConfigArgumentParser, add_config_arguments
from seedrl.config import LearnerConfig, config_hints
from seedrl.presets import build_config
from seedrl.proto import seedrl_pb2 as pb

PROG = "python -m learner serve"
DEFAULT_LOGDIR = "runs/serve"
"""Where a serve writes its metrics unless --logdir says: never the checkpoint's folder."""
SERVING_FIELDS = frozenset(
    {
        "bind", "port", "advertise_host", "local_socket", "logdir", "device", "seed",
        "torch_threads", "precision", "greedy", "inference_batch_size",
        "inference_timeout_ms", "inference_quorum", "inference_backend", "time_phases",
        "uvloop", "serving_processes", "max_actors", "max_envs", "max_message_bytes",
        "hello_timeout_s", "stream_idle_timeout_s", "actor_envs_per_actor", "auth_token",
        "auth_token_file", "tls_cert", "tls_key", "tls_client_ca", "insecure",
        "total_frames", "max_seconds", "log_interval_s", "progress", "tensorboard",
        "metrics_port", "log_episodes", "wandb", "wandb_project", "wandb_entity",
        "wandb_mode",
    }
)  # fmt: skip
"""LearnerConfig fields this command takes from its own flags; every other one (env,
model, agent, normalisation) is the checkpoint's."""
OPPONENTS = ("pool",)


class ServeError(checkpoint.CheckpointError):
    """A checkpoint that cannot be served as asked: one line, exit 2."""


class FrozenHost:
    """The trainer host of a learner that does not train: inference runs the loaded
    weights themselves, which nothing changes."""

    mode = "none"
    error: BaseException | None = None

    def __init__(self, learner: Learner) -> None:
        self.inference_model = learner.model
        self._lock = learner.weights_lock

    @property
    def inference_lock(self) -> Any:
        return self._lock

    def start(self) -> None:
        pass

    def stop(self, timeout: float = 0.0) -> None:
        pass

    @property
    def alive(self) -> bool:
        return True

    def refresh_weights(self) -> None:
        pass

    def training_state(self) -> None:
        return None

    def metrics(self) -> dict[str, Any]:
        return {}


class CheckpointRank:
    """A learner alone that takes its initial state from a checkpoint and writes none."""

    def __init__(self, path: Path, state: dict[str, Any]) -> None:
        self.path, self.state = path, state
        self.stop_reason = ""
        self.rank_addresses: list[str] = []
        self.writes_checkpoints = False

    def attach(self, learner: Learner) -> None:
        load_policy(self.path, self.state, learner)

    def make_host(self, learner: Learner) -> TrainerHost:
        return FrozenHost(learner)

    def metrics(self) -> dict[str, Any]:
        return {}

    def checkpoint_counters(self) -> None:
        return None


def load_policy(path: Path, state: dict[str, Any], learner: Learner) -> None:
    """The checkpoint's weights, observation statistics (frozen) and, when the learner
    serves a pool, its league, into the learner built from its config; ServeError when
    the env as this host builds it has other spaces than the checkpoint's."""
    check_spaces(path, state, learner.env_spec)
    try:
        learner.agent.load_state_dict(learner.state, state)
        if learner.normalizer is not None:
            learner.normalizer.load_state_dict(state["obs_normalizer"])
        if learner.league is not None:
            learner.league.load_state_dict(state[SELF_PLAY_KEY])
    except (RuntimeError, ValueError, KeyError, TypeError) as exc:
        raise ServeError(f"{path}: does not fit the model its config describes ({exc})") from exc
    if learner.normalizer is not None:
        learner.normalizer.frozen = True  # as trained: served frames do not move it
    learner.step_counter.value = int(state.get("learner_steps", 0))


def check_spaces(path: Path, state: dict[str, Any], env_spec: pb.EnvSpec) -> None:
    """The checkpoint's env and spaces must be the ones this host's env has."""
    saved = pb.EnvSpec.FromString(state["env_spec"])
    if (mismatch := codec.space_mismatch(saved, env_spec)) is not None:
        name, theirs, ours = mismatch
        raise ServeError(
            f"{path}: trained on {saved.env_id} with {name} {theirs}; the env built here has {ours}"
        )


def serving_config(
    path: Path, state: dict[str, Any], given: dict[str, Any], opponent: str | None
) -> LearnerConfig:
    """The checkpoint's config with this command's serving fields, untrained.

    ``given``: the LearnerConfig flags on this command line (``--env`` among them, which
    must name the checkpoint's env)."""
    names = config_hints(LearnerConfig, state["config"])  # the fields and its agent's knobs
    saved = build_config(LearnerConfig, {k: v for k, v in state["config"].items() if k in names})
    if "env" in given and given["env"] != saved.env:
        raise ServeError(
            f"--env {given['env']}: the checkpoint {path} was trained on {saved.env}, and "
            "serve serves the checkpoint's env (actors learn it from GetInfo)"
        )
    if opponent is not None and not saved.self_play:
        raise ServeError(f"--opponent {opponent}: the checkpoint {path} is not a self-play run")
    defaults = LearnerConfig()
    serving = {name: given.get(name, getattr(defaults, name)) for name in SERVING_FIELDS}
    serving["logdir"] = given.get("logdir", DEFAULT_LOGDIR)
    if "actor_envs_per_actor" not in given:  # the shape the run was trained with
        serving["actor_envs_per_actor"] = saved.actor_envs_per_actor
    if Path(serving["logdir"]).resolve() == path.parent.resolve():
        raise ServeError(
            f"--logdir {serving['logdir']} holds the checkpoint; serve writes nothing beside "
            "it: give another --logdir"
        )
    return dataclasses.replace(
        saved, **serving, train=False, resume=False, standby="", target_return=None,
        self_play=saved.self_play and opponent == "pool",
    )  # fmt: skip


def parser() -> ConfigArgumentParser:
    p = ConfigArgumentParser(prog=PROG, description=__doc__)
    p.add_argument(
        "--checkpoint", required=True,
        help="a checkpoint file, or a logdir: its checkpoint.pt, or with --best its "
        "checkpoint-best.pt",
    )  # fmt: skip
    p.add_argument("--best", action="store_true", help="with a logdir: its checkpoint-best.pt")
    p.add_argument(
        "--opponent", choices=OPPONENTS,
        help="a self-play checkpoint: serve its opponent pool (snapshots and fixed opponents) "
        "in the other seat, as training did (default: the learning policy in every seat)",
    )  # fmt: skip
    add_member_argument(p)
    envs.add_allow_env_module_argument(p)
    add_config_arguments(p, LearnerConfig, only=SERVING_FIELDS | {"env"})
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from learner.__main__ import run_learner
    from learner.run import serve

    p = parser()
    ns = vars(p.parse_args(argv))
    path = Path(ns.pop("checkpoint"))
    best, opponent, allowed = ns.pop("best"), ns.pop("opponent"), ns.pop("allow_env_module")
    member = ns.pop("member")
    if path.is_dir():
        path = path / (checkpoint.BEST_FILE if best else "checkpoint.pt")
    elif best:
        p.exit(2, f"{PROG}: error: --best picks checkpoint-best.pt in a logdir, not {path}\n")
    try:
        state = member_checkpoint(path, checkpoint.load(path), member)
        checkpoint.require_one_policy(path, state)
        config = serving_config(path, state, ns, opponent)
        if "env" not in ns:  # named by the checkpoint, not by this command's user
            envs.check_env_allowed(config.env, allowed, f"checkpoint {path}")
    except (checkpoint.CheckpointError, ValueError) as exc:  # ServeError and EnvError too
        p.exit(2, f"{PROG}: error: {exc}\n")
    one = "" if "member" not in state else f" ({state['member']} of the population)"
    print(f"seedrl serve: {checkpoint.CheckpointInfo.of(path, state).describe()}{one}", flush=True)
    rank = CheckpointRank(path, state)
    return run_learner(PROG, lambda: serve(config, rank=rank), config.uvloop)


if __name__ == "__main__":
    sys.exit(main())
