"""The V-trace actor-critic agent (IMPALA): its off-policy targets and its loss."""
