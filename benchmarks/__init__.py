"""Benchmark code, run from a checkout and never installed: ``make bench``, echo server.

``benchmarks.bench`` measures the system against its own limits (a one-process ideal,
an echo server, inference only, training) over sweeps of actor fleets;
``benchmarks.echo`` is the echo server. They observe the learner and the actors from
outside (``/proc``, ``metrics.jsonl``, the actors' ``--stats-dir`` records), so the
product carries no benchmark hooks.

``benchmarks.learning`` is the learning benchmark (``make bench-learning``): named suites
of envs trained through ``learner.train`` to frame budgets over several seeds, scored
with ``learner.tools.evaluate`` and set against published returns.
"""
