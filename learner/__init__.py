"""The seedrl learner: batched inference for every actor, and training, in one process.

Run it with ``python -m learner``, or from Python with ``learner.train(...)``
(:mod:`learner.api`). Rooms by role: ``serving`` (gRPC servicer, dynamic batcher, the hot
loop ``learner.serving.inference.InferenceEngine.process`` around the rows-in, actions-out
core ``learner.serving.rows.ServingCore.serve``), ``agents`` (what differs
between algorithms: network, action choice, loss, ``learner.agents.base.Agent``),
``training`` (one ``learner.training.trainer.Trainer`` and the hosts that run it),
``state`` (slots, checkpoints, normalisers, statistics) and ``tools`` (demo, evaluate,
plot). ``learner.run.serve`` wires them together.
"""

import seedrl  # noqa: F401  (first: sets gRPC core defaults before grpc loads)
from learner.api import TrainResult, train  # torch-free: torch loads inside train
from seedrl.config import AgentOptions, set_agent_catalog


def _agent_sections() -> dict[str, type[AgentOptions]]:
    """The registry's agents, imported (with torch) only once a config needs them."""
    from learner.agents.registry import agent_sections

    return dict(agent_sections())


set_agent_catalog(_agent_sections)

__all__ = ["TrainResult", "train"]
