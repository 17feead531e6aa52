"""The actor side of the conformance suite: run an actor command against a scripted
learner in a few sessions, then judge every actor case from what was recorded.

Each session is one run of the actor command against a fresh
:class:`~seedrl.conformance.scripted.ScriptedLearner`:

- ``stream``: two connections. The first is served for a whole time limit of the env
  (so env 0, kept alive by the suite's actions, is truncated) and ends with
  ``Shutdown{final: false}``; the second ends with ``Shutdown{final: true}``. Stacked
  envs are offered frame-once stacking on the first GetInfo and not on the second.
- ``retry``: the actor starts before anything listens on its port, then meets a learner
  that refuses it ten times with UNAVAILABLE or RESOURCE_EXHAUSTED before serving it.
- ``refuse-invalid``, ``refuse-unauthenticated``: one refusal each, after which the actor
  must exit with a non-zero status.

Only the sessions that the selected cases need are run. Shape suffixes: K envs, O
observation dims.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import logging
import os
import secrets
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np

from seedrl import envs
from seedrl.config import AUTH_TOKEN_ENV
from seedrl.conformance.cases import Case, Report, Skip, Status, Verdict, select
from seedrl.conformance.config import ActorSuiteConfig
from seedrl.conformance.models import (
    AGENT_MODELS,
    AgentsFrame,
    AgentsModel,
    EnvModel,
    agents_model_for,
    model_for,
)
from seedrl.conformance.scripted import (
    CANCELLED,
    HALF_CLOSED,
    SHUTDOWN_WAIT_S,
    SILENT,
    FrameRecord,
    InfoCall,
    Refuse,
    Script,
    ScriptedLearner,
    Serve,
    StreamRecord,
)
from seedrl.proto import seedrl_pb2 as pb
from seedrl.transport import auth_metadata

log = logging.getLogger(__name__)

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
EXIT_GRACE_S = 10.0
"""How long an actor may take to exit after a final Shutdown or a refusal that stops it."""
SHUTDOWN_END_S = 2.0
"""How soon after a Shutdown the actor must end its side of the stream."""
BACKOFF_SLACK_S = 0.25
"""What a wait may exceed the cap by: a new channel, a TCP handshake, a busy host."""
RETRY_FAILURES: tuple[tuple[str, grpc.StatusCode], ...] = (
    ("info", UNAVAILABLE), ("act", UNAVAILABLE), ("act", EXHAUSTED), ("info", UNAVAILABLE),
    ("act", EXHAUSTED), ("act", UNAVAILABLE), ("act", EXHAUSTED), ("info", UNAVAILABLE),
    ("act", UNAVAILABLE), ("act", EXHAUSTED), ("info", UNAVAILABLE), ("act", EXHAUSTED),
)  # fmt: skip
"""The retry session's refusals, in order: the call refused and its status."""
FAR_OVER = 4
"""A wait above this many caps (plus a second) fails backoff-capped on its own."""
UNREACHABLE_AFTER_S = 0.2
"""How long the port stays unanswered after the actor's first attempt to reach it."""
AT_CAP = 8
"""The last this-many retry waits count as "at the cap" (an actor doubling from a tenth of
the cap gets there within the first four)."""
ALIKE = 0.03
"""Waits within this share of the cap of each other are alike (timing noise, no jitter)."""
PLACEHOLDERS = ("{learner}", "{num_envs}", "{max_backoff_s}", "{token}")
SESSIONS = ("stream", "retry", "refuse-invalid", "refuse-unauthenticated")
CASE_SESSIONS: dict[str, tuple[str, ...]] = {
    "retry-unreachable": ("retry",),
    "retry-unavailable": ("retry",),
    "retry-resource-exhausted": ("retry",),
    "backoff-capped": ("retry",),
    "backoff-jittered": ("retry",),
    "backoff-waits": ("retry", "stream"),
    "stop-invalid-argument": ("refuse-invalid",),
    "stop-unauthenticated": ("refuse-unauthenticated",),
}
"""The sessions a case needs (every other case: the stream session)."""


# ---------------------------------------------------------------------- one actor run


class ActorProcess:
    """The actor command in its own session, its output collected on a thread."""

    def __init__(self, args: Sequence[str], env: dict[str, str], echo: str = "") -> None:
        self.popen = subprocess.Popen(
            list(args), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, text=True, errors="replace", start_new_session=True,
        )  # fmt: skip
        self.output: list[str] = []
        self.exited_at: float | None = None
        self.stopped_by_suite = False
        """The actor was still running when the suite ended its session."""
        self._echo = echo
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.output.append(line.rstrip("\n"))
            if self._echo:
                sys.stderr.write(f"  {self._echo} | {line}")

    def poll(self) -> int | None:
        code = self.popen.poll()
        if code is not None and self.exited_at is None:
            self.exited_at = time.monotonic()
        return code

    def stop(self) -> None:
        """SIGTERM, then SIGKILL, to the actor and everything it started."""
        self.stopped_by_suite = self.poll() is None
        for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            if self.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(wait_s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)  # whatever it left behind
        self.poll()
        self._reader.join(timeout=2)


@dataclass
class ActorRun:
    """What one session recorded."""

    session: str
    learner: ScriptedLearner
    started: float
    exit_code: int | None = None
    """None when the suite had to stop the actor."""
    exited_at: float | None = None
    output: list[str] = field(default_factory=list)
    unreachable_attempts: list[float] = field(default_factory=list)
    """Times the actor dialled the port before the learner listened (retry session)."""
    timed_out: bool = False
    error: str = ""
    """Why the session could not run as planned."""


@dataclass
class Context:
    command: list[str]
    config: ActorSuiteConfig
    env: pb.EnvSpec
    model: EnvModel | None
    frame_stack: int
    """D offered to the actor when the env's observations are D-frame stacks, else 0."""
    token: str | None
    agents_model: AgentsModel | None = None
    """The model of a multi-agent env (None: single-agent, or no model)."""
    agent_walk: dict[str, list[str]] | None = None
    """What the multi-agent walk found, per case (it runs once for three cases)."""

    @property
    def agents(self) -> int:
        """A multi-agent env's agents per env (rows of every frame); 0 for one agent."""
        return len(self.env.agents)


def _launch(ctx: Context, address: str, session: str) -> ActorProcess:
    values = {
        "{learner}": address,
        "{num_envs}": str(ctx.config.num_envs),
        "{max_backoff_s}": f"{ctx.config.max_backoff_s:g}",
        "{token}": ctx.token or "",
    }
    args = []
    for arg in ctx.command:
        for key, value in values.items():
            arg = arg.replace(key, value)
        args.append(arg)
    env = {k: v for k, v in os.environ.items() if k != AUTH_TOKEN_ENV}
    if ctx.token:
        env[AUTH_TOKEN_ENV] = ctx.token
    env.setdefault("PYTHONUNBUFFERED", "1")
    return ActorProcess(args, env, session if ctx.config.verbose else "")


def _choose(
    model: EnvModel | AgentsModel | None,
) -> Callable[[int, np.ndarray, np.random.Generator], Any] | None:
    return None if model is None else (lambda i, obs, rng: model.choose(obs, i, rng))


def _session(
    ctx: Context,
    name: str,
    script: Script,
    done_after: Callable[[ScriptedLearner], float | None],
    unreachable_first: bool = False,
) -> ActorRun:
    """Run the actor command against a scripted learner until it exits, ``done_after``
    (a time, once known) passes, or the session times out."""
    model = ctx.agents_model if ctx.agents else ctx.model
    learner = ScriptedLearner(ctx.env, script, ctx.token, _choose(model), ctx.config.seed)
    run = ActorRun(name, learner, time.monotonic())
    deadline = run.started + ctx.config.session_timeout_s
    actor: ActorProcess | None = None
    try:
        if unreachable_first:
            with _Unreachable() as unreachable:
                address = f"127.0.0.1:{unreachable.port}"
                actor = _launch(ctx, address, name)
                while not unreachable.attempts and actor.poll() is None:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.01)
                time.sleep(UNREACHABLE_AFTER_S)  # the attempt fails before the learner is up
                run.unreachable_attempts = list(unreachable.attempts)
            if actor.poll() is None:
                learner.start(address)  # the same port, free again (SO_REUSEADDR)
        else:
            address = f"127.0.0.1:{learner.start('127.0.0.1:0')}"
            actor = _launch(ctx, address, name)
        while actor.poll() is None:
            now = time.monotonic()
            until = done_after(learner)
            if now > deadline or (until is not None and now > until):
                run.timed_out = now > deadline
                break
            time.sleep(0.02)
    except OSError as exc:
        run.error = f"session {name} could not run: {exc}"
    finally:
        if actor is not None:
            actor.stop()
            if not actor.stopped_by_suite:
                run.exit_code, run.exited_at = actor.popen.returncode, actor.exited_at
            run.output = actor.output
        learner.stop()
    log.info("session %s took %.1f s", name, time.monotonic() - run.started)
    if run.timed_out:
        run.error = f"session {name} timed out after {ctx.config.session_timeout_s:g} s"
    return run


class _Unreachable:
    """A port where no learner listens yet: connections are accepted and closed at once,
    and their times kept, so the suite sees the actor try."""

    def __init__(self) -> None:
        self.attempts: list[float] = []
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        self._sock.listen(16)
        self._sock.settimeout(0.05)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> _Unreachable:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.attempts.append(time.monotonic())
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()  # a reset: the actor sees the learner as unreachable


# ---------------------------------------------------------------------- the sessions


def _final_shutdown_at(learner: ScriptedLearner) -> float | None:
    for stream in learner.streams:
        if stream.shutdown is not None and stream.shutdown.final and stream.shutdown_at:
            return stream.shutdown_at + EXIT_GRACE_S
    return None


def _refused_at(learner: ScriptedLearner) -> float | None:
    for event in learner.events:
        if isinstance(event, InfoCall) and event.refused is not None:
            return event.at + EXIT_GRACE_S
        if isinstance(event, StreamRecord) and event.refused is not None and event.ended:
            return event.ended + EXIT_GRACE_S
    return None


def stream_session(ctx: Context) -> ActorRun:
    limit = ctx.model.max_episode_steps if ctx.model is not None else None
    if ctx.agents_model is not None:  # every agent ends, twice, and the env resets
        limit = 2 * ctx.agents_model.episode_frames
    first = (limit + 5) if limit else 120
    offers = [ctx.frame_stack, 0] if ctx.frame_stack > 1 else [0]
    script = Script(
        frame_stack_offers=offers, acts=[Serve(first, final=False), Serve(30, final=True)]
    )
    return _session(ctx, "stream", script, _final_shutdown_at)


def retry_session(ctx: Context) -> ActorRun:
    infos: list[grpc.StatusCode | None] = []
    acts: list[Refuse | Serve] = []
    for call, code in RETRY_FAILURES:
        if call == "info":
            infos.append(code)
        else:
            infos.append(None)
            acts.append(Refuse(code, f"conformance: scripted {code.name}, retry later"))
    acts.append(Serve(3, final=True))
    script = Script(info_refusals=infos, acts=acts)
    return _session(ctx, "retry", script, _final_shutdown_at, unreachable_first=True)


def refuse_invalid_session(ctx: Context) -> ActorRun:
    refusal = Refuse(grpc.StatusCode.INVALID_ARGUMENT, "conformance: scripted INVALID_ARGUMENT")
    return _session(ctx, "refuse-invalid", Script(acts=[refusal]), _refused_at)


def refuse_unauthenticated_session(ctx: Context) -> ActorRun:
    script = Script(info_refusals=[grpc.StatusCode.UNAUTHENTICATED])
    return _session(ctx, "refuse-unauthenticated", script, _refused_at)


SESSION_RUNNERS: dict[str, Callable[[Context], ActorRun]] = {
    "stream": stream_session,
    "retry": retry_session,
    "refuse-invalid": refuse_invalid_session,
    "refuse-unauthenticated": refuse_unauthenticated_session,
}


# ---------------------------------------------------------------------- checks

Runs = dict[str, ActorRun]
Check = Callable[[Runs, Context], list[str]]
"""Recorded runs -> what the actor did wrong (empty: pass); raises Skip when it cannot tell."""
CHECKS: dict[str, Check] = {}


def check(case_id: str) -> Callable[[Check], Check]:
    def register(fn: Check) -> Check:
        CHECKS[case_id] = fn
        return fn

    return register


def _all_streams(runs: Runs) -> Iterator[tuple[str, StreamRecord]]:
    for name, run in runs.items():
        for stream in run.learner.streams:
            yield name, stream


def _recorded(runs: Runs, case_id: str) -> list[str]:
    return [
        f"{name} session, {p}"
        for name, s in _all_streams(runs)
        for p in s.problems.get(case_id, [])
    ]


def _served(runs: Runs) -> list[StreamRecord]:
    """The stream session's streams that carried frames."""
    run = runs.get("stream")
    if run is None:
        raise Skip("the stream session did not run")
    streams = [s for s in run.learner.streams if s.frames]
    if not streams:
        raise Skip(f"the actor sent no frame in the stream session{_why(run)}")
    return streams


def _why(run: ActorRun) -> str:
    if run.error:
        return f" ({run.error})"
    if run.exit_code is not None:
        return f" (it exited with status {run.exit_code})"
    return ""


@check("getinfo-first")
def _getinfo_first(runs: Runs, ctx: Context) -> list[str]:
    problems = []
    for name, run in runs.items():
        asked = False
        for event in run.learner.events:
            if isinstance(event, InfoCall):
                asked = asked or event.info is not None
            else:
                if not asked:
                    problems.append(
                        f"{name} session: stream {event.index} opened with no GetInfo answered "
                        "since the last stream"
                    )
                asked = False
    if not any(run.learner.streams for run in runs.values()):
        raise Skip("the actor opened no stream")
    return problems


@check("auth-metadata")
def _auth_metadata(runs: Runs, ctx: Context) -> list[str]:
    if not ctx.token:
        raise Skip("run without --auth")
    expected = dict(auth_metadata(ctx.token))
    problems = []
    for name, run in runs.items():
        for event in run.learner.events:
            what = (
                f"GetInfo call {event.index}"
                if isinstance(event, InfoCall)
                else f"stream {event.index}"
            )
            got = event.metadata.get("authorization")
            if got is None:
                problems.append(f"{name} session: {what} carried no authorization metadata")
            elif got != expected["authorization"]:
                problems.append(
                    f"{name} session: {what} carried authorization {got[:12]!r}..., "
                    "not 'Bearer ' and the token"
                )
    if not any(run.learner.events for run in runs.values()):
        raise Skip("the actor made no call")
    return problems


@check("hello-first")
def _hello_first(runs: Runs, ctx: Context) -> list[str]:
    if not any(s.first is not None for _, s in _all_streams(runs)):
        raise Skip("no stream carried a message")
    return _recorded(runs, "hello-first")


def _hellos(runs: Runs) -> list[tuple[str, StreamRecord]]:
    found = [(n, s) for n, s in _all_streams(runs) if s.hello is not None]
    if not found:
        raise Skip("the actor sent no Hello")
    return found


@check("hello-fields")
def _hello_fields(runs: Runs, ctx: Context) -> list[str]:
    _hellos(runs)
    return _recorded(runs, "hello-fields")


@check("hello-env")
def _hello_env(runs: Runs, ctx: Context) -> list[str]:
    _hellos(runs)
    return _recorded(runs, "hello-env")


@check("fresh-run-id")
def _fresh_run_id(runs: Runs, ctx: Context) -> list[str]:
    problems = _recorded(runs, "fresh-run-id")
    seen: dict[str, str] = {}
    for name, stream in _hellos(runs):
        run_id = stream.hello.run_id if stream.hello else ""
        where = f"stream {stream.index} of the {name} session"
        if run_id and run_id in seen:
            problems.append(f"{where} reused run_id {run_id!r} of {seen[run_id]}")
        seen.setdefault(run_id, where)
    return problems


@check("reset-frame-first")
def _reset_frame_first(runs: Runs, ctx: Context) -> list[str]:
    problems = []
    for stream in _served(runs):
        frame = stream.frames[0]
        if frame.reward_K.any():
            problems.append(
                f"stream {stream.index}: first frame's rewards are {frame.reward_K.tolist()}, not 0"
            )
        for flag in ("terminated", "truncated"):
            values = getattr(frame, f"{flag}_K")
            if values.any():
                problems.append(
                    f"stream {stream.index}: first frame has {flag} set ({values.tolist()})"
                )
        if ctx.agents_model is not None:
            reset = ctx.agents_model.reset()
            for row, obs in enumerate(frame.obs_KO):
                want = reset.obs[row % ctx.agents]
                if want is not None and not ctx.agents_model.same(want, obs):
                    problems.append(
                        f"stream {stream.index}: row {row}'s first observation {_show(obs)} "
                        "is not one a reset gives"
                    )
        if ctx.model is not None:
            for i, obs in enumerate(frame.obs_KO):
                if not ctx.model.is_reset(obs):
                    problems.append(
                        f"stream {stream.index}: env {i}'s first observation {_show(obs)} "
                        "is not one a reset gives"
                    )
    return problems


@check("k-constant")
def _k_constant(runs: Runs, ctx: Context) -> list[str]:
    problems = _recorded(runs, "k-constant")
    if not problems and not any(len(s.frames) > 1 for s in _served(runs)):
        raise Skip("no stream carried two frames")
    return problems


@check("tensor-layout")
def _tensor_layout(runs: Runs, ctx: Context) -> list[str]:
    problems = _recorded(runs, "tensor-layout")
    if not problems:
        _served(runs)
    return problems


@check("observation-leaves")
def _observation_leaves(runs: Runs, ctx: Context) -> list[str]:
    from seedrl import codec

    if not codec.is_structured(ctx.env.observation_space):
        raise Skip(
            f"{ctx.env.env_id}'s observation is not a dict/tuple (try --env "
            "seedrl.conformance.probe:DictProbe)"
        )
    problems = _recorded(runs, "observation-leaves")
    if not problems:
        _served(runs)
    return problems


@check("finite-values")
def _finite_values(runs: Runs, ctx: Context) -> list[str]:
    problems = _recorded(runs, "finite-values")
    if not problems:
        _served(runs)
    return problems


@check("next-step-autoreset")
def _next_step_autoreset(runs: Runs, ctx: Context) -> list[str]:
    if ctx.agents:
        raise Skip("a multi-agent env ends per agent (agent-episode-ends)")
    problems, ends = [], 0
    for stream in _served(runs):
        for t, (frame, after) in enumerate(itertools.pairwise(stream.frames)):
            for i in np.flatnonzero(frame.terminated_K | frame.truncated_K):
                ends += 1
                where = f"stream {stream.index}, env {i}, frame {t + 1} (after its episode ended)"
                if after.reward_K[i] != 0:
                    problems.append(f"{where}: reward {after.reward_K[i]}, not 0")
                if after.terminated_K[i] or after.truncated_K[i]:
                    problems.append(f"{where}: an end flag is set")
                if ctx.model is not None and not ctx.model.is_reset(after.obs_KO[i]):
                    problems.append(
                        f"{where}: observation {_show(after.obs_KO[i])} is not a reset observation"
                    )
    if not ends and not problems:
        raise Skip("no episode ended while the suite watched")
    return problems


def _need_model(ctx: Context) -> EnvModel:
    if ctx.agents:
        raise Skip("a multi-agent env: its steps are judged per agent (agent-actions-applied)")
    if ctx.model is None:
        raise Skip(
            f"the suite has no model of {ctx.env.env_id} (models: CartPole-v1 and the probe envs)"
        )
    return ctx.model


@dataclass
class _Step:
    """One env's step from frame t to t+1 within an episode."""

    stream: StreamRecord
    t: int
    env: int
    episode_step: int
    """Steps taken in the episode at frame t + 1."""


def _steps(stream: StreamRecord) -> Iterator[_Step]:
    k = stream.frames[0].reward_K.shape[0]
    start = np.zeros(k, np.int64)
    for t, frame in enumerate(stream.frames[:-1]):
        ended = frame.terminated_K | frame.truncated_K
        for i in range(k):
            if ended[i]:
                start[i] = t + 1
            elif frame.actions_KA is not None:
                yield _Step(stream, t, i, t + 1 - int(start[i]))


@check("actions-applied")
def _actions_applied(runs: Runs, ctx: Context) -> list[str]:
    model = _need_model(ctx)
    problems, checked = [], 0
    for stream in _served(runs):
        for step in _steps(stream):
            checked += 1
            problem = _transition_problem(model, step)
            if problem:
                problems.append(problem)
    if not checked:
        raise Skip("no env stepped twice in a row while the suite watched")
    return problems


def _transition_problem(model: EnvModel, step: _Step) -> str:
    frame, after = step.stream.frames[step.t], step.stream.frames[step.t + 1]
    assert frame.actions_KA is not None
    i = step.env
    action = frame.actions_KA[i]
    got = after.obs_KO[i]
    want = model.step(frame.obs_KO[i], action)
    where = f"stream {step.stream.index}, env {i}, frame {step.t + 1}"
    if not model.same(want.obs, got):
        hint = _which_action(model, frame.obs_KO[i], got, frame.actions_KA, i)
        return (
            f"{where}: observation {_show(got)}, but the env's dynamics under the action "
            f"sent ({_show(action)}) give {_show(want.obs)}{hint}"
        )
    if abs(float(after.reward_K[i]) - want.reward) > 1e-5 * max(1.0, abs(want.reward)):
        return f"{where}: reward {after.reward_K[i]}, but the step gives {want.reward}"
    if bool(after.terminated_K[i]) != want.terminated and not want.decided_by_rounding:
        return (
            f"{where}: terminated {bool(after.terminated_K[i])}, the step gives {want.terminated}"
        )
    return ""


def _which_action(
    model: EnvModel, obs: np.ndarray, got: np.ndarray, actions_KA: np.ndarray, i: int
) -> str:
    for j, other in enumerate(actions_KA):
        if (
            j != i
            and not np.array_equal(other, actions_KA[i])
            and model.same(model.step(obs, other).obs, got)
        ):
            return f"; it is what env {j}'s action gives: actions applied to the wrong env?"
    return ""


@check("time-limit-truncation")
def _time_limit_truncation(runs: Runs, ctx: Context) -> list[str]:
    model = _need_model(ctx)
    limit = model.max_episode_steps
    if limit is None:
        raise Skip(f"{ctx.env.env_id} has no time limit")
    problems, reached = [], 0
    for stream in _served(runs):
        for step in _steps(stream):
            after = stream.frames[step.t + 1]
            truncated, terminated = (
                bool(after.truncated_K[step.env]),
                bool(after.terminated_K[step.env]),
            )
            where = f"stream {stream.index}, env {step.env}, frame {step.t + 1}"
            if step.episode_step == limit:
                reached += 1
                if not truncated:
                    kind = "terminated" if terminated else "neither truncated nor terminated"
                    problems.append(
                        f"{where}: the episode reached the {limit}-step limit but is {kind}"
                    )
            elif truncated:
                problems.append(
                    f"{where}: truncated after {step.episode_step} steps; the limit is {limit}"
                )
    served = max(len(s.frames) for s in _served(runs))
    if not reached and not problems:
        if served > limit:
            return [
                f"no episode reached the {limit}-step limit in {served} frames (env 0 was "
                "kept alive by the suite's actions)"
            ]
        raise Skip(f"no stream was long enough to reach the {limit}-step limit")
    return problems


@check("box-actions-clipped")
def _box_actions_clipped(runs: Runs, ctx: Context) -> list[str]:
    model = _need_model(ctx)
    space = ctx.env.action_space
    if space.kind != "box" or not model.clips_box_actions_visibly:
        raise Skip(
            f"{ctx.env.env_id} has no Box actions whose clipping shows "
            "(try --env seedrl.conformance.probe:BoxProbe)"
        )
    from seedrl import codec

    low, high = codec.action_bounds(space)
    problems, outside = [], 0
    for stream in _served(runs):
        for step in _steps(stream):
            frame = stream.frames[step.t]
            assert frame.actions_KA is not None
            action = frame.actions_KA[step.env]
            if low is None or high is None or np.all((action >= low) & (action <= high)):
                continue
            outside += 1
            problem = _transition_problem(model, step)
            if problem:
                problems.append(
                    f"action {_show(action)} is outside [{_show(low)}, {_show(high)}]: {problem}"
                )
    if not outside and not problems:
        raise Skip("no out-of-bounds action was stepped")
    return problems


def _multi_agent(ctx: Context) -> int:
    if not ctx.agents:
        raise Skip(
            f"{ctx.env.env_id} is single-agent (try --env seedrl.conformance.probe:TurnProbe "
            "or :SimulProbe)"
        )
    return ctx.agents


def _need_agents_model(ctx: Context) -> AgentsModel:
    _multi_agent(ctx)
    if ctx.agents_model is None:
        raise Skip(
            f"the suite has no model of {ctx.env.env_id} (multi-agent models: "
            f"{', '.join(AGENT_MODELS)})"
        )
    return ctx.agents_model


@check("agent-rows")
def _agent_rows(runs: Runs, ctx: Context) -> list[str]:
    _multi_agent(ctx)
    problems = _recorded(runs, "agent-rows")
    if not problems:
        _served(runs)
    return problems


AGENT_WALK_CASES = ("acting-rows", "agent-actions-applied", "agent-episode-ends")


def _agent_walk(runs: Runs, ctx: Context) -> dict[str, list[str]]:
    """Every served frame of a multi-agent env against its model, driven by the actions
    the suite sent: what each case finds wrong. An env is followed until its first
    wrong frame in a stream (its later frames would only repeat the error)."""
    if ctx.agent_walk is not None:
        return ctx.agent_walk
    model = _need_agents_model(ctx)
    a = ctx.agents
    found: dict[str, list[str]] = {case: [] for case in AGENT_WALK_CASES}
    for stream in _served(runs):
        k = len(stream.frames[0].reward_K) // a
        follow: list[tuple[AgentsFrame, AgentsFrame | None, np.ndarray | None] | None] = [
            (model.reset(), None, None) for _ in range(k)
        ]
        for t, frame in enumerate(stream.frames):
            for i in range(k):
                state = follow[i]
                if state is None:
                    continue
                want, before, sent = state
                where = f"stream {stream.index}, env {i}, frame {t}"
                wrong = _agent_frame_problems(model, ctx, frame, i, want, before, sent, where)
                for case, problem in wrong:
                    found[case].append(problem)
                if wrong or frame.actions_KA is None:
                    follow[i] = None
                    continue
                sent_A = frame.actions_KA[i * a : (i + 1) * a]
                after = model.reset() if want.over else model.step(want, sent_A)
                follow[i] = (after, None if want.over else want, sent_A)
    ctx.agent_walk = found
    return found


def _agent_frame_problems(
    model: AgentsModel,
    ctx: Context,
    frame: FrameRecord,
    i: int,
    want: AgentsFrame,
    before: AgentsFrame | None,
    sent_A: np.ndarray | None,
    where: str,
) -> list[tuple[str, str]]:
    """(case, problem) for env i's rows of ``frame`` against the model's ``want`` (``before``
    and ``sent_A``: the frame and actions it came from; None for a reset frame)."""
    a, ids = ctx.agents, ctx.env.agents
    rows = slice(i * a, (i + 1) * a)
    reset = before is None
    found: list[tuple[str, str]] = []
    assert frame.acting_R is not None  # the scripted learner refuses a frame without it
    acting = frame.acting_R[rows]
    if not np.array_equal(acting, want.acting):
        got = [ids[j] for j in np.flatnonzero(acting)]
        mover = [ids[j] for j in np.flatnonzero(want.acting)]
        note = " (a reset frame)" if reset else ""
        found.append(("acting-rows", f"{where}: acting marks {got}, but the env applies the "
                      f"action of {mover} next{note}"))  # fmt: skip
    for j in range(a):
        row, who = i * a + j, f"{ids[j]} (row {i * a + j})"
        flags = (bool(frame.terminated_K[row]), bool(frame.truncated_K[row]))
        wanted = (bool(want.terminated[j]), bool(want.truncated[j]))
        out = want.obs[j] is None
        if flags != wanted:
            why = (
                "a reset frame has both flags clear" if reset
                else "its episode ended earlier: its rows carry both flags clear until it "
                "acts again" if out
                else f"its episode ends here ({'truncated' if wanted[1] else 'terminated'})"
                if any(wanted) else "it plays on"
            )  # fmt: skip
            found.append(("agent-episode-ends", f"{where}, {who}: terminated {flags[0]}, "
                          f"truncated {flags[1]}, but {why}"))  # fmt: skip
        expected = want.obs[j]
        got_obs = frame.obs_KO[row]
        if expected is not None and not model.same(expected, got_obs):
            if reset:
                found.append(("agent-episode-ends", f"{where}, {who}: observation "
                              f"{_show_record(got_obs)} is not one a reset gives"))  # fmt: skip
            else:
                hint = _which_row(model, before, sent_A, got_obs, j, ids)
                found.append(("agent-actions-applied", f"{where}, {who}: observation "
                              f"{_show_record(got_obs)}, but the env's rules under the actions "
                              f"sent give {_show_record(expected)}{hint}"))  # fmt: skip
        reward = float(frame.reward_K[row])
        if reward != float(want.reward[j]):
            case = "agent-episode-ends" if reset or out else "agent-actions-applied"
            why = (
                "a reset frame's rewards are 0" if reset
                else "its episode ended earlier: its rows carry reward 0 until it acts again"
                if out else "the env's rules under the action sent give that"
            )  # fmt: skip
            found.append((case, f"{where}, {who}: reward {reward}, not {want.reward[j]} ({why})"))
    return found


WRONG_AGENT_HINT_AGENTS = 5
"""Up to this many agents per env, a wrong observation is tried against every way of
handing the actions sent to other agents of the env (A! candidates)."""


def _which_row(
    model: AgentsModel,
    before: AgentsFrame | None,
    sent_A: np.ndarray | None,
    got: np.ndarray,
    j: int,
    ids: Sequence[str],
) -> str:
    """A hint when ``got`` is what the env gives with the actions sent handed to other
    agents of the env (an AEC mover's, a Parallel env's every acting agent's)."""
    if before is None or sent_A is None or not 1 < len(ids) <= WRONG_AGENT_HINT_AGENTS:
        return ""
    movers = [int(q) for q in np.flatnonzero(before.acting)]
    for order in itertools.permutations(range(len(ids))):
        moved = np.asarray(sent_A)[list(order)]
        handed = [q for q in movers if not np.array_equal(moved[q], sent_A[q])]
        if not handed:
            continue
        maybe = model.step(before, moved).obs[j]
        if maybe is not None and model.same(maybe, got):
            pairs = ", ".join(f"{ids[order[q]]}'s action applied to {ids[q]}" for q in handed)
            return f"; it is what the env gives with {pairs}: an action applied to the wrong agent?"
    return ""


def _show_record(value: Any) -> str:
    """An observation as ``{leaf: value, ...}`` (a record's fields, a dict's items)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{name}: {_show(v)}" for name, v in value.items()) + "}"
    names = getattr(getattr(value, "dtype", None), "names", None)
    if not names:
        return _show(value)
    return "{" + ", ".join(f"{name}: {_show(value[name])}" for name in names) + "}"


@check("acting-rows")
def _acting_rows(runs: Runs, ctx: Context) -> list[str]:
    return _agent_walk(runs, ctx)["acting-rows"]


@check("agent-actions-applied")
def _agent_actions_applied(runs: Runs, ctx: Context) -> list[str]:
    return _agent_walk(runs, ctx)["agent-actions-applied"]


@check("agent-episode-ends")
def _agent_episode_ends(runs: Runs, ctx: Context) -> list[str]:
    a = _multi_agent(ctx)
    problems = _agent_ends_by_rule(runs, a)
    if ctx.agents_model is not None:
        problems += _agent_walk(runs, ctx)["agent-episode-ends"]
    return problems


def _agent_ends_by_rule(runs: Runs, a: int) -> list[str]:
    """The per-agent end rules that need no model: a final row does not act; until its
    agent acts again, its rows carry reward 0 and both flags clear; once every agent of an
    env has ended, the next frame is a reset frame (rewards 0, flags clear, someone acting)."""
    problems, ends = [], 0
    for stream in _served(runs):
        rows = len(stream.frames[0].reward_K)
        out = np.zeros(rows, np.bool_)
        """Rows whose agent ended and has not acted since."""
        for t, frame in enumerate(stream.frames):
            assert frame.acting_R is not None
            acting = frame.acting_R
            flags = frame.terminated_K | frame.truncated_K
            reset_E = out.reshape(-1, a).all(axis=1)
            for i in np.flatnonzero(reset_E):  # every agent ended: a reset frame
                span = slice(i * a, (i + 1) * a)
                where = f"stream {stream.index}, env {i}, frame {t} (all its agents had ended)"
                if frame.reward_K[span].any() or flags[span].any() or not acting[span].any():
                    problems.append(f"{where}: rewards {frame.reward_K[span].tolist()}, flags "
                                    f"{flags[span].tolist()}, acting {acting[span].tolist()}: "
                                    "not a reset frame")  # fmt: skip
                out[span] = False
            for row in np.flatnonzero(out & ~acting):
                where = f"stream {stream.index}, row {row}, frame {t} (its agent ended earlier)"
                if frame.reward_K[row] != 0:
                    problems.append(f"{where}: reward {frame.reward_K[row]}, not 0")
                if flags[row]:
                    problems.append(f"{where}: an end flag is set again")
            out &= ~acting
            for row in np.flatnonzero(flags & ~out):
                ends += 1
                if acting[row]:
                    problems.append(f"stream {stream.index}, row {row}, frame {t}: the final "
                                    "row of its agent's episode is marked acting")  # fmt: skip
            out |= flags
    if not ends and not problems:
        raise Skip("no agent's episode ended while the suite watched")
    return problems


def _stacked(ctx: Context) -> None:
    if ctx.frame_stack <= 1:
        raise Skip(
            f"{ctx.env.env_id}'s observations are not frame stacks (try --env "
            "seedrl.conformance.probe:StackedProbe or an ALE/ env)"
        )


@check("frame-stack-offered")
def _frame_stack_offered(runs: Runs, ctx: Context) -> list[str]:
    _stacked(ctx)
    problems = _recorded(runs, "frame-stack-offered")
    if problems:
        return problems
    if not [s for s in _served(runs) if s.info is not None and s.info.frame_stack > 1]:
        raise Skip("no stream followed a GetInfo with the offer")
    return []


@check("frame-stack-not-offered")
def _frame_stack_not_offered(runs: Runs, ctx: Context) -> list[str]:
    _stacked(ctx)
    problems = _recorded(runs, "frame-stack-not-offered")
    if problems:
        return problems
    if not [s for s in _served(runs) if s.info is not None and s.info.frame_stack == 0]:
        raise Skip("no stream followed a GetInfo without the offer")
    return []


def _shutdowns(runs: Runs) -> list[StreamRecord]:
    found = [s for _, s in _all_streams(runs) if s.shutdown is not None]
    if not found:
        raise Skip("no stream got as far as its Shutdown")
    return found


@check("shutdown-ends-stream")
def _shutdown_ends_stream(runs: Runs, ctx: Context) -> list[str]:
    problems = []
    for stream in _shutdowns(runs):
        kind = "final" if stream.shutdown and stream.shutdown.final else "restart"
        where = f"stream {stream.index} (Shutdown, {kind})"
        after, seconds = stream.after_shutdown()
        if after == SILENT:
            problems.append(
                f"{where}: the actor had not ended its side {SHUTDOWN_WAIT_S:g} s later"
            )
        elif after not in (HALF_CLOSED, CANCELLED):
            problems.append(f"{where}: the actor sent {after} after it")
        elif seconds is not None and seconds > SHUTDOWN_END_S:
            problems.append(f"{where}: the actor ended its side after {seconds:.1f} s")
    return problems


@check("shutdown-restart-reconnects")
def _shutdown_restart_reconnects(runs: Runs, ctx: Context) -> list[str]:
    run = runs.get("stream")
    if run is None:
        raise Skip("the stream session did not run")
    streams = run.learner.streams
    restart = next((s for s in streams if s.shutdown is not None and not s.shutdown.final), None)
    if restart is None:
        raise Skip(f"no stream got as far as its Shutdown{{final: false}}{_why(run)}")
    later = [s for s in streams if s.index > restart.index and s.hello is not None]
    if not later:
        return [f"no new stream with a Hello after Shutdown{{final: false}}{_why(run)}"]
    return []


@check("shutdown-final-exits")
def _shutdown_final_exits(runs: Runs, ctx: Context) -> list[str]:
    problems = []
    for name, run in runs.items():
        final = next((s for s in run.learner.streams if s.shutdown and s.shutdown.final), None)
        if final is None or final.shutdown_at is None:
            continue
        after = [e for e in run.learner.events if _at(e) > final.shutdown_at]
        if after:
            problems.append(f"{name} session: {len(after)} call(s) after Shutdown{{final: true}}")
        if run.exit_code is None:
            problems.append(
                f"{name} session: the actor had not exited {EXIT_GRACE_S:g} s after "
                "Shutdown{final: true}"
            )
        elif run.exit_code != 0:
            problems.append(f"{name} session: the actor exited with status {run.exit_code}, not 0")
        return problems
    raise Skip(
        "no stream got as far as its Shutdown{final: true}"
        + _why(runs.get("stream") or next(iter(runs.values())))
    )


def _at(event: InfoCall | StreamRecord) -> float:
    return event.at if isinstance(event, InfoCall) else event.opened


def _retry_run(runs: Runs) -> ActorRun:
    run = runs.get("retry")
    if run is None:
        raise Skip("the retry session did not run")
    if run.error and not run.learner.events:
        raise Skip(run.error)
    return run


@check("retry-unreachable")
def _retry_unreachable(runs: Runs, ctx: Context) -> list[str]:
    run = _retry_run(runs)
    if not run.unreachable_attempts:
        return [f"the actor never dialled its learner's address{_why(run)}"]
    if not run.learner.events:
        return [
            f"the actor dialled {len(run.unreachable_attempts)} time(s) before the learner "
            f"listened, then never reached it{_why(run)}"
        ]
    return []


def _failures(run: ActorRun) -> list[tuple[float, str, float | None]]:
    """(when, what, the next attempt's time) for every scripted refusal in the retry run."""
    events = run.learner.events
    found = []
    for n, event in enumerate(events):
        if isinstance(event, InfoCall) and event.refused is not None:
            when, what = event.at, f"GetInfo {event.refused.name}"
        elif isinstance(event, StreamRecord) and event.refused is not None and event.ended:
            when, what = event.ended, f"Act {event.refused.name}"
        else:
            continue
        later = [_at(e) for e in events[n + 1 :] if _at(e) >= when]
        found.append((when, what, later[0] if later else None))
    return found


def _retried(runs: Runs, code: grpc.StatusCode) -> list[str]:
    run = _retry_run(runs)
    if code is UNAVAILABLE and run.unreachable_attempts and not run.learner.events:
        return [
            "after UNAVAILABLE (nothing listening yet) the actor "
            + (f"exited with status {run.exit_code}" if run.exit_code is not None else "stopped")
            + " instead of retrying"
        ]
    problems = []
    for _, what, next_at in _failures(run):
        if code.name in what and next_at is None:
            problems.append(f"after {what} the actor never tried again{_why(run)}")
    if not any(code.name in what for _, what, _ in _failures(run)):
        return [f"the session never got to refuse the actor with {code.name}{_why(run)}"]
    return problems


@check("retry-unavailable")
def _retry_unavailable(runs: Runs, ctx: Context) -> list[str]:
    return _retried(runs, UNAVAILABLE)


@check("retry-resource-exhausted")
def _retry_resource_exhausted(runs: Runs, ctx: Context) -> list[str]:
    return _retried(runs, EXHAUSTED)


def _waits(runs: Runs, least: int = AT_CAP) -> list[float]:
    """The retry session's waits, failure to next attempt; Skip with fewer than ``least``."""
    failures = _failures(_retry_run(runs))
    waits = [next_at - when for when, _, next_at in failures if next_at is not None]
    if len(waits) < least:
        raise Skip(f"only {len(waits)} retries were seen")
    return waits


@check("backoff-capped")
def _backoff_capped(runs: Runs, ctx: Context) -> list[str]:
    cap = ctx.config.max_backoff_s
    waits = _waits(runs, least=1)
    over = [w for w in waits if w > cap * 1.1 + BACKOFF_SLACK_S]
    # One late wait among a dozen is a busy host's scheduling, not an uncapped backoff
    # (which overshoots on every wait past the cap); a far overshoot counts at once.
    if len(over) > 1 or any(w > FAR_OVER * cap + 1.0 for w in over):
        return [
            f"waits of {_seconds(over)} exceed the cap of {cap:g} s (the actor must run "
            "with its cap set to the suite's --max-backoff-s)"
        ]
    return []


@check("backoff-jittered")
def _backoff_jittered(runs: Runs, ctx: Context) -> list[str]:
    cap = ctx.config.max_backoff_s
    last = sorted(_waits(runs)[-AT_CAP:])
    alike = max(bisect.bisect_right(last, w + ALIKE * cap) - i for i, w in enumerate(last))
    if alike * 3 >= 2 * len(last):
        return [
            f"{alike} of the {len(last)} waits at the cap, {_seconds(last)}, lie within "
            f"{ALIKE * cap * 1000:.0f} ms of each other: no jitter"
        ]
    return []


@check("backoff-waits")
def _backoff_waits(runs: Runs, ctx: Context) -> list[str]:
    cap = ctx.config.max_backoff_s
    problems = []
    last = _waits(runs)[-AT_CAP:]
    if sum(last) / len(last) < cap / 6:
        problems.append(
            f"the waits at the cap, {_seconds(last)}, average under {cap / 6:.3f} s: "
            "a tight retry loop"
        )
    run = runs.get("stream")
    if run is not None:
        streams = run.learner.streams
        restart = next(
            (s for s in streams if s.shutdown is not None and not s.shutdown.final), None
        )
        if restart is not None and restart.shutdown_at is not None:
            later = [_at(e) for e in run.learner.events if _at(e) > restart.shutdown_at]
            if (
                later
                and later[0] - restart.shutdown_at > cap / 2 + BACKOFF_SLACK_S + SHUTDOWN_END_S
            ):
                problems.append(
                    f"after a served connection's Shutdown{{final: false}} the first retry "
                    f"came {later[0] - restart.shutdown_at:.2f} s later: the backoff must "
                    "start (again) below half the cap"
                )
    return problems


def _stopped(runs: Runs, session: str, code: str) -> list[str]:
    run = runs.get(session)
    if run is None:
        raise Skip(f"the {session} session did not run")
    refusal = _refused_at(run.learner)
    if refusal is None:
        return [f"the actor never got as far as the scripted {code}{_why(run)}"]
    refused_at = refusal - EXIT_GRACE_S
    problems = []
    after = [e for e in run.learner.events if _at(e) > refused_at + 1e-3]
    if after:
        problems.append(f"the actor made {len(after)} more call(s) after {code}")
    if run.exit_code is None:
        problems.append(f"the actor had not exited {EXIT_GRACE_S:g} s after {code}")
    elif run.exit_code == 0:
        problems.append(f"the actor exited with status 0 after {code}; it must fail")
    return problems


@check("stop-invalid-argument")
def _stop_invalid_argument(runs: Runs, ctx: Context) -> list[str]:
    return _stopped(runs, "refuse-invalid", "INVALID_ARGUMENT")


@check("stop-unauthenticated")
def _stop_unauthenticated(runs: Runs, ctx: Context) -> list[str]:
    return _stopped(runs, "refuse-unauthenticated", "UNAUTHENTICATED")


def _show(value: Any) -> str:
    array = np.asarray(value)
    if array.dtype.kind == "f":
        return np.array2string(array, precision=4, separator=", ", max_line_width=200)
    return np.array2string(array, separator=", ", max_line_width=200)


def _seconds(values: Sequence[float]) -> str:
    return "[" + ", ".join(f"{v:.2f}" for v in values) + "] s"


# ---------------------------------------------------------------------- the suite


MAX_PROBLEMS_SHOWN = 3


def sessions_for(cases: Sequence[Case]) -> list[str]:
    wanted = {s for case in cases for s in CASE_SESSIONS.get(case.id, ("stream",))}
    return [s for s in SESSIONS if s in wanted]


def run_actor_suite(command: Sequence[str], config: ActorSuiteConfig) -> Report:
    """Run the sessions the selected cases need against ``command``; judge every case."""
    if not any("{learner}" in arg for arg in command):
        raise ValueError("the actor command must contain {learner}, the address to dial")
    cases = select("actor", config.only)
    env = envs.describe_env(config.env, config.env_kwargs)
    model = model_for(config.env, config.env_kwargs)
    stack = (
        model.frame_stack if model is not None else envs.frame_stack(config.env, config.env_kwargs)
    )
    token = secrets.token_urlsafe(16) if config.auth else None
    ctx = Context(list(command), config, env, model, stack if stack > 1 else 0, token)
    if env.agents:
        ctx.model = None  # a multi-agent env's rows are judged by its own kind of model
        ctx.agents_model = agents_model_for(config.env, config.env_kwargs)
    report = Report("actor", " ".join(command), config.env)
    names = sessions_for(cases)
    with ThreadPoolExecutor(len(names) if config.parallel else 1) as pool:
        done = pool.map(lambda name: SESSION_RUNNERS[name](ctx), names)
        runs: Runs = dict(zip(names, done, strict=True))
    for case in cases:
        report.verdicts.append(judge(case, runs, ctx))
    failing_sessions = {
        name for name, run in runs.items()
        if run.error or (run.exit_code not in (0, None) and name == "stream")
    }  # fmt: skip
    for name, run in runs.items():
        if run.error:
            report.notes.append(run.error)
        if report.failed and (name in failing_sessions or run.exit_code is None) and run.output:
            tail = " / ".join(run.output[-6:])
            report.notes.append(f"{name} session, the actor's last output: {tail}")
    return report


def judge(case: Case, runs: Runs, ctx: Context) -> Verdict:
    try:
        problems = CHECKS[case.id](runs, ctx)
    except Skip as reason:
        return Verdict(case, Status.SKIP, str(reason))
    if not problems:
        return Verdict(case, Status.PASS)
    shown = "; ".join(problems[:MAX_PROBLEMS_SHOWN])
    if len(problems) > MAX_PROBLEMS_SHOWN:
        shown += f"; and {len(problems) - MAX_PROBLEMS_SHOWN} more"
    return Verdict(case, Status.FAIL, shown)
