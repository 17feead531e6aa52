"""``python -m learner healthcheck``: ask a learner's gRPC health service whether it serves.

Exit status 0 when the service reports SERVING, 1 otherwise (not serving, unreachable,
timed out), so container healthchecks (docker compose) can call it directly. Kubernetes
uses its native gRPC probe against the same health service instead.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def check(
    address: str, service: str = "", timeout_s: float = 5.0, tls_ca: str | None = None
) -> tuple[bool, str]:
    """(serving?, human-readable status) of ``service`` at ``address``."""
    if tls_ca:
        with open(tls_ca, "rb") as f:
            channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(f.read()))
    else:
        channel = grpc.insecure_channel(address)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as exc:
            return False, f"{exc.code().name}: {exc.details()}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return reply.status == health_pb2.HealthCheckResponse.SERVING, status


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m learner healthcheck", description=__doc__)
    parser.add_argument("--address", default="127.0.0.1:8686", help="learner HOST:PORT")
    parser.add_argument("--service", default="", help="health service name ('' = the whole server)")
    parser.add_argument("--timeout-s", type=float, default=5.0, help="give up after this long")
    parser.add_argument("--tls-ca", default=None, help="PEM CA when the learner uses TLS")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    serving, status = check(args.address, args.service, args.timeout_s, args.tls_ca)
    print(f"{args.address} {args.service or '(server)'}: {status}", flush=True)
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main())
