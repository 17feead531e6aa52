"""An actor process starts lean: numpy's BLAS pool is capped unless the user set it."""

from __future__ import annotations

import os
import subprocess
import sys

from actors import BLAS_THREADS_ENV

PROBE = (
    "import os\n"
    "import actors.actor\n"
    "import numpy\n"
    "threads = [l for l in open('/proc/self/status') if l.startswith('Threads:')][0]\n"
    "print(os.environ.get('OPENBLAS_NUM_THREADS'), threads.split()[1])\n"
)


def _probe(value: str | None) -> tuple[str, int]:
    env = {k: v for k, v in os.environ.items() if k != BLAS_THREADS_ENV}
    if value is not None:
        env[BLAS_THREADS_ENV] = value
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    return out[0], int(out[1])


def test_actor_imports_start_no_blas_thread_pool() -> None:
    setting, threads = _probe(None)
    assert setting == "1"
    assert threads == 1  # the main thread only: no OpenBLAS workers, no gRPC threads yet


def test_a_users_blas_setting_wins() -> None:
    setting, threads = _probe("2")
    assert setting == "2"
    assert threads == min(2, os.cpu_count() or 1)
