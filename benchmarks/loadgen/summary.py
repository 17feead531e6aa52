"""The load generator's statistics: medians per mode over repeats, costs beyond echo, targets.

Everything here reads only result rows, so an old result file summarizes with today's code.
"""

from __future__ import annotations

import statistics
from typing import Any

from seedrl.envs import family_of

SCHEMA = "seedrl-loadgen/1"
MEDIAN_KEYS = (
    "learner_cpu_us_per_frame", "learner_loop_thread_us_per_frame",
    "learner_other_threads_us_per_frame", "trainer_cpu_us_per_frame",
    "generator_cpu_us_per_frame", "fps_answered", "fps_taken", "trained_fps", "rtt_p50_ms",
    "rtt_p99_ms", "learner_cpu_cores", "inference_batch_mean", "learner_steps_per_s",
    "trainer_wait_share", "learner_rss_mb", "host_cpu_us_per_frame", "host_cpu_cores",
    "frontend_cpu_us_per_frame", "fps_per_frontend_core", "model_rss_mb", "frontends_rss_mb",
    "others_rss_mb", "host_rss_mb", "model_pss_mb", "frontends_pss_mb", "others_pss_mb",
    "host_pss_mb",
)  # fmt: skip
EACH_KEYS = ("frontend_cpu_us_per_frame_each", "frontend_rss_mb_each", "frontend_pss_mb_each")
"""Per-frontend lists: their medians are taken frontend by frontend."""
SERVING_BEYOND_ECHO_TARGET_US = 5.0
"""The learner process's CPU per frame beyond the echo server's at 64 x 1 CartPole."""
ATARI_NON_MODEL_TARGET_US = 15.0
"""The learner process's CPU per Atari single frame (K = 1) beyond its forward pass."""
TIER_MODEL_TARGET_US = 5.0
"""With the serving tier: the model process's CPU per frame at 64 x 1 CartPole, its
forward pass included."""


def base_mode(mode: str) -> tuple[str, int]:
    """``system@2`` -> (``system``, 2); ``system`` -> (``system``, 0)."""
    name, _, tier = mode.partition("@")
    return name, int(tier) if tier.isdigit() else 0


def _each_median(rows: list[dict[str, Any]], key: str) -> list[float | None] | None:
    lists = [r[key] for r in rows if r.get(key)]
    if not lists:
        return None
    width = max(len(values) for values in lists)
    return [_median([v[i] for v in lists if i < len(v) and v[i] is not None]) for i in range(width)]


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _ok(rows: list[dict[str, Any]], mode: str) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("mode") == mode and not r.get("error")]


def summarize(rows: list[dict[str, Any]], env: str, envs_per_stream: int) -> dict[str, Any]:
    """``summary`` (medians per mode), ``beyond_echo_us_per_frame``,
    ``non_model_us_per_frame`` (beyond the forward pass),
    ``non_model_beyond_echo_us_per_frame`` (beyond the forward pass and the echo server's
    cost) and ``targets``."""
    summary: dict[str, dict[str, Any]] = {}
    for mode in sorted({r["mode"] for r in rows}):
        ok = _ok(rows, mode)
        if not ok:
            continue
        medians: dict[str, Any] = {"runs": len(ok)}
        for key in MEDIAN_KEYS:
            medians[key] = _median([r[key] for r in ok if r.get(key) is not None])
        for key in EACH_KEYS:
            medians[key] = _each_median(ok, key)
        medians["learner_cpu_us_per_frame_runs"] = [r["learner_cpu_us_per_frame"] for r in ok]
        phase_rows = [r["phases_us_per_frame"] for r in ok if r.get("phases_us_per_frame")]
        if phase_rows:
            medians["phases_us_per_frame"] = {
                p: statistics.median(row[p] for row in phase_rows) for p in phase_rows[0]
            }
        summary[mode] = medians

    def less(mode: str, other: float | None) -> float | None:
        """The mode's learner CPU per frame minus ``other`` (None when either is missing)."""
        cost = summary.get(mode, {}).get("learner_cpu_us_per_frame")
        return None if cost is None or other is None else cost - other

    echo = summary.get("echo", {}).get("learner_cpu_us_per_frame")
    forward = summary.get("phases", {}).get("phases_us_per_frame", {}).get("forward")
    beyond = {mode: less(mode, echo) for mode in ("inference", "system")}
    non_model = {mode: less(mode, forward) for mode in ("inference", "system")}
    # What is left beyond the transport too: the learner's own work other than its model.
    own_non_model = {
        mode: None if value is None or echo is None else value - echo
        for mode, value in non_model.items()
    }
    targets = []
    if env == "CartPole-v1" and envs_per_stream == 1:
        targets.append(
            _target(
                "serving_beyond_echo_us_per_frame",
                "learner process CPU per frame beyond the echo server's, training on (µs)",
                beyond["system"], SERVING_BEYOND_ECHO_TARGET_US,
            )
        )  # fmt: skip
    if family_of(env).name == "atari" and envs_per_stream == 1:
        targets.append(
            _target(
                "atari_non_model_us_per_frame",
                "learner process CPU per single Atari frame beyond its forward pass, "
                "training on (µs)",
                non_model["system"], ATARI_NON_MODEL_TARGET_US,
            )
        )  # fmt: skip
    for mode in sorted(summary):
        name, tier = base_mode(mode)
        if name != "system" or not tier or envs_per_stream != 1:
            continue
        model = summary[mode]["learner_cpu_us_per_frame"]
        if env == "CartPole-v1":
            targets.append(
                _target(
                    f"tier_model_us_per_frame@{tier}",
                    f"model process CPU per frame with {tier} frontend(s), forward pass "
                    "included, training on (µs)",
                    model, TIER_MODEL_TARGET_US,
                )
            )  # fmt: skip
        if family_of(env).name == "atari":
            # Beyond the forward pass as the same process timed it in the same run
            # (phases@N); else the system row less the one-process phases row's forward.
            timed = summary.get(f"phases@{tier}", {})
            own_forward = timed.get("phases_us_per_frame", {}).get("forward")
            if own_forward is not None:
                value, source = timed["learner_cpu_us_per_frame"] - own_forward, f"phases@{tier}"
            else:
                value = None if model is None or forward is None else model - forward
                source = f"{mode} less the phases row's forward pass"
            targets.append(
                _target(
                    f"tier_atari_non_model_us_per_frame@{tier}",
                    f"model process CPU per single Atari frame beyond its forward pass with "
                    f"{tier} frontend(s), training on ({source}; µs)",
                    value, ATARI_NON_MODEL_TARGET_US,
                )
            )  # fmt: skip
    return {
        "summary": summary,
        "beyond_echo_us_per_frame": beyond,
        "non_model_us_per_frame": non_model,
        "non_model_beyond_echo_us_per_frame": own_non_model,
        "targets": targets,
    }


def _target(name: str, description: str, value: float | None, limit: float) -> dict[str, Any]:
    return {
        "name": name,
        "description": description,
        "value": value,
        "target": limit,
        "comparison": "<=",
        "pass": None if value is None else value <= limit,
    }
