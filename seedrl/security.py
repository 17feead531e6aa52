"""What protects a learner on a network: the shared token and the bind check."""

from __future__ import annotations

import ipaddress
import os

from seedrl.config import AUTH_TOKEN_ENV, LearnerConfig


def resolve_auth_token(token: str | None) -> str | None:
    """The explicit token, else $SEEDRL_AUTH_TOKEN, else None (auth off)."""
    if token:
        return token
    return os.environ.get(AUTH_TOKEN_ENV) or None


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
        f"set --auth-token or ${AUTH_TOKEN_ENV} (actors need the same), or --tls-client-ca "
        "with --tls-cert/--tls-key, or pass --insecure on a network you trust"
    )
