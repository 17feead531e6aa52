"""gRPC core settings that must be in place before ``import grpc`` reads them.

gRPC core reads ``GRPC_EXPERIMENTS`` once, when ``grpc`` is first imported, so this module
imports nothing of gRPC and ``seedrl/__init__.py`` applies it: ``actors`` and ``learner``
import ``seedrl`` before anything else. A value the user already exported wins.
"""

from __future__ import annotations

import os

GRPC_EXPERIMENTS_ENV = "GRPC_EXPERIMENTS"

DEFAULT_GRPC_EXPERIMENTS = "-event_engine_client,-event_engine_listener"
"""Channels and served connections do their socket I/O on the thread that polls for
completions (gRPC core's posix iomgr) instead of handing it to EventEngine workers.

With grpcio's EventEngine, every read and write of an actor's stream passes through
worker threads before the caller sees it: more context switches per round trip and
more CPU per message, which is most of an actor's cost with one env per
message (docs/performance.md).
"""


def apply_grpc_core_defaults() -> None:
    """Set seedrl's ``GRPC_EXPERIMENTS`` unless the environment already has one."""
    os.environ.setdefault(GRPC_EXPERIMENTS_ENV, DEFAULT_GRPC_EXPERIMENTS)
