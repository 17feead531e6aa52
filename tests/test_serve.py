"""``python -m learner serve``: a checkpoint's policy served to actors without training.

Served greedy actions are ``evaluate``'s for the same observations (normalised by the
checkpoint's frozen statistics), the checkpoint and its folder are left byte for byte as
they were, a checkpoint cannot be served as another env, and a population's checkpoint
serves its best member (``--member N`` another).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys

import grpc
import numpy as np
import pytest

from learner.parts import build_learner, save_checkpoint
from learner.state import checkpoint
from learner.tools import serve
from learner.tools.trained_policy import Policy
from seedrl import codec
from seedrl.config import LearnerConfig
from seedrl.proto import seedrl_pb2 as pb
from seedrl.transport import free_port
from tests.population_support import BEST, population_checkpoint
from tests.support import ROOT, running
from tests.wire_clients import act, frame, get_info, hello

K, FRAMES = 8, 6


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A CartPole checkpoint with statistics of few frames, far from zero mean and unit
    scale: served frames folded into them would move them."""
    logdir = tmp_path_factory.mktemp("trained")
    config = LearnerConfig(logdir=str(logdir), normalize_observations=True, hidden_sizes=(16,))
    learner = build_learner(config)
    rng = np.random.default_rng(1)
    assert learner.normalizer is not None
    learner.normalizer.update(rng.normal(0.5, 2.0, (16, 4)).astype(np.float32))
    save_checkpoint(learner)
    return config.checkpoint_path


def _folder_state(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


def _observations(rng):
    return [rng.normal(0.5, 2.0, (K, 4)).astype(np.float32) for _ in range(FRAMES)]


@pytest.mark.parametrize("serving", ["0", "2"], ids=["one process", "two frontends"])
def test_served_greedy_actions_are_evaluates_and_the_checkpoint_is_untouched(
    trained, tmp_path, serving
):
    """Served as this command's --serving-processes says, not as the training host
    resolved it (the checkpoint's config keeps that host's count)."""
    before = _folder_state(trained.parent)
    port = free_port()
    command = [
        sys.executable, "-m", "learner", "serve", "--checkpoint", str(trained), "--greedy",
        "--port", str(port), "--logdir", str(tmp_path / "serving"), "--progress", "plain",
        "--no-local-socket", "--inference-batch-size", str(K), "--serving-processes", serving,
    ]  # fmt: skip
    observations = _observations(np.random.default_rng(2))
    with running(command) as proc:
        line = proc.wait_for("listening on", 240)  # frontends import torch and gRPC
        assert line.rstrip().endswith("by 2 frontends)" if serving == "2" else "process)"), line
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            info = get_info(channel)
            messages = [hello(info.env, K)] + [frame(K, obs=obs) for obs in observations]
            outcome = act(channel, messages, timeout=60)
        assert outcome.code is grpc.StatusCode.OK, outcome.details
        assert proc.stop() is not None
    assert info.env.env_id == "CartPole-v1"
    served = [
        codec.decode_tensor(reply.actions.actions, "actions", np.int64, (K,))
        for reply in outcome.replies
        if reply.WhichOneof("kind") == "actions"
    ]
    policy = Policy.load(trained, greedy=True)
    expected = [[policy.act(row) for row in obs] for obs in observations]
    assert [list(map(int, a)) for a in served] == expected
    assert len({a for frame_actions in expected for a in frame_actions}) == 2  # not constant
    assert _folder_state(trained.parent) == before
    assert (tmp_path / "serving" / "metrics.jsonl").exists()


def _serve_exit(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        serve.main(argv)
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return exc.value.code, err


def test_the_checkpoints_own_folder_is_not_a_logdir(trained, capsys):
    before = _folder_state(trained.parent)
    argv = ["--checkpoint", str(trained), "--logdir", str(trained.parent), "--port", "0"]
    code, err = _serve_exit([*argv, "--max-seconds", "1", "--no-tensorboard"], capsys)
    assert code == 2
    assert "holds the checkpoint" in err
    assert _folder_state(trained.parent) == before


def test_a_checkpoint_of_other_spaces_than_the_env_built_here_is_refused(trained):
    state = checkpoint.load(trained)
    spec = pb.EnvSpec.FromString(state["env_spec"])
    spec.observation_space.shape[:] = [5]
    with pytest.raises(serve.ServeError, match="observation_space"):
        serve.check_spaces(trained, state, spec)


def test_the_learners_command_line_refuses_a_mismatched_env_with_exit_2(trained, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "learner", "serve", "--checkpoint", str(trained),
         "--env", "Pendulum-v1", "--logdir", str(tmp_path / "s")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "trained on CartPole-v1" in done.stderr


def test_greedy_actions_are_for_serving_not_training():
    """V-trace and the replay learn from sampled behaviour: --greedy needs --no-train."""
    with pytest.raises(ValueError, match="--no-train"):
        LearnerConfig(greedy=True)
    assert LearnerConfig(greedy=True, train=False).greedy


@pytest.fixture(scope="module")
def population(tmp_path_factory):
    return population_checkpoint(tmp_path_factory.mktemp("population"))


@pytest.mark.parametrize(("flags", "member"), [([], BEST), (["--member", "1"], 1)])
def test_a_population_serves_its_best_member_or_the_one_asked_for(
    population, tmp_path, flags, member
):
    """Member k of the checkpoint always chooses action k: every served action is the
    chosen member's, and the line serve prints names it."""
    port = free_port()
    command = [
        sys.executable, "-m", "learner", "serve", "--checkpoint", str(population), *flags,
        "--port", str(port), "--logdir", str(tmp_path / "serving"), "--progress", "plain",
        "--no-local-socket", "--inference-batch-size", str(K), "--greedy",
    ]  # fmt: skip
    rng = np.random.default_rng(3)
    observations = [rng.uniform(-1, 1, (K, 6)).astype(np.float32) for _ in range(FRAMES)]
    with running(command) as proc:
        proc.wait_for("listening on", 60)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            info = get_info(channel)
            messages = [hello(info.env, K)] + [frame(K, obs=obs) for obs in observations]
            outcome = act(channel, messages, timeout=60)
        assert outcome.code is grpc.StatusCode.OK, outcome.details
        assert proc.stop() is not None
    served = [
        codec.decode_tensor(reply.actions.actions, "actions", np.int64, (K,)).tolist()
        for reply in outcome.replies
        if reply.WhichOneof("kind") == "actions"
    ]
    assert served == [[member] * K] * FRAMES
    assert any(f"(member{member} of the population)" in line for line in proc.lines), proc.lines


def test_a_bad_member_is_refused_in_one_line_with_exit_2(population, trained, tmp_path, capsys):
    # Bounded should the refusal break: a serve that goes on stops within a second.
    logdir = ["--logdir", str(tmp_path / "s"), "--port", "0", "--max-seconds", "1"]
    code, err = _serve_exit(["--checkpoint", str(population), "--member", "3", *logdir], capsys)
    assert code == 2 and "--member 3: the population has members 0 to 2" in err
    code, err = _serve_exit(["--checkpoint", str(trained), "--member", "0", *logdir], capsys)
    assert code == 2 and "--member 0 picks a member of a population" in err
    assert not (tmp_path / "s").exists()
