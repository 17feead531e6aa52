"""The conformance suites' settings: one frozen dataclass per side, one flag per field."""

from __future__ import annotations

import dataclasses
from typing import Any

from seedrl.config import require_range


@dataclasses.dataclass(frozen=True)
class ActorSuiteConfig:
    """A scripted learner tests an actor command: ``python -m seedrl.conformance actor
    [flags] -- CMD ...``, where CMD's ``{learner}`` becomes the scripted learner's
    address (and ``{num_envs}``, ``{max_backoff_s}``, ``{token}`` the values below)."""

    env: str = "CartPole-v1"
    """The env the scripted learner offers (gymnasium id or ``module:callable``); it must
    be installed where the suite runs, which reads its spaces."""
    env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments of the env, as a JSON object."""
    num_envs: int = 3
    """K, put in place of ``{num_envs}`` in the command; 2 or more shows whether each env
    gets its own action."""
    max_backoff_s: float = 0.5
    """The actor's reconnect backoff cap, put in place of ``{max_backoff_s}``: the backoff
    cases hold the actor to it."""
    auth: bool = True
    """Require a token: a fresh random one, given to the actor as $SEEDRL_AUTH_TOKEN and in
    place of ``{token}``."""
    only: str = ""
    """Comma-separated case ids to run (default: all); only the sessions they need run."""
    session_timeout_s: float = 90.0
    """The longest one run of the actor command may take; then it is stopped and what it had
    not shown fails."""
    report_json: str = ""
    """Also write the report as JSON to this file."""
    parallel: bool = True
    """Run the sessions at the same time, each against its own scripted learner on its own
    port (off: one after the other, for an actor that cannot run twice on one host)."""
    seed: int = 0
    """Seed of the actions the scripted learner sends."""
    verbose: bool = False
    """Echo the actor's output as it runs."""

    def __post_init__(self) -> None:
        require_range(self, ("num_envs",), low=1, high=4096)
        require_range(self, ("max_backoff_s", "session_timeout_s"), low=0, low_open=True)


@dataclasses.dataclass(frozen=True)
class LearnerSuiteConfig:
    """A scripted actor tests a learner: ``python -m seedrl.conformance learner HOST:PORT
    [flags]``. It opens its own streams beside any real actors and never trains badly:
    its frames are valid observations of the learner's env, or refused."""

    auth_token: str | None = None
    """The learner's token (default: $SEEDRL_AUTH_TOKEN); given, auth-required also checks
    that calls without it are refused."""
    tls_ca: str | None = None
    """PEM CA to verify the learner's certificate; turns TLS on."""
    tls_server_name: str | None = None
    """Override the TLS server name checked against the certificate."""
    num_envs: int = 2
    """K of the scripted actor's streams."""
    frames: int = 20
    """Frames each well-behaved stream sends."""
    wait_shutdown_s: float = 0.0
    """Keep one stream open this long for the learner to stop on its own (shutdown-message);
    0 skips that case."""
    only: str = ""
    """Comma-separated case ids to run (default: all)."""
    call_timeout_s: float = 20.0
    """Deadline of each call the scripted actor makes."""
    report_json: str = ""
    """Also write the report as JSON to this file."""

    def __post_init__(self) -> None:
        require_range(self, ("num_envs",), low=1, high=4096)
        require_range(self, ("frames",), low=2)
        require_range(self, ("wait_shutdown_s",), low=0)
        require_range(self, ("call_timeout_s",), low=0, low_open=True)
