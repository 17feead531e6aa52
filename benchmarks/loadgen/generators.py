"""Several generator processes splitting one run's synthetic streams (``--generators G``).

One process drives a few thousand streams, but its driver threads share one GIL: at
thousands of lockstep streams the generator, not the learner, becomes what a window
measures. :class:`GeneratorProcesses` splits the S streams into G contiguous runs of
stream numbers (:func:`split_streams`), runs a :class:`SyntheticActors` over each in its
own spawned process, and answers as one :class:`SyntheticActors` does: streams accepted,
replies, errors, round trips, the generators' CPU.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.bench.procfs import cpu_seconds
from benchmarks.loadgen.synthetic import (
    OPENING_WINDOW,
    SyntheticActors,
    Tape,
    percentiles_ms,
)
from seedrl.proto import seedrl_pb2 as pb

ANSWER_TIMEOUT_S = 60.0
"""How long a generator may take to answer one command (it answers between replies)."""
ERRORS_REPORTED = 5
"""Stream errors a generator sends back per question: the first few say why."""


def split_streams(streams: int, connections: int, generators: int) -> list[tuple[range, int]]:
    """Per generator: its stream numbers (a contiguous run) and its connections.

    Runs differ in length by at most one stream and the connections are split the same
    way; each generator has at least one connection and no more than it has streams.
    """
    if not 1 <= generators <= streams:
        raise ValueError(f"cannot split {streams} streams over {generators} generators")
    out = []
    for g in range(generators):
        first, end = streams * g // generators, streams * (g + 1) // generators
        share = connections * (g + 1) // generators - connections * g // generators
        out.append((range(first, end), min(max(share, 1), end - first)))
    return out


def generator_main(
    pipe: Any,
    targets: Sequence[str],
    info_bytes: bytes,
    tape: Tape,
    indices: Sequence[int],
    num_envs: int,
    connections: int,
    metadata: tuple[tuple[str, str], ...],
    opening_window: int,
) -> None:
    """One generator process: its streams, and answers to the parent's commands until
    ``stop`` (or the parent's end closes the pipe)."""
    info = pb.LearnerInfo.FromString(info_bytes)
    actors = SyntheticActors(
        targets, info, tape, len(indices), num_envs, connections, metadata, indices,
        opening_window,
    )  # fmt: skip
    actors.start()
    try:
        while True:
            try:
                command = pipe.recv()
            except EOFError:
                return
            if command == "counts":
                pipe.send(
                    (actors.connected, actors.replies, actors.errors[:ERRORS_REPORTED],
                     time.process_time())
                )  # fmt: skip
            elif command == "open_window":
                actors.open_window()
                pipe.send(None)
            elif command == "release":
                actors.release()
                pipe.send(None)
            elif command == "rtt":
                pipe.send(actors.rtt_samples_s())
            elif command == "stop":
                return
    finally:
        actors.stop()


class GeneratorProcesses:
    """S streams of K envs split over G spawned generator processes; the run's connections
    take ``targets`` in turn across the generators."""

    def __init__(
        self,
        targets: Sequence[str],
        info: pb.LearnerInfo,
        tape: Tape,
        streams: int,
        num_envs: int,
        connections: int,
        generators: int,
        metadata: tuple[tuple[str, str], ...] = (),
    ) -> None:
        ctx = mp.get_context("spawn")  # gRPC must start fresh in each
        window = max(1, OPENING_WINDOW // generators)
        self._pipes: list[Any] = []
        self._processes: list[Any] = []
        first = 0  # this generator's first connection among the run's
        for g, (indices, share) in enumerate(split_streams(streams, connections, generators)):
            parent, child = ctx.Pipe()
            own = [targets[(first + c) % len(targets)] for c in range(share)]
            first += share
            args = (
                child, own, info.SerializeToString(), tape, list(indices), num_envs, share,
                metadata, window,
            )  # fmt: skip
            self._processes.append(
                ctx.Process(target=generator_main, args=args, name=f"loadgen-{g}", daemon=True)
            )
            self._pipes.append(parent)

    def start(self) -> None:
        for process in self._processes:
            process.start()

    def _ask(self, command: str) -> list[Any]:
        for pipe in self._pipes:
            pipe.send(command)
        answers = []
        for g, pipe in enumerate(self._pipes):
            if not pipe.poll(ANSWER_TIMEOUT_S):
                raise RuntimeError(f"generator {g} did not answer {command!r}")
            answers.append(pipe.recv())
        return answers

    def _counts(self) -> list[tuple[int, int, list[str], float]]:
        return self._ask("counts")

    @property
    def connected(self) -> int:
        return sum(c[0] for c in self._counts())

    @property
    def replies(self) -> int:
        return sum(c[1] for c in self._counts())

    @property
    def errors(self) -> list[str]:
        dead = [
            f"generator {g} exited with {p.exitcode}"
            for g, p in enumerate(self._processes)
            if p.exitcode is not None
        ]
        if dead:
            return dead
        return [e for c in self._counts() for e in c[2]]

    def open_window(self) -> None:
        self._ask("open_window")

    def release(self) -> None:
        self._ask("release")

    def cpu_seconds(self) -> float:
        """The generators' CPU seconds so far, this process's included."""
        return time.process_time() + sum(cpu_seconds(p.pid) for p in self._processes if p.pid)

    def rtt_percentiles_ms(self) -> tuple[float | None, float | None]:
        samples = self._ask("rtt")
        return percentiles_ms(np.concatenate(samples) if samples else np.zeros(0))

    def stop(self) -> None:
        for pipe in self._pipes:
            try:
                pipe.send("stop")
            except OSError:
                continue
        for process in self._processes:
            process.join(30)
            if process.is_alive():
                process.kill()
                process.join(5)
