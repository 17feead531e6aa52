"""The serving tier's groundwork: what the model process pays per frame when frontends
meet it in a shared-memory slot table, and what ``SO_REUSEPORT`` gives several gRPC
servers on one port. ``python -m benchmarks.serving_tier``; the design is
docs/serving-tier.md."""
