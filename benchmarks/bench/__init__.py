"""``make bench``: the system measured against its own limits (``python -m benchmarks.bench``).

Split by job: ``plan`` (sweep points, modes, targets), ``fleet`` (the actor fleet and
process control), ``procfs`` (CPU and memory from ``/proc``), ``measure`` (one mode at
one point), ``report`` (medians, ratios, the table) and ``__main__`` (the CLI).
"""
