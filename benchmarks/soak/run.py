"""The soak itself: train with local actors while faults come on a schedule, and measure
each one: time to recover, frames lost against its bound, streams and checkpoints after.

One fault at a time: it is injected, the soak waits (bounded) until training has
recovered, settles, and goes on with the next kind in the cycle. A kind that cannot run
here (no root, no iproute2, no tmpfs) is skipped with a line saying why.
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
import secrets
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.soak import cluster
from benchmarks.soak.cluster import ActorHost, MetricsTail, Proc, RssSampler
from seedrl.transport import free_port

KINDS = (
    "actor_kill", "frontend_kill", "partition", "learner_restart", "corrupt_checkpoint",
    "trainer_crash", "disk_full", "failover", "connection_flood",
)  # fmt: skip
"""The fault kinds, in the order a cycle injects them."""
UNROLL = 20
"""The learner's --unroll-length (its default): a dropped stream loses at most K x (T+1)."""
LEARNER_START_BOUND_S = 180.0
"""A learner restarted on a loaded 2-core machine takes long to import torch and spawn its
trainer; recovery after a learner fault is bounded by this."""
FLOOD_CONNECTIONS = 600
"""Idle connections a flood opens at once (the number the issue's probe held open)."""
HANDSHAKE_BOUND_S = 10.0
"""The learners' --handshake-timeout-s (its default): a flood's sockets are closed by then,
and health may fail no longer than that (while a full --max-connections refuses probes)."""
STUCK_STREAM_BOUND_S = 20.0
"""The learner ends a dead stream by keepalive (10 s + 5 s): more streams than actors for
longer than this is a stuck stream."""


@dataclasses.dataclass(frozen=True)
class SoakConfig:
    """What a soak runs: its length, its cluster and how often faults come."""

    minutes: float = 60.0
    """Length of the run."""
    env: str = "CartPole-v1"
    """The env trained."""
    host_actors: int = 4
    """Actors on this host."""
    remote_actors: int = 2
    """Actors in the network namespace whose link the partition cuts (on this host when
    namespaces cannot be made)."""
    envs_per_actor: int = 8
    """K of every actor."""
    warmup_s: float = 120.0
    """Fault-free start; the RSS baseline is taken after it."""
    fault_every_s: float = 90.0
    """Seconds between fault starts (a fault still recovering delays the next)."""
    settle_s: float = 15.0
    """Quiet time after each recovery before the next fault."""
    quiet_end_s: float = 300.0
    """Fault-free end of the run: the RSS and the return are judged there."""
    checkpoint_interval_s: float = 10.0
    """The learners' --checkpoint-interval-s."""
    partition_s: float = 25.0
    """How long a partition lasts (longer than keepalive's 15 s: streams must drop)."""
    history_frames: int = 200_000
    """The learners' --checkpoint-history-frames: what a corrupt checkpoint.pt falls back
    to, so at most this many frames (and one checkpoint interval) are trained again."""
    once: bool = False
    """Inject each kind once, back to back, then end (the short CI version)."""
    seed: int = 0
    """Which actor (or frontend) a kill picks."""
    serving_processes: int = 0
    """The learners' --serving-processes: frontend processes serve the actors' streams
    (0: the learner serves them itself); with some, the frontend_kill fault runs."""


class Soak:
    """The cluster under test and the faults done to it."""

    def __init__(self, config: SoakConfig, work: Path, say: Callable[[str], None]) -> None:
        self.config = config
        self.work = work
        self.say = say
        self.rng = random.Random(config.seed)
        self.started = time.monotonic()
        self.logdir = work / "run"
        self.skipped: dict[str, str] = {}
        self.faults: list[dict[str, Any]] = []
        self.launchers: list[Proc] = []
        self.leader_proc: Proc | None = None
        self.learner_starts = 0
        self.remote: ActorHost | None = None
        reason = cluster.mount_tmpfs(self.logdir, 256)
        self.tmpfs = reason is None
        if reason is not None:
            self.skipped["disk_full"] = reason
        host = ActorHost.make()
        if isinstance(host, str):
            self.skipped["partition"] = host
        else:
            self.remote = host
            if host.netem:
                self.skipped["partition (netem)"] = f"only pulled links: {host.netem}"
        if not config.serving_processes:
            self.skipped["frontend_kill"] = "the learner serves its streams itself (no frontends)"
        bind = self.remote.host_address if self.remote else "127.0.0.1"
        self.places = [f"{bind}:{free_port()}", f"{bind}:{free_port()}"]
        self.leader = 0
        """Index in ``places`` of the learner that serves."""
        self.env = {
            **os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
            "SEEDRL_LOG_LEVEL": "INFO", "SEEDRL_AUTH_TOKEN": secrets.token_urlsafe(16),
        }  # fmt: skip
        self.metrics = MetricsTail(self.logdir / "metrics.jsonl")
        self.rss = RssSampler(self, 5.0)
        self.actors_total = config.host_actors + config.remote_actors
        self.interrupted = False
        """Told to end early (SIGINT/SIGTERM): no new fault; the run so far is reported."""

    # ------------------------------------------------------------ processes

    def now(self) -> float:
        return time.monotonic() - self.started

    def learner_command(self, place: str, *extra: str) -> list[str]:
        host, port = place.rsplit(":", 1)
        return [
            cluster.python(), "-m", "learner", "--env", self.config.env, "--bind", host,
            "--port", port, "--logdir", str(self.logdir), "--resume", "--progress", "off",
            "--no-tensorboard", "--log-interval-s", "1", "--standby-grace-s", "3",
            "--checkpoint-interval-s", str(self.config.checkpoint_interval_s),
            "--checkpoint-history-frames", str(self.config.history_frames),
            "--serving-processes", str(self.config.serving_processes), *extra,
        ]  # fmt: skip

    def start_learner(self, place: int, *extra: str) -> Proc:
        self.learner_starts += 1
        log = self.work / f"learner-{self.learner_starts}.log"
        return Proc(self.learner_command(self.places[place], *extra), log, self.env)

    def serve(self, place: int) -> Proc:
        """A learner that serves at ``place`` (resuming the run directory)."""
        proc = self.start_learner(place)
        self.leader, self.leader_proc = place, proc
        return proc

    def actors_command(self, count: int, remote: bool) -> list[str]:
        first, second = self.places[self.leader], self.places[1 - self.leader]
        args = [
            cluster.python(), "-m", "actors", "--learner", first, "--fallback-learner", second,
            "--num-actors", str(count), "--envs-per-actor", str(self.config.envs_per_actor),
            "--max-backoff-s", "2", "--first-index", str(1000 if remote else 0),
        ]  # fmt: skip
        return self.remote.command(args) if remote and self.remote else args

    def start(self) -> None:
        self.say(f"soak: run directory {self.logdir} (tmpfs: {self.tmpfs}); learners at "
                 f"{' and '.join(self.places)}")  # fmt: skip
        for kind, why in self.skipped.items():
            self.say(f"soak: {kind} fault skipped: {why}")
        self.serve(0)
        self.wait_line(self.leader_proc, "listening on", LEARNER_START_BOUND_S)
        config = self.config
        self.launchers = [
            Proc(self.actors_command(config.host_actors, False), self.work / "actors.log", self.env)
        ]
        if config.remote_actors:
            self.launchers.append(
                Proc(self.actors_command(config.remote_actors, True),
                     self.work / "actors-remote.log", self.env)
            )  # fmt: skip
        self.rss.start()

    def stop(self) -> None:
        self.rss.stop()
        for launcher in self.launchers:
            launcher.stop()
        if self.leader_proc is not None:
            self.leader_proc.stop(30)
        if self.remote is not None:
            self.remote.close()

    def close(self) -> None:
        if self.tmpfs:
            cluster.unmount(self.logdir)

    def wait_line(self, proc: Proc | None, text: str, timeout: float, after: int = 0) -> bool:
        """Whether ``text`` shows in ``proc``'s log (past offset ``after``) within ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc is not None and text in proc.text()[after:]:
                return True
            time.sleep(0.2)
        return False

    # ------------------------------------------------------------ measuring

    def wait_recovered(self, after_wall: float, timeout: float) -> dict[str, Any] | None:
        """The first record from ``after_wall`` on with every actor connected, frames
        flowing and the trainer stepping; None when none comes within ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for record in self.metrics.since(after_wall):
                if (
                    record.get("actors_connected") == self.actors_total
                    and record.get("fps", 0) > 0
                    and record.get("learner_steps_per_s", 0) > 0
                ):
                    return record
            time.sleep(0.5)
        return None

    def checkpoint_frames(self) -> int | None:
        """The frame count checkpoint.pt holds (None when it does not load)."""
        from learner.state import checkpoint

        try:
            return int(checkpoint.load(self.logdir / "checkpoint.pt")["frames"])
        except checkpoint.CheckpointError:
            return None

    def recent_fps(self) -> float:
        records = self.metrics.poll()[-30:]
        return max((r.get("fps", 0.0) for r in records), default=0.0)

    def checkpoint_bound(self) -> int:
        """Frames a learner fault may lose: those since the last checkpoint, at most one
        interval (and a log interval) of training at the recent rate."""
        return int(self.recent_fps() * (self.config.checkpoint_interval_s + 2.0))

    def stream_bound(self, streams: int) -> int:
        """Frames ``streams`` dropped streams may lose: their partial unrolls."""
        return streams * self.config.envs_per_actor * (UNROLL + 1)

    def record(self, kind: str, t0: float, **fields: Any) -> dict[str, Any]:
        fault = {"kind": kind, "t_s": round(t0, 1), **fields}
        lost, bound = fault.get("frames_lost"), fault.get("frames_lost_bound")
        rec, rec_bound = fault.get("recovery_s"), fault.get("recovery_bound_s")
        fault["ok"] = (
            rec is not None and rec <= rec_bound
            and (lost is None or bound is None or lost <= bound)
            and fault.get("checkpoint_ok", True)
            and fault.get("health_ok", True)
            and fault.get("learner_survived", True)
            and fault.get("frontend_restarted", True)
        )  # fmt: skip
        self.faults.append(fault)
        self.say(
            f"soak {self.now():7.0f} s: {kind}: recovered in "
            f"{'-' if rec is None else f'{rec:.1f}'} s (bound {rec_bound:g}), frames lost "
            f"{lost} (bound {bound}){'' if fault['ok'] else '  <-- BOUND BROKEN'}"
        )
        return fault

    # ------------------------------------------------------------ the faults

    def inject(self, kind: str, occurrence: int) -> None:
        """Do one fault; one that cannot be done (a tool failing) is recorded as broken."""
        t0 = self.now()
        try:
            getattr(self, f"fault_{kind}")(occurrence)
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            self.say(f"soak: {kind} failed: {exc}")
            self.record(
                kind, t0, recovery_s=None, recovery_bound_s=0.0, frames_lost=None,
                frames_lost_bound=None, error=str(exc),
            )  # fmt: skip

    def fault_actor_kill(self, occurrence: int) -> None:
        """SIGKILL one actor process of this host's launcher; the launcher restarts it."""
        launcher = self.launchers[0]
        before = self.metrics.last()
        pids = cluster.children(launcher.pid)
        t0, wall = self.now(), time.time()
        victim = self.rng.choice(pids)
        os.kill(victim, signal.SIGKILL)
        # Recovered: the launcher has a new process in its place and every actor streams.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and victim in cluster.children(launcher.pid):
            time.sleep(0.1)
        while time.monotonic() < deadline and len(cluster.children(launcher.pid)) < len(pids):
            time.sleep(0.1)
        back = self.wait_recovered(time.time(), 60)
        self.fault_done("actor_kill", t0, wall, before, back, self.stream_bound(1), 60.0)

    def fault_frontend_kill(self, occurrence: int) -> None:
        """SIGKILL one frontend process of the serving learner: only its streams end (their
        partial unrolls lost), their actors reconnect, the learner restarts the frontend
        and training goes on, in the same learner."""
        proc = self.leader_proc
        assert proc is not None
        frontends = cluster.frontend_pids(proc.pid)
        if not frontends:
            raise RuntimeError(f"the learner (pid {proc.pid}) has no frontend process")
        before = self.metrics.last()
        log_at = len(proc.text())
        index = self.busiest_frontend(proc.text(), sorted(frontends))
        victim = frontends[index]
        t0, wall = self.now(), time.time()
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 60
        restarted = None
        while time.monotonic() < deadline and proc.alive() and restarted is None:
            pid = cluster.frontend_pids(proc.pid).get(index)
            restarted = pid if pid not in (None, victim) else None
            time.sleep(0.2)
        died = re.search(
            rf"serving frontend {index} died \(exit code -9\): its (\d+) streams ended",
            proc.text()[log_at:],
        )
        streams = int(died.group(1)) if died else self.actors_total
        back = self.wait_recovered(time.time(), 90)
        self.fault_done(
            "frontend_kill", t0, wall, before, back, self.stream_bound(streams), 90.0,
            frontend=index, streams_cut=streams if died else None,
            learner_survived=proc.alive() and died is not None,
            frontend_restarted=restarted is not None,
        )  # fmt: skip

    def busiest_frontend(self, log: str, indices: list[int]) -> int:
        """The frontend serving the most streams by the learner's log (since it last
        started), so that its kill cuts streams; ties go to the soak's random pick."""

        def streams(i: int) -> int:
            since = log[max(0, log.rfind(f"serving frontend {i} (pid")) :]
            lines = [ln for ln in since.splitlines() if f" frontend {i} " in ln]
            return sum("connected from" in ln for ln in lines) - sum(
                "disconnected after" in ln for ln in lines
            )

        most = max(streams(i) for i in indices)
        return self.rng.choice([i for i in indices if streams(i) == most])

    def fault_done(
        self, kind: str, t0: float, wall: float, before: dict[str, Any],
        back: dict[str, Any] | None, bound: int, recovery_bound: float, **extra: Any,
    ) -> None:  # fmt: skip
        """Record a fault the learner lived through: its frames lost are the dropped ones."""
        lost = None
        if back is not None:
            lost = int(back.get("frames_dropped", 0) - before.get("frames_dropped", 0))
        self.record(
            kind, t0,
            recovery_s=None if back is None else round(back["time"] - wall, 1),
            recovery_bound_s=recovery_bound, frames_lost=lost, frames_lost_bound=bound,
            **extra,
        )  # fmt: skip

    def fault_partition(self, occurrence: int) -> None:
        """Cut the actor host's link (pulled, or lossy and slow) for ``partition_s``."""
        assert self.remote is not None
        mode = "down" if occurrence % 2 == 0 or self.remote.netem else "netem"
        before = self.metrics.last()
        t0, wall = self.now(), time.time()
        self.remote.cut(mode)
        try:
            time.sleep(self.config.partition_s)
        finally:
            self.remote.heal(mode)
        healed = time.time()
        back = self.wait_recovered(healed, 90)
        window = self.config.partition_s
        self.fault_done(
            "partition", t0, wall, before, back, self.stream_bound(self.config.remote_actors),
            window + 60.0, mode=mode, window_s=window,
            after_heal_s=None if back is None else round(back["time"] - healed, 1),
        )  # fmt: skip

    def learner_lost(
        self, before: dict[str, Any], killed_wall: float, checkpoint_frames: int | None
    ) -> int | None:
        """Frames a killed learner had trained past its checkpoint: its last record's,
        carried on at that record's rate to the kill, less the checkpoint's."""
        if checkpoint_frames is None or not before:
            return None
        at_kill = before["frames"] + before.get("fps", 0) * max(0.0, killed_wall - before["time"])
        return max(0, int(at_kill) - checkpoint_frames)

    def kill_leader(self) -> tuple[dict[str, Any], int, float, float, int | None]:
        """SIGKILL the serving learner: (its last metrics record, the frames-lost bound,
        soak time and wall time of the kill, the frames of the checkpoint it left)."""
        before = self.metrics.last()
        bound = self.checkpoint_bound()
        t0, wall = self.now(), time.time()
        assert self.leader_proc is not None
        self.leader_proc.kill()
        self.leader_proc.stop(1)
        return before, bound, t0, wall, self.checkpoint_frames()

    def fault_learner_restart(self, occurrence: int) -> None:
        """SIGKILL the serving learner (its trainer with it) and start it again with --resume."""
        before, bound, t0, wall, frames = self.kill_leader()
        self.serve(self.leader)
        back = self.wait_recovered(time.time(), LEARNER_START_BOUND_S)
        self.record(
            "learner_restart", t0,
            recovery_s=None if back is None else round(back["time"] - wall, 1),
            recovery_bound_s=LEARNER_START_BOUND_S,
            frames_lost=self.learner_lost(before, wall, frames), frames_lost_bound=bound,
            checkpoint_frames=frames, checkpoint_ok=frames is not None,
        )  # fmt: skip

    def fault_corrupt_checkpoint(self, occurrence: int) -> None:
        """SIGKILL the serving learner, damage its checkpoint.pt (random bytes, or every
        other time the file cut in half), start it again with --resume: it must go on
        from the newest history (or best) checkpoint and train past where it was."""
        before, bound, t0, wall, frames = self.kill_leader()
        path = self.logdir / "checkpoint.pt"
        data = path.read_bytes()
        # A new file: writing in place would damage a history checkpoint hard-linked to it.
        path.unlink()
        path.write_bytes(os.urandom(4096) if occurrence % 2 == 0 else data[: len(data) // 2])
        proc = self.serve(self.leader)
        fallback = self.resumed_from(proc, LEARNER_START_BOUND_S)
        back = self.wait_recovered(time.time(), LEARNER_START_BOUND_S)
        redo_s = self.config.history_frames / max(1.0, before.get("fps", 0.0))
        bound_s = LEARNER_START_BOUND_S + redo_s + 3 * self.config.checkpoint_interval_s
        # Recovered: a readable checkpoint.pt past the one the damage took.
        deadline = time.monotonic() + bound_s
        after = self.checkpoint_frames()
        while time.monotonic() < deadline and (after is None or after <= (frames or 0)):
            time.sleep(0.5)
            after = self.checkpoint_frames()
        past = after is not None and frames is not None and after > frames
        warned = "resuming from" in proc.text() and "skipped" in proc.text()
        self.record(
            "corrupt_checkpoint", t0,
            recovery_s=round(time.time() - wall, 1) if past and back else None,
            recovery_bound_s=round(bound_s, 1),
            frames_lost=self.learner_lost(before, wall, fallback[1] if fallback else None),
            frames_lost_bound=bound + self.config.history_frames,
            damage="random bytes" if occurrence % 2 == 0 else "truncated",
            resumed_from=fallback[0] if fallback else None, checkpoint_frames=frames,
            checkpoint_frames_after=after,
            checkpoint_ok=fallback is not None and fallback[0] != str(path) and warned and past,
        )  # fmt: skip

    def resumed_from(self, proc: Proc, timeout: float) -> tuple[str, int] | None:
        """(path, frames) of the checkpoint a restarted learner says it resumed from."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.alive():
            found = re.search(r"resumed from (\S+) at frame (\d+)", proc.text())
            if found:
                return found.group(1), int(found.group(2))
            time.sleep(0.2)
        return None

    def fault_trainer_crash(self, occurrence: int) -> None:
        """SIGKILL the learner's trainer process: the learner stops ("trainer failed"), and
        is started again with --resume (what compose's restart: on-failure does)."""
        assert self.leader_proc is not None
        proc = self.leader_proc
        trainer = cluster.trainer_pid(proc.pid)
        if trainer is None:
            self.skipped.setdefault("trainer_crash", "the learner has no trainer process")
            return
        bound = self.checkpoint_bound()
        t0, wall = self.now(), time.time()
        os.kill(trainer, signal.SIGKILL)
        try:
            code = proc.popen.wait(60)
        except subprocess.TimeoutExpired:  # a learner that does not stop is a finding
            code = None
        proc.stop(1)
        before = self.metrics.last()  # the stopping learner's last record
        frames = self.checkpoint_frames()
        self.serve(self.leader)
        back = self.wait_recovered(time.time(), LEARNER_START_BOUND_S)
        self.record(
            "trainer_crash", t0,
            recovery_s=None if back is None else round(back["time"] - wall, 1),
            recovery_bound_s=LEARNER_START_BOUND_S + 60,
            frames_lost=self.learner_lost(before, before.get("time", wall), frames),
            frames_lost_bound=bound, learner_exit=code, checkpoint_frames=frames,
            checkpoint_ok=frames is not None and code not in (None, 0),
        )  # fmt: skip

    def fault_disk_full(self, occurrence: int) -> None:
        """Fill the run directory's disk for longer than a checkpoint interval: checkpoint
        writes fail, the old checkpoint stays whole, training goes on; once there is room
        again the next checkpoint is written."""
        assert self.leader_proc is not None
        proc = self.leader_proc
        before = self.metrics.last()
        log_at = len(proc.text())
        t0, wall = self.now(), time.time()
        filler = cluster.fill_disk(self.logdir)
        frames_before = self.checkpoint_frames()  # what the full disk keeps
        hold = self.config.checkpoint_interval_s * 1.5 + 3
        time.sleep(hold)
        failed_write = "could not write checkpoint" in proc.text()[log_at:]
        frames_full = self.checkpoint_frames()
        leftovers = [p.name for p in self.logdir.glob(".checkpoint.pt.tmp-*")]
        alive = proc.alive()
        filler.unlink()
        freed = time.time()
        # Recovered: a new checkpoint past the one the full disk kept, from the same learner.
        deadline = time.monotonic() + self.config.checkpoint_interval_s * 3 + 30
        frames_after = frames_full
        while time.monotonic() < deadline:
            frames_after = self.checkpoint_frames()
            if frames_after is not None and frames_after > (frames_full or 0):
                break
            time.sleep(0.5)
        written = time.time()
        back = self.wait_recovered(freed, 30)
        ok = (
            alive and proc.alive() and failed_write and frames_full == frames_before
            and not leftovers and frames_after is not None and frames_after > (frames_full or 0)
        )  # fmt: skip
        lost = None if back is None else int(back["frames_dropped"] - before["frames_dropped"])
        self.record(
            "disk_full", t0,
            recovery_s=round(written - wall, 1) if ok else None,
            recovery_bound_s=hold + self.config.checkpoint_interval_s * 3 + 30,
            frames_lost=lost, frames_lost_bound=0, held_s=round(hold, 1),
            checkpoint_write_failed=failed_write, learner_survived=alive and proc.alive(),
            checkpoint_frames_kept=frames_full, checkpoint_frames_after=frames_after,
            checkpoint_after_s=round(written - freed, 1), torn_files=leftovers, checkpoint_ok=ok,
        )  # fmt: skip

    def fault_failover(self, occurrence: int) -> None:
        """Start a standby at the other place, SIGKILL the serving learner: the standby
        takes over from the newest checkpoint and the actors follow it."""
        old = self.leader
        standby = self.start_learner(1 - old, "--standby", self.places[old])
        if not self.wait_line(standby, "serves", LEARNER_START_BOUND_S):
            standby.stop()
            self.skipped.setdefault("failover", "the standby never saw the leader serve")
            return
        before, bound, t0, wall, frames = self.kill_leader()
        self.leader, self.leader_proc = 1 - old, standby
        noticed = None
        if self.wait_line(standby, "stopped answering", 60):
            noticed = round(self.now() - t0, 1)
        back = self.wait_recovered(wall, LEARNER_START_BOUND_S)
        self.record(
            "failover", t0,
            recovery_s=None if back is None else round(back["time"] - wall, 1),
            recovery_bound_s=LEARNER_START_BOUND_S,
            frames_lost=self.learner_lost(before, wall, frames), frames_lost_bound=bound,
            noticed_s=noticed, checkpoint_frames=frames,
            new_leader=self.places[self.leader],
            checkpoint_ok=frames is not None and back is not None and back["frames"] >= frames,
        )  # fmt: skip

    def fault_connection_flood(self, occurrence: int) -> None:
        """Open idle TCP connections to the serving learner from this host (no token, no
        bytes) and hold them past a checkpoint interval: the learner closes them all within
        its handshake bound, answers its health checks, writes its checkpoint and serves
        its actors throughout."""
        from learner.serving.healthcheck import check

        place = self.places[self.leader]
        before = self.metrics.last()
        frames_before = self.checkpoint_frames()
        t0, wall = self.now(), time.time()
        flood = cluster.IdleFlood(place, FLOOD_CONNECTIONS)
        hold = max(HANDSHAKE_BOUND_S + 10, self.config.checkpoint_interval_s * 1.5 + 3)
        all_closed_s = None
        checks = failed = 0
        outage_s, failing_since = 0.0, None
        try:
            started = time.monotonic()
            while time.monotonic() - started < hold:
                if flood.poll(0.5) == len(flood.socks) and all_closed_s is None:
                    all_closed_s = round(time.monotonic() - started, 1)
                serving, _ = check(place, timeout_s=2.0)
                checks, now = checks + 1, time.monotonic()
                if serving:
                    failing_since = None
                else:
                    failed += 1
                    failing_since = now if failing_since is None else failing_since
                    outage_s = max(outage_s, now - failing_since)
        finally:
            flood.close()
        frames_after = self.checkpoint_frames()
        back = self.wait_recovered(time.time(), 30)
        written = frames_after is not None and frames_after > (frames_before or 0)
        # Health stayed up: no outage past the handshake bound, and the flood was let go.
        health_ok = outage_s <= HANDSHAKE_BOUND_S and all_closed_s is not None
        self.fault_done(
            "connection_flood", t0, wall, before, back, 0, hold + 30,
            connections=len(flood.socks), closed_by_server=flood.closed,
            all_closed_s=all_closed_s, health_checks=checks, health_failed=failed,
            health_outage_s=round(outage_s, 1), health_outage_bound_s=HANDSHAKE_BOUND_S,
            health_ok=health_ok, checkpoint_frames=frames_after, checkpoint_ok=written,
        )  # fmt: skip

    # ------------------------------------------------------------ the schedule

    def run(self) -> None:
        config = self.config
        end = config.minutes * 60
        self.start()
        self.sleep_until(config.warmup_s)
        runnable = [k for k in KINDS if k not in self.skipped]
        self.say(f"soak: faults {', '.join(runnable)}")
        count: dict[str, int] = {}
        index = 0
        while runnable and not self.interrupted:
            if config.once and index >= len(runnable):
                break
            if not config.once and self.now() + config.fault_every_s > end - config.quiet_end_s:
                break
            kind = runnable[index % len(runnable)]
            index += 1
            due = self.now() + config.fault_every_s
            self.inject(kind, count.get(kind, 0))
            count[kind] = count.get(kind, 0) + 1
            runnable = [k for k in runnable if k not in self.skipped]
            self.sleep_until(self.now() + config.settle_s)
            if not config.once:
                self.sleep_until(due)
        self.sleep_until(end if not config.once else self.now() + config.quiet_end_s)

    def sleep_until(self, t: float) -> None:
        while self.now() < t and not self.interrupted:
            time.sleep(min(1.0, t - self.now()))
            self.metrics.poll()
