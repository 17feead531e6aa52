"""Command lines built from configs parse back into the same configs, token kept off them."""

from __future__ import annotations

import sys

from seedrl.cli import parse_config
from seedrl.commands import actors_command, config_flags, secret_env
from seedrl.config import AUTH_TOKEN_ENV, ActorConfig


def test_an_actor_config_survives_its_command_line():
    config = ActorConfig(
        learner="10.0.0.5:8686,10.0.0.6:8686", num_actors=3, envs_per_actor=8, env_groups=2,
        seed=7, restart=False, local_socket=False, max_backoff_s=0.5, stats_dir="/tmp/x",
        tls_ca="ca.pem", first_index=-1,
    )  # fmt: skip
    assert parse_config(ActorConfig, config_flags(config), "test", "test") == config


def test_defaults_make_no_flags_and_the_command_names_the_entry():
    assert config_flags(ActorConfig()) == []
    assert actors_command(ActorConfig()) == [sys.executable, "-m", "actors"]
    assert actors_command(ActorConfig(), "actor")[:4] == [sys.executable, "-m", "actors", "actor"]


def test_the_token_travels_in_the_environment_only():
    config = ActorConfig(auth_token="s3cret")
    assert not any("s3cret" in arg for arg in actors_command(config, "actor"))
    assert secret_env(config, {"A": "1"}) == {"A": "1", AUTH_TOKEN_ENV: "s3cret"}
    assert secret_env(ActorConfig(), {"A": "1"}) == {"A": "1"}
