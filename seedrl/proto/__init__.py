"""Generated protobuf and gRPC code for ``protos/seedrl/proto/seedrl.proto``.

Committed so neither side needs grpcio-tools at run time; never edited by hand:
``make proto`` regenerates it from the ``.proto`` file.
"""
