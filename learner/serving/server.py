"""The learner's gRPC server: the Learner service behind its interceptors, health checking
and reflection, on TCP (optionally TLS, mutual TLS) and the same-host unix socket."""

from __future__ import annotations

import logging
import resource

import grpc
from grpc._cython import cygrpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from learner.serving.interceptors import DecodeGuardInterceptor, TokenAuthInterceptor
from learner.serving.servicer import LearnerServicer
from seedrl.config import LearnerConfig
from seedrl.transport import (
    ACT_METHOD,
    SERVICE_NAME,
    add_learner_service,
    channel_options,
    listen_address,
)

log = logging.getLogger(__name__)


def build_server(
    config: LearnerConfig,
    servicer: LearnerServicer,
    auth_token: str | None,
    local_address: str | None = None,
    reuse_port: bool = False,
    on_bind: bool = True,
) -> tuple[grpc.aio.Server, int, health.aio.HealthServicer]:
    """An aio server with the Learner service, health and reflection: (server, port, health).

    ``local_address`` (``unix:PATH``) is a second, plaintext listening address that
    GetInfo offers to actors on this host; the token check applies there too.
    ``reuse_port``: join the port's ``SO_REUSEPORT`` group (the serving tier's frontends,
    whose model process holds the port's lock); otherwise a port in use fails the bind.
    ``on_bind`` False: listen on ``local_address`` only, with the bind's TLS (a serving
    frontend other than the first on a unix ``--bind``, whose path one listener holds).
    """
    # The first interceptor sees the handler the later ones chose (also the auth denial).
    interceptors: list[grpc.aio.ServerInterceptor] = [
        DecodeGuardInterceptor(checks_itself=frozenset({ACT_METHOD}))
    ]
    if auth_token:
        interceptors.append(TokenAuthInterceptor(auth_token))
    options = [
        *channel_options(config.max_message_bytes),
        ("grpc.so_reuseport", int(reuse_port)),
        # The server-side name of the minimum interval between *received* pings: accept
        # the actors' keepalive pings (every 10 s) while a stream is idle (a slow env);
        # the default (5 min) answers the third early ping with GOAWAY too_many_pings.
        ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
        *connection_limits(config),
    ]
    _quiet_unsendable_status()
    server = grpc.aio.server(interceptors=interceptors, options=options)
    add_learner_service(servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (
            SERVICE_NAME,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ),
        server,
    )
    address = listen_address(config.bind, config.port)
    credentials = _server_credentials(config)
    if not on_bind:  # a socket beside a unix --bind: as protected as the path itself
        assert local_address is not None, "a server that listens on no address"
        _add_port(server, local_address, credentials)
        return server, 0, health_servicer
    port = _add_port(server, address, credentials)
    if port == 0 and not address.startswith("unix:"):
        raise OSError(
            f"could not bind the learner to {address} (port in use, or not this host's address?)"
        )
    if local_address is not None:
        server.add_insecure_port(local_address)
    return server, port, health_servicer


def _server_credentials(config: LearnerConfig) -> grpc.ServerCredentials | None:
    """TLS (mutual with --tls-client-ca) when the learner has a certificate, else None."""
    if not (config.tls_cert and config.tls_key):
        return None
    client_ca = _read(config.tls_client_ca) if config.tls_client_ca else None
    return grpc.ssl_server_credentials(
        [(_read(config.tls_key), _read(config.tls_cert))],
        root_certificates=client_ca,
        require_client_auth=client_ca is not None,
    )


def _add_port(
    server: grpc.aio.Server, address: str, credentials: grpc.ServerCredentials | None
) -> int:
    """Listen on ``address``; the port bound, 0 where it could not be."""
    try:
        if credentials is None:
            return int(server.add_insecure_port(address))
        return int(server.add_secure_port(address, credentials))
    except RuntimeError:  # newer grpcio raises where older ones returned port 0
        return 0


def connection_limits(config: LearnerConfig) -> list[tuple[str, int]]:
    """gRPC core's bounds on connections: how many at once, how long one may take to begin
    HTTP/2, how long one may stay open with no call.

    A connection that sends nothing is otherwise kept two minutes, and past the open-file
    limit the server can accept nothing (health probes included) and the learner can open
    no file (checkpoints, TensorBoard): so the number served stays under half that limit.
    """
    limits = [
        ("grpc.max_allowed_incoming_connections", connection_cap(config.max_connections)),
        ("grpc.server_handshake_timeout_ms", round(config.handshake_timeout_s * 1000)),
    ]
    if config.connection_idle_timeout_s:
        limits.append(
            ("grpc.max_connection_idle_ms", round(config.connection_idle_timeout_s * 1000))
        )
    return limits


def connection_cap(max_connections: int) -> int:
    """``max_connections``, held under half the soft open-file limit (at least one)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_connections
    cap = max(1, soft // 2)
    if cap < max_connections:
        log.warning(
            "serving at most %d connections (half the open-file limit %d), not "
            "--max-connections %d", cap, soft, max_connections,
        )  # fmt: skip
    return min(cap, max_connections)


def raise_open_file_limit() -> int:
    """Raise the soft open-file limit to the hard one (a process may, unprivileged): each
    connection holds a descriptor, and a default soft limit of 1024 is soon reached. Returns
    the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:  # a hard limit above what the kernel allows a process
        log.debug("open-file limit stays %d (raising it to %d: %s)", soft, hard, exc)
        return soft
    return hard


async def set_serving(health_servicer: health.aio.HealthServicer, serving: bool) -> None:
    status = (
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, status)


class _UnsendableStatusFilter(logging.Filter):
    """Drops grpc's traceback for a final status that could not be sent.

    A handler that returns after its actor has left (an actor that exits on its
    Shutdown, one killed mid-stream) has its status batch fail on the closed transport;
    grpc's aio server logs that as an unexpected servicer error when the close reached
    it before its own client-closed flag did. Nothing is lost (the actor is gone, its
    slots are freed by the handler's ``finally``), so it is one debug line, not a
    traceback in the learner's output.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, cygrpc.ExecuteBatchError) and "SendStatusFromServer" in str(exc):
            logging.getLogger(__name__).debug("a stream's final status found its actor gone")
            return False
        return True


_UNSENDABLE_STATUS = _UnsendableStatusFilter()


def _quiet_unsendable_status() -> None:
    logger = logging.getLogger(cygrpc.__name__)
    if _UNSENDABLE_STATUS not in logger.filters:
        logger.addFilter(_UNSENDABLE_STATUS)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()
