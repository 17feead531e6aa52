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

With grpcio's EventEngine, every read and write of an actor's stream passed through
worker threads before the asyncio loop saw it: one actor round trip cost 9.5 context
switches and ~310 µs of CPU; without it, 5 switches and ~260 µs (one CartPole actor
against the echo server, 2026-11-24). Bench A/B, 2 rounds of 64x1 and 256x1: 256 x K=1
system 1,767 / 1,585 frames/s with grpcio's defaults, 2,033 / 1,924 with the client off,
2,041 / 2,091 with client and listener off (machine CPU per frame 1,095-1,174 -> ~900 µs).
"""


def apply_grpc_core_defaults() -> None:
    """Set seedrl's ``GRPC_EXPERIMENTS`` unless the environment already has one."""
    os.environ.setdefault(GRPC_EXPERIMENTS_ENV, DEFAULT_GRPC_EXPERIMENTS)
