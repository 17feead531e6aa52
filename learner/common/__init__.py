"""What every room of the learner may use: small shared types and values, with no part of
the learner under them (schedules, the spaces no model fits, what a best checkpoint is
measured by)."""
