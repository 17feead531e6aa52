"""Render a peers run (``peers.json``, schema ``seedrl-peers/1``) as the Markdown block of
``docs/performance.md`` between ``<!-- peers-results:begin -->`` and
``<!-- peers-results:end -->``: the machine and date, CartPole time to the target,
Atari steady throughput, the structured suite's mean-100 returns after the same wall
time and SAC's update and env-step rates, one row per system, failures with their
reason. It reads only the JSON, so an old run renders with today's code.
"""

from __future__ import annotations

from typing import Any

from benchmarks.results_table import _num

BEGIN = "<!-- peers-results:begin -->"
END = "<!-- peers-results:end -->"
SCHEMA = "seedrl-peers/1"
CARTPOLE_COLUMNS = (
    "system",
    "settings",
    "result",
    "wall s to target",
    "training s to target",
    "frames to target",
    "frames/s",
    "episodes",
    "stopped by",
)
ATARI_COLUMNS = (
    "system",
    "settings",
    "result",
    "agent steps/s",
    "emulator frames/s",
    "window s",
    "start-up s",
)

STRUCTURED_COLUMNS = (
    "env",
    "system",
    "seed",
    "wall cap s",
    "settings",
    "result",
    "mean-100 return",
    "random",
    "upper",
    "frames",
    "frames/s",
    "start-up s",
    "stopped by",
)


SAC_COLUMNS = (
    "env",
    "system",
    "settings",
    "result",
    "updates/s",
    "env steps/s",
    "updates per env step",
    "transitions per update",
    "window s",
    "start-up s",
)


def _table(columns: tuple[str, ...], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
        *("| " + " | ".join(cells) + " |" for cells in rows),
    ]


def _cell(text: str) -> str:
    """Table-safe: one line, no column breaks."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _outcome(row: dict[str, Any], target: float) -> str:
    if row.get("status") != "ok":
        return _cell(f"failed: {row.get('reason') or 'no reason recorded'}")
    if row.get("task") == "structured":
        return "trained"
    if row.get("task") == "sac":
        return "measured" if row.get("updates_per_s") is not None else "too short to measure"
    if row.get("task") == "atari":
        return "measured" if row.get("agent_steps_per_s") is not None else "too short to measure"
    if row.get("reached"):
        return f"reached {target:g}"
    mean = row.get("return_mean100")
    return f"not reached (mean {_num(mean, '{:.1f}')} at the end)"


def cartpole_row(row: dict[str, Any], target: float) -> list[str]:
    frames, seconds = row.get("frames_to_target"), row.get("train_to_target_s")
    rate = frames / seconds if row.get("reached") and frames and seconds else None
    return [
        _cell(row.get("system", row.get("peer", "?"))),
        _cell(row.get("summary", "—")),
        _outcome(row, target),
        _num(row.get("launch_to_target_s"), "{:.1f}"),
        _num(row.get("train_to_target_s"), "{:.1f}"),
        _num(frames),
        _num(rate),
        _num(row.get("episodes")),
        _cell(row.get("stopped_by") or "—"),
    ]


def atari_row(row: dict[str, Any]) -> list[str]:
    rate = row.get("agent_steps_per_s")
    skip = row.get("frame_skip")
    return [
        _cell(row.get("system", row.get("peer", "?"))),
        _cell(row.get("summary", "—")),
        _outcome(row, 0.0),
        _num(rate),
        _num(rate * skip if rate is not None and skip else None),
        _num(row.get("measured_s") if rate is not None else None, "{:.0f}"),
        _num(row.get("startup_s"), "{:.0f}"),
    ]


def structured_row(row: dict[str, Any]) -> list[str]:
    frames, wall, startup = row.get("frames"), row.get("wall_s"), row.get("startup_s")
    trained = wall - startup if wall is not None and startup is not None else None
    ok = row.get("status") == "ok"
    return [
        _cell(short_env(str(row.get("env", "?")))),
        _cell(row.get("system", row.get("peer", "?"))),
        str(row_seed(row)),
        f"{row_wall_cap(row):g}",
        _cell(row.get("summary", "—")),
        _outcome(row, 0.0),
        _num(row.get("return_mean100") if ok else None, "{:.2f}"),
        _num(row.get("random_level"), "{:.3f}"),
        _num(row.get("upper_level"), "{:g}"),
        _num(frames if ok else None),
        _num(frames / trained if ok and frames and trained else None),
        _num(startup if ok else None, "{:.0f}"),
        _cell(row.get("stopped_by") or "—"),
    ]


def row_seed(row: dict[str, Any]) -> int:
    """The seed a row ran with (rows from before seeds were recorded ran seed 0)."""
    return int((row.get("settings") or {}).get("seed", 0))


STRUCTURED_WALL_CAP_S = 300.0
"""The wall cap of the structured rows from before each row recorded its own."""


def row_wall_cap(row: dict[str, Any]) -> float:
    """The seconds from launch a structured row trained for (its return is read then)."""
    return float(row.get("wall_cap_s", STRUCTURED_WALL_CAP_S))


def short_env(env: str) -> str:
    """An env id without its module (``lit_cell`` for a structured suite's env)."""
    return env.partition(":")[2] or env


def structured_seeds(rows: list[dict[str, Any]]) -> list[str]:
    """Per env (and wall cap, where rows ran under several), each system's mean-100
    return averaged over the seeds it trained (its seeds' own returns beside), and
    whether seedrl's mean is at or above every peer's: the suite's target, read over
    seeds rather than from one run."""
    envs: dict[str, dict[str, dict[int, float]]] = {}
    systems: list[str] = []
    trained = [r for r in rows if r.get("task") == "structured" and r.get("status") == "ok"]
    several_caps = len({row_wall_cap(r) for r in trained}) > 1
    for row in sorted(trained, key=lambda r: (row_wall_cap(r), row_seed(r))):
        system = str(row.get("system", row.get("peer", "?")))
        if system not in systems:
            systems.append(system)
        env = short_env(str(row.get("env", "?")))
        if several_caps:
            env += f" at {row_wall_cap(row):g} s"
        returns = envs.setdefault(env, {}).setdefault(system, {})
        returns[row_seed(row)] = float(row["return_mean100"])
    if not any(len(seeds) > 1 for by in envs.values() for seeds in by.values()):
        return []
    ours = next((s for s in systems if s.startswith("seedrl")), None)
    systems.sort(key=lambda s: s != ours)  # seedrl's column first, the peers' in their order
    table = []
    for env, by_system in envs.items():
        means = {s: sum(v.values()) / len(v) for s, v in by_system.items()}
        cells = [_cell(env)]
        for system in systems:
            seeds = by_system.get(system, {})
            each = ", ".join(f"{seeds[k]:.2f}" for k in sorted(seeds))
            cells.append(f"{means[system]:.2f} ({len(seeds)}: {each})" if seeds else "—")
        peers = [means[s] for s in by_system if s != ours]
        if ours in means and peers:
            short = max(peers) - means[ours]
            cells.append("yes" if short <= 0 else f"no, by {short:.2f}")
        else:
            cells.append("—")
        table.append(cells)
    columns = ("env", *(f"{s}: mean (seeds: each)" for s in systems), "seedrl at or above")
    return _table(columns, table)


def sac_row(row: dict[str, Any]) -> list[str]:
    updates, steps = row.get("updates_per_s"), row.get("env_steps_per_s")
    measured = updates is not None and steps is not None
    return [
        _cell(row.get("env", "?")),
        _cell(row.get("system", row.get("peer", "?"))),
        _cell(row.get("summary", "—")),
        _outcome(row, 0.0),
        _num(updates),
        _num(steps),
        _num(updates / steps if measured and steps else None, "{:.2f}"),
        _num(row.get("transitions_per_update")),
        _num(row.get("measured_s") if measured else None, "{:.0f}"),
        _num(row.get("startup_s"), "{:.0f}"),
    ]


def _machine_line(report: dict[str, Any]) -> str:
    m = report.get("machine", {})
    usable = m.get("cpus_usable")
    cpus = f"{m.get('cpus', '?')} CPUs"
    if usable is not None and usable != m.get("cpus"):
        cpus += f", this run pinned to {usable}"
    return (
        f"Measured {report.get('date', '?')} on {m.get('cpu_model') or 'an unknown CPU'} "
        f"({cpus}, {m.get('platform', '?')}), Python {m.get('python', '?')}; "
        f"`make bench-peers` took {report.get('wall_time_s', 0) / 60:.1f} min."
    )


def _versions_line(rows: list[dict[str, Any]]) -> str:
    parts: list[str] = []
    for row in rows:
        versions = ", ".join(f"{k} {v}" for k, v in sorted((row.get("versions") or {}).items()))
        part = f"{row.get('system', row.get('peer', '?'))}: {versions}"
        if versions and part not in parts:
            parts.append(part)
    return "; ".join(parts)


def render(report: dict[str, Any]) -> str:
    """The Markdown block: provenance, the CartPole table, the Atari table, the legend."""
    if report.get("schema") != SCHEMA:
        raise ValueError(f"not a {SCHEMA} report (schema {report.get('schema')!r})")
    s = report.get("settings", {})
    target = float(s.get("target", 475.0))
    rows = report.get("results", [])
    cartpole = [cartpole_row(r, target) for r in rows if r.get("task") == "cartpole"]
    atari = [atari_row(r) for r in rows if r.get("task") == "atari"]
    structured = [structured_row(r) for r in rows if r.get("task") == "structured"]
    sac = [sac_row(r) for r in rows if r.get("task") == "sac"]
    lines = [_machine_line(report)]
    earlier = sorted(
        {
            f"{r.get('system', r.get('peer'))} {r.get('task')} ({r['date']})"
            for r in rows
            if r.get("date") not in (None, report.get("date"))
        }
    )
    if earlier:
        lines += ["", f"Kept from earlier runs on this machine: {', '.join(earlier)}."]
    if s.get("note"):
        lines += ["", f"Note: {s['note']}"]
    versions = _versions_line(rows)
    if versions:
        lines += ["", f"Versions: {versions}."]
    if cartpole:
        lines += [
            "",
            f"CartPole-v1 to a mean return of {target:g} over the last 100 training episodes "
            f"(caps: {_num(s.get('cartpole_wall_cap_s'), '{:.0f}')} s from launch):",
            "",
            *_table(CARTPOLE_COLUMNS, cartpole),
        ]
    if atari:
        lines += [
            "",
            f"Atari Pong, steady throughput over the window after "
            f"{_num(s.get('atari_warmup_s'), '{:.0f}')} s of warm-up from the first frames:",
            "",
            *_table(ATARI_COLUMNS, atari),
        ]
    if structured:
        caps = sorted({row_wall_cap(r) for r in rows if r.get("task") == "structured"})
        lines += [
            "",
            f"The structured learning suite: the mean return of the last 100 training "
            f"episodes after {' or '.join(f'{c:g}' for c in caps)} s from launch (its wall cap), "
            "each system on its defaults with as many envs (random: a uniform policy's "
            "expected return over the allowed actions; upper: the best, a scripted policy's):",
            "",
            *_table(STRUCTURED_COLUMNS, structured),
        ]
        seeds = structured_seeds(rows)
        if seeds:
            lines += ["", "The same over the seeds each system ran:", "", *seeds]
    if sac:
        lines += [
            "",
            f"SAC on a robot: the rates over the window after "
            f"{_num(s.get('sac_warmup_s'), '{:.0f}')} s of warm-up from the first update "
            "(an update: one critic step on a batch of that many transitions; the actor's "
            "steps come on its own cadence in both):",
            "",
            *_table(SAC_COLUMNS, sac),
        ]
    lines += [
        "",
        "Wall s: from launching the system's process (imports and start-up included) to the "
        "moment the target held; training s: from the start of training. Frames are env "
        "steps the learner received; on Atari one agent step is as many emulator frames as "
        "the system's frame skip (seedrl and Sample Factory skip 4, PufferLib's Atari config "
        "1), and Sample Factory's own counter, which counts emulator frames, is divided by "
        "4. Window s: the span the Atari rate was measured over.",
    ]
    return "\n".join(lines) + "\n"
