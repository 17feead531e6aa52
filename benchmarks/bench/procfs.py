"""What the benchmark reads from ``/proc``: CPU seconds, child processes, USS/PSS.

The benchmark observes the learner and the actors from outside, so neither carries
measuring code: a process's CPU time and memory come from the kernel's accounting.
"""

from __future__ import annotations

import os
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")


def stat_cpu_seconds(stat: str) -> float:
    """User + system CPU seconds from the text of a ``/proc/<pid>/stat`` (or a task's):
    the fields after the parenthesised name, which may itself hold spaces and ``)``."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return stat_cpu_seconds(f.read())
    except OSError:
        return 0.0


def task_cpu_seconds(pid: int, tid: int) -> float:
    """User + system CPU seconds of one thread of a live process (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            return stat_cpu_seconds(f.read())
    except OSError:
        return 0.0


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of a live process and its live children (the learner's trainer process)."""
    return sum(split_cpu_seconds(pid))


def split_cpu_seconds(pid: int) -> tuple[float, float]:
    """(the process's own, its live children's) CPU seconds: for the learner, serving and
    training (the trainer process is its child)."""
    return cpu_seconds(pid), sum(cpu_seconds(child) for child in child_pids(pid))


def child_pids(pid: int, proc: Path = PROC) -> list[int]:
    """A live process's children, its threads' in thread order (``proc``: where ``/proc``
    is, so tests can read a tree made on disk)."""
    try:
        tasks = sorted(os.listdir(proc / str(pid) / "task"), key=int)
    except OSError:
        return []
    children: list[int] = []
    for task in tasks:
        try:
            children.extend(
                int(c) for c in (proc / str(pid) / "task" / task / "children").read_text().split()
            )
        except OSError:
            continue
    return children


def shared_aware_mb(pid: int) -> tuple[float, float] | None:
    """(USS, PSS) in MB: the memory only this process holds, and its proportional share.

    RSS counts every shared-library page a process maps in full, and how many the kernel
    maps depends on the page cache; USS leaves shared pages out, PSS divides each page by
    the processes mapping it, so N actors on one host cost the sum of their PSS.
    """
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return None
    kb = sum(int(fields[k].split()[0]) for k in ("Private_Clean", "Private_Dirty") if k in fields)
    pss_kb = int(fields["Pss"].split()[0]) if "Pss" in fields else kb
    return kb / 1024, pss_kb / 1024
