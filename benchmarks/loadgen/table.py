"""Render load-generator results (``seedrl-loadgen/1``) as the Markdown block of the docs.

``python -m benchmarks.loadgen table FILE... --update docs/performance.md`` writes the
block between the page's ``<!-- loadgen:begin -->`` and ``<!-- loadgen:end -->``
markers, from the JSON alone (an old file renders with today's script).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.doc_blocks import replace_block
from benchmarks.loadgen.summary import base_mode, summarize

BEGIN = "<!-- loadgen:begin -->"
END = "<!-- loadgen:end -->"
MODE_ORDER = ("echo", "inference", "system", "phases")
PHASE_NAMES = {
    "decode": "decode",
    "batch_assembly": "batch assembly",
    "forward": "forward",
    "trajectory_write": "trajectory write",
    "trainer_handoff": "trainer hand-off",
    "reply": "reply",
    "loop_rest": "rest of the loop thread (gRPC, asyncio, batcher)",
    "other_threads": "other threads (gRPC poller, trainer feeder)",
}
ROLE_COLUMNS = (
    "env, S × K", "mode", "G", "model µs/frame", "frontends µs/frame (each)",
    "learner host µs/frame", "frames/s per frontend core", "frames/s answered",
    "round trip p50/p99 ms", "RSS MB model / frontends (each) / trainer", "PSS MB host",
)  # fmt: skip
COLUMNS = (
    "env, S × K", "mode", "learner CPU µs/frame", "beyond echo", "frames/s answered",
    "trained frames/s", "round trip p50/p99 ms", "batch", "loop / other threads µs",
    "trainer µs/frame", "generator µs/frame",
)  # fmt: skip


def _num(value: float | None, fmt: str = "{:,.0f}") -> str:
    return "—" if value is None else fmt.format(value)


def _runs(values: list[float]) -> str:
    return " / ".join(f"{v:.1f}" for v in values)


def render(results: list[dict[str, Any]]) -> str:
    lines: list[str] = []
    for result in results:
        s = result["settings"]
        m = result["machine"]
        versions = ", ".join(f"{k} {v}" for k, v in sorted(m.get("versions", {}).items()))
        lines.append(
            f"Measured {result['date']} on {m.get('cpu_model') or 'unknown CPU'} "
            f"({m.get('cpus')} CPUs), Python {m.get('python')}, {versions}. "
            f"`python -m benchmarks.loadgen --env {s['env']}"
            + (f" --preset {s['preset']}" if s.get("preset") else "")
            + (f" --device {s['device']}" if s.get("device", "cpu") != "cpu" else "")
            + (f" --learner-args '{s['learner_args']}'" if s.get("learner_args") else "")
            + f" --streams {s['streams']} --envs {s['envs']}"
            + (
                f" --serving-processes {s['serving_processes']}"
                if s.get("serving_processes", "0") != "0"
                else ""
            )
            + (f" --generators {s['generators']}" if s.get("generators", 1) > 1 else "")
            + f"`: {s['repeats']} repeat(s) of {', '.join(s['modes'])}, windows of "
            f"{s['measure_s']:g} s, {s['connections']} connections, transport "
            f"{s['transport']}; {result['wall_time_s'] / 60:.1f} min."
        )
        lines.append("")
    lines.append("| " + " | ".join(COLUMNS) + " |")
    lines.append("|" + "---|" * len(COLUMNS))
    for result in results:
        lines.extend(_rows(result))
    lines.append("")
    lines.append(
        "Learner CPU µs/frame: the learner process's CPU (all its threads, not its trainer "
        "process) over the frames answered in the window, median with each repeat's value "
        "in brackets; beyond echo: that minus the echo server's. Trained frames/s: learner "
        "steps/s × frames per step. Loop / other threads: the learner process's main "
        "thread (the event loop) and the rest. The phases row runs with `--time-phases`. "
        "A mode `MODE@N` ran the learner with `--serving-processes N`: its learner CPU is "
        "the model process's, the frontends' is in the table by role below."
    )
    roles = [line for result in results for line in _role_rows(result)]
    if roles:
        lines += ["", "By process role:", ""]
        lines.append("| " + " | ".join(ROLE_COLUMNS) + " |")
        lines.append("|" + "---|" * len(ROLE_COLUMNS))
        lines += roles
        lines += [
            "",
            "Model: the process with the model (the whole learner at N = 0); "
            "frontends: the serving-tier processes, summed and each; learner host: every "
            "process of the learner (model, frontends, trainer), the generators not among "
            "them. Frames/s per frontend core: frames answered per CPU second of the "
            "frontends. G: generator processes. RSS at the window's end, per process "
            "(pages they share, the slot table and libraries, counted in each); PSS: the "
            "learner's processes summed, shared pages split between them.",
        ]
    for result in results:
        lines.extend(_phases(result))
        lines.extend(_targets(result))
    return "\n".join(lines).rstrip() + "\n"


def _rows(result: dict[str, Any]) -> list[str]:
    s = result["settings"]
    summary = summarize(result["results"], s["env"], s["envs"])
    label = f"{s['env']}, {s['streams']} × {s['envs']}"
    out = []
    for mode in _ordered(summary["summary"]):
        m = summary["summary"][mode]
        beyond = summary["beyond_echo_us_per_frame"].get(mode)
        cells = [
            label, mode,
            f"**{_num(m['learner_cpu_us_per_frame'], '{:.1f}')}** "
            f"[{_runs(m['learner_cpu_us_per_frame_runs'])}]",
            _num(beyond, "{:+.1f}"), _num(m["fps_answered"]), _num(m["trained_fps"]),
            f"{_num(m['rtt_p50_ms'], '{:.2f}')} / {_num(m['rtt_p99_ms'], '{:.2f}')}",
            _num(m["inference_batch_mean"], "{:.1f}"),
            f"{_num(m['learner_loop_thread_us_per_frame'], '{:.1f}')} / "
            f"{_num(m['learner_other_threads_us_per_frame'], '{:.1f}')}",
            _num(m["trainer_cpu_us_per_frame"], "{:.1f}"),
            _num(m["generator_cpu_us_per_frame"], "{:.1f}"),
        ]  # fmt: skip
        out.append("| " + " | ".join(cells) + " |")
    return out


def _ordered(modes: dict[str, Any]) -> list[str]:
    """Modes as the table lists them: echo, inference, system, phases, each at N = 0
    first and then by frontend count."""

    def key(mode: str) -> tuple[int, int]:
        name, tier = base_mode(mode)
        return (MODE_ORDER.index(name) if name in MODE_ORDER else len(MODE_ORDER), tier)

    return sorted(modes, key=key)


def _each(values: list[float | None] | None, fmt: str) -> str:
    if not values or len(values) < 2:
        return ""
    return " (" + " / ".join(_num(v, fmt) for v in values) + ")"


def _role_rows(result: dict[str, Any]) -> list[str]:
    s = result["settings"]
    summary = summarize(result["results"], s["env"], s["envs"])["summary"]
    label = f"{s['env']}, {s['streams']} × {s['envs']}"
    out = []
    for mode in _ordered(summary):
        m = summary[mode]
        if m.get("host_cpu_us_per_frame") is None:
            continue  # a file from before the roles were read
        tiered = base_mode(mode)[1] > 0
        fe = (
            _num(m.get("frontend_cpu_us_per_frame"), "{:.1f}")
            + _each(m.get("frontend_cpu_us_per_frame_each"), "{:.1f}")
            if tiered
            else "—"
        )
        rss_fe = (
            _num(m.get("frontends_rss_mb"), "{:.0f}")
            + _each(m.get("frontend_rss_mb_each"), "{:.0f}")
            if tiered
            else "—"
        )
        cells = [
            label, mode, str(s.get("generators", 1)),
            f"**{_num(m['learner_cpu_us_per_frame'], '{:.1f}')}**", fe,
            _num(m["host_cpu_us_per_frame"], "{:.1f}"),
            _num(m.get("fps_per_frontend_core")) if tiered else "—",
            _num(m["fps_answered"]),
            f"{_num(m['rtt_p50_ms'], '{:.2f}')} / {_num(m['rtt_p99_ms'], '{:.2f}')}",
            f"{_num(m.get('model_rss_mb'))} / {rss_fe} / {_num(m.get('others_rss_mb') or None)}",
            _num(m.get("host_pss_mb")),
        ]  # fmt: skip
        out.append("| " + " | ".join(cells) + " |")
    return out


def _phases(result: dict[str, Any]) -> list[str]:
    s = result["settings"]
    summary = summarize(result["results"], s["env"], s["envs"])
    out = []
    for mode in _ordered(summary["summary"]):
        if base_mode(mode)[0] != "phases":
            continue
        phases = summary["summary"][mode].get("phases_us_per_frame")
        if not phases:
            continue
        parts = ", ".join(f"{PHASE_NAMES.get(k, k)} {v:.1f}" for k, v in phases.items())
        total = summary["summary"][mode]["learner_cpu_us_per_frame"]
        if mode != "phases":  # the model process of the tier: its split alone
            out += [
                "",
                f"Where the model process's CPU per frame goes with `--serving-processes "
                f"{base_mode(mode)[1]}`, {s['env']} {s['streams']} × {s['envs']} (µs/frame, "
                f"training on): {parts}; total {total:.1f}, timing included; beyond the "
                f"forward pass {total - phases['forward']:.1f}.",
            ]
            continue
        non_model = summary["non_model_us_per_frame"]
        own = summary.get("non_model_beyond_echo_us_per_frame", {})
        out += [
            "",
            f"Where the learner's CPU per frame goes, {s['env']} {s['streams']} × {s['envs']} "
            f"(µs/frame, training on, medians): {parts}; total {total:.1f}, timing included. "
            f"Beyond the forward pass: {_num(non_model.get('inference'), '{:.1f}')} with "
            f"`--no-train`, {_num(non_model.get('system'), '{:.1f}')} training; beyond the "
            f"forward pass and the echo server's cost: {_num(own.get('inference'), '{:.1f}')} "
            f"and {_num(own.get('system'), '{:.1f}')}.",
        ]
    return out


def _targets(result: dict[str, Any]) -> list[str]:
    s = result["settings"]
    targets = summarize(result["results"], s["env"], s["envs"])["targets"]
    out = []
    for t in targets:
        verdict = "not measured" if t["pass"] is None else ("met" if t["pass"] else "not met")
        out += ["", f"- {t['description']}: **{_num(t['value'], '{:.1f}')}**, wanted "
                    f"{t['comparison']} {t['target']:g}: {verdict}"]  # fmt: skip
    return out


def update_doc(path: Path, block: str) -> None:
    """Replace the text between the loadgen markers of ``path`` with ``block``."""
    replace_block(path, BEGIN, END, block)
