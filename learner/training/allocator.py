"""glibc malloc settings for the learner's processes: freed memory stays for reuse.

Why: a training step allocates and frees a few dozen blocks of a megabyte or less
(activations, gradients, unroll copies), and so does inference at large K. glibc serves
a block above its mmap threshold with a fresh mapping and hands the top of its heap back
to the kernel past its trim threshold; both thresholds move at run time, and some
processes settled where every step faulted its pages back in and ran markedly slower.
With fixed thresholds every process is the fast one.
"""

from __future__ import annotations

import ctypes
import logging
import platform

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""``mallopt`` parameter numbers from glibc's ``malloc.h``."""

MMAP_THRESHOLD_BYTES = 32 * 2**20
"""Blocks below this come from the heap (glibc's largest allowed value on 64-bit)."""
TRIM_THRESHOLD_BYTES = 128 * 2**20
"""Free memory at the heap's top that stays mapped rather than going back to the kernel."""


def keep_freed_memory() -> bool:
    """Fix glibc's mmap and trim thresholds for this process; False where that is not glibc.

    Costs at most :data:`TRIM_THRESHOLD_BYTES` of freed memory kept mapped, which the
    next step reuses.
    """
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    ok = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1 and ok
    if not ok:
        log.debug("glibc refused the malloc thresholds; keeping its defaults")
    return ok
