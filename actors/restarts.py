"""How long to wait before restarting a crashed actor (a thread or a whole process).

Shared by ``actors.process`` (per actor thread) and ``actors.launcher`` (per actor
process), so both back off the same way and neither imports the other for it.
"""

from __future__ import annotations


class CrashRestarts:
    """When to restart an actor that crashed: after 0.5 s, doubling up to 30 s.

    An actor that ran ``HEALTHY_RUN_S`` before crashing starts over at 0.5 s, so a crash a
    day does not grow the wait forever. Used per thread in ``actors.process``
    and per process in ``actors.launcher``.
    """

    HEALTHY_RUN_S = 30.0

    def __init__(self) -> None:
        self.failures = 0

    def delay(self, ran_s: float) -> float:
        """Seconds to wait before the restart of an actor that crashed after ``ran_s``."""
        if ran_s >= self.HEALTHY_RUN_S:
            self.failures = 0
        self.failures += 1
        return min(30.0, 0.5 * 2 ** (self.failures - 1))
