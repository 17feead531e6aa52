"""From a suite's run directories to its summary JSON, learning-curve PNGs and the
markdown table that ``docs/learning.md`` carries."""

from __future__ import annotations

import dataclasses
import datetime
import functools
import itertools
import json
import math
import os
import re
import statistics
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks.learning.runner import RANDOM_FILE, RUN_FILE
from benchmarks.learning.suites import (
    PBT_CURVE_METRIC,
    RETURN_METRIC,
    SUITES,
    YARDSTICK_METRIC,
    EnvSpec,
    Suite,
)
from seedrl.metrics import METRICS_FILE, read_metrics

SUMMARY_FILE = "summary.json"
CONFIG_FILE = "config.json"
SMALL_RETURNS = 5.0
"""Returns below this in size are printed with more decimals (MiniGrid's lie in [0, 1])."""
ARCHIVE_POINTS = 500
"""Curve points an archived run keeps: enough for the plot, small enough to commit."""
ARCHIVE_FIELDS = ("frames", "elapsed_s", RETURN_METRIC, "entropy", "learning_rate")
"""What an archived metrics record keeps: the curve (and the env's own curve metric, where
it has another), and what explains its shape."""
CURVE_LABELS = {
    RETURN_METRIC: "mean return of the last 100 episodes",
    YARDSTICK_METRIC: "lowest score over the last 100 games\nagainst a fixed opponent",
    PBT_CURVE_METRIC: "the best member's mean return\n(last 100 episodes since it last copied)",
}


def _timed_records(logdir: Path) -> Iterator[tuple[dict[str, Any], float]]:
    """Each metrics record with its wall time summed over the segments of a resumed run
    (each segment's clock starts again at 0)."""
    offset, previous = 0.0, 0.0
    for record in read_metrics(logdir):
        elapsed = float(record["elapsed_s"])
        if elapsed < previous:
            offset += previous
        previous = elapsed
        yield record, offset + elapsed


def curve(logdir: Path, metric: str = RETURN_METRIC) -> list[tuple[int, float, float]]:
    """(frames, wall seconds, value) per metrics record that has ``metric`` (the mean-100
    return unless the env's curve is another)."""
    return [
        (int(record["frames"]), wall, record[metric])
        for record, wall in _timed_records(logdir)
        if record.get(metric) is not None
    ]


def wall_time_s(logdir: Path) -> float:
    """The run's wall time, summed over its resumed segments."""
    return max((wall for _, wall in _timed_records(logdir)), default=0.0)


def run_summary(spec: EnvSpec, logdir: Path) -> dict[str, Any] | None:
    """One finished run: final returns, threshold crossings, throughput."""
    path = logdir / RUN_FILE
    if not path.exists():
        return None
    run: dict[str, Any] = json.loads(path.read_text())
    points = curve(logdir, spec.curve_metric)
    wall = wall_time_s(logdir)
    crossings: dict[str, Any] = {}
    for threshold in spec.thresholds:
        hit = next((p for p in points if p[2] >= threshold), None)
        crossings[f"{threshold:g}"] = (
            None if hit is None else {"frames": hit[0], "wall_time_s": round(hit[1], 1)}
        )
    return {
        "seed": run["seed"],
        "run": logdir.name,
        "actors": run.get("actors"),
        "frames": run["frames"],
        "budget_frames": run["budget_frames"],
        "overrides": run.get("overrides", {}),
        "wall_time_s": round(wall, 1),
        "frames_per_s": round(run["frames"] / wall, 1) if wall > 0 else None,
        "final_return_mean100": run["train_return_mean100"],
        "eval": None
        if run["eval"] is None
        else {k: v for k, v in run["eval"].items() if not k.endswith(("returns", "lengths"))},
        **({"heuristic": run["heuristic"]} if "heuristic" in run else {}),
        **(match_summary(spec, run, wall) if spec.opponents else {}),
        "learner_steps": run.get("learner_steps"),
        "episodes": run.get("episodes"),
        "thresholds": crossings,
        **held_returns(spec, points),
    }


def match_summary(spec: EnvSpec, run: dict[str, Any], wall_s: float) -> dict[str, Any]:
    """A two-player run's games: those of the weights its verdict is on (the best
    checkpoint, else the final weights), the final weights' beside them, and the verdict."""
    kept = ("matches", "matches_of", "best_frames", "final_matches")
    return {
        **{key: run[key] for key in kept if key in run},
        "matches_of": run.get("matches_of", "final"),
        **match_verdict(spec, run, wall_s),
    }


def match_verdict(spec: EnvSpec, run: dict[str, Any], wall_s: float) -> dict[str, Any]:
    """Whether a two-player run met its targets: at least its win rate against each of
    ``spec.opponents`` in both seats, having trained within the wall budget."""
    played = {match["opponent"]: match for match in run["matches"]}
    short = [
        f"{name} {seat}"
        for name, need in spec.opponents.items()
        for seat, result in (played[name]["seats"].items() if name in played else [("-", None)])
        if result is None or result["wins"] < need * result_games(result) - 1e-9
    ]
    in_time = not spec.wall_budget_s or wall_s <= spec.wall_budget_s
    return {"meets_targets": not short and in_time, "short_of": short, "in_time": in_time}


def seat_scores(played: list[dict[str, Any]], opponent: str, form: str) -> str:
    """One opponent's win rates in percent, seat by seat in the arena's order (first /
    second), from a run's matches; "-" where it was not played."""
    seats: dict[str, Any] = next((m["seats"] for m in played if m["opponent"] == opponent), {})
    return " / ".join(form.format(100 * seat["win"]) for seat in seats.values()) or "-"


def result_games(seat: dict[str, Any]) -> int:
    """Games one seat's record counts (wins, draws and losses)."""
    return int(seat["wins"] + seat["draws"] + seat["losses"])


def held_returns(spec: EnvSpec, points: list[tuple[int, float, float]]) -> dict[str, Any]:
    """What a long run kept: its best mean-100 return, the lowest after it first reached
    the solved level (the env's last threshold; None if it never did), and the last."""
    solved = spec.thresholds[-1]
    first = next((i for i, p in enumerate(points) if p[2] >= solved), None)
    return {
        "best_return_mean100": max((p[2] for p in points), default=None),
        "lowest_after_solved": None if first is None else min(p[2] for p in points[first:]),
    }


def compact_records(spec: EnvSpec, logdir: Path, points: int = ARCHIVE_POINTS) -> list[dict]:
    """A run's metrics thinned to about ``points`` records for committing, keeping the
    first and last and each threshold's first crossing, so that the summary and curve
    read off the archive are the run's own. Wall time is summed over resumed segments
    into one ``elapsed_s`` clock."""
    from learner.league.league import ELO_PREFIX  # torch comes with it: only when archiving

    rating_fields = ("learner_steps", ELO_PREFIX)
    metric = spec.curve_metric
    timed = [
        (record, wall) for record, wall in _timed_records(logdir) if record.get(metric) is not None
    ]
    if not timed:
        return []
    keep = {0, len(timed) - 1}
    keep.update(range(0, len(timed), max(1, len(timed) // points)))
    returns = [r[metric] for r, _ in timed]
    for threshold in spec.thresholds:
        crossing = (i for i, ret in enumerate(returns) if ret >= threshold)
        keep.update(itertools.islice(crossing, 1))
    # The best and the lowest after solving, so the stability columns read off the archive
    # are the run's own.
    keep.add(max(range(len(returns)), key=returns.__getitem__))
    solved = next((i for i, ret in enumerate(returns) if ret >= spec.thresholds[-1]), None)
    if solved is not None:
        keep.add(min(range(solved, len(returns)), key=returns.__getitem__))
    compact = []
    for i in sorted(keep):
        record, wall = timed[i]
        kept = {k: record[k] for k in (*ARCHIVE_FIELDS, metric) if k in record}
        if spec.opponents:  # each player's Elo by learner step, for the plot of them
            kept.update(
                (k, round(v, 1) if isinstance(v, float) else v)
                for k, v in record.items()
                if k.startswith(rating_fields)
            )
        compact.append({**kept, "elapsed_s": round(wall, 3)})
    return compact


HOSTING_FIELDS = frozenset({
    "seed", "logdir", "port", "metrics_port", "bind", "advertise_host", "auth_token_file",
    "insecure", "tls_cert", "tls_key", "tls_client_ca", "standby", "standby_tls_ca",
    "standby_grace_s", "local_socket", "progress", "tensorboard", "wandb", "wandb_entity",
    "wandb_mode", "wandb_project", "log_interval_s", "log_episodes", "checkpoint_interval_s",
    "best_checkpoint_interval_s", "resume", "max_seconds", "total_frames", "time_phases",
    "device", "trainer", "inference_backend", "torch_threads", "uvloop",
})  # fmt: skip
"""Learner fields that say where a run ran and what it logged, not how it learned: seeds
differing in these still table together (``total_frames`` too: a longer budget extends a
run, and the suite's budget is in ``run.json``)."""


Run = tuple[dict[str, Any], dict[str, Any] | None]
"""A finished run's ``--set`` overrides and its saved learner config."""


def _saved_run(run_dir: Path) -> Run:
    """A run's ``--set`` overrides and its saved learner config (None where it saved none)."""
    overrides = json.loads((run_dir / RUN_FILE).read_text()).get("overrides", {})
    config_file = run_dir / CONFIG_FILE
    return overrides, json.loads(config_file.read_text()) if config_file.exists() else None


def _compared_fields(mine: Run, theirs: Run) -> set[str]:
    """Either run's overrides, and the config fields both saved less the hosting ones: a
    default changed between two runs is a difference as much as a ``--set`` (a field one
    of them predates is left out, as it did not exist to differ)."""
    fields = set(mine[0]) | set(theirs[0])
    if mine[1] is not None and theirs[1] is not None:
        fields |= (set(mine[1]) & set(theirs[1])) - HOSTING_FIELDS
    return fields


def _as_run(run: Run, fields: set[str]) -> dict[str, Any]:
    """What ``fields`` were in the run: its saved config where it has one, else its
    overrides."""
    overrides, config = run
    return {field: (overrides if config is None else config).get(field) for field in fields}


def _check_same_settings(run_dir: Path, env_results: Path) -> None:
    """Seeds tabled together must be one configuration: a sweep's run (other ``--set``
    overrides) is not archived beside the preset's, nor a run of changed defaults beside
    the runs of the old ones. An override that only restates what the run would have had
    anyway (a default changed to the swept value) is no difference, so the fields are
    compared as the runs had them: from the saved config where there is one, else from the
    overrides."""
    mine = _saved_run(run_dir)
    for other in sorted(env_results.glob(f"seed*/{RUN_FILE}")):
        if other.parent.name == run_dir.name:
            continue  # the same seed is replaced
        theirs = _saved_run(other.parent)
        fields = _compared_fields(mine, theirs)
        ours, its = _as_run(mine, fields), _as_run(theirs, fields)
        differ = {f: (ours[f], its[f]) for f in sorted(fields) if ours[f] != its[f]}
        if differ:
            raise ValueError(
                f"{run_dir} was run with --set {mine[0]} but {other.parent} with {theirs[0]}, "
                f"and they differ in {differ} (this run's, that one's); archive another "
                "configuration in its own --results"
            )


def archive(suite: Suite, out: Path, results: Path) -> list[Path]:
    """Copy the finished runs of ``out`` into ``results`` without checkpoints or logs
    (``run.json``, ``config.json``, thinned metrics, the env's ``random.json``), replacing
    runs of the same env and seed there, and rewrite the summary from everything
    ``results`` holds: runs from several hosts or sessions add up to one table.

    Every run is checked before any is copied, so a refused archive changes nothing."""
    finished = [
        (spec, seed_dir)
        for spec in suite.envs
        for seed_dir in sorted((out / spec.name).glob("seed*"))
        if (seed_dir / RUN_FILE).exists()  # unfinished: its curve would stop short
    ]
    for spec, seed_dir in finished:
        _check_same_settings(seed_dir, results / spec.name)
    copied = []
    for spec, seed_dir in finished:
        target = results / spec.name / seed_dir.name
        target.mkdir(parents=True, exist_ok=True)
        for name in (RUN_FILE, CONFIG_FILE):
            if (seed_dir / name).exists():
                (target / name).write_text((seed_dir / name).read_text())
        records = compact_records(spec, seed_dir)
        (target / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))
        copied.append(target)
    for name in {spec.name for spec, _ in finished}:
        random_path = out / name / RANDOM_FILE
        if random_path.exists():
            (results / name / RANDOM_FILE).write_text(random_path.read_text())
    results.mkdir(parents=True, exist_ok=True)
    write_summary(suite, results)
    return copied


def env_summary(suite: Suite, spec: EnvSpec, out: Path) -> dict[str, Any]:
    runs = []
    for seed_dir in sorted((out / spec.name).glob("seed*")):
        summary = run_summary(spec, seed_dir)
        if summary is not None:
            runs.append(summary)
    finals = [r["final_return_mean100"] for r in runs if r["final_return_mean100"] is not None]
    evals = [r["eval"]["mean"] for r in runs if r["eval"] is not None]
    heuristics = [r["heuristic"]["mean"] for r in runs if "heuristic" in r]
    random_path = out / spec.name / RANDOM_FILE
    ref = spec.reference
    mean_final = statistics.fmean(finals) if finals else None
    mean_eval = statistics.fmean(evals) if evals else None
    mean_heuristic = statistics.fmean(heuristics) if heuristics else None
    # the verdict is against the published figure, else the heuristic on the same episodes
    target = ref.value if ref is not None else mean_heuristic
    meets = None if mean_eval is None or target is None else mean_eval >= target
    if spec.opponents:  # every run wins enough against every opponent in both seats, in time
        meets = all(r["meets_targets"] for r in runs) if runs else None
    return {
        "env": spec.title,
        "name": spec.name,
        "preset": spec.preset,
        "frames_per_step": spec.frames_per_step,
        "seeds_finished": len(runs),
        "solved_level": spec.thresholds[-1],
        "final_return_mean100": mean_final,
        "eval_mean": mean_eval,
        "random": json.loads(random_path.read_text()) if random_path.exists() else None,
        "reference": None if ref is None else dataclasses.asdict(ref),
        "heuristic": spec.heuristic or None,
        "heuristic_mean": mean_heuristic,
        "target": target,
        "same_setting": [dataclasses.asdict(r) for r in spec.same_setting],
        "others": [dataclasses.asdict(r) for r in spec.others],
        "suite_budget_frames": spec.frames,
        "opponents": dict(spec.opponents),
        "wall_budget_s": spec.wall_budget_s,
        # the final score is evaluate's (mean of seeds), as published scores are
        "meets_reference": meets,
        "runs": runs,
    }


def write_summary(suite: Suite, out: Path) -> dict[str, Any]:
    summary = {
        "suite": suite.name,
        "written": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "actors": ", ".join(
            sorted({f"{n} x {k} envs" for spec in suite.envs for n, k in suite.shapes_of(spec)})
        ),
        "eval_mode": "greedy" if suite.greedy else "sampled",
        "envs": [env_summary(suite, spec, out) for spec in suite.envs],
    }
    write_whole(out / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")
    return summary


def write_whole(path: Path, content: str | Callable[[Path], object]) -> None:
    """Write ``content`` (text, or a function that writes the file it is given) to
    ``path`` by renaming a finished file over it, so that runs of one suite going on in
    parallel into one directory never leave a half-written summary or curve."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    if isinstance(content, str):
        partial.write_text(content)
    else:
        content(partial)
    os.replace(partial, path)


def plot_curves(suite: Suite, out: Path, folder: Path | None = None) -> list[Path]:
    """One PNG per env in ``folder`` (default ``out/curves``): return vs frames for every
    seed, the reference and random as lines."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.ticker import EngFormatter

    from learner.league.plot import has_ratings, plot_ratings

    written = []
    folder = folder or out / "curves"
    folder.mkdir(parents=True, exist_ok=True)
    for spec in suite.envs:
        seed_dirs = sorted((out / spec.name).glob("seed*"))
        curves = [(d.name, curve(d, spec.curve_metric)) for d in seed_dirs]
        curves = [(name, pts) for name, pts in curves if pts]
        if not curves:
            continue
        fig, ax = plt.subplots(figsize=(6.4, 4.2), constrained_layout=True)
        for name, pts in curves:
            done = "" if (out / spec.name / name / RUN_FILE).exists() else " (unfinished)"
            ax.plot([p[0] for p in pts], [p[2] for p in pts], label=f"{name}{done}")
        ref = spec.reference
        if ref is not None:
            ax.axhline(ref.value, color="black", linestyle="--",
                       label=f"reference {ref.value:g} ({ref.budget})")  # fmt: skip
        heuristic = [r["heuristic"]["mean"] for r in _finished_runs(out / spec.name)
                     if "heuristic" in r]  # fmt: skip
        if heuristic:
            level = statistics.fmean(heuristic)
            ax.axhline(level, color="tab:green", linestyle="--",
                       label=f"heuristic {level:.1f} ({spec.heuristic})")  # fmt: skip
        for other, color in zip(spec.same_setting, itertools.cycle(("tab:olive", "tab:cyan"))):
            ax.axhline(other.value, color=color, linestyle="-.", linewidth=1,
                       label=f"{other.label} {other.value:g}, same setting")  # fmt: skip
        for other, color in zip(spec.others, itertools.cycle(("tab:purple", "tab:brown"))):
            ax.axhline(other.value, color=color, linestyle="-.", linewidth=1,
                       label=f"{other.label} {other.value:g} ({other.budget})")  # fmt: skip
        random_path = out / spec.name / RANDOM_FILE
        rnd = json.loads(random_path.read_text())["mean"] if random_path.exists() else None
        if spec.curve_metric != RETURN_METRIC:
            rnd = None  # a random policy's return is not on this curve's scale
            for level in spec.thresholds:
                ax.axhline(level, color="tab:red", linestyle=":", linewidth=1,
                           label=f"{level:g}")  # fmt: skip
        if rnd is not None:
            digits = 2 if abs(rnd) < SMALL_RETURNS else 1
            ax.axhline(rnd, color="gray", linestyle=":", label=f"random {rnd:.{digits}f}")
        if suite.stability:
            floor = held_floor({"random": None if rnd is None else {"mean": rnd}},
                               spec.thresholds[-1])  # fmt: skip
            ax.axhline(floor, color="tab:red", linestyle=":", label=f"floor {floor:.1f}")
        unit = "env steps" if spec.frames_per_step == 1 else (
            f"agent steps (x{spec.frames_per_step} emulator frames)"
        )  # fmt: skip
        ax.set_xlabel(f"seedrl frames = {unit}")
        ax.set_ylabel(CURVE_LABELS.get(spec.curve_metric, spec.curve_metric))
        ax.set_title(f"{spec.title} ({suite.name} suite)")
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)  # curves rise away from it
        path = folder / f"{spec.name}.png"
        write_whole(path, functools.partial(fig.savefig, dpi=100, format="png"))
        plt.close(fig)
        written.append(path)
        if spec.opponents:
            written += [
                plot_ratings(d, folder / ratings_png(spec.name, d.name))
                for d in seed_dirs
                if (d / RUN_FILE).exists() and has_ratings(d)
            ]
    return written


def ratings_png(env_name: str, run_name: str) -> str:
    """The file name of one self-play run's ratings plot."""
    return f"{env_name}-{run_name}-ratings.png"


def _finished_runs(env_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(env_dir.glob(f"seed*/{RUN_FILE}"))]


def _num(value: Any, spec: str = ".1f") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


def _frames(value: int | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1e6:.2f} M" if value >= 100_000 else f"{value / 1e3:.0f} k"


def shortfall(env: dict[str, Any]) -> str:
    """How far the mean evaluate score of the seeds falls below the reference, as a
    clause for the table (" by 512.3, 64 % of it"); empty when it meets it or is unknown."""
    ref = env.get("target", env["reference"] and env["reference"]["value"])
    got = env["eval_mean"]
    if got is None or ref is None or got >= ref:
        return ""
    share = f", {100 * got / ref:.0f} % of it" if ref > 0 and got > 0 else ""
    # Returns within a few units (MiniGrid's) are a few steps apart in the third decimal.
    gap = ".3f" if abs(ref) < SMALL_RETURNS else ".1f"
    return f" (short by {ref - got:{gap}}{share})"


def held_floor(env: dict[str, Any], solved: float) -> float:
    """The level a solved run must stay above: half way from the random policy's mean
    return to the solved level (half of it when the random return is unknown), so the
    rule reads the same for Acrobot's negative returns as for CartPole's."""
    rnd = env["random"]["mean"] if env["random"] else 0.0
    return rnd + (solved - rnd) / 2


def stability_table(summary: dict[str, Any], curves_dir: str = "") -> str:
    """A long-run suite's table: per run, what it reached and what it kept after solving."""
    lines = [
        f"Suite `{summary['suite']}` (the mean return of the last 100 training episodes; "
        f"summary written {summary['written']}). A run holds when its lowest mean-100 after "
        "first reaching the solved level stays above the floor, half way from random to "
        "solved.",
        "",
        "| env | actors | seed | frames | solved at | best | lowest after solving | final "
        "| floor | holds |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for env in summary["envs"]:
        solved = env["solved_level"]
        floor = held_floor(env, solved)
        for r in env["runs"]:
            hit = r["thresholds"].get(f"{solved:g}")
            lowest = r.get("lowest_after_solved")
            holds = "not solved" if lowest is None else ("yes" if lowest >= floor else "**no**")
            actors = "x".join(str(n) for n in r["actors"]) if r.get("actors") else "-"
            solved_at = _frames(hit["frames"]) if hit else "-"
            lines.append(
                f"| {env['env']} | {actors} | {r['seed']} | {_frames(r['frames'])} "
                f"| {solved_at} | {_num(r.get('best_return_mean100'))} "
                f"| {_num(lowest)} | {_num(r['final_return_mean100'])} | {_num(floor)} | {holds} |"
            )
    if curves_dir:
        lines.append("")
        for env in summary["envs"]:
            if env["runs"]:
                name = env.get("name") or env["env"].replace("/", "-")
                lines.append(f"![{env['env']}]({curves_dir}/{name}.png)")
    return "\n".join(lines) + "\n"


def match_table(summary: dict[str, Any], curves_dir: str = "") -> str:
    """A two-player suite's table: per run, its win rates in each seat against each
    scripted opponent, the targets and the wall time they count within."""
    lines = [
        f"Suite `{summary['suite']}` ({summary['actors']} per run; {summary['eval_mode']} "
        "play of each run's best checkpoint, the final weights' beside it; summary written "
        f"{summary['written']}).",
        "",
    ]
    for env in summary["envs"]:
        names = list(env["opponents"])
        targets = ", ".join(
            f"{100 * need:g} % against {name}" for name, need in env["opponents"].items()
        )
        budget = env["wall_budget_s"]
        within = f" within {budget / 60:g} minutes" if budget else ""
        counts = sorted({
            result_games(seat)
            for r in env["runs"] for m in r["matches"] for seat in m["seats"].values()
        })  # fmt: skip
        games = f" Games a seat: {', '.join(map(str, counts))}." if counts else ""
        lines += [
            f"{env['env']}: target at least {targets}, as first and as second player{within}."
            + games,
            "",
            "| env | actors | seed | frames | wall time | learner steps | episodes "
            "| weights played | "
            + " | ".join(f"vs {name}, first / second" for name in names)
            + " | the final weights, "
            + "; ".join(f"vs {name}" for name in names)
            + f" | yardstick {env['solved_level']:g} at | meets |",
            "|---|---|---|---|---|---|---|---|" + "---|" * len(names) + "---|---|---|",
        ]
        for r in env["runs"]:
            scores = [seat_scores(r["matches"], name, "{:.1f} %") for name in names]
            final = "as played"
            if "final_matches" in r:
                final = "; ".join(seat_scores(r["final_matches"], n, "{:.1f}") for n in names)
            weights = "final"
            if r["matches_of"] == "best":
                weights = f"best (at {_frames(r.get('best_frames'))})"
            hit = r["thresholds"].get(f"{env['solved_level']:g}")
            reached = "-"
            if hit:
                reached = f"{_frames(hit['frames'])} ({hit['wall_time_s'] / 60:.1f} min)"
            verdict = "yes" if r["meets_targets"] else "no"
            if not r["meets_targets"]:
                misses = list(r["short_of"]) + ([] if r["in_time"] else ["over the wall budget"])
                verdict += f" ({', '.join(misses)})"
            actors = "x".join(str(n) for n in r["actors"]) if r.get("actors") else "-"
            lines.append(
                f"| {env['env']} | {actors} | {r['seed']} | {_frames(r['frames'])} "
                f"| {r['wall_time_s'] / 60:.1f} min | {_num(r.get('learner_steps'), ',d')} "
                f"| {_num(r.get('episodes'), ',d')} | {weights} | "
                + " | ".join(scores)
                + f" | {final} | {reached} | {verdict} |"
            )
        lines.append("")
    if curves_dir:
        for env in summary["envs"]:
            if env["runs"]:
                lines.append(f"![{env['env']}]({curves_dir}/{env['name']}.png)")
            lines += [
                f"![Elo ratings, {env['env']} {r['run']}]"
                f"({curves_dir}/{ratings_png(env['name'], r['run'])})"
                for r in env["runs"]
            ]
    return "\n".join(lines).rstrip("\n") + "\n"


def markdown_table(summary: dict[str, Any], curves_dir: str = "") -> str:
    """The results table and the references table of one suite, in markdown (a long-run
    suite's: :func:`stability_table`; a two-player suite's: :func:`match_table`)."""
    suite = summary["suite"]
    if SUITES[suite].stability:
        return stability_table(summary, curves_dir)
    if any(spec.opponents for spec in SUITES[suite].envs):
        return match_table(summary, curves_dir)
    # A suite with scripted baselines shows them in their own column.
    heuristics = any(env.get("heuristic") for env in summary["envs"])
    lines = [
        f"Suite `{suite}` ({summary['actors']} per run, final score from `evaluate`, "
        f"{summary['eval_mode']} actions; summary written {summary['written']}).",
        "",
        "| env | seeds | frames per run | final mean-100 return (per seed) | evaluate "
        "mean ± std (per seed) | random "
        + ("| heuristic, same episodes (per seed) " if heuristics else "")
        + "| reference | evaluate meets it | frames (wall) to thresholds | frames/s |",
        "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if heuristics else ""),
    ]
    for env in summary["envs"]:
        runs = env["runs"]
        target = _target_text(env)
        if not runs:
            lines.append(
                f"| {env['env']} | 0 | no finished run here | - | - | - "
                + ("| - " if heuristics else "")
                + f"| {target} | - | - | - |"
            )
            continue
        # Returns of at most a few units (MiniGrid's, in [0, 1]) get two decimals: at one,
        # 0.96 against a reference of 0.964 would read as 1.0 and "no".
        small = env["target"] is not None and abs(env["target"]) < SMALL_RETURNS
        digits = ".2f" if small else ".1f"
        per_seed = ", ".join(_num(r["final_return_mean100"], digits) for r in runs)
        evals = "; ".join(
            f"{_num(r['eval']['mean'], digits)} ± {_num(r['eval']['std'], digits)} "
            f"(n={r['eval']['episodes']})"
            for r in runs
        )
        crossings = []
        for threshold in runs[0]["thresholds"]:
            hits = [r["thresholds"][threshold] for r in runs]
            got = [h for h in hits if h is not None]
            text = ", ".join(
                f"{_frames(h['frames'])} ({h['wall_time_s'] / 60:.1f} min)" for h in got
            )
            crossings.append(f"{threshold}: {len(got)}/{len(runs)} seeds {text}".strip())
        rnd = env["random"]["mean"] if env["random"] else None
        frames = sorted({r["frames"] for r in runs})
        budget = ", ".join(_frames(f) for f in frames)
        if env["frames_per_step"] > 1:
            emulator = ", ".join(_frames(f * env["frames_per_step"]) for f in frames)
            budget += f" steps ({emulator} emulator frames)"
        suite_budget = env.get("suite_budget_frames")
        if suite_budget and frames[0] < suite_budget:
            budget += (
                f" (**partial**: {100 * frames[0] / suite_budget:.0f} % of the suite's "
                f"{_frames(suite_budget)})"
            )
        rates = [r["frames_per_s"] for r in runs if r["frames_per_s"]]
        fps = f"{statistics.fmean(rates):,.0f}" if rates else "-"
        meets = "yes" if env["meets_reference"] else "no" + shortfall(env)
        if env["meets_reference"] is None:
            meets = "-"
        heuristic = ""
        if heuristics:
            per_seed_h = "; ".join(
                f"{_num(r['heuristic']['mean'], digits)} ± {_num(r['heuristic']['std'], digits)}"
                for r in runs
                if "heuristic" in r
            )
            heuristic = f"| {per_seed_h or '-'} "
        lines.append(
            f"| {env['env']} | {len(runs)} | {budget} "
            f"| **{_num(env['final_return_mean100'], digits)}** ({per_seed}) | {evals} "
            f"| {_num(rnd, digits)} {heuristic}"
            f"| {target} | {meets} | {'; '.join(crossings)} | {fps} |"
        )
    lines += [
        "",
        "| env | reference | source | budget (unit) | source's setting |",
        "|---|---|---|---|---|",
    ]
    for env in summary["envs"]:
        if env["reference"] is None:
            lines.append(
                f"| {env['env']} | - | none in this env's reward convention: held to the "
                f"`{env['heuristic']}` heuristic on the same episodes | - | - |"
            )
        for ref, note in (
            ([(env["reference"], "")] if env["reference"] is not None else [])
            + [(r, " (same setting as ours, for scale)") for r in env["same_setting"]]
            + [(r, " (another source, for scale)") for r in env.get("others", [])]
        ):
            source = f"[{ref['source']}]({ref['url']})" if ref["url"] else ref["source"]
            lines.append(
                f"| {env['env']}{note} | {ref['value']:g} | {source} | {ref['budget']} "
                f"| {ref['setting']} |"
            )
    if curves_dir:
        lines.append("")
        for env in summary["envs"]:
            if env["runs"]:
                name = env.get("name") or env["env"].replace("/", "-")
                lines.append(f"![{env['env']}]({curves_dir}/{name}.png)")
    return "\n".join(lines) + "\n"


def _target_text(env: dict[str, Any]) -> str:
    """The reference column: the published figure, else the heuristic the run is held to."""
    if env["reference"] is not None:
        return f"{env['reference']['value']:g}"
    level = env.get("heuristic_mean")
    return (
        f"heuristic {_num(level, '.2f')}"
        if level is not None
        else f"heuristic ({env['heuristic']})"
    )


def update_doc(doc: Path, suite: str, table: str) -> None:
    """Replace (or append) the suite's block between its markers in ``doc``."""
    start, end = f"<!-- bench-learning:{suite}:start -->", f"<!-- bench-learning:{suite}:end -->"
    block = f"{start}\n{table}{end}"
    text = doc.read_text() if doc.exists() else "# Learning benchmark\n"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = text.rstrip("\n") + f"\n\n## Suite `{suite}`\n\n{block}\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)


def suite_of(summary: dict[str, Any]) -> Suite:
    return SUITES[summary["suite"]]
