"""Every command a user types answers ``--help`` with text that names and explains its flags."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support import ROOT

from seedrl.cli import ConfigArgumentParser, add_config_arguments, field_docs, parse_config
from seedrl.config import ActorConfig

COMMANDS = {
    "learner": (["-m", "learner"], "--inference-batch-size"),
    "actor": (["-m", "actors", "actor"], "--env-groups"),
    "launcher": (["-m", "actors"], "--num-actors"),
    "demo": (["-m", "learner", "demo"], "--envs-per-actor"),
    "evaluate": (["-m", "learner", "evaluate"], "--episodes"),
    "serve": (["-m", "learner", "serve"], "--auth-token-file"),
    "plot": (["-m", "learner", "plot"], "--out"),
    "tournament": (["-m", "learner", "tournament"], "--max-players"),
    "healthcheck": (["-m", "learner", "healthcheck"], "--address"),
    "bench": (["-m", "learner", "bench"], "--sweep"),
    "echo": (["-m", "benchmarks.echo"], "--port"),
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_lists_the_flags(name):
    args, expected_flag = COMMANDS[name]
    done = subprocess.run(
        [sys.executable, *args, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert expected_flag in done.stdout
    assert "Traceback" not in done.stderr


def test_help_carries_the_field_docstrings():
    done = subprocess.run(
        [sys.executable, "-m", "actors", "actor", "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    help_text = " ".join(done.stdout.split())
    assert "Sample Factory's double buffering); K % G == 0. (default: 1)" in help_text


def test_parsing_flags_leaves_the_docstrings_unread():
    """Every actor process parses flags; only --help needs the source-parsed docstrings."""
    field_docs.cache_clear()
    config = parse_config(ActorConfig, ["--envs-per-actor", "4"], "test", "test")
    assert config.envs_per_actor == 4
    assert field_docs.cache_info().currsize == 0
    parser = ConfigArgumentParser(prog="test")
    add_config_arguments(parser, ActorConfig)
    assert "environments each actor steps" in parser.format_help()
    assert field_docs.cache_info().currsize == 1


def test_bench_says_so_where_benchmarks_is_not_there(tmp_path, monkeypatch, capsys):
    """An installed package has no benchmarks/: one clear line and exit 2, no traceback."""
    import learner.__main__ as cli

    monkeypatch.setattr(cli, "find_spec", lambda name: None)
    monkeypatch.setattr(cli, "__file__", str(tmp_path / "site-packages" / "learner" / "x.py"))
    assert cli.main(["bench", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "benchmarks/ is not installed" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["-m", "learner", "--batch-size", "x"], "--batch-size"),
        (["-m", "learner", "demo", "--envs-per-actor", "x"], "--envs-per-actor"),
        (["-m", "actors", "--num-actors", "x"], "--num-actors"),
        (["-m", "actors", "actor", "--env-groups", "x"], "--env-groups"),
    ],
)
def test_a_bad_flag_exits_2_with_one_line_naming_it(args, flag):
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert flag in last and "Traceback" not in done.stderr


def test_torchrun_ranks_refuse_to_stand_by(monkeypatch, capsys):
    """A standby is one learner process; under torchrun it is refused: one line, exit 2."""
    import learner.__main__ as cli

    monkeypatch.setenv("WORLD_SIZE", "2")
    assert cli.main(["--standby", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--standby" in err[0]


@pytest.mark.parametrize("trainer", ["process", "device"])
def test_torchrun_ranks_refuse_a_trainer_other_than_thread(trainer, monkeypatch, capsys):
    """Under torchrun the trainer flag is checked before anything starts: one line, exit 2."""
    import learner.__main__ as cli

    monkeypatch.setenv("WORLD_SIZE", "2")
    assert cli.main(["--trainer", trainer]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--trainer {trainer}" in err[0]
