"""seedrl actors: processes that only step environments and stream frames to the learner.

Nothing here imports torch (a test checks it): an actor is numpy, gymnasium and grpcio.
``python -m actors`` launches N actor processes (``actors.launcher``); each runs the
loop in ``actors.actor``.
"""

import seedrl  # noqa: F401  (first: sets gRPC core defaults before grpc loads)
