"""Flags a policy that collapsed, in the metrics and on the progress line, and logs it once.

Three signs, checked on each metrics record:

- entropy low: the batch entropy of a discrete policy fell below ENTROPY_FLOOR of its
  maximum (the log of the number of actions): the policy acts (nearly) deterministically,
  so on-policy training can no longer find out that another action is better.
- return drop: the mean return of the last 100 episodes lost more than RETURN_DROP of
  what the run had gained, from its first full window to its best one (for a return of
  0 to 500, below 250 after 500; the rule reads the same for Acrobot's negative returns).
  A gain within NOISE_ERRORS standard errors of the window's mean is no gain: a run still
  at its floor (Pong's -21) drifts by a tenth, and its best window is just the luckiest.
- premature determinism: the entropy fell below PREMATURE_ENTROPY of its maximum while the
  run's best window is no more than PREMATURE_GAIN standard deviations of the episodes'
  returns above its first: the policy stopped exploring while a typical episode still looks
  like one from the start. The bar is the returns' own spread, not an upper level (the
  watch does not know the env's) nor the standard error (a gain of many errors can still be
  a small step: a mean of 1.9 where a random policy scores 0.2 and a right one 10). A first
  window whose entropy was already below PREMATURE_START of the maximum is no start (the
  policy learned within its first episodes, as masked MiniGrid runs do): not watched then.

In self-play the return is the learning policy's score against a pool that grows stronger
as it does, so a falling return is what progress looks like there: only the entropy is
watched (``watch_return=False``); the win rates and ratings say how play goes.

Each sign is logged when it appears and not again until it has cleared with margin
(entropy back above REARM_ENTROPY of its maximum, the return back above REARM_RETURN of
the gain; the entropy back above REARM_PREMATURE_ENTROPY or the gain above
REARM_PREMATURE_GAIN spreads), so a policy that hovers at a threshold does not flood the
log; the metrics carry the flags (0 or 1) on every record.
"""

from __future__ import annotations

import logging
import math
from typing import Any

log = logging.getLogger(__name__)

ENTROPY_FLOOR = 0.01
"""Share of the maximum entropy below which a policy counts as collapsed."""
REARM_ENTROPY = 0.02
RETURN_DROP = 0.5
"""Share of the run's gain (first full window to best) whose loss counts as a collapse."""
REARM_RETURN = 0.75
NOISE_ERRORS = 4.0
"""Standard errors of the mean return a gain must exceed before its loss is watched."""

PREMATURE_ENTROPY = 0.25
"""Share of the maximum entropy below which a policy that has gained little is flagged."""
REARM_PREMATURE_ENTROPY = 0.35
PREMATURE_GAIN = 1.0
"""Standard deviations of the episodes' returns the best window must gain over the first."""
REARM_PREMATURE_GAIN = 1.5
PREMATURE_START = 0.5
"""Share of the maximum entropy the first full window must have had to count as a start."""

ENTROPY_FLAG = "collapse_entropy_low"
RETURN_FLAG = "collapse_return_drop"
PREMATURE_FLAG = "collapse_premature_determinism"


class CollapseWatch:
    """The collapse flags of a run, given its policy's maximum entropy (None for a
    continuous policy, whose entropy has no maximum: only the return drop is watched) and
    whether its return means anything on its own (not in self-play: then only the entropy
    floor is watched)."""

    def __init__(self, max_entropy: float | None, watch_return: bool = True) -> None:
        self.max_entropy = max_entropy
        self.watch_return = watch_return
        self.entropy_low = False
        self.return_dropped = False
        self.premature = False
        self.start_fraction: float | None = None
        """The entropy's share of its maximum at the first full window (after a resume: at
        the first record that has one), what PREMATURE_START is checked against."""

    def check(
        self,
        record: dict[str, Any],
        return_first: float | None,
        return_best: float | None,
        return_error: float = 0.0,
        return_spread: float | None = None,
    ) -> list[str]:
        """Add the flags (and ``entropy_fraction``) to ``record``; return a message for
        each sign that has just appeared. ``return_error``: the standard error of the
        mean return now; ``return_spread``: the standard deviation of the episodes' returns
        in the window (None until it is full: premature determinism is not watched)."""
        messages = []
        entropy = record.get("entropy")
        fraction = None
        if self.max_entropy and entropy is not None and math.isfinite(entropy):
            fraction = entropy / self.max_entropy
            record["entropy_fraction"] = fraction
            if not self.entropy_low and fraction < ENTROPY_FLOOR:
                self.entropy_low = True
                messages.append(
                    f"policy collapse? entropy {entropy:.3g} is {fraction:.2%} of its maximum "
                    f"{self.max_entropy:.3g} (flagged below {ENTROPY_FLOOR:.0%}) at frame "
                    f"{record['frames']:,}"
                )
            elif self.entropy_low and fraction > REARM_ENTROPY:
                self.entropy_low = False
        mean = record.get("episode_return_mean") if self.watch_return else None
        first, best = return_first, return_best
        gain = best - first if first is not None and best is not None else 0.0
        if mean is not None and best is not None and gain > NOISE_ERRORS * return_error:
            if not self.return_dropped and mean < best - RETURN_DROP * gain:
                self.return_dropped = True
                messages.append(
                    f"policy collapse? mean return {mean:.1f} lost more than half of the "
                    f"run's gain ({first:.1f} at first, best {best:.1f}) at "
                    f"frame {record['frames']:,}"
                )
            elif self.return_dropped and mean > best - (1 - REARM_RETURN) * gain:
                self.return_dropped = False
        if self.watch_return and fraction is not None and first is not None and best is not None:
            if self.start_fraction is None:
                self.start_fraction = fraction
            if return_spread is not None and self.start_fraction >= PREMATURE_START:
                low = fraction < PREMATURE_ENTROPY and gain <= PREMATURE_GAIN * return_spread
                if not self.premature and low:
                    self.premature = True
                    messages.append(
                        f"premature determinism? entropy {entropy:.3g} is {fraction:.1%} of "
                        f"its maximum {self.max_entropy:.3g} (flagged below "
                        f"{PREMATURE_ENTROPY:.0%}) while the best mean return {best:.3g} is "
                        f"within {PREMATURE_GAIN:g} spread ({return_spread:.3g}) of the first "
                        f"window's {first:.3g}, at frame {record['frames']:,}"
                    )
                elif self.premature and (
                    fraction > REARM_PREMATURE_ENTROPY
                    or gain > REARM_PREMATURE_GAIN * return_spread
                ):
                    self.premature = False
        record[ENTROPY_FLAG] = int(self.entropy_low)
        record[RETURN_FLAG] = int(self.return_dropped)
        record[PREMATURE_FLAG] = int(self.premature)
        for message in messages:
            log.warning("%s", message)
        return messages
