"""Several learner ranks (one per GPU) with ``torch.distributed``: synchronous data parallelism.

``torchrun --nproc-per-node=G -m learner --port P ...`` starts G learner processes. Each
rank is a whole learner: it serves its own actors on port ``P + rank``, batches their
inference on its own device, builds its own unrolls and trains on them. Every learner
step the ranks average their gradients with one ``all_reduce`` (NCCL on CUDA, gloo on
CPU), so all ranks apply the same update and hold identical weights; rank 0's initial
state (fresh or ``--resume``d) is broadcast before anyone serves. No parameter server.

Lockstep without stalls: each step starts with a tiny control ``all_reduce`` of
``[has_batch, stop_vote, frames, episodes]``. A rank whose own batch is not ready within
``WAIT_FOR_BATCH_S`` joins with ``has_batch = 0`` and contributes zero gradients; the
gradient sum is divided by the number of ranks that did contribute, and every rank
(contributing or not) applies the same optimizer step. So a rank without actors slows
the others to at most ``1 / WAIT_FOR_BATCH_S`` steps per second instead of blocking
them; give every rank actors. The same exchange makes stopping collective: a rank that
stops (signal, time limit, target return) votes, and every rank's trainer leaves after
the same step, then their supervisors stop too. ``--total-frames`` counts the frames of
all ranks together.

Log directories: rank 0 writes into ``--logdir`` itself (metrics.jsonl with the extra
``frames_all_ranks`` and ``episodes_all_ranks`` keys, the only checkpoint, ``ranks.json``
at the end); rank r > 0 writes its own metrics and result into ``--logdir/rank{r}/``.
At the end the ranks all-gather their frame counts and a SHA-256 of their parameters:
``ranks.json`` holds the combined frames (the exact sum of the ranks') and whether the
parameters are bit-identical.

Actors find the ranks through ``GetInfo.rank_addresses`` (actor i uses rank i mod G), so
they need only rank 0's address.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import json
import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from learner.agents.base import Store
from learner.state.trajectories import TrajectoryBuilder, Unrolls
from learner.training.hosts import ThreadHost, trainer_mode
from learner.training.trainer import Trainer, TrainerParts, agent_training_state, to_time_major
from seedrl.config import LearnerConfig
from seedrl.transport import listen_address

if TYPE_CHECKING:
    from learner.parts import Learner
    from seedrl.metrics import RunResult

log = logging.getLogger(__name__)

WAIT_FOR_BATCH_S = 0.1
"""How long a rank waits for its own batch before joining a step without one."""
COLLECTIVE_TIMEOUT_S = 300.0
"""A collective that waits longer than this fails (a rank died or hangs)."""
RANKS_FILE = "ranks.json"


@dataclasses.dataclass(frozen=True)
class RankEnv:
    """This process's place in the job, from the variables torchrun sets."""

    rank: int
    world_size: int
    local_rank: int

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> RankEnv | None:
        """The rank of a torchrun job with more than one process, else None."""
        world = int(environ.get("WORLD_SIZE") or 1)
        if world <= 1:
            return None
        rank = int(environ["RANK"])
        return cls(rank=rank, world_size=world, local_rank=int(environ.get("LOCAL_RANK", rank)))

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def rank_config(config: LearnerConfig, env: RankEnv) -> LearnerConfig:
    """This rank's config: port + rank, its own GPU, seed and (for rank > 0) log subfolder."""
    if config.port == 0:
        raise ValueError("several learner ranks need a fixed --port (rank r serves port + r)")
    device = config.device
    if device in ("auto", "cuda") and (device == "cuda" or torch.cuda.is_available()):
        device = f"cuda:{env.local_rank}"
    elif device == "auto":
        device = "cpu"
    logdir = Path(config.logdir)
    return dataclasses.replace(
        config,
        port=config.port + env.rank,
        device=device,
        # Different action sampling per rank; the weights come from rank 0 anyway.
        seed=config.seed + env.rank,
        logdir=str(logdir if env.is_main else logdir / f"rank{env.rank}"),
        progress=config.progress if env.is_main else "off",
        wandb=config.wandb and env.is_main,  # one W&B run: rank 0's, with the totals
    )


def advertised_address(config: LearnerConfig) -> str:
    """``host:port`` actors should dial for this rank (a wildcard host means 'as for rank 0')."""
    return listen_address(config.advertise_host or config.bind, config.port)


def parameter_digest(model: torch.nn.Module) -> str:
    """SHA-256 of every parameter and buffer, in state-dict order (bit-exact comparison)."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().to("cpu").contiguous().numpy().tobytes())
    return digest.hexdigest()


@dataclasses.dataclass
class Control:
    """The outcome of one step's control exchange, the same on every rank."""

    contributors: int
    stop: bool
    frames: int
    episodes: int


class RankSync:
    """One rank's membership in the process group and the state shared with its trainer."""

    def __init__(self, env: RankEnv, config: LearnerConfig) -> None:
        self.env = env
        self.config = config
        self.device = torch.device(config.device)
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        timeout = datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
        dist.init_process_group(backend, timeout=timeout)
        # Python objects (addresses, initial state, summaries) travel over gloo on the CPU.
        self.cpu_group = dist.new_group(backend="gloo", timeout=timeout)
        addresses: list[Any] = [None] * env.world_size
        dist.all_gather_object(addresses, advertised_address(config), group=self.cpu_group)
        self.addresses: list[str] = [str(a) for a in addresses]
        self.learner: Learner | None = None
        self.stop_reason = ""
        self.frames_all_ranks = 0
        self.episodes_all_ranks = 0
        self.idle_steps = 0
        log.info("rank %d/%d on %s, ranks at %s", env.rank, env.world_size, backend, addresses)

    @property
    def is_main(self) -> bool:
        return self.env.is_main

    # ------------------------------------------------------------------ start

    def attach(self, learner: Learner) -> None:
        """Give every rank rank 0's model, optimizer state and step count (fresh or resumed)."""
        if self.config.normalize_observations:
            raise ValueError(
                "--normalize-observations is not supported with torchrun ranks (each rank "
                "would normalize by its own frames)"
            )
        self.learner = learner
        state: list[Any] = [None]
        if self.is_main:
            training = agent_training_state(
                learner.agent, learner.state, contextlib.nullcontext(), learner.step_counter
            )
            state[0] = {"training": training.saved(), "steps": training.learner_steps}
        dist.broadcast_object_list(state, src=0, group=self.cpu_group)
        if not self.is_main:
            learner.agent.load_state_dict(learner.state, state[0]["training"])
            learner.step_counter.value = int(state[0]["steps"])
            learner.stats.learner_steps = learner.step_counter.value

    @property
    def rank_addresses(self) -> list[str]:
        return self.addresses

    @property
    def writes_checkpoints(self) -> bool:
        """Rank 0 alone writes the (one) checkpoint."""
        return self.is_main

    def make_host(self, learner: Learner) -> RankHost:
        """The trainer thread that steps in lockstep with the other ranks."""
        trainer_mode(self.config, learner.device, ranked=True)  # anything but a thread: raises
        return RankHost(learner.trainer_parts(), learner.queue, learner.builder, self)

    # ------------------------------------------------------------------ every step

    def exchange_control(self, has_batch: bool, stop_vote: bool, frames: int, episodes: int):
        """Sum the control vector over ranks; every rank gets the same :class:`Control`."""
        control = torch.tensor(
            [int(has_batch), int(stop_vote), frames, episodes],
            dtype=torch.int64,
            device=self.device,
        )
        dist.all_reduce(control)
        contributors, votes, frames_all, episodes_all = (int(v) for v in control.tolist())
        self.frames_all_ranks, self.episodes_all_ranks = frames_all, episodes_all
        total = self.config.total_frames
        stop = votes > 0 or bool(total and frames_all >= total)
        if stop and not self.stop_reason:
            self.stop_reason = (
                f"reached {total} frames on all ranks"
                if votes == 0
                else f"{votes} of {self.env.world_size} ranks stopping"
            )
        return Control(contributors, stop, frames_all, episodes_all)

    def average_gradients(self, flat: torch.Tensor, contributed: bool, count: int) -> None:
        """All-reduce the flat gradient buffer and leave its mean over contributors.

        Every parameter's ``.grad`` is a view into ``flat`` (``GradientBuffer``), so the
        collective averages them in place. A rank without a batch contributes zeros.
        """
        if not contributed:
            flat.zero_()
        dist.all_reduce(flat)
        flat.div_(count)

    def weighted_mean(self, value: float, weight: float) -> float:
        """The ``weight``-ed mean of ``value`` over the ranks (0 when no rank weighs in):
        what every rank must agree on, such as how far a step moved the policy."""
        sums = torch.tensor([value * weight, weight], dtype=torch.float64, device=self.device)
        dist.all_reduce(sums)
        total, weights = sums.tolist()
        return total / weights if weights > 0 else 0.0

    def metrics(self) -> dict[str, Any]:
        """Extra keys for this rank's metrics record."""
        return {
            "rank": self.env.rank,
            "world_size": self.env.world_size,
            "frames_all_ranks": self.frames_all_ranks,
            "episodes_all_ranks": self.episodes_all_ranks,
            "idle_steps": self.idle_steps,
        }

    def checkpoint_counters(self) -> tuple[int, int]:
        """(frames, episodes) rank 0's checkpoint records: the totals over all ranks."""
        stats = self.learner.stats if self.learner is not None else None
        frames = max(self.frames_all_ranks, stats.frames if stats else 0)
        episodes = max(self.episodes_all_ranks, stats.episodes if stats else 0)
        return frames, episodes

    # ------------------------------------------------------------------ end

    def finish(self, result: RunResult) -> dict[str, Any]:
        """All-gather every rank's counters and parameter digest; rank 0 writes ranks.json."""
        assert self.learner is not None
        mine = {
            "rank": self.env.rank,
            "address": self.addresses[self.env.rank],
            "frames": result.frames,
            "episodes": result.episodes,
            "learner_steps": result.learner_steps,
            "param_sha256": parameter_digest(self.learner.model),
        }
        gathered: list[Any] = [None] * self.env.world_size
        dist.all_gather_object(gathered, mine, group=self.cpu_group)
        summary = {
            "world_size": self.env.world_size,
            "frames_all_ranks": sum(int(r["frames"]) for r in gathered),
            "episodes_all_ranks": sum(int(r["episodes"]) for r in gathered),
            "params_identical": len({r["param_sha256"] for r in gathered}) == 1,
            "ranks": gathered,
        }
        logdir = Path(self.config.logdir)
        (logdir / "rank.json").write_text(json.dumps(mine, indent=2) + "\n")
        if self.is_main:
            (logdir / RANKS_FILE).write_text(json.dumps(summary, indent=2) + "\n")
            per_rank = " + ".join(str(r["frames"]) for r in gathered)
            print(
                f"seedrl ranks: {self.env.world_size} ranks, frames {summary['frames_all_ranks']}"
                f" ({per_rank}), parameters identical: {summary['params_identical']}",
                flush=True,
            )
        return summary

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


class RankGradients:
    """The gradient exchange of one rank: a control ``all_reduce`` (who has a batch, stop
    votes, frame and episode counts), then the gradients averaged over contributors."""

    def __init__(self, sync: RankSync, stats: Any, stop_vote: threading.Event) -> None:
        self.sync = sync
        self.stats = stats
        self.stop_vote = stop_vote
        self.world_size = sync.env.world_size
        self.stop = False
        """The ranks decided together to stop, after this step."""
        self._contributors = 0

    def combine(self, flat: torch.Tensor, contributed: bool) -> int:
        control = self.sync.exchange_control(
            contributed, self.stop_vote.is_set(), self.stats.frames, self.stats.episodes
        )
        self.stop = control.stop
        self._contributors = control.contributors
        if control.contributors:
            self.sync.average_gradients(flat, contributed, control.contributors)
            if not contributed:
                self.sync.idle_steps += 1
        return control.contributors

    def scalars(self) -> dict[str, float]:
        return {"ranks_contributing": float(self._contributors)}

    def mean(self, value: float, weight: float) -> float:
        return self.sync.weighted_mean(value, weight)


class RankHost(ThreadHost):
    """The trainer of one rank, in a thread: every update is one exchange of collectives.

    Every rank runs this loop the same number of times and leaves it after the same
    step, so no rank is ever left waiting in a collective its peers will not join.
    """

    def __init__(
        self, parts: TrainerParts, store: Store, builder: TrajectoryBuilder, sync: RankSync
    ) -> None:
        self.sync = sync
        stop_vote = threading.Event()
        self.exchange = RankGradients(sync, parts.stats, stop_vote)
        super().__init__(parts, store, builder)
        self._stop = stop_vote  # stopping this host is this rank's vote to stop them all

    def _trainer(self, parts: TrainerParts) -> Trainer:
        return Trainer(parts, self.exchange)

    def run(self) -> None:
        batch_size = self.config.batch_size
        while True:
            with self.stats.timer("trainer_wait_data"):
                unrolls = self.queue.get(batch_size, timeout=WAIT_FOR_BATCH_S)
            with self.stats.timer("trainer_step"):
                stop = self.lockstep_batch(unrolls)
            if stop:
                return

    def lockstep_batch(self, unrolls: Unrolls | None) -> bool:
        """``--updates-per-batch`` lockstep updates on this rank's batch (one without a
        batch); True once the ranks decided to stop. Every update is one exchange of the
        collectives, so a rank on its k-th update of a batch meets a peer's k-th, or the
        single update of a peer that had no batch, and all leave at the same stop."""
        trainer = self.trainer
        batch = None
        core_state: tuple[torch.Tensor, ...] = ()
        if unrolls is not None:
            batch = to_time_major(unrolls, trainer.device)
            core_state = tuple(torch.from_numpy(s).to(trainer.device) for s in unrolls.core_state)
        for _ in range(trainer.agent.updates_per_batch if unrolls is not None else 1):
            scalars = trainer.step_on(batch, core_state, unrolls, trainer.step_counter.value)
            if scalars is not None:
                self.stats.on_train_step(scalars)
            if self.exchange.stop:
                return True
        return False
