"""The learner host's processes by role: CPU over a window and memory, read from ``/proc``.

With ``--serving-processes N`` a learner is several processes: the model process (the one
the load generator started), its N frontends (named ``seedrl-fe-<i>``, as
:mod:`learner.serving.frontend` sets them) and its other children (the trainer process,
multiprocessing's resource tracker). :func:`read_tree` takes one reading of that tree;
:func:`role_cpu` turns two readings into CPU seconds per role, and :func:`role_memory`
one reading into RSS and PSS per role. The load generators and ``make bench``'s actors are
not the learner's children, so they never count here. ``proc`` is a parameter so the
tests read a tree made on disk.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.bench.procfs import PROC, child_pids, stat_cpu_seconds
from learner.serving.slots import PROCESS_NAME as FRONTEND_PROCESS_NAME


@dataclass(frozen=True)
class ProcReading:
    pid: int
    name: str
    """``comm``: a frontend's says which it is."""
    cpu_s: float
    """User + system CPU seconds since it started."""


@dataclass(frozen=True)
class TreeReading:
    """One reading of a learner's processes."""

    model: ProcReading
    model_main_thread_s: float
    """The model process's main thread (its event loop)."""
    children: tuple[ProcReading, ...]


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _reading(pid: int, proc: Path) -> ProcReading | None:
    stat = _read(proc / str(pid) / "stat")
    if stat is None:
        return None
    name = (_read(proc / str(pid) / "comm") or "").strip()
    return ProcReading(pid, name, stat_cpu_seconds(stat))


def read_tree(pid: int, proc: Path = PROC) -> TreeReading:
    """The model process and its live children now (a child gone is not read)."""
    model = _reading(pid, proc)
    if model is None:
        raise RuntimeError(f"the learner (pid {pid}) is gone")
    main = _read(proc / str(pid) / "task" / str(pid) / "stat")
    children = [r for c in child_pids(pid, proc) if (r := _reading(c, proc)) is not None]
    return TreeReading(model, stat_cpu_seconds(main) if main else 0.0, tuple(children))


def frontend_index(reading: ProcReading) -> int | None:
    """Which frontend a child is (from its name), or None for the trainer and others."""
    if not reading.name.startswith(FRONTEND_PROCESS_NAME):
        return None
    suffix = reading.name[len(FRONTEND_PROCESS_NAME) :]
    return int(suffix) if suffix.isdigit() else None


@dataclass(frozen=True)
class RoleCpu:
    """CPU seconds per role between two readings."""

    model: float
    model_main_thread: float
    frontends: list[float]
    """Per frontend, by index."""
    others: float
    """The model's other children: the trainer process, the resource tracker."""

    @property
    def host(self) -> float:
        """The whole learner: model, frontends and the rest (the generators are not in it)."""
        return self.model + sum(self.frontends) + self.others


def _since(before: dict[int, ProcReading], after: ProcReading) -> float:
    """CPU a child spent since the first reading (all of it when it started since: a
    frontend restarted in the window)."""
    first = before.get(after.pid)
    return after.cpu_s - (first.cpu_s if first is not None else 0.0)


def role_cpu(before: TreeReading, after: TreeReading) -> RoleCpu:
    """CPU seconds per role between two readings of one learner. A child that ended
    between them is missing from the second and its share of the window is not counted."""
    if before.model.pid != after.model.pid:
        raise ValueError("two readings of different learners")
    first = {c.pid: c for c in before.children}
    frontends: dict[int, float] = {}
    others = 0.0
    for child in after.children:
        index = frontend_index(child)
        if index is None:
            others += _since(first, child)
        else:
            frontends[index] = frontends.get(index, 0.0) + _since(first, child)
    count = max(frontends, default=-1) + 1
    return RoleCpu(
        model=after.model.cpu_s - before.model.cpu_s,
        model_main_thread=after.model_main_thread_s - before.model_main_thread_s,
        frontends=[frontends.get(i, 0.0) for i in range(count)],
        others=others,
    )


def memory_mb(pid: int, proc: Path = PROC) -> tuple[float | None, float | None]:
    """(RSS, PSS) of a process in MB; None where it cannot be read (PSS needs
    ``smaps_rollup``, which a kernel or a sandbox may not offer)."""
    rss = pss = None
    for line in (_read(proc / str(pid) / "status") or "").splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    for line in (_read(proc / str(pid) / "smaps_rollup") or "").splitlines():
        if line.startswith("Pss:"):
            pss = int(line.split()[1]) / 1024
    return rss, pss


def role_memory(tree: TreeReading, proc: Path = PROC) -> dict[str, Any]:
    """RSS and PSS (MB) per role: the model process, each frontend (by index), the other
    children summed, and the host's sums. RSS counts a page every process maps (the
    slot table, shared libraries) once per process; PSS splits it, so the PSS sum is
    what the learner holds."""
    model_rss, model_pss = memory_mb(tree.model.pid, proc)
    frontends: dict[int, tuple[float | None, float | None]] = {}
    other_rss: list[float | None] = []
    other_pss: list[float | None] = []
    for child in tree.children:
        index = frontend_index(child)
        if index is None:
            rss, pss = memory_mb(child.pid, proc)
            other_rss.append(rss)
            other_pss.append(pss)
        else:
            frontends[index] = memory_mb(child.pid, proc)
    ordered = [frontends[i] for i in sorted(frontends)]
    fe_rss = [m[0] for m in ordered]
    fe_pss = [m[1] for m in ordered]
    return {
        "model_rss_mb": model_rss,
        "frontend_rss_mb_each": fe_rss,
        "frontends_rss_mb": _sum(fe_rss),
        "others_rss_mb": _sum(other_rss),
        "host_rss_mb": _sum([model_rss, *fe_rss, *other_rss]),
        "model_pss_mb": model_pss,
        "frontend_pss_mb_each": fe_pss,
        "frontends_pss_mb": _sum(fe_pss),
        "others_pss_mb": _sum(other_pss),
        "host_pss_mb": _sum([model_pss, *fe_pss, *other_pss]),
    }


def _sum(values: list[float | None]) -> float | None:
    """The sum, or None when any is unknown (a partial sum would read as the whole)."""
    if any(v is None for v in values):
        return None
    return sum(v for v in values if v is not None)
