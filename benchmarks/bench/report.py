"""The benchmark's statistics and report: medians over repeats, ratios, targets, table.

Runs repeat and interleave because a shared machine swings; every target is judged on
medians, and with repeats also per repeat, so a verdict the repeats disagree on says so.
"""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import statistics
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks.bench.plan import (
    BEST_TARGET,
    FOCUS_TARGETS,
    IDEAL_REFERENCE_ENVS,
    MODES,
    Point,
    targets_for,
)

# ---------------------------------------------------------------------- summary


def summarize(
    rows: list[dict[str, Any]],
    ideal_reference_fps: float | None = None,
    reference_runs: Sequence[float | None] = (),
    env: str | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per-point medians over repeats (with the ratios) and the target checks.

    ``ideal_reference_fps`` is the one-process limit with IDEAL_REFERENCE_ENVS envs; when
    absent, the ideal of a sweep point with that many envs stands in for it. With two or
    more repeats each target also carries its value in every repeat (``runs``, judged
    with that repeat's reference from ``reference_runs``) and whether they all agree
    with the verdict (``steady``): one short window at 64 x K=1 can swing by a third.
    Rows marked ``focus`` (the extra rounds, :func:`focus_plan`) add to their points'
    medians; a focus round judges :data:`FOCUS_TARGETS`, and the best configuration
    only when its own best point is the sweep's. ``env`` (the bench's env) picks the
    targets that judge it (:func:`~benchmarks.bench.plan.targets_for`; all when None).
    """
    table, targets = _summarize_once(rows, ideal_reference_fps, env)
    repeats = sorted({int(r.get("repeat", 0)) for r in rows})
    if len(repeats) < 2:
        return table, targets
    in_focus = {int(r.get("repeat", 0)) for r in rows if r.get("focus")}
    best_point = next((t.get("point") for t in targets if t["name"] == BEST_TARGET), None)
    per_repeat = []
    for repeat in repeats:
        reference = reference_runs[repeat] if repeat < len(reference_runs) else None
        reference = reference if reference is not None else ideal_reference_fps
        subset = [r for r in rows if int(r.get("repeat", 0)) == repeat]
        checks = _summarize_once(subset, reference, env)[1]
        values = {t["name"]: t["value"] for t in checks}
        if repeat in in_focus:
            in_round = set(FOCUS_TARGETS)
            if any(t["name"] == BEST_TARGET and t.get("point") == best_point for t in checks):
                in_round.add(BEST_TARGET)
            values = {name: v for name, v in values.items() if name in in_round}
        per_repeat.append(values)
    for target in targets:
        runs = [values[target["name"]] for values in per_repeat if target["name"] in values]
        if all(v is None for v in runs):
            continue
        target["runs"] = runs
        threshold, higher = target["target"], target["comparison"] == ">="
        judged = [(v >= threshold if higher else v <= threshold) for v in runs if v is not None]
        target["steady"] = (
            all(j == target["pass"] for j in judged) if judged and target["pass"] is not None
            else None
        )  # fmt: skip
    return table, targets


def _summarize_once(
    rows: list[dict[str, Any]], ideal_reference_fps: float | None, env: str | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    points: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row.get("error") or row.get("fps") is None:
            continue
        label = _label(row)
        point = points.setdefault(
            label, {"point": label, "n": row["n"], "k": row["k"], "batch": row.get("batch", 0)}
        )
        point.setdefault(f"{row['mode']}_fps_runs", []).append(row["fps"])
    for point in points.values():
        for mode in MODES:
            runs = point.pop(f"{mode}_fps_runs", None)
            point[f"{mode}_fps"] = statistics.median(runs) if runs else None
        point["system_over_ideal"] = _ratio(point["system_fps"], point["ideal_fps"])
        # The trainer-bound limit: what one process reaches that also trains.
        point["system_over_ideal_train"] = _ratio(point["system_fps"], point["ideal_train_fps"])
        point["system_over_echo"] = _ratio(point["system_fps"], point["echo_fps"])
        point["inference_over_echo"] = _ratio(point["inference_fps"], point["echo_fps"])
        # Load-robust companion of system/ideal: ideal CPU per frame / system CPU per frame.
        point["system_cpu_efficiency"] = _ratio(
            _median_field(rows, point["point"], "ideal", "cpu_us_per_frame"),
            _median_field(rows, point["point"], "system", "cpu_us_per_frame"),
        )
        point["system_extra_us_per_frame"] = _extra_cost(rows, point["point"])
        point["serving_beyond_echo_us_per_frame"] = _serving_beyond_echo(rows, point["point"])
        for key in ("train_step_ms", "training_us_per_frame"):
            point[key] = _median_field(rows, point["point"], "ideal_train", key)
    table = sorted(points.values(), key=lambda p: (p["batch"], p["n"], p["k"]))

    def fps(label: str, mode: str) -> float | None:
        return points.get(label, {}).get(f"{mode}_fps")

    system = [(p["system_fps"], p["point"]) for p in table if p["system_fps"]]
    best_fps, best_point = max(system, default=(None, None))
    if ideal_reference_fps is None:
        same_envs = [p["ideal_fps"] for p in table if p["n"] * p["k"] == IDEAL_REFERENCE_ENVS]
        ideal_reference_fps = max((x for x in same_envs if x), default=None)
    actor_rss = [r["actor_rss_mb_max"] for r in rows if r.get("actor_rss_mb_max")]
    rss_64 = _median_field(rows, "64x1", "system", "learner_rss_mb")
    rss_1 = _median_field(rows, "1x1", "system", "learner_rss_mb")
    values = {
        BEST_TARGET: _ratio(best_fps, ideal_reference_fps),
        "actor_rss_mb_max": max(actor_rss, default=None),
        "learner_rss_mb_per_actor": (
            (rss_64 - rss_1) / 63 if rss_64 is not None and rss_1 is not None else None
        ),
        "system_256x1_over_64x1": _ratio(fps("256x1", "system"), fps("64x1", "system")),
    }
    serving_64 = points.get("64x1", {}).get("serving_beyond_echo_us_per_frame") or {}
    values["serving_us_per_frame_64x1"] = serving_64.get("system")
    # Training cost per frame hardly depends on N x K (the ideal only feeds the batches),
    # so every point at the learner's default batch measures it: their median.
    default_batch = [
        r["training_us_per_frame"] for r in rows
        if r["mode"] == "ideal_train" and not r.get("batch") and not r.get("error")
        and r.get("training_us_per_frame") is not None
    ]  # fmt: skip
    values["training_us_per_frame"] = statistics.median(default_batch) if default_batch else None
    trained = [(p["system_fps"], p) for p in table if p["system_over_ideal_train"] is not None]
    where = {BEST_TARGET: best_point}
    values["system_over_ideal_train"] = None
    if trained:  # the best configuration against the trainer-bound limit
        best_trained = max(trained, key=lambda x: x[0])[1]
        values["system_over_ideal_train"] = best_trained["system_over_ideal_train"]
        where["system_over_ideal_train"] = best_trained["point"]
    targets = []
    for t in targets_for(env):
        value = values[t.name]
        passed = None
        if value is not None:
            passed = value >= t.threshold if t.higher_is_better else value <= t.threshold
        targets.append(
            {
                "name": t.name,
                "description": t.description,
                "value": value,
                "target": t.threshold,
                "comparison": ">=" if t.higher_is_better else "<=",
                "pass": passed,
                **({"point": where[t.name]} if where.get(t.name) else {}),
            }
        )
    return table, targets


COST_ROLES = ("actors", "serving", "training")
"""Who spends the machine's CPU per frame: actor processes, the learner's serving (its own
process, serving and inference, and any serving frontends), its trainer process."""


def _extra_cost(rows: list[dict[str, Any]], label: str) -> dict[str, float] | None:
    """What the system mode costs per frame beyond echo, per role (µs, medians).

    The learner earns system/echo only by adding little to the transport; this says
    where it adds: the actors' own cost (it moves with latency and batching), serving
    (decode, batching, inference, replies) or training.
    """
    extra = {}
    for role in COST_ROLES:
        key = f"{role}_cpu_us_per_frame"
        system = _median_field(rows, label, "system", key)
        echo = _median_field(rows, label, "echo", key)
        if system is None or echo is None:
            return None
        extra[role] = system - echo
    return extra


SERVING_MODES = ("inference", "system")


def _serving_beyond_echo(rows: list[dict[str, Any]], label: str) -> dict[str, float] | None:
    """The learner process's CPU per frame beyond the echo server's, per mode (µs, medians).

    Echo runs the same handler, batcher and gRPC server with no model, so the difference
    is the learner's own serving: decoding into batches, the forward pass, the unroll
    store, the weights refresh and the hand-off to the trainer process (whose own CPU
    is training, counted apart). CPU time from /proc holds up on a loaded machine where
    wall time does not.
    """
    echo = _median_field(rows, label, "echo", "serving_cpu_us_per_frame")
    if echo is None:
        return None
    beyond = {}
    for mode in SERVING_MODES:
        serving = _median_field(rows, label, mode, "serving_cpu_us_per_frame")
        if serving is not None:
            beyond[mode] = serving - echo
    return beyond or None


def _label(row: dict[str, Any]) -> str:
    return str(row.get("point") or Point(row["n"], row["k"], row.get("batch", 0)).label)


def _median_field(rows: list[dict[str, Any]], label: str, mode: str, key: str) -> float | None:
    values = [
        r[key] for r in rows if _label(r) == label and r["mode"] == mode and r.get(key) is not None
    ]
    return statistics.median(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def machine_info() -> dict[str, Any]:
    versions = {}
    for dist in ("torch", "grpcio", "gymnasium", "numpy"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[dist] = metadata.version(dist)
    cpu_model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_model": cpu_model,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "versions": versions,
    }


def device_info(name: str) -> dict[str, Any]:
    """The torch device the learner and the ideal run on, with the GPU's name if any."""
    import torch

    from learner.agents.models import resolve_device

    device = resolve_device(name)
    info: dict[str, Any] = {"name": str(device)}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info


def preset_env(preset: str) -> str:
    """The env a learner preset trains on."""
    from seedrl.config import LearnerConfig
    from seedrl.presets import load_preset

    return str(load_preset(preset).get("env", LearnerConfig.env))


def _format_extra(extra: dict[str, float] | None) -> str:
    if not extra:
        return "-"
    return "/".join(f"{extra[role]:+.0f}" for role in COST_ROLES)


def _format_serving(beyond: dict[str, float] | None) -> str:
    if not beyond:
        return "-"
    return "/".join(f"{beyond[mode]:+.1f}" if mode in beyond else "-" for mode in SERVING_MODES)


def print_report(table: list[dict[str, Any]], rows: list[dict[str, Any]], targets: list) -> None:
    from rich.console import Console
    from rich.table import Table

    def f(value: Any, fmt: str = "{:,.0f}") -> str:
        return "-" if value is None else fmt.format(value)

    def med(label: str, mode: str, key: str) -> float | None:
        return _median_field(rows, label, mode, key)

    console = Console(width=max(Console().width, 180))
    t = Table(title="seedrl bench: frames/s (medians over repeats)")
    for col in ("NxK[bB]", "ideal", "ideal+train", "echo", "inference", "system", "sys/ideal",
                "sys/ideal+train", "sys/echo", "train ms/step", "train µs/frame",
                "serve +µs i/s",
                "cpu µs/frame i/e/s", "batch", "rtt p50/p99 ms", "learner cpu", "steps/s",
                "trainer wait", "inf wait", "RSS learner/actor MB", "actor procs",
                "wire B/step", "wire MB/s", "+µs a/s/t"):  # fmt: skip
        t.add_column(col, justify="right", no_wrap=col.startswith("+µs"))
    for p in table:
        pt = p["point"]
        p50, p99 = med(pt, "system", "rtt_p50_ms"), med(pt, "system", "rtt_p99_ms")
        t.add_row(
            pt, f(p["ideal_fps"]), f(p["ideal_train_fps"]), f(p["echo_fps"]),
            f(p["inference_fps"]), f(p["system_fps"]), f(p["system_over_ideal"], "{:.2f}"),
            f(p["system_over_ideal_train"], "{:.2f}"), f(p["system_over_echo"], "{:.2f}"),
            f(med(pt, "ideal_train", "train_step_ms"), "{:.1f}"),
            f(med(pt, "ideal_train", "training_us_per_frame"), "{:.1f}"),
            _format_serving(p.get("serving_beyond_echo_us_per_frame")),
            "/".join(f(med(pt, m, "cpu_us_per_frame")) for m in ("ideal", "echo", "system")),
            f(med(pt, "system", "inference_batch_mean"),
            "{:.1f}"), f"{f(p50, '{:.1f}')}/{f(p99, '{:.1f}')}",
            f(med(pt, "system", "learner_cpu"), "{:.2f}"),
            f(med(pt, "system", "learner_steps_per_s"), "{:.1f}"),
            f(med(pt, "system", "trainer_wait_share"), "{:.0%}"),
            f(med(pt, "system", "inference_wait_share"), "{:.0%}"),
            f"{f(med(pt, 'system', 'learner_rss_mb'))}/"
            f"{f(med(pt, 'system', 'actor_rss_mb_max'))}",
            f(med(pt, "system", "actor_processes")),
            f(med(pt, "system", "wire_bytes_per_step")),
            f(med(pt, "system", "wire_mb_per_s"), "{:.1f}"),
            _format_extra(p.get("system_extra_us_per_frame")),
        )  # fmt: skip
    console.print(t)
    console.print(
        "NxK: N actors (one stream each) x K envs, in the launcher's actor processes "
        "(actor procs); bB: B unrolls per training step; wire: gRPC message bytes per agent "
        "step (frame + reply) and per second, system; train µs/frame: the in-process ideal's "
        "training step time / frames per batch; serve +µs i/s: the learner process's CPU "
        "per frame beyond the echo server's, inference / system; +µs: machine CPU per frame the "
        "system spends beyond echo, in actors / serving (learner process) / training "
        "(trainer process)"
    )
    tt = Table(title="targets: value over the repeats' medians (each repeat's own)")
    for col in ("target", "value", "wanted", "pass"):
        tt.add_column(col)
    for target in targets:
        verdict = {True: "[green]PASS", False: "[red]FAIL", None: "[yellow]n/a"}[target["pass"]]
        if target.get("steady") is False:
            verdict += "[yellow] (repeats disagree)"
        value = f(target["value"], "{:.2f}")
        if target.get("runs"):
            value += " (" + " / ".join(f(v, "{:.2f}") for v in target["runs"]) + ")"
        tt.add_row(
            target["description"] + (f" [{target['point']}]" if target.get("point") else ""),
            value, f"{target['comparison']} {target['target']}", verdict,
        )  # fmt: skip
    console.print(tt)
    for row in rows:
        if row.get("error"):
            console.print(f"[red]{_label(row)} {row['mode']}: {row['error']}")


def sweep_best_point(rows: list[dict[str, Any]]) -> Point | None:
    """The point whose median system frames/s is highest (the best configuration)."""
    table = _summarize_once(rows, None)[0]
    best = max((p for p in table if p["system_fps"]), key=lambda p: p["system_fps"], default=None)
    return None if best is None else Point(best["n"], best["k"], best["batch"])
