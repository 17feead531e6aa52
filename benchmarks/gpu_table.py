"""Render a GPU check's JSONs as the GPU section of ``docs/performance.md``.

``python -m benchmarks.gpu_table summary.json --timings timings.jsonl --bench a.json b.json``
prints the card, the date, the CUDA tests' outcome, the training rows (frames/s, learner
steps/s, GPU utilisation, trainer waits, speed-up over the same env's CPU row), the step
times (forward pass, training step per trainer, weight hand-off) and the quick bench
rows; ``--update docs/performance.md`` writes them between the page's
``<!-- gpu-results:begin -->`` and ``<!-- gpu-results:end -->`` markers with the block
replacement of ``results_table.py``. A summary with the load generator's step (``loadgen``)
renders its rows, GPU utilisation per window and the GPU learner's aim between the
``<!-- gpu-loadgen:begin -->`` and ``<!-- gpu-loadgen:end -->`` markers instead; each
block is written only when the summary holds its steps. It reads only what
``benchmarks/gpu_check.py`` and ``benchmarks.bench`` wrote, so an old run renders with
today's script.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.results_table import COLUMNS as BENCH_COLUMNS
from benchmarks.results_table import _num, table_rows, write_block

BEGIN = "<!-- gpu-results:begin -->"
END = "<!-- gpu-results:end -->"
LOADGEN_BEGIN = "<!-- gpu-loadgen:begin -->"
LOADGEN_END = "<!-- gpu-loadgen:end -->"
SERVED_AIM = 100_000
"""Agent steps a second one GPU learner should answer with the Atari CNN: the aim of
docs/performance.md, the rate at which the GPU rather than the host's CPU is the limit."""
TRAINED_AIM = 30_000
"""Agent steps a second it should train on meanwhile."""
GPU_BUSY_AIM = 50.0
"""Per cent of the time the GPU should be busy while it does: less, and the GPU waits."""
LOADGEN_COLUMNS = (
    "env, S × K",
    "model",
    "device",
    "mode",
    "frames/s answered",
    "trained frames/s",
    "learner steps/s",
    "GPU util mean/max",
    "learner process µs/frame",
    "loop / other threads µs",
    "trainer µs/frame",
    "generator µs/frame",
    "batch",
    "round trip p50/p99 ms",
    "note",
)
PRESET_NAMES = {"cartpole": "CartPole", "atari": "Atari"}
TORSO_NAMES = {"mlp": "MLP", "cnn": "CNN", "resnet": "ResNet"}
PRESET_TORSO = {"cartpole": "mlp", "atari": "cnn"}
"""The torso a preset's own model resolves to: rows written before they named it."""
LISTENING = re.compile(
    r"\(env (?P<env>\S+), device (?P<device>[^,]+), trainer (?P<trainer>[^,]+), "
    r"(?P<precision>\w+)(?:, [^)]*)?\)"  # then how it serves (older lines lack it)
)
TRAIN_COLUMNS = (
    "env",
    "model",
    "actors",
    "trainer",
    "device",
    "precision",
    "frames/s",
    "× CPU",
    "learner steps/s",
    "GPU util mean/max",
    "trainer waits",
    "inference batch",
    "window s",
    "return at end",
    "note",
)
STEP_COLUMNS = (
    "model",
    "device",
    "precision",
    "params",
    "batch",
    "forward b64 ms",
    "forward b256 ms",
    "train step thread ms",
    "train step device ms",
    "hand-off device→device ms",
    "hand-off via host ms",
)


def _table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
        *("| " + " | ".join(cells) + " |" for cells in rows),
    ]


def torso_name(preset: str, model: str | None) -> str:
    """ "ResNet": the torso that ran (the preset's own when the row names none)."""
    torso = model if model not in (None, "preset") else PRESET_TORSO.get(preset, "")
    return TORSO_NAMES.get(torso, torso)


def model_label(preset: str, model: str | None) -> str:
    """ "Atari ResNet": the preset's name and the torso that ran."""
    return f"{PRESET_NAMES.get(preset, preset)} {torso_name(preset, model)}".strip()


def _ms(value: float | None) -> str:
    return _num(value, "{:.3f}" if value is not None and value < 1 else "{:.2f}")


def train_facts(name: str, run: dict[str, Any]) -> dict[str, Any]:
    """What one training run says, with env, trainer and precision read off the learner's
    ``listening on`` line (the resolved values, not the requested ones)."""
    said = LISTENING.search(run.get("listening") or "")
    found = said.groupdict() if said else {}
    note = run.get("error") or run.get("skipped") or ""
    if run.get("skipped"):
        note = f"skipped: {note}"
    elif run.get("rc") not in (0, None) and not note:
        note = f"exit {run['rc']}"
    return {
        "name": name,
        "env": found.get("env") or run.get("preset") or name,
        "model": torso_name(run.get("preset", ""), run.get("model")),
        "actors": run.get("actors", "—"),
        "trainer": found.get("trainer") or run.get("trainer", "—"),
        "device": run.get("device") or found.get("device", "—"),
        "precision": found.get("precision", "—"),
        "fps": run.get("fps"),
        "steps": run.get("learner_steps_per_s"),
        "gpu": run.get("gpu") or {},
        "wait": run.get("trainer_wait_share"),
        "batch": run.get("inference_batch_mean"),
        "window": run.get("measured_s"),
        "return": run.get("episode_return_mean"),
        "note": note,
    }


def cpu_baselines(facts: list[dict[str, Any]]) -> dict[str, float]:
    """Each env's CPU frames/s on this host: the denominator of the speed-up column."""
    out: dict[str, float] = {}
    for f in facts:
        if f["device"] == "cpu" and f["fps"] and f["env"] not in out:
            out[f["env"]] = f["fps"]
    return out


def train_rows(summary: dict[str, Any]) -> list[list[str]]:
    """One row per training run in the check's order; × CPU is frames/s over the same
    env's CPU row."""
    facts = [train_facts(k, v) for k, v in (summary.get("train") or {}).items()]
    base = cpu_baselines(facts)
    rows = []
    for f in facts:
        gpu = f["gpu"]
        util = (
            f"{gpu['util_mean']:.0f}% / {gpu['util_max']:.0f}%"
            if f["device"] != "cpu" and gpu.get("util_mean") is not None
            else "—"
        )
        ratio = f["fps"] / base[f["env"]] if f["fps"] and f["env"] in base else None
        rows.append(
            [
                f["env"],
                f["model"],
                f["actors"],
                f["trainer"],
                f["device"],
                f["precision"],
                _num(f["fps"]),
                _num(ratio, "{:.2f}×"),
                _num(f["steps"], "{:.1f}"),
                util,
                _num(f["wait"], "{:.0%}"),
                _num(f["batch"], "{:.1f}"),
                _num(f["window"], "{:.1f}"),
                _num(f["return"], "{:.1f}"),
                f["note"],
            ]
        )
    return rows


def step_rows(timings: list[dict[str, Any]]) -> list[list[str]]:
    """One row per (model, device, precision) the timings step measured."""
    rows = []
    for t in timings:
        params = t.get("params")
        rows.append(
            [
                model_label(t.get("preset", "?"), t.get("model")),
                t.get("device", "?"),
                t.get("precision", "?"),
                _num(params),
                t.get("batch", "—") if not t.get("error") else f"error: {t['error']}",
                _ms(t.get("forward_b64_ms")),
                _ms(t.get("forward_b256_ms")),
                _ms(t.get("train_step_thread_ms")),
                _ms(t.get("train_step_device_ms")),
                _ms(t.get("handoff_device_ms")),
                _ms(t.get("handoff_host_ms")),
            ]
        )
    return rows


def derived_lines(summary: dict[str, Any], timings: list[dict[str, Any]]) -> list[str]:
    """Ratios worth reading off the tables: device-resident over process trainer on CUDA
    per env, GPU over CPU (fp32, its default) forward time per model, and what bf16 does
    to the CPU's training step."""
    lines = []
    facts = [train_facts(k, v) for k, v in (summary.get("train") or {}).items()]
    by = {(f["env"], f["model"], f["trainer"], f["device"]): f for f in facts if f["fps"]}
    for env, model in dict.fromkeys((f["env"], f["model"]) for f in facts):
        dev = by.get((env, model, "device", "cuda"))
        proc = by.get((env, model, "process", "cuda"))
        if dev and proc:
            lines.append(
                f"- {env} on CUDA, device-resident over process trainer: "
                f"{dev['fps'] / proc['fps']:.2f}× frames/s, "
                f"{dev['steps'] / proc['steps']:.2f}× learner steps/s."
            )

    def label(t: dict[str, Any]) -> str:
        return model_label(t.get("preset", "?"), t.get("model"))

    cpu = {
        (label(t), t.get("precision")): t
        for t in timings
        if t.get("device") == "cpu" and not t.get("error")
    }
    for name in dict.fromkeys(label(t) for t in timings):
        parts = []
        gpu = [t for t in timings if label(t) == name and t.get("device") == "cuda"]
        c = cpu.get((name, "fp32")) or {}  # the CPU as it runs by default
        forward = [
            f"{t['precision']} {t['forward_b64_ms'] / c['forward_b64_ms']:.2g}× / "
            f"{t['forward_b256_ms'] / c['forward_b256_ms']:.2g}×"
            for t in gpu
            if all(x.get(k) for x in (t, c) for k in ("forward_b64_ms", "forward_b256_ms"))
        ]
        if forward:
            parts.append(
                "GPU forward time over the CPU's at batch 64 / 256 (above 1: the CPU is "
                "faster) " + ", ".join(forward)
            )
        handoff = [
            f"{t['precision']} {t['handoff_host_ms'] / t['handoff_device_ms']:.0f}×"
            for t in gpu
            if t.get("handoff_host_ms") and t.get("handoff_device_ms")
        ]
        if handoff:
            parts.append("hand-off via host over device-to-device " + ", ".join(handoff))
        fp32, bf16 = (cpu.get((name, p), {}).get("train_step_thread_ms") for p in ("fp32", "bf16"))
        if fp32 and bf16:
            parts.append(f"CPU training step in bf16 over fp32 {bf16 / fp32:.2g}×")
        if parts:
            lines.append(f"- {name}: " + "; ".join(parts) + ".")
    return lines


def _machine_line(summary: dict[str, Any], benches: list[dict[str, Any]]) -> str:
    info = summary.get("info") or {}
    smi = [x.strip() for x in (info.get("nvidia_smi") or "").split(",")]
    card = info.get("gpu") or (smi[0] if smi and smi[0] else "no GPU")
    detail = f" ({smi[1]}, driver {smi[2]})" if len(smi) >= 3 else ""
    cpu_model = next((b["machine"]["cpu_model"] for b in benches if b.get("machine")), None)
    cpus = f"{info.get('cpus', '?')} CPUs" + (f", {cpu_model}" if cpu_model else "")
    versions = ", ".join(
        f"{k} {info[k]}" for k in ("grpcio", "gymnasium", "numpy", "protobuf") if info.get(k)
    )
    return (
        f"GPU check {summary.get('started', '?')} to {summary.get('finished', '?')} on an "
        f"**{card}**{detail}, {cpus}; "
        f"Python {info.get('python', '?')}, torch {info.get('torch', '?')} "
        f"(CUDA {info.get('cuda', '—')}), {versions}."
    )


def _steps_line(summary: dict[str, Any]) -> str:
    tests = summary.get("tests") or {}
    said = tests.get("summary") or tests.get("skipped") or tests.get("error") or "not run"
    parts = [f"CUDA tests (`pytest -k cuda`): {said} (exit {tests.get('rc', '—')})"]
    for step in ("timings", "bench_atari", "bench_cartpole"):
        rc = (summary.get(step) or {}).get("rc")
        if rc not in (0, None):
            why = " (its time ran out)" if rc == 124 else ""
            parts.append(f"the check's `{step}` step exited {rc}{why}")
    return "; ".join(parts) + "."


def bench_block(benches: list[dict[str, Any]]) -> list[str]:
    """The quick bench rows (``results_table``'s columns) with each file's env and device."""
    if not benches:
        return []
    lines = ["`benchmarks.bench --quick` on the same host:", ""]
    rows = []
    for b in benches:
        s, device = b.get("settings", {}), b.get("machine", {}).get("device") or {}
        where = device.get("gpu") or device.get("name") or "cpu"
        for cells in table_rows(b):
            rows.append([s.get("env", "?"), where, b.get("date", "?"), *cells])
    lines += _table(("env", "device", "date", *BENCH_COLUMNS), rows)
    lines += [
        "",
        "Modes and columns as in the CPU table above; one repeat, windows of "
        + ", ".join(sorted({f"{b.get('settings', {}).get('measure_s', '?')} s" for b in benches}))
        + ".",
    ]
    return lines


def render(
    summary: dict[str, Any], timings: list[dict[str, Any]], benches: list[dict[str, Any]]
) -> str:
    """The Markdown block: provenance, training rows, step times, ratios, quick bench."""
    lines = [
        _machine_line(summary, benches),
        _steps_line(summary),
        "",
        "Short trainings with local actors (frames/s over the window after the first frames; "
        "× CPU: over the same env's CPU row on this host, which runs the preset's model):",
        "",
        *_table(TRAIN_COLUMNS, train_rows(summary)),
        "",
        "Step times (medians; train step: one batch of unrolls, thread trainer from pageable "
        "memory, device trainer from pinned buffers on its own stream; hand-off: one weight "
        "refresh for inference):",
        "",
        *_table(STEP_COLUMNS, step_rows(timings)),
    ]
    derived = derived_lines(summary, timings)
    if derived:
        lines += ["", *derived]
    bench = bench_block(benches)
    if bench:
        lines += ["", *bench]
    return "\n".join(lines) + "\n"


def _util(gpu: dict[str, Any] | None) -> str:
    if not gpu or gpu.get("util_mean") is None:
        return "—"
    return f"{gpu['util_mean']:.0f}% / {gpu['util_max']:.0f}%"


def loadgen_rows(summary: dict[str, Any]) -> list[list[str]]:
    """One row per (config, mode) the load generator measured, a config it did not with
    its reason."""
    rows = []
    for name, config in (summary.get("loadgen") or {}).items():
        if not isinstance(config, dict):
            continue
        label = f"{config.get('env', name)}, {config.get('streams', '?')} × {config.get('envs', 1)}"
        model = torso_name(config.get("preset") or "", config.get("model"))  # its torso
        if config.get("skipped") or not config.get("rows"):
            why = config.get("skipped") or config.get("error") or f"exit {config.get('rc')}"
            note = f"skipped: {why}" if config.get("skipped") else why
            rows.append([label, model, config.get("device", "—"), "—", *["—"] * 10, note])
            continue
        for r in config["rows"]:
            rows.append(
                [
                    label,
                    model,
                    config.get("device", "—"),
                    r.get("mode", "?"),
                    _num(r.get("fps_answered")),
                    _num(r.get("trained_fps") or None),
                    _num(r.get("learner_steps_per_s"), "{:.1f}"),
                    _util(r.get("gpu")),
                    _num(r.get("learner_cpu_us_per_frame"), "{:.1f}"),
                    f"{_num(r.get('learner_loop_thread_us_per_frame'), '{:.1f}')} / "
                    f"{_num(r.get('learner_other_threads_us_per_frame'), '{:.1f}')}",
                    _num(r.get("trainer_cpu_us_per_frame"), "{:.1f}"),
                    _num(r.get("generator_cpu_us_per_frame"), "{:.1f}"),
                    _num(r.get("inference_batch_mean"), "{:.1f}"),
                    f"{_ms(r.get('rtt_p50_ms'))} / {_ms(r.get('rtt_p99_ms'))}",
                    (r.get("error") or "")[:200],
                ]
            )
    return rows


def _verdict(value: float | None, aim: float, unit: str) -> str:
    if value is None:
        return "not measured"
    if value >= aim:
        return f"**{value:,.0f}**{unit}: met"
    return f"**{value:,.0f}**{unit}: missed by {aim - value:,.0f} ({value / aim:.0%} of it)"


def aim_lines(summary: dict[str, Any]) -> list[str]:
    """The GPU learner's aim with the Atari CNN, met or missed by how much."""
    config = (summary.get("loadgen") or {}).get("atari-cnn") or {}
    by_mode = {r.get("mode"): r for r in config.get("rows") or [] if not r.get("error")}
    served = by_mode.get("inference", {}).get("fps_answered")
    training = by_mode.get("system", {})
    busy = (training.get("gpu") or {}).get("util_mean")
    return [
        f"- Atari CNN, answered with `--no-train` (aim ≥ {SERVED_AIM:,}): "
        + _verdict(served, SERVED_AIM, " frames/s"),
        f"- Atari CNN, trained while serving (aim ≥ {TRAINED_AIM:,}): "
        + _verdict(training.get("trained_fps"), TRAINED_AIM, " frames/s"),
        f"- GPU busy meanwhile (aim over {GPU_BUSY_AIM:.0f} %): "
        + ("not measured" if busy is None else
           f"**{busy:.0f} %**: " + ("met" if busy > GPU_BUSY_AIM else "missed")),
    ]  # fmt: skip


def render_loadgen(summary: dict[str, Any]) -> str:
    """The load generator against the GPU learner: provenance, one row per mode, the aim."""
    lines = [
        _machine_line(summary, []),
        "",
        "`python -m benchmarks.loadgen --device cuda` (device: where the learner ran), one "
        "repeat per mode (inference: "
        "`--no-train`; system: training), GPU utilisation sampled by `nvidia-smi` over each "
        "window alone; µs/frame: CPU per frame answered, the learner process's, its "
        "event-loop thread's and the rest's, its trainer process's, the generator's:",
        "",
        *_table(LOADGEN_COLUMNS, loadgen_rows(summary)),
        "",
        *aim_lines(summary),
    ]
    return "\n".join(lines) + "\n"


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_table", description=__doc__.splitlines()[0]
    )
    parser.add_argument("summary", help="the GPU check's summary.json")
    parser.add_argument(
        "--timings", help="its timings.jsonl (default: the rows inside the summary)"
    )
    parser.add_argument("--bench", nargs="*", default=[], help="bench JSONs from the GPU host")
    parser.add_argument("--update", metavar="PAGE", help="replace the GPU block in this page")
    args = parser.parse_args(argv)
    summary = json.loads(Path(args.summary).read_text())
    timings = (
        _read_jsonl(Path(args.timings))
        if args.timings
        else (summary.get("timings") or {}).get("rows", [])
    )
    benches = [json.loads(Path(b).read_text()) for b in args.bench]
    # Each block the summary holds: a run of the load generator alone leaves the
    # accelerator check's block as it was, and the other way round.
    if summary.get("train") or timings or benches:
        write_block(render(summary, timings, benches), args.update, parser, BEGIN, END)
    if summary.get("loadgen"):
        block = render_loadgen(summary)
        write_block(block, args.update, parser, LOADGEN_BEGIN, LOADGEN_END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
