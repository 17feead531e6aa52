"""seedrl actors: processes that only step environments and stream frames to the learner.

Nothing here imports torch (a test checks it): an actor is numpy, gymnasium and grpcio.
``python -m actors`` launches N actor processes (``actors.launcher``); each
(``actors.process``, or ``python -m actors actor``) runs its actors' step loop
(``actors.actor``) on a thread each.
"""

import os

BLAS_THREADS_ENV = "OPENBLAS_NUM_THREADS"

# Actors do no linear algebra, yet numpy's OpenBLAS starts a pool of (cores - 1) idle
# threads on import, thousands on a big host running one actor per core. One is
# enough; a value the user exported wins. Must precede the first numpy import.
os.environ.setdefault(BLAS_THREADS_ENV, "1")

import seedrl  # noqa: E402, F401  (sets gRPC core defaults before grpc loads)
