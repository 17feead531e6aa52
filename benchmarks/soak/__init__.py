"""An endurance run with faults (``make soak``, ``python -m benchmarks.soak``).

A learner, a standby place beside it and local actors (some in a network namespace
behind a link the soak can cut) train CartPole on a run directory on a small tmpfs,
while faults come on a schedule: an actor SIGKILL (its launcher restarts it), a network
partition, a learner SIGKILL and ``--resume``, the same with its checkpoint.pt
corrupted (it must come back from a history checkpoint), a trainer crash, a full disk
under a checkpoint write and a fail-over to a standby learner. Per fault it measures the time
to recover and the frames lost against the fault's bound; over the run, the RSS of
learner and actors after warm-up, streams held by nobody, checkpoints and the return.
``report`` judges, plots and renders ``docs/reliability.md``'s soak block.
"""
