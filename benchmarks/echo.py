"""An echo learner for benchmarks: the real wire protocol, no model, no training.

``python -m benchmarks.echo --port P --logdir D`` serves ``GetInfo`` and ``Act`` exactly as
the learner does on the wire (Hello -> Accept, then one LearnerMessage of K actions per
Frame) but answers every frame at once with a constant action tensor. What actors reach
against it is the transport limit of a topology: the ``echo`` row of ``make bench``.
It writes ``metrics.jsonl`` records with the learner's key names (``time``,
``elapsed_s``, ``frames``, ``fps``, ``actors_connected``, ``learner_rss_mb``) so the
benchmark reads both the same way. It never imports torch, so it starts in a blink.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from seedrl import PROTOCOL_VERSION, codec, envs
from seedrl.proto import seedrl_pb2 as pb
from seedrl.proto import seedrl_pb2_grpc as pb_grpc
from seedrl.timing import process_rss_mb
from seedrl.transport import (
    add_learner_service,
    channel_options,
    listen_address,
    offered_local_socket,
    run_event_loop,
)


class EchoServicer(pb_grpc.LearnerServicer):
    """Accepts any Hello for the published env and answers each frame with zero actions."""

    def __init__(self, env_spec: pb.EnvSpec, max_message_bytes: int, frame_stack: int = 0) -> None:
        self.env_spec = env_spec
        self.max_message_bytes = max_message_bytes
        self.frame_stack = frame_stack
        """Offered as the learner offers it, so echo rows move the learner's bytes."""
        self.frames = 0
        self.actors_connected = 0
        self.stopping = False
        self.local_address = ""
        self._replies: dict[int, bytes] = {}

    def _reply(self, num_envs: int) -> bytes:
        """One prebuilt serialized reply per K (the constant actions never change)."""
        reply = self._replies.get(num_envs)
        if reply is None:
            space = self.env_spec.action_space
            dtype = np.int64 if space.kind == "discrete" else np.float32
            actions = np.zeros((num_envs, *codec.spec_shape(space)), dtype)
            message = pb.LearnerMessage()
            codec.encode_tensor(actions, message.actions.actions)
            reply = self._replies[num_envs] = message.SerializeToString()
        return reply

    async def GetInfo(self, request: pb.GetInfoRequest, context: Any) -> pb.LearnerInfo:
        return pb.LearnerInfo(
            protocol_version=PROTOCOL_VERSION,
            env=self.env_spec,
            learner_run_id="echo",
            max_message_bytes=self.max_message_bytes,
            local_address=self.local_address,
            frame_stack=self.frame_stack,
        )

    async def Act(self, request_iterator: Any, context: Any) -> None:
        """Read a frame, write the constant reply: the learner's stream shape, minus the model.

        Messages arrive and leave as bytes, as the learner's do; frames are not parsed.
        """
        first = await context.read()
        try:
            hello = pb.ActorMessage.FromString(first) if first is not grpc.aio.EOF else None
        except DecodeError:
            hello = None
        if hello is None or hello.WhichOneof("kind") != "hello":
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "the first message must be a Hello"
            )
            return
        k = hello.hello.num_envs
        reply = self._reply(k)
        self.actors_connected += 1
        read, write = context.read, context.write
        try:
            accept = pb.LearnerMessage(accept=pb.Accept(learner_run_id="echo"))
            await write(accept.SerializeToString())
            while True:
                message = await read()
                if message is grpc.aio.EOF:
                    return
                if self.stopping:
                    shutdown = pb.LearnerMessage(shutdown=pb.Shutdown(reason="echo stopping"))
                    await write(shutdown.SerializeToString())
                    return
                self.frames += k
                await write(reply)
        finally:
            self.actors_connected -= 1

    def record(self, start: float, last: tuple[float, int]) -> dict[str, Any]:
        now = time.perf_counter()
        return {
            "time": time.time(),
            "elapsed_s": now - start,
            "frames": self.frames,
            "fps": (self.frames - last[1]) / max(now - last[0], 1e-9),
            "actors_connected": self.actors_connected,
            "learner_rss_mb": process_rss_mb(),
        }


async def serve(args: argparse.Namespace) -> None:
    """Serve until SIGTERM/SIGINT, appending a metrics record every ``log_interval_s``."""
    spec = envs.describe_env(args.env)
    frame_stack = envs.frame_stack(args.env, {}) if args.frame_once else 1
    servicer = EchoServicer(spec, args.max_message_bytes, frame_stack if frame_stack > 1 else 0)
    server = grpc.aio.server(options=channel_options(args.max_message_bytes))
    add_learner_service(servicer, server)
    port = server.add_insecure_port(listen_address(args.bind, args.port))
    # The same same-host unix socket the learner offers, so echo and learner rows of the
    # bench compare one transport.
    with offered_local_socket(args.local_socket, args.bind) as local:
        if local is not None:
            server.add_insecure_port(local)
            servicer.local_address = local
        await _serve_until_signal(args, server, servicer, port)


async def _serve_until_signal(
    args: argparse.Namespace, server: grpc.aio.Server, servicer: EchoServicer, port: int
) -> None:
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    logdir = Path(args.logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    print(f"seedrl echo listening on {listen_address(args.bind, port)}", flush=True)
    start = time.perf_counter()
    last = (start, 0)
    with open(logdir / "metrics.jsonl", "a") as out:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), args.log_interval_s)
            record = servicer.record(start, last)
            last = (time.perf_counter(), servicer.frames)
            out.write(json.dumps(record) + "\n")
            out.flush()
    servicer.stopping = True
    await server.stop(grace=1.0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.echo", description=__doc__)
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--bind", default="127.0.0.1", help="host, or unix:PATH")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--logdir", default="runs/echo")
    parser.add_argument("--log-interval-s", type=float, default=0.5)
    parser.add_argument("--max-message-bytes", type=int, default=16 * 1024 * 1024)
    parser.add_argument(
        "--local-socket",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also listen on a unix socket offered to same-host actors (as the learner)",
    )
    parser.add_argument(
        "--frame-once",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="offer stacked-frame envs' actors to send the newest frame only (as the learner)",
    )
    parser.add_argument(
        "--uvloop",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="serve on uvloop's event loop when installed (as the learner)",
    )
    args = parser.parse_args(argv)
    run_event_loop(serve(args), args.uvloop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
