"""learner.training.allocator: freed blocks of training size are reused without page faults."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from learner.training import allocator

REUSE_PROBE = """
import resource
import numpy as np
from learner.training.allocator import keep_freed_memory

assert keep_freed_memory()
for _ in range(3):  # the heap grows once to hold the blocks
    blocks = [np.ones(2**18, np.float32) for _ in range(8)]  # 8 x 1 MiB
    del blocks
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    blocks = [np.ones(2**18, np.float32) for _ in range(8)]
    del blocks
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_freed_megabyte_blocks_are_reused_without_page_faults():
    """50 rounds of 8 fresh 1 MiB arrays would fault ~100k pages if each came from mmap."""
    out = subprocess.run(
        [sys.executable, "-c", REUSE_PROBE], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) < 500


def test_other_c_libraries_are_left_alone(monkeypatch):
    monkeypatch.setattr(platform, "libc_ver", lambda: ("", ""))
    assert allocator.keep_freed_memory() is False
