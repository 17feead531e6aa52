"""``--serving-processes auto`` (the default): how many frontends a host runs.

The resolver is checked with the host's cores given (the suite's conftest makes every
other test's host look like 2 cores): none below 4 cores, a frontend per two cores
beyond two, at most 8; none for a run the tier would refuse, where an explicit count
keeps its one-line refusal; the field takes auto or a whole number, anything else is one
line and exit 2. A learner left at auto on a 4-core host serves through one frontend and
says so, and its config.json records the count.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from learner.__main__ import main as learner_main
from learner.agents.models import UnsupportedSetup
from learner.serving import auto
from learner.serving.tier import check_tier_supported
from seedrl.config import LearnerConfig
from seedrl.envs import describe_env
from seedrl.proto import seedrl_pb2 as pb

HOST_CORES = auto.usable_cores
"""The real one: conftest replaces the module's during each test."""
CARTPOLE = describe_env("CartPole-v1")
TWO_PLAYERS = pb.EnvSpec(env_id="game", agents=["first", "second"])


@pytest.mark.parametrize(
    ("cores", "frontends"),
    [(1, 0), (2, 0), (3, 0), (4, 1), (5, 1), (6, 2), (8, 3), (17, 7), (18, 8), (64, 8)],
)
def test_auto_takes_a_frontend_per_two_cores_beyond_two_from_four_cores_up_to_eight(
    cores: int, frontends: int
) -> None:
    assert auto.frontends_for_cores(cores) == frontends
    resolved = auto.resolve_serving(LearnerConfig(), CARTPOLE, cores=cores)
    assert resolved.serving_processes == str(frontends) and auto.frontends(resolved) == frontends


def test_auto_counts_the_cores_this_process_may_run_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(6)), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert HOST_CORES() == 6
    monkeypatch.setattr(auto, "usable_cores", HOST_CORES)
    assert auto.resolve_serving(LearnerConfig(), CARTPOLE).serving_processes == "2"


LONG_UNIX_BIND = "unix:/tmp/" + "x" * 90 + ".sock"
"""A path the kernel binds (100 bytes) whose frontends' sockets beside it it would not."""


@pytest.mark.parametrize(
    "fields",
    [
        {"bind": "unix:/tmp/seedrl-learner.sock"},
        {"bind": "unix:/tmp/seedrl-learner.sock", "local_socket": False},
        {"bind": "unix:/tmp/seedrl-learner.sock", "tls_cert": "c.pem", "tls_key": "k.pem"},
        {"bind": "unix:/tmp/" + "x" * 86 + ".sock"},
    ],
    ids=["unix bind", "without local sockets", "with TLS", "the longest path auto takes"],
)
def test_auto_serves_a_unix_bind_by_frontends_with_or_without_tls(fields: dict) -> None:
    """The frontends' sockets sit beside the bound path with its TLS, so neither TLS nor
    --no-local-socket holds a unix bind to one process."""
    resolved = auto.resolve_serving(LearnerConfig(**fields), CARTPOLE, cores=64)
    assert resolved.serving_processes == str(auto.MAX_FRONTENDS)
    check_tier_supported(resolved, CARTPOLE)


@pytest.mark.parametrize(
    ("fields", "spec", "environ"),
    [({"bind": LONG_UNIX_BIND}, CARTPOLE, {})],
    ids=["unix bind with no room for the frontends' sockets beside it"],
)
def test_auto_serves_in_one_process_what_the_tier_refuses_and_a_count_still_refuses_it(
    monkeypatch: pytest.MonkeyPatch, fields: dict, spec: pb.EnvSpec, environ: dict
) -> None:
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    resolved = auto.resolve_serving(LearnerConfig(**fields), spec, cores=64)
    assert resolved.serving_processes == "0"
    asked = LearnerConfig(**fields, serving_processes="2")
    assert auto.resolve_serving(asked, spec, cores=64) is asked
    with pytest.raises(UnsupportedSetup, match="--serving-processes 2 does not serve"):
        check_tier_supported(asked, spec)


@pytest.mark.parametrize(
    "fields",
    [{}, {"self_play": True}, {"policy_mapping": ("first=pa", "second=pb")}],
    ids=["shared policy", "self-play", "policy mapping"],
)
def test_auto_serves_a_multi_agent_env_by_frontends(fields: dict) -> None:
    resolved = auto.resolve_serving(LearnerConfig(**fields), TWO_PLAYERS, cores=8)
    assert resolved.serving_processes == "3"
    check_tier_supported(resolved, TWO_PLAYERS)


def test_auto_serves_a_population_by_frontends() -> None:
    resolved = auto.resolve_serving(LearnerConfig(population=3), CARTPOLE, cores=8)
    assert resolved.serving_processes == "3"
    check_tier_supported(resolved, CARTPOLE)


def test_an_explicit_count_is_kept_whatever_the_host() -> None:
    for given in ("0", "3", 3):
        resolved = auto.resolve_serving(LearnerConfig(serving_processes=given), CARTPOLE, cores=2)
        assert resolved.serving_processes == str(given)
    assert LearnerConfig().serving_processes == "auto" and LearnerConfig().serving_frontends is None
    with pytest.raises(ValueError, match="resolved before the learner serves"):
        auto.frontends(LearnerConfig())


@pytest.mark.parametrize("junk", ["many", "-1", "1.5", "", " 2", "²", "Auto"])
def test_junk_is_one_line_and_exit_2(junk: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="--serving-processes must be auto or a whole number"):
        LearnerConfig(serving_processes=junk)
    with pytest.raises(SystemExit) as exited:
        learner_main(["--serving-processes", junk, "--port", "0"])
    err = capsys.readouterr().err.strip()
    assert exited.value.code == 2 and len(err.splitlines()) == 1, err
    assert "--serving-processes must be auto or a whole number >= 0" in err


def test_a_learner_left_at_auto_on_four_cores_serves_by_one_frontend_and_records_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from learner.run import serve

    monkeypatch.setattr(auto, "usable_cores", lambda: 4)
    config = LearnerConfig(
        logdir=str(tmp_path), port=0, max_seconds=0.5, progress="off", trainer="thread",
        tensorboard=False,
    )  # fmt: skip
    asyncio.run(serve(config))
    said = capsys.readouterr().out
    assert "serving by 1 frontend [auto])" in said, said
    assert json.loads((tmp_path / "config.json").read_text())["serving_processes"] == "1"
    monkeypatch.setattr(auto, "usable_cores", lambda: 2)
    config = config.with_changes(logdir=str(tmp_path / "two"))
    asyncio.run(serve(config))
    assert "serving in this process [auto])" in capsys.readouterr().out
    assert json.loads((tmp_path / "two" / "config.json").read_text())["serving_processes"] == "0"


def test_auto_serves_in_one_process_where_the_tiers_shared_memory_does_not_fit() -> None:
    def needed(count: int) -> int:
        return 100 * count

    fits = auto.resolve_serving(LearnerConfig(), CARTPOLE, cores=8, shared_bytes=needed, room=300)
    assert fits.serving_processes == "3"
    short = auto.resolve_serving(LearnerConfig(), CARTPOLE, cores=8, shared_bytes=needed, room=299)
    assert short.serving_processes == "0"
    asked = LearnerConfig(serving_processes="3")  # fails at its block, in one line
    assert auto.resolve_serving(asked, CARTPOLE, cores=8, shared_bytes=needed, room=0) is asked


def test_the_tiers_shared_memory_is_what_its_blocks_take(tmp_path: Path) -> None:
    from support import small_learner

    from learner.serving.slots import SlotTable
    from learner.serving.tier import shared_bytes, table_spec, unroll_ring_capacity
    from learner.serving.tier_unrolls import ReplyRows, RingSpec, UnrollRing, reply_spec

    learner = small_learner(tmp_path, 8, 4, max_envs=64, max_actors=16, lstm=True)
    config, builder = learner.config, learner.builder
    two = config.with_changes(serving_processes="2")
    blocks = [
        SlotTable(table_spec(two, builder, None)),
        ReplyRows(reply_spec(config, builder, None)),
        *(UnrollRing(RingSpec.of(builder, unroll_ring_capacity(config))) for _ in range(2)),
    ]
    try:
        taken = sum(block.shm.size for block in blocks)
        assert shared_bytes(config, builder, None, 2) == taken
        assert shared_bytes(config, builder, None, 3) > taken  # another ring, more lanes
    finally:
        for block in blocks:
            block.close()
