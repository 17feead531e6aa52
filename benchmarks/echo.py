"""An echo learner for benchmarks: the learner's own ``Act`` handler with the model replaced.

``python -m benchmarks.echo --port P --logdir D`` (it takes the learner's flags) serves
the real :class:`~learner.serving.servicer.LearnerServicer` behind the real dynamic batcher, with
the same server options, local socket, auth and shutdown handshake, but its engine
answers every frame with zero actions and records nothing: no forward pass, no
trajectories, no training. What actors reach against it is the transport limit of a
topology, measured through the very handler the learner runs: the ``echo`` row of
``make bench``. It writes the learner's ``metrics.jsonl`` records, so the benchmark
reads both the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from learner.metrics import JsonlSink, MetricsWriter
from learner.run import Serving, StopRequest, make_batcher
from learner.serving.batcher import DynamicBatcher, PendingRequest
from learner.serving.server import build_server
from learner.serving.servicer import LearnerServicer
from learner.serving.streams import Connection
from learner.state.stats import LearnerStats
from seedrl import codec, envs
from seedrl.cli import parse_config
from seedrl.config import LearnerConfig
from seedrl.proto import seedrl_pb2 as pb
from seedrl.security import config_auth_token
from seedrl.transport import listen_address, offered_local_socket, run_event_loop

ECHO_RUN_ID = "echo"


class EchoEngine:
    """The inference engine's place in the serving path, answering with zero actions.

    It is the servicer's slot pool too: slots are only numbers here, since nothing is
    recorded against them.
    """

    def __init__(self, action_space: pb.SpaceSpec, stats: LearnerStats) -> None:
        self.stats = stats
        self._dtype = np.dtype("int64" if action_space.kind == "discrete" else "float32")
        self._shape = codec.spec_shape(action_space)
        self._zeros: dict[int, np.ndarray] = {}
        self._slot_ids = itertools.count()

    def allocate(self, count: int) -> np.ndarray:
        return np.array([next(self._slot_ids) for _ in range(count)], dtype=np.int64)

    def release_later(self, conn: Connection) -> None:
        conn.closed = True

    async def process(self, batch: list[PendingRequest]) -> None:
        frames = 0
        for request in batch:
            conn = request.payload.conn
            k = conn.num_envs
            conn.frames += k
            frames += k
            if not request.future.done():
                request.future.set_result(self._actions(k))
        self.stats.on_batch(frames, None)

    def _actions(self, k: int) -> np.ndarray:
        actions = self._zeros.get(k)
        if actions is None:
            actions = self._zeros[k] = np.zeros((k, *self._shape), self._dtype)
        return actions


def echo_servicer(
    config: LearnerConfig, local_address: str = ""
) -> tuple[LearnerServicer, DynamicBatcher, LearnerStats]:
    """The learner's servicer and batcher for ``config``, around an :class:`EchoEngine`
    (run ``batcher.run()`` beside the server)."""
    env_spec = envs.describe_env(config.env, config.env_kwargs)
    stats = LearnerStats(time_phases=config.time_phases)
    engine = EchoEngine(env_spec.action_space, stats)
    batcher = make_batcher(config, engine.process)
    servicer = LearnerServicer(
        config, env_spec, batcher, engine, engine, stats, ECHO_RUN_ID,
        local_addresses=[local_address] if local_address else [],
    )  # fmt: skip
    return servicer, batcher, stats


async def serve(config: LearnerConfig) -> None:
    """Serve until SIGTERM/SIGINT, writing a metrics record every ``log_interval_s``."""
    with offered_local_socket(config.offers_local_socket, config.bind) as local:
        servicer, batcher, stats = echo_servicer(config, local or "")
        token = config_auth_token(config)
        serving = Serving(batcher, servicer, *build_server(config, servicer, token, local))
        await serving.start()
        serving.start_batching()
        stop = StopRequest()
        print(f"seedrl echo listening on {listen_address(config.bind, serving.port)}", flush=True)
        Path(config.logdir).mkdir(parents=True, exist_ok=True)
        writer = MetricsWriter([JsonlSink(config.logdir)])
        try:
            while not stop.event.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.event.wait(), config.log_interval_s)
                writer.write(stats.snapshot())
        finally:
            await serving.stop("echo stopping", final=False)
            writer.close()


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_config(
        LearnerConfig,
        argv,
        "python -m benchmarks.echo",
        "The learner's Act handler with zero actions instead of a model (the bench's echo).",
    )
    run_event_loop(serve(config), config.uvloop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
