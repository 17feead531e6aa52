"""Render a ``make bench`` result (``bench.json``) as the Markdown results table of the docs.

``python benchmarks/results_table.py bench.json`` prints the table with the machine, the
date and the settings it was measured with; ``--update docs/performance.md`` writes it
between the page's ``<!-- bench-results:begin -->`` and ``<!-- bench-results:end -->``
markers, so the page carries one current table that any run can replace. It reads only
the JSON (schema ``seedrl-bench/1``), never the benchmark's code, so an old file renders
with today's script.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BEGIN = "<!-- bench-results:begin -->"
END = "<!-- bench-results:end -->"
COST_ROLES = ("actors", "serving", "training")
COLUMNS = (
    "N × K",
    "ideal",
    "echo",
    "inference",
    "system",
    "system/ideal",
    "system/echo",
    "CPU µs/frame e/s",
    "serving +µs/frame i/s",
    "train µs/frame",
    "batch",
    "step p50/p99 ms",
    "trainer waits",
    "learner steps/s",
    "actor procs",
    "actor RSS MB",
    "+µs a/s/t",
)


def _median(rows: list[dict[str, Any]], point: str, mode: str, key: str) -> float | None:
    values = [
        r[key]
        for r in rows
        if r.get("point") == point
        and r.get("mode") == mode
        and not r.get("error")
        and r.get(key) is not None
    ]
    return statistics.median(values) if values else None


def _num(value: float | None, fmt: str = "{:,.0f}") -> str:
    return "—" if value is None else fmt.format(value)


def _batch(value: float | None) -> str:
    return _num(value, "{:,.0f}" if value is not None and value >= 100 else "{:.1f}")


def _extra(extra: dict[str, float] | None) -> str:
    if not extra:
        return "—"
    return "/".join(f"{extra[role]:+.0f}" for role in COST_ROLES)


def _serving_beyond_echo(med: Any) -> str:
    """The learner process's CPU per frame beyond the echo server's, inference / system,
    from the rows (so a file written before the point carried it renders the same)."""
    echo = med("echo", "serving_cpu_us_per_frame")
    if echo is None:
        return "—"
    cells = []
    for mode in ("inference", "system"):
        serving = med(mode, "serving_cpu_us_per_frame")
        cells.append("—" if serving is None else f"{serving - echo:+.1f}")
    return " / ".join(cells)


def table_rows(report: dict[str, Any]) -> list[list[str]]:
    """One row of cells per point, in the report's order (medians over repeats)."""
    rows = report["results"]
    out = []
    for p in report["points"]:
        label = p["point"]

        def med(mode: str, key: str, label: str = label) -> float | None:
            return _median(rows, label, mode, key)

        out.append(
            [
                label,
                _num(p.get("ideal_fps")),
                _num(p.get("echo_fps")),
                _num(p.get("inference_fps")),
                _num(p.get("system_fps")),
                _num(p.get("system_over_ideal"), "{:.2f}"),
                _num(p.get("system_over_echo"), "{:.2f}"),
                f"{_num(med('echo', 'cpu_us_per_frame'))} / "
                f"{_num(med('system', 'cpu_us_per_frame'))}",
                _serving_beyond_echo(med),
                _num(med("ideal_train", "training_us_per_frame"), "{:.2f}"),
                _batch(med("system", "inference_batch_mean")),
                f"{_num(med('system', 'rtt_p50_ms'), '{:.1f}')}/"
                f"{_num(med('system', 'rtt_p99_ms'), '{:.1f}')}",
                _num(med("system", "trainer_wait_share"), "{:.0%}"),
                _num(med("system", "learner_steps_per_s"), "{:.1f}"),
                _num(med("system", "actor_processes")),
                _num(med("system", "actor_rss_mb_max")),
                _extra(p.get("system_extra_us_per_frame")),
            ]
        )
    return out


def _machine_line(report: dict[str, Any]) -> str:
    m = report.get("machine", {})
    versions = ", ".join(f"{k} {v}" for k, v in sorted(m.get("versions", {}).items()))
    return (
        f"Measured {report.get('date', '?')} on {m.get('cpu_model') or 'an unknown CPU'} "
        f"({m.get('cpus', '?')} CPUs, {m.get('platform', '?')}), Python "
        f"{m.get('python', '?')}, {versions}."
    )


def _settings_line(report: dict[str, Any]) -> str:
    s = report.get("settings", {})
    extra = " ".join(s.get("learner_args", []) + s.get("actor_args", []))
    return (
        f"`make bench`: env {s.get('env', '?')}, sweep {','.join(s.get('sweep', []))}, "
        f"modes {','.join(s.get('modes', []))}, {s.get('repeats', '?')} repeat(s) and "
        f"{s.get('focus_repeats', 0)} focus round(s), windows of {s.get('measure_s', '?')} s, "
        f"transport {s.get('transport', '?')}"
        + (f", extra flags `{extra}`" if extra else "")
        + f"; {report.get('wall_time_s', 0) / 60:.1f} min. Frames/s are medians over repeats."
    )


def _target_line(t: dict[str, Any]) -> str:
    verdict = {True: "met", False: "not met", None: "not measured"}[t.get("pass")]
    if t.get("steady") is False:
        verdict += " (repeats disagree)"
    value = _num(t.get("value"), "{:.2f}")
    if t.get("runs"):
        value += " [" + " / ".join(_num(v, "{:.2f}") for v in t["runs"]) + "]"
    where = f" ({t['point']})" if t.get("point") else ""
    return (
        f"- {t['description']}{where}: **{value}**, wanted {t['comparison']} {t['target']}: "
        f"{verdict}"
    )


def render(report: dict[str, Any]) -> str:
    """The Markdown block: provenance, the table, its legend and the targets."""
    lines = [
        _machine_line(report),
        _settings_line(report),
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
        *("| " + " | ".join(cells) + " |" for cells in table_rows(report)),
        "",
        "N × K: N actors × K envs each (`NxKbB`: the learner trains on B unrolls a step). "
        "CPU µs/frame: the whole machine's, echo / system. Step: an actor's round trip. "
        "+µs a/s/t: what the system spends per frame beyond echo in actors / serving "
        "(the learner process and its serving frontends) / training (its trainer process). "
        "Serving +µs/frame: the learner process's CPU per frame beyond the echo server's, "
        "in inference / system mode. Train µs/frame: the in-process ideal's training step "
        "time / frames per batch.",
    ]
    ref = report.get("ideal_reference") or {}
    if ref.get("fps"):
        lines += ["", f"One-process ideal with {ref.get('envs')} envs: {ref['fps']:,.0f} frames/s."]
    targets = report.get("targets") or []
    if targets:
        lines += ["", "Targets (value from the medians; each repeat's own in brackets):", ""]
        lines += [_target_line(t) for t in targets]
    return "\n".join(lines) + "\n"


def update_page(page: str, block: str, begin: str = BEGIN, end: str = END) -> str:
    """``page`` with the text between the ``begin`` and ``end`` markers replaced by ``block``
    (other renderers of the page, such as the GPU table's, pass their own markers)."""
    first, last = page.find(begin), page.find(end)
    if first < 0 or last < first:
        raise ValueError(f"the page has no {begin} ... {end} markers")
    return page[: first + len(begin)] + "\n" + block + page[last:]


def write_block(
    block: str,
    update: str | None,
    parser: argparse.ArgumentParser,
    begin: str = BEGIN,
    end: str = END,
) -> None:
    """Replace the marked block of the page ``update`` names, or print the block."""
    if not update:
        sys.stdout.write(block)
        return
    page = Path(update)
    try:
        page.write_text(update_page(page.read_text(), block, begin, end))
    except ValueError as exc:
        parser.error(f"{page}: {exc}")
    print(f"updated {page}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/results_table.py", description=__doc__.splitlines()[0]
    )
    parser.add_argument("bench_json", help="the file make bench wrote (default name bench.json)")
    parser.add_argument("--update", metavar="PAGE", help="replace the table in this Markdown page")
    parser.add_argument(
        "--block",
        default="bench-results",
        help="the page's markers to write between (one block per benchmark, e.g. bench-atari)",
    )
    args = parser.parse_args(argv)
    report = json.loads(Path(args.bench_json).read_text())
    block = render(report)
    write_block(block, args.update, parser, *block_markers(args.block))
    return 0


def block_markers(name: str) -> tuple[str, str]:
    """Begin and end markers of a named block (``bench-results``: :data:`BEGIN`, :data:`END`)."""
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


if __name__ == "__main__":
    sys.exit(main())
