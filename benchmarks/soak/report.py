"""The soak's verdict: the bounds checked over a finished run, its JSON, plots and table.

The checks read only what the run recorded (faults, metrics records, RSS samples), so an
old JSON file renders and judges with today's script.
"""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path
from typing import Any

from benchmarks.doc_blocks import replace_block

BEGIN = "<!-- soak:begin -->"
END = "<!-- soak:end -->"
RSS_SLACK_MB = 32.0
RSS_SLACK_SHARE = 0.10
"""RSS may grow after warm-up by at most this much plus this share of its size then:
allocator noise and a few cached buffers, not a leak over an hour."""
STUCK_STREAM_BOUND_S = 20.0


def rss_growth(samples: list[dict[str, float]], key: str, warmup_s: float) -> dict[str, Any]:
    """Median RSS over the first and the last tenth of the run after warm-up, the growth
    between them and its bound."""
    after = [s[key] for s in samples if s["t"] >= warmup_s and s[key] > 0]
    if len(after) < 4:
        return {"ok": False, "detail": "too few samples after warm-up"}
    tenth = max(2, len(after) // 10)
    first, last = statistics.median(after[:tenth]), statistics.median(after[-tenth:])
    bound = RSS_SLACK_MB + RSS_SLACK_SHARE * first
    return {
        "ok": last - first <= bound, "first_mb": round(first, 1), "last_mb": round(last, 1),
        "growth_mb": round(last - first, 1), "bound_mb": round(bound, 1),
        "max_mb": round(max(after), 1),
    }  # fmt: skip


def stuck_streams(records: list[dict[str, Any]], actors: int) -> dict[str, Any]:
    """The longest stretch in which the learner counted more streams than there are actors
    (a dead stream it still holds), and whether the run ends with exactly every actor."""
    longest, since = 0.0, None
    for record in records:
        if record.get("actors_connected", 0) > actors:
            since = record["time"] if since is None else since
            longest = max(longest, record["time"] - since)
        else:
            since = None
    final = records[-1].get("actors_connected") if records else None
    return {
        "ok": longest <= STUCK_STREAM_BOUND_S and final == actors,
        "longest_excess_s": round(longest, 1), "bound_s": STUCK_STREAM_BOUND_S,
        "final_connected": final, "actors": actors,
    }  # fmt: skip


def checkpoints(faults: list[dict[str, Any]], final_frames: int | None) -> dict[str, Any]:
    """Every checkpoint read during the run loaded, and none went backwards."""
    seen = [f[k] for f in faults for k in ("checkpoint_frames",) if k in f]
    seen = [s for s in seen if s is not None] + ([final_frames] if final_frames else [])
    loaded = all(f.get("checkpoint_ok", True) for f in faults) and final_frames is not None
    monotone = all(a <= b for a, b in itertools.pairwise(seen))
    return {"ok": loaded and monotone, "frames_read": seen, "final_frames": final_frames}


def returns(records: list[dict[str, Any]], warmup_s: float, started_wall: float) -> dict[str, Any]:
    """Solved at the end (mean-100 >= 475 for CartPole), or still rising: the last mean-100
    return above the one at the end of warm-up."""
    values = [
        (r["time"] - started_wall, r["episode_return_mean"])
        for r in records
        if r.get("episode_return_mean") is not None
    ]
    if not values:
        return {"ok": False, "detail": "no episode ended"}
    at_warmup = next((v for t, v in values if t >= warmup_s), values[0][1])
    final = values[-1][1]
    solved = final >= 475.0
    return {
        "ok": solved or final > at_warmup, "at_warmup": round(at_warmup, 1),
        "final": round(final, 1), "best": round(max(v for _, v in values), 1), "solved": solved,
    }  # fmt: skip


def judge(result: dict[str, Any]) -> dict[str, Any]:
    """The checks of a finished soak, each ``{"ok": bool, ...}``."""
    warmup = result["config"]["warmup_s"]
    records = result["records"]
    checks: dict[str, Any] = {
        "faults_within_bounds": {
            "ok": all(f["ok"] for f in result["faults"]) and bool(result["faults"]),
            "broken": [f"{f['kind']} at {f['t_s']} s" for f in result["faults"] if not f["ok"]],
        },
        "learner_rss": rss_growth(result["rss"], "learner_total_mb", warmup),
        "actor_rss": rss_growth(result["rss"], "actors_mb", warmup),
        "no_stuck_stream": stuck_streams(
            [r for r in records if r["time"] < result["stopped_wall"]], result["actors"]
        ),
        "no_lost_checkpoint": checkpoints(result["faults"], result.get("final_checkpoint_frames")),
        "return": returns(records, warmup, result["started_wall"]),
    }
    return checks


def thin(records: list[dict[str, Any]], every_s: float) -> list[dict[str, Any]]:
    """At most one record per ``every_s``, with the keys the report reads."""
    keys = ("time", "frames", "fps", "actors_connected", "frames_dropped", "learner_steps",
            "learner_steps_per_s", "episode_return_mean")  # fmt: skip
    out: list[dict[str, Any]] = []
    for record in records:
        if not out or record["time"] - out[-1]["time"] >= every_s:
            out.append({k: record.get(k) for k in keys})
    return out


# ---------------------------------------------------------------- plots


def plot(result: dict[str, Any], png: Path) -> None:
    """Three panels over the run's time: RSS, return and frames/s, and per fault the time
    to recover and the frames lost against their bounds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rss_ax, ret_ax, fault_ax) = plt.subplots(3, 1, figsize=(10, 11))
    minutes = [s["t"] / 60 for s in result["rss"]]
    for key, label in (("learner_total_mb", "learner + trainer"), ("actors_mb", "all actors")):
        rss_ax.plot(minutes, [s[key] for s in result["rss"]], label=label)
    for fault in result["faults"]:
        for ax in (rss_ax, ret_ax):
            ax.axvline(fault["t_s"] / 60, color="grey", alpha=0.3, lw=0.8)
    rss_ax.axvline(result["config"]["warmup_s"] / 60, color="k", ls="--", lw=0.8)
    rss_ax.set(ylabel="RSS (MB)", title="RSS over time (grey: faults; dashed: end of warm-up)")
    rss_ax.legend(loc="upper left")
    start = result["started_wall"]
    records = result["records"]
    t = [(r["time"] - start) / 60 for r in records]
    ret_ax.plot(t, [r["episode_return_mean"] for r in records], color="C2", label="mean-100 return")
    ret_ax.set(ylabel="return", xlabel="minutes")
    fps_ax = ret_ax.twinx()
    fps_ax.plot(t, [r["fps"] for r in records], color="C1", alpha=0.35, lw=0.7)
    fps_ax.set_ylabel("frames/s", color="C1")
    ret_ax.legend(loc="upper left")
    kinds = sorted({f["kind"] for f in result["faults"]})
    for i, kind in enumerate(kinds):
        mine = [f for f in result["faults"] if f["kind"] == kind]
        rec = [f["recovery_s"] or 0 for f in mine]
        share = [
            (f["frames_lost"] or 0) / f["frames_lost_bound"] if f.get("frames_lost_bound") else 0
            for f in mine
        ]
        x = [i + 0.08 * (j - len(mine) / 2) for j in range(len(mine))]
        fault_ax.scatter(x, rec, color="C0", marker="o", label="recovery (s)" if i == 0 else None)
        fault_ax.scatter(x, [100 * s for s in share], color="C3", marker="x",
                        label="frames lost, % of bound" if i == 0 else None)  # fmt: skip
    fault_ax.axhline(100, color="C3", ls=":", lw=0.8)
    fault_ax.set_xticks(range(len(kinds)), kinds)
    fault_ax.set(ylabel="s  /  % of bound", title="per fault: time to recover, frames lost")
    fault_ax.legend(loc="upper left")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=80)
    plt.close(fig)


# ---------------------------------------------------------------- the docs table


def render(result: dict[str, Any], png: str | None = None) -> str:
    """The Markdown block for docs/reliability.md."""
    c, checks = result["config"], result["checks"]
    m = result["machine"]
    lines = [
        f"Measured {result['date']} on {m.get('cpu_model') or 'unknown CPU'} ({m.get('cpus')} "
        f"CPUs, shared), Python {m.get('python')}: `{result['command']}`, "
        f"{result['duration_s'] / 60:.1f} min, {c['env']}, {result['actors']} actors × "
        f"{c['envs_per_actor']} envs ({c['remote_actors']} behind the cut link), "
        + ("ended early by a signal, " if result.get("interrupted") else "")
        + f"checkpoint "
        f"every {c['checkpoint_interval_s']:g} s, {len(result['faults'])} faults; verdict: "
        f"**{'all bounds held' if result['ok'] else 'BOUND BROKEN'}**.",
        "",
    ]
    for kind, why in result.get("skipped", {}).items():
        lines.append(f"- {kind} not run: {why}")
    if result.get("skipped"):
        lines.append("")
    lines += [
        "| fault | times | recovery s (median / max) | bound s | frames lost (max) "
        "| bound (max) | all within |",
        "|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for kind in sorted({f["kind"] for f in result["faults"]}):
        mine = [f for f in result["faults"] if f["kind"] == kind]
        rec = [f["recovery_s"] for f in mine if f["recovery_s"] is not None]
        lost = [f["frames_lost"] for f in mine if f["frames_lost"] is not None]
        lines.append(
            f"| {kind} | {len(mine)} | "
            + (f"{statistics.median(rec):.1f} / {max(rec):.1f}" if rec else "—")
            + f" | {max(f['recovery_bound_s'] for f in mine):g} | "
            + (f"{max(lost):,}" if lost else "—")
            + f" | {max(f['frames_lost_bound'] for f in mine):,} | "
            + ("yes" if all(f["ok"] for f in mine) else "**no**")
            + " |"
        )
    lr, ar = checks["learner_rss"], checks["actor_rss"]
    st, ck, rt = checks["no_stuck_stream"], checks["no_lost_checkpoint"], checks["return"]
    if ck.get("final_frames"):
        checkpoint_row = (
            f"| no lost checkpoint | every read loaded, frames never went back; final at "
            f"{ck['final_frames']:,} frames | — | {_yes(ck['ok'])} |"
        )
    else:
        checkpoint_row = f"| no lost checkpoint | final one missing | — | {_yes(False)} |"
    lines += [
        "",
        "| check | result | bound | held |",
        "|---|---|---|---|",
        _rss_row("learner + trainer RSS", lr),
        _rss_row("all actors' RSS", ar),
        f"| no stuck stream | longest stretch with more streams than actors "
        f"{st['longest_excess_s']} s; at the end {st['final_connected']} of {st['actors']} | "
        f"≤ {st['bound_s']:g} s; all at the end | {_yes(st['ok'])} |",
        checkpoint_row,
        f"| return | mean-100 {rt.get('at_warmup')} after warm-up, {rt.get('final')} at the end "
        f"(best {rt.get('best')}) | solved (475) or higher than after warm-up | {_yes(rt['ok'])} |",
    ]  # fmt: skip
    if png:
        lines += ["", f"![soak: RSS, return and faults]({png})"]
    return "\n".join(lines) + "\n"


def _yes(ok: bool) -> str:
    return "yes" if ok else "**no**"


def _rss_row(name: str, check: dict[str, Any]) -> str:
    if "first_mb" not in check:
        return f"| {name} | {check.get('detail')} | — | {_yes(False)} |"
    return (
        f"| {name} | {check['first_mb']} MB after warm-up → {check['last_mb']} MB at the end "
        f"(max {check['max_mb']}) | growth ≤ {check['bound_mb']} MB "
        f"({RSS_SLACK_MB:g} MB + {RSS_SLACK_SHARE:.0%}) | {_yes(check['ok'])} |"
    )


def update_doc(path: Path, block: str) -> None:
    """Replace the text between the soak markers of ``path`` with ``block``."""
    replace_block(path, BEGIN, END, block)
