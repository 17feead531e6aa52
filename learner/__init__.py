"""The seedrl learner: gRPC server, dynamic batcher, trajectory builder, V-trace trainer.

Run it with ``python -m learner``, or from Python with ``learner.train(...)``
(:mod:`learner.api`). The hot loop (batch -> forward -> reply) is
``learner.serving.inference.InferenceEngine.process``; the training loop is
``learner.training.trainer.Trainer.run``.
"""

import seedrl  # noqa: F401  (first: sets gRPC core defaults before grpc loads)
from learner.api import TrainResult, train  # torch-free: torch loads inside train

__all__ = ["TrainResult", "train"]
