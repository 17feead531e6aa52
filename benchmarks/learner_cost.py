"""The learner's own CPU per frame, measured in one process: ``python -m benchmarks.learner_cost``.

Two microbenchmarks for cutting the learner's cost, each a few seconds on one core (pin
it, e.g. ``taskset -c 1``, and compare builds interleaved: a shared machine drifts):

- ``train``: optimizer steps of the learner's :class:`~learner.training.trainer.Trainer` on one
  fixed batch of real unrolls (stepped from the env with the learner's own policy), for
  the learner's flags (default: CartPole-v1 and its defaults). Reports the step time and
  training µs per frame (step time / frames in a batch), the figure ``make bench`` reports
  from its ideal-with-training mode.
- ``serve``: the servicer's ``Act`` handler driven in-process by N streams of K envs
  (instant actors: each stream's next frame is there as soon as its reply is written),
  through the real batcher, once with the echo engine and once with the learner's
  inference engine and trajectory store, as ``make bench``'s modes run it: ``system``
  with the trainer process the learner starts on the CPU (its feeder, weight refresh and
  result threads in this process, the training step in the child), ``inference`` as
  with ``--no-train``. Reports this process's CPU µs per frame (the child's is not
  counted: it is training) for each, and the difference: serving beyond echo without
  gRPC, whose cost both share.

Prints one JSON line per measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

import grpc
import numpy as np

import learner.agents.registry  # noqa: F401  (the agents whose knobs the learner's flags take)
from seedrl import PROTOCOL_VERSION
from seedrl.cli import parse_config
from seedrl.config import LearnerConfig
from seedrl.proto import seedrl_pb2 as pb


def _config(learner_args: Sequence[str]) -> LearnerConfig:
    argv = ["--torch-threads", "1", "--device", "cpu", *learner_args]
    return parse_config(LearnerConfig, argv, "learner_cost", "learner_cost", presets=True)


# ---------------------------------------------------------------------- train


def fixed_batch(config: LearnerConfig, learner: Any) -> Any:
    """``batch_size`` unrolls stepped from the env with the learner's policy (seeded)."""
    from learner.agents.policy import inference_policy
    from seedrl import envs

    builder = learner.builder
    policy = inference_policy(learner.model, learner.head, learner.device, "auto", config.seed)
    n = config.batch_size
    vec = envs.make_vector_env(config.env, config.env_kwargs, n)
    slots = builder.allocate(n)
    obs, _ = vec.reset(seed=config.seed)
    reward = np.zeros(n, np.float32)
    terminated = truncated = np.zeros(n, np.bool_)
    stacked = builder.frame_stack > 1
    try:
        while True:
            first = builder.first_flags(slots)
            frame = np.asarray(obs[:, -1] if stacked else obs, builder.obs_dtype)
            x = builder.stack_frames(slots, frame, first) if stacked else frame
            before = tuple(s[slots] for s in builder.core_state_SH)
            action, params, after = policy(x, first, before)
            unrolls, _ = builder.record(
                slots, frame, reward, terminated, truncated, first, action, params,
                before, after, 0,
            )  # fmt: skip
            if unrolls is not None:
                return unrolls
            obs, r, term, trunc, _ = vec.step(action)
            reward = np.asarray(r, np.float32)
            terminated, truncated = np.asarray(term), np.asarray(trunc)
    finally:
        vec.close()


def measure_train(learner_args: Sequence[str], steps: int, warmup: int) -> dict[str, Any]:
    from learner.parts import build_learner, make_trainer

    config = _config(learner_args)
    learner = build_learner(config)
    trainer = make_trainer(learner)
    batch = fixed_batch(config, learner)
    for _ in range(warmup):
        trainer.train_step(batch)
    times, cpu_times = [], []
    for _ in range(steps):
        began, began_cpu = time.perf_counter(), time.process_time()
        trainer.train_step(batch)
        times.append(time.perf_counter() - began)
        cpu_times.append(time.process_time() - began_cpu)
    frames = config.batch_size * config.unroll_length
    # Medians: a step the machine's other processes slowed down says nothing of the code.
    step_s, cpu_s = statistics.median(times), statistics.median(cpu_times)
    return {
        "bench": "train",
        "env": config.env,
        "batch_size": config.batch_size,
        "unroll_length": config.unroll_length,
        "steps": steps,
        "train_step_ms": step_s * 1e3,
        "training_us_per_frame": step_s / frames * 1e6,
        "training_cpu_us_per_frame": cpu_s / frames * 1e6,
    }


# ---------------------------------------------------------------------- serve


class _InstantActor:
    """An ``Act`` call's context whose actor answers at once: Hello, then ``frames``
    copies of one Frame, each read only after the previous reply was written."""

    def __init__(self, hello: bytes, frame: bytes, frames: int) -> None:
        self._hello: bytes | None = hello
        self._frame = frame
        self.left = frames

    async def read(self) -> Any:
        if self._hello is not None:
            hello, self._hello = self._hello, None
            return hello
        if self.left == 0:
            return grpc.aio.EOF
        self.left -= 1
        return self._frame

    async def write(self, data: bytes) -> None:
        return None

    def peer(self) -> str:
        return "in-process"

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise RuntimeError(f"{code}: {details}")


def _frames(env_spec: pb.EnvSpec, num_envs: int, seed: int) -> tuple[bytes, bytes]:
    """(Hello, Frame) bytes of one K-env stream."""
    from seedrl import codec

    shape = codec.spec_shape(env_spec.observation_space)
    dtype = np.dtype(env_spec.observation_space.dtype)
    rng = np.random.default_rng(seed)
    obs = rng.uniform(-0.05, 0.05, (num_envs, *shape)).astype(dtype)
    message = pb.ActorMessage()
    codec.encode_tensor(obs, message.frame.observations)
    codec.encode_tensor(np.ones(num_envs, np.float32), message.frame.rewards)
    codec.encode_tensor(np.zeros(num_envs, np.bool_), message.frame.terminated)
    codec.encode_tensor(np.zeros(num_envs, np.bool_), message.frame.truncated)
    hello = pb.ActorMessage(
        hello=pb.Hello(
            protocol_version=PROTOCOL_VERSION, actor_id="bench", run_id=uuid.uuid4().hex,
            num_envs=num_envs, env=env_spec,
        )
    )  # fmt: skip
    return hello.SerializeToString(), message.SerializeToString()


async def _serve_once(
    engine_kind: str, config: LearnerConfig, streams: int, num_envs: int, frames: int
) -> dict[str, Any]:
    from benchmarks.echo import echo_servicer
    from learner.parts import build_learner
    from learner.run import choose_host, make_batcher, make_engine
    from learner.serving.servicer import LearnerServicer

    trainer = None
    if engine_kind == "echo":
        servicer, batcher, _ = echo_servicer(config)
        env_spec = servicer.env_spec
    else:
        learner = build_learner(config)
        trainer = choose_host(learner)
        if config.train:
            trainer.start()
        engine = make_engine(learner, trainer)
        batcher = make_batcher(config, engine.process)
        env_spec = learner.env_spec
        servicer = LearnerServicer(
            config, env_spec, batcher, engine, learner.builder, learner.stats
        )
    batching = asyncio.create_task(batcher.run())
    contexts = []
    for i in range(streams):
        hello, frame = _frames(env_spec, num_envs, i)
        contexts.append(_InstantActor(hello, frame, frames))
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(servicer.Act(None, ctx) for ctx in contexts))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    batcher.close()
    batching.cancel()
    if trainer is not None and config.train:
        trainer.stop()
    served = streams * num_envs * frames
    return {
        "cpu_us_per_frame": cpu / served * 1e6,
        "wall_us_per_frame": wall / served * 1e6,
        "batches": batcher.batches,
    }


def measure_serve(
    learner_args: Sequence[str],
    mode: str,
    streams: int,
    num_envs: int,
    frames: int,
    uvloop: bool,
) -> dict[str, Any]:
    from seedrl.transport import run_event_loop

    no_train = ["--no-train"] if mode == "inference" else []
    config = _config(["--max-actors", str(max(streams, 1)), *no_train, *learner_args])
    result: dict[str, Any] = {
        "bench": "serve", "mode": mode, "env": config.env, "streams": streams,
        "envs_per_stream": num_envs, "frames_per_stream": frames,
    }  # fmt: skip
    for kind in ("echo", "learner"):
        # A short first run warms the caches and the policy's first call.
        run_event_loop(_serve_once(kind, config, streams, num_envs, max(frames // 10, 5)), uvloop)
        row = run_event_loop(_serve_once(kind, config, streams, num_envs, frames), uvloop)
        result[f"{kind}_cpu_us_per_frame"] = row["cpu_us_per_frame"]
        result[f"{kind}_batch_mean"] = streams * num_envs * frames / max(row["batches"], 1)
    result["beyond_echo_us_per_frame"] = (
        result["learner_cpu_us_per_frame"] - result["echo_cpu_us_per_frame"]
    )
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.learner_cost", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="bench", required=True)
    train = sub.add_parser("train", help="training step time per frame on a fixed batch")
    train.add_argument("--steps", type=int, default=200)
    train.add_argument("--warmup", type=int, default=20)
    serve = sub.add_parser("serve", help="Act path CPU per frame, learner and echo")
    serve.add_argument("--mode", choices=("system", "inference"), default="system")
    serve.add_argument("--streams", type=int, default=64)
    serve.add_argument("--envs", type=int, default=1, help="envs per stream (K)")
    serve.add_argument("--frames", type=int, default=2000, help="frames per stream")
    serve.add_argument("--no-uvloop", action="store_true")
    for p in (train, serve):
        p.add_argument("--learner-args", default="", help="the learner's flags, one string")
    args = parser.parse_args(argv)
    learner_args = args.learner_args.split()
    if args.bench == "train":
        result = measure_train(learner_args, args.steps, args.warmup)
    else:
        result = measure_serve(learner_args, args.mode, args.streams, args.envs, args.frames,
                               not args.no_uvloop)  # fmt: skip
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
