"""Serving actors: the gRPC servicer, the dynamic batcher and the batched inference hot loop."""
