"""What a best checkpoint is measured by: named by the checkpoint that keeps it, scored
by the run (the return) or by the league (the yardstick games)."""

from __future__ import annotations

YARDSTICK_GAMES = 100
"""The learner's latest games against each fixed opponent that
:meth:`learner.league.league.League.yardstick` scores."""

BY_RETURN = "mean-100 return"
BY_YARDSTICK = f"lowest score against a fixed opponent over its last {YARDSTICK_GAMES} games"
"""Self-play with fixed opponents (``League.yardstick``): there the return is against a
pool that strengthens with the learner, so a higher one need not be a better player."""
