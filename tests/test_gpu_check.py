"""The GPU check's steps are bounded: a step that runs out of time ends everything it started."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from benchmarks.gpu_check import Log, run

SPAWNS_A_SLEEPER = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
    "print(child.pid, flush=True)\n"
    "print('started', file=sys.stderr, flush=True)\n"
    "time.sleep(120)\n"
)


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for its parent counts as ended)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def test_a_timed_out_step_ends_the_processes_it_started(tmp_path: Path) -> None:
    began = time.monotonic()
    code, output = run([sys.executable, "-c", SPAWNS_A_SLEEPER], 8, Log(tmp_path / "log"))
    assert time.monotonic() - began < 60, "the step outlived its timeout by its child's life"
    assert code == 124
    assert "started" in output  # stderr printed before the timeout is kept
    grandchild = int(output.split()[0])
    deadline = time.monotonic() + 10
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(grandchild), "the step's own child outlived its timeout"


def test_a_step_that_finishes_gives_its_exit_code_and_output(tmp_path: Path) -> None:
    code, output = run(
        [sys.executable, "-c", "import sys; print('out'); sys.exit(3)"], 30, Log(tmp_path / "l")
    )
    assert (code, output.strip()) == (3, "out")
