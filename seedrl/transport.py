"""gRPC settings both ends share: addresses, channel options, credentials, auth metadata.

The learner and the actors meet only here and in the proto: how an address is dialled
or bound (TCP, unix sockets, the same-host socket the learner offers), the channel
options both sides must agree on, the token metadata, the Act method's path, and how
the ``Learner`` service is registered with ``Act`` on raw bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any, TypeVar

import grpc

from seedrl.proto import seedrl_pb2 as pb

log = logging.getLogger(__name__)

AUTH_METADATA_KEY = "authorization"
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Learner"].full_name
"""``seedrl.v1.Learner``, from the proto."""
_ACT = pb.DESCRIPTOR.services_by_name["Learner"].methods_by_name["Act"]
ACT_METHOD = f"/{SERVICE_NAME}/{_ACT.name}"
"""The Act stream's gRPC method path (``/seedrl.v1.Learner/Act``), for both ends."""

T = TypeVar("T")


def run_event_loop(main: Coroutine[Any, Any, T], use_uvloop: bool = True) -> T:
    """Run a server's coroutine to the end on a new event loop, as ``asyncio.run`` does.

    With ``use_uvloop`` the loop is uvloop's when it is installed. Per frame the serving
    loop mostly runs loop machinery: callbacks for gRPC's completions, the futures of the
    batch. uvloop does that in Cython, so each message costs the server less CPU.
    """
    with asyncio.Runner(loop_factory=_uvloop_factory() if use_uvloop else None) as runner:
        return runner.run(main)


def _uvloop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # not on Windows, or a bare install: asyncio's loop serves too
        log.info("uvloop is not installed; serving on asyncio's event loop")
        return None
    return uvloop.new_event_loop


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port the OS says is free right now (the demo and the benchmark bind it next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def listen_address(bind: str, port: int) -> str:
    """``host:port`` for gRPC, bracketing IPv6 hosts; ``unix:`` addresses pass through."""
    if bind.startswith("unix:"):
        return bind
    host = f"[{bind}]" if ":" in bind and not bind.startswith("[") else bind
    return f"{host}:{port}"


def channel_options(max_message_bytes: int) -> list[tuple[str, Any]]:
    """Message size limits and keepalive (dead or hung peers are noticed within ~15 s)."""
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 10_000),
        ("grpc.keepalive_timeout_ms", 5_000),
        # grpc core 1.85 closes the connection on an unanswered ping only after this
        # (default 1 min, and in our tests never on a server): without it a hung actor
        # host (no FIN, no RST) holds its stream and its --max-actors place forever.
        ("grpc.http2.ping_timeout_ms", 5_000),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying the shared token, or nothing when auth is off."""
    return ((AUTH_METADATA_KEY, f"Bearer {token}"),) if token else ()


def client_channel(
    target: str,
    tls_ca: str | None = None,
    tls_server_name: str | None = None,
    max_message_bytes: int = 64 * 1024 * 1024,
    tls_cert: str | None = None,
    tls_key: str | None = None,
) -> grpc.Channel:
    """A channel to the learner, TLS-verified against ``tls_ca`` when given.

    ``tls_cert``/``tls_key`` present a client certificate (mutual TLS). A blocking
    channel, not an asyncio one: actors stream on it with ``actors.stream``.
    """
    options = channel_options(max_message_bytes)
    if tls_ca is None:
        return grpc.insecure_channel(target, options=options)
    with open(tls_ca, "rb") as f:
        root = f.read()
    key = chain = None
    if tls_cert and tls_key:
        with open(tls_key, "rb") as f:
            key = f.read()
        with open(tls_cert, "rb") as f:
            chain = f.read()
    credentials = grpc.ssl_channel_credentials(
        root_certificates=root, private_key=key, certificate_chain=chain
    )
    if tls_server_name:
        options.append(("grpc.ssl_target_name_override", tls_server_name))
    return grpc.secure_channel(target, credentials, options=options)


WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})


def split_host_port(target: str) -> tuple[str, str]:
    """``host:port`` (IPv6 hosts in brackets) -> (host, port); the port may be empty."""
    if target.startswith("["):
        host, _, rest = target.partition("]")
        return host + "]", rest.removeprefix(":")
    host, sep, port = target.rpartition(":")
    return (host, port) if sep else (target, "")


def learner_targets(learner: str) -> list[str]:
    """The learner addresses in an actor's ``--learner`` (a comma-separated list is allowed)."""
    return [t.strip() for t in learner.split(",") if t.strip()]


def rank_target(rank_address: str, dialled: str) -> str:
    """A rank's address as an actor should dial it: a wildcard host becomes ``dialled``'s host.

    A learner bound to 0.0.0.0 advertises ``0.0.0.0:PORT``; the actor reached rank 0
    through some host name, and ranks started together by torchrun share that host.
    """
    if rank_address.startswith("unix:"):
        return rank_address
    host, port = split_host_port(rank_address)
    if host in WILDCARD_HOSTS:
        return f"{split_host_port(dialled)[0]}:{port}"
    return rank_address


def pick_rank(rank_addresses: Sequence[str], index: int, dialled: str) -> str:
    """The learner rank actor ``index`` should use: rank ``index mod n`` (``dialled`` if none)."""
    if len(rank_addresses) <= 1:
        return dialled
    return rank_target(rank_addresses[index % len(rank_addresses)], dialled)


LOOPBACK_HOSTS = frozenset({"localhost", "[::1]", "::1"})


def is_loopback(target: str) -> bool:
    """Whether ``host:port`` names this host through the loopback interface."""
    if target.startswith("unix:"):
        return False
    host = split_host_port(target)[0]
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def local_target(local_address: str, dialled: str) -> str | None:
    """The learner's unix socket if this actor can use it, else None.

    Only for an actor that dialled a loopback address or a unix socket (so the learner is
    on this host) and that sees the socket file (same filesystem: not across containers).
    """
    same_host = is_loopback(dialled) or dialled.startswith("unix:")
    if not local_address.startswith("unix:") or not same_host or local_address == dialled:
        return None
    return local_address if os.path.exists(local_address.removeprefix("unix:")) else None


LOCAL_SOCKET_NAME = "learner.sock"


def frontend_local_address(local_address: str, index: int) -> str:
    """Serving frontend ``index``'s own socket beside the learner's (``unix:PATH``): unix
    sockets have no ``SO_REUSEPORT`` group, so each frontend offers the actors it took
    over TCP a socket of its own in the same private directory."""
    directory = os.path.dirname(local_address.removeprefix("unix:"))
    return "unix:" + os.path.join(directory, f"frontend-{index}.sock")


UNIX_PATH_MAX = 107
"""The longest unix socket path the kernel takes (``sun_path`` less its terminating NUL)."""


def frontend_bind_address(bind: str, index: int) -> str:
    """Serving frontend ``index``'s socket on a unix ``--bind`` (``unix:PATH``): frontend 0
    holds the path itself, the others a socket beside it named from it, so two learners
    bound in one directory never share a name and each socket is as reachable as the path."""
    if index == 0:
        return bind
    root, ext = os.path.splitext(bind.removeprefix("unix:"))
    return f"unix:{root}-frontend-{index}{ext}"


class LocalSocket:
    """A unix socket path in a fresh private directory (mode 0700: this user only).

    The directory is named ``<prefix><pid>-XXXX`` so that the ones a killed learner
    left behind can be told from live ones and removed by the next learner.
    """

    def __init__(self, prefix: str = "seedrl-") -> None:
        remove_stale_local_sockets(prefix)
        self.directory = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")
        self.address = "unix:" + os.path.join(self.directory, LOCAL_SOCKET_NAME)

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def _listening(path: str) -> bool:
    """Whether something accepts connections on the unix socket at ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.5)
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


def _any_listening(directory: str) -> bool:
    """Whether the learner's socket or one of its frontends' takes connections."""
    try:
        names = [n for n in os.listdir(directory) if n.endswith(".sock")]
    except OSError:
        return False
    return any(_listening(os.path.join(directory, name)) for name in names)


def remove_stale_local_sockets(prefix: str = "seedrl-", tmp: str | None = None) -> list[str]:
    """Remove this user's socket directories whose learner died without cleaning up.

    A directory counts as stale only when its owner pid is gone and nothing listens on
    its socket: a learner in another pid namespace (a container sharing /tmp) has a pid
    that means nothing here, but its socket still answers. Returns the directories removed.
    """
    tmp = tmp or tempfile.gettempdir()
    removed: list[str] = []
    try:
        entries = list(os.scandir(tmp))
    except OSError:
        return removed
    for entry in entries:
        pid_text, sep, _ = entry.name.removeprefix(prefix).partition("-")
        if not (entry.name.startswith(prefix) and sep and pid_text.isdigit()):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        if _pid_running(int(pid_text)) or _any_listening(entry.path):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.path)
    return removed


@contextlib.contextmanager
def offered_local_socket(enabled: bool, bind: str) -> Iterator[str | None]:
    """A fresh same-host socket address (``unix:PATH``) for a server to listen on and
    offer in GetInfo, removed when the block ends; None when off or on a unix bind (whose
    actors are on this host already: the serving tier's frontends listen beside its path).
    """
    if not enabled or bind.startswith("unix:"):
        yield None
        return
    local = LocalSocket()
    try:
        yield local.address
    finally:
        local.remove()


def add_learner_service(servicer: Any, server: Any) -> None:
    """Register ``seedrl.v1.Learner`` on an aio server, with ``Act`` on raw bytes both ways.

    ``GetInfo`` is (de)serialized by protobuf as usual. ``Act`` receives and sends
    ``bytes``: its Frames are checked and split against a
    :class:`~seedrl.codec.WireTemplate` and its replies joined from one, which saves a
    parse and a message per frame; the servicer parses (and rejects) whatever does not
    match. The wire is the same protobuf either way.
    """
    handlers = {
        "Act": grpc.stream_stream_rpc_method_handler(servicer.Act),
        "GetInfo": grpc.unary_unary_rpc_method_handler(
            servicer.GetInfo,
            request_deserializer=pb.GetInfoRequest.FromString,
            response_serializer=pb.LearnerInfo.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)
