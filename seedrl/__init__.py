"""seedrl: SEED-RL-style distributed reinforcement learning.

The learner (``python -m learner``) runs batched policy inference and V-trace training
behind one streaming gRPC endpoint; actors (``python -m actors``) only step gymnasium
environments. This package holds what both sides share, so it imports neither
``learner`` nor ``actors`` (the Python API is ``learner.train``). It must never import
torch at module level: actors import it and stay torch-free.
"""

from seedrl.grpc_defaults import apply_grpc_core_defaults

apply_grpc_core_defaults()  # before anything imports grpc (see seedrl.grpc_defaults)

__version__ = "0.1.0"

PROTOCOL_VERSION = 1
"""Wire protocol version carried in every Hello; bumped on incompatible changes."""

__all__ = ["PROTOCOL_VERSION", "__version__"]
