"""What protects a learner on a network: the shared token and the bind check."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

from seedrl.config import AUTH_TOKEN_ENV, ActorConfig, LearnerConfig


def resolve_auth_token(token: str | None, token_file: str | None = None) -> str | None:
    """The explicit token, else the one in ``token_file``, else $SEEDRL_AUTH_TOKEN, else
    None (auth off). A file that cannot be read or holds no token is a ValueError naming
    the flag and the file, never the token."""
    if token:
        return token
    if token_file:
        try:
            text = Path(token_file).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or type(exc).__name__
            raise ValueError(f"--auth-token-file {token_file}: cannot read it ({reason})") from None
        if not text.strip():
            raise ValueError(f"--auth-token-file {token_file}: the file is empty")
        return text.strip()
    return os.environ.get(AUTH_TOKEN_ENV) or None


def config_auth_token(config: LearnerConfig | ActorConfig) -> str | None:
    """The token a learner or actor config names (:func:`resolve_auth_token`)."""
    return resolve_auth_token(config.auth_token, config.auth_token_file)


def check_ca_file(flag: str, path: str) -> None:
    """ValueError naming ``flag`` unless ``path`` holds a PEM certificate: gRPC takes empty
    root certificates as "trust the system's public CAs", which an unreadable or empty
    file must never turn into."""
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{flag} {path}: cannot read it ({exc.strerror})") from None
    if b"-----BEGIN CERTIFICATE-----" not in text:
        raise ValueError(f"{flag} {path}: no PEM certificate in it")


class UnprotectedBindError(ValueError):
    """A learner would listen beyond this host with nothing to tell actors from strangers."""


def is_loopback_bind(bind: str) -> bool:
    """Whether ``--bind`` is reachable from this host only (loopback or a unix socket).

    A host name other than localhost counts as reachable from outside: what it resolves
    to can change, so only literal loopback addresses are trusted.
    """
    if bind.startswith("unix:"):
        return True
    host = bind.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind_protected(config: LearnerConfig, token: str | None) -> None:
    """Refuse to serve the network unprotected, like Redis' protected mode.

    Raises UnprotectedBindError (one line saying how to fix it) when ``--bind`` is not
    loopback and there is neither a token nor TLS client certificates, unless --insecure.
    """
    mutual_tls = config.tls_cert is not None and config.tls_client_ca is not None
    if config.insecure or token or mutual_tls or is_loopback_bind(config.bind):
        return
    raise UnprotectedBindError(
        f"--bind {config.bind} would let anyone who reaches the port join unauthenticated: "
        f"set --auth-token-file, ${AUTH_TOKEN_ENV} or --auth-token (actors need the same), "
        "or --tls-client-ca with --tls-cert/--tls-key, or pass --insecure on a network you trust"
    )


def check_metrics_bind_protected(config: LearnerConfig) -> None:
    """Refuse to serve /metrics beyond this host unless asked to in so many words.

    The Prometheus endpoint has no authentication of its own (a token and TLS guard the
    gRPC port only), so a non-loopback --metrics-bind needs --metrics-insecure; a unix
    socket is no address for it. Raises UnprotectedBindError (one line).
    """
    if not config.metrics_port:
        return
    if config.metrics_bind.startswith("unix:"):
        raise UnprotectedBindError(
            f"--metrics-bind {config.metrics_bind}: /metrics is served over TCP, give an address"
        )
    if config.metrics_insecure or is_loopback_bind(config.metrics_bind):
        return
    raise UnprotectedBindError(
        f"--metrics-bind {config.metrics_bind} would serve /metrics, which has no "
        "authentication, to anyone who reaches the port: keep it on 127.0.0.1 (scrape "
        "through a sidecar or tunnel), or pass --metrics-insecure on a network you trust"
    )
