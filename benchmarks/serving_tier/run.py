"""One bounded run of the slot transport: start the model and F frontends, warm up, measure
a window, stop, drain, and join every process (ended by force if one overstays)."""

from __future__ import annotations

import multiprocessing as mp
import time
from typing import Any

import numpy as np

from benchmarks.serving_tier.slots import (
    MEASURE,
    STOP,
    RunSpec,
    SlotTable,
    frontend_main,
    make_bell,
    model_main,
)

JOIN_TIMEOUT_S = 10.0
STARTUP_TIMEOUT_S = 30.0
"""How long every slot may take to make its first round trips (a loaded host starts
processes late)."""


def run_once(
    spec: RunSpec, warmup_s: float, measure_s: float, min_round_trips: int = 2
) -> dict[str, Any]:
    """Measure one configuration; the result holds both sides' counts for checking.

    The warm-up starts once every slot has made ``min_round_trips`` round trips, so the
    window never opens on processes still starting.
    """
    ctx = mp.get_context("fork")  # the doorbells' descriptors are inherited, not sent
    table = SlotTable(spec.table)
    model_bell = make_bell(spec.bell, ctx)
    bells = [make_bell(spec.bell, ctx) for _ in range(spec.table.frontends)]
    name = table.shm.name
    model_rx, model_tx = ctx.Pipe(duplex=False)
    model = ctx.Process(
        target=model_main, args=(spec, name, model_bell, bells, model_tx), name="model"
    )
    frontends, receivers = [], []
    for i in range(spec.table.frontends):
        rx, tx = ctx.Pipe(duplex=False)
        receivers.append(rx)
        frontends.append(
            ctx.Process(
                target=frontend_main,
                args=(spec, i, name, model_bell, bells[i], tx),
                name=f"frontend-{i}",
            )
        )
    procs = [model, *frontends]
    try:
        for p in procs:
            p.start()
        _await_round_trips(table, procs, min_round_trips)
        time.sleep(warmup_s)
        table.control[0] = MEASURE
        t0 = time.perf_counter()
        time.sleep(measure_s)
        table.control[0] = STOP
        wall = time.perf_counter() - t0
        front = [_receive(rx, p) for rx, p in zip(receivers, frontends, strict=True)]
        for bell in bells:  # a frontend waiting on its bell sees the stop at once
            bell.ring()
        model_bell.ring()
        mod = _receive(model_rx, model)
    finally:
        for p in procs:
            p.join(JOIN_TIMEOUT_S)
            if p.is_alive():
                p.kill()
                p.join()
        table.close()
        table.shm.unlink()
    return _summarise(spec, wall, mod, front, [p.exitcode for p in procs])


def _await_round_trips(table: SlotTable, procs: list[Any], count: int) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while int(table.req_S.min()) <= count:  # a slot's counter is one ahead while it waits
        dead = [p.name for p in procs if p.exitcode is not None]
        if dead or time.monotonic() > deadline:
            raise RuntimeError(
                f"slots made fewer than {count} round trips within {STARTUP_TIMEOUT_S:g} s "
                f"(ended: {dead or 'none'})"
            )
        time.sleep(0.001)


def _receive(rx: Any, proc: Any) -> dict[str, Any]:
    if not rx.poll(JOIN_TIMEOUT_S + 5.0):
        raise RuntimeError(f"{proc.name} sent no result (exit code {proc.exitcode})")
    return rx.recv()


def _summarise(
    spec: RunSpec, wall: float, mod: dict[str, Any], front: list[dict[str, Any]], codes: list
) -> dict[str, Any]:
    latency = np.concatenate([np.asarray(f["latency_s"]) for f in front] or [np.zeros(0)])
    requested_S = np.zeros(spec.table.slots, np.int64)
    for f in front:
        requested_S[f["begin"] : f["begin"] + len(f["requested_S"])] = f["requested_S"]
    frames = mod["frames"]
    us = 1e6 / frames if frames else float("nan")
    phases = {k: v * us for k, v in mod["phases_s"].items()}
    front_cpu = sum(f["cpu_s"] for f in front)
    front_frames = sum(f["frames"] for f in front)
    return {
        "obs_shape": list(spec.table.obs_shape), "obs_dtype": spec.table.obs_dtype,
        "slots": spec.table.slots, "frontends": spec.table.frontends, "bell": spec.bell,
        "policy": spec.policy, "quorum": spec.quorum, "deadline_ms": spec.deadline_s * 1e3,
        "window_s": wall, "frames": frames, "fps": frames / wall,
        "batch_mean": frames / mod["batches"] if mod["batches"] else 0.0,
        "model_cpu_us_per_frame": mod["cpu_s"] * us,
        "model_phases_us_per_frame": phases,
        "model_beyond_forward_us_per_frame": mod["cpu_s"] * us - phases["forward"],
        "frontend_cpu_us_per_frame": front_cpu * 1e6 / front_frames if front_frames else None,
        "rtt_p50_ms": float(np.percentile(latency, 50) * 1e3) if len(latency) else None,
        "rtt_p99_ms": float(np.percentile(latency, 99) * 1e3) if len(latency) else None,
        "errors": [e for f in front for e in f["errors"]],
        "unanswered": sum(f["unanswered"] for f in front),
        "served_S": mod["served_S"],
        "requested_S": requested_S.tolist(),
        "exit_codes": codes,
    }  # fmt: skip
