"""End-to-end: a real learner process and real actor processes on loopback."""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest
from support import actor_args, learner_process, read_records, running, wait_until

# The learning budget CI can afford on 2 cores: well above random (~22) but far from solved.
CI_TARGET_RETURN = 100.0


def test_cartpole_learns_well_above_random(tmp_path):
    """Fixed seed, 2 actors x 16 envs: the mean return rises from ~22 to >= 100."""
    extra = ["--seed", "1", "--target-return", str(CI_TARGET_RETURN), "--max-seconds", "150"]
    # Records often enough to see the start of the curve: it can reach 100 within 2 s.
    extra += ["--log-interval-s", "0.25"]
    with learner_process(tmp_path, *extra) as (learner, port):
        with running(actor_args(port, 2, 16, "--seed", "1")) as actors:
            code = learner.wait(timeout=200)
            assert code == 0, learner.output()
            assert actors.wait(timeout=30) == 0, actors.output()
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["solved"], f"did not reach {CI_TARGET_RETURN}: {result}"
    assert result["episode_return_mean"] >= CI_TARGET_RETURN
    records = read_records(tmp_path)
    first_returns = [r["episode_return_mean"] for r in records if r["episode_return_mean"]]
    assert first_returns[0] < 40, "training should start near random"
    assert records[-1]["learner_steps"] > 0
    assert max(r["inference_batch_mean"] for r in records) > 1, "inference must batch"
    for key in ("time", "frames", "fps", "episodes", "actors_connected", "loss_policy"):
        assert any(key in r for r in records), key
    assert (tmp_path / "checkpoint.pt").exists()
    # The run ended at its best so far: that is kept too; a climbing policy is not flagged.
    import torch

    best = torch.load(tmp_path / "checkpoint-best.pt", weights_only=True)
    assert best["best_return_mean"] >= CI_TARGET_RETURN
    assert records[-1]["episode_return_best"] >= CI_TARGET_RETURN
    assert records[-1]["collapse_entropy_low"] == 0
    assert "seedrl done:" in learner.output()


def test_total_frames_stop_and_summary(tmp_path):
    with learner_process(tmp_path, "--total-frames", "3000") as (learner, port):
        with running(actor_args(port, 2, 4)) as actors:
            assert learner.wait(timeout=60) == 0, learner.output()
            assert actors.wait(timeout=30) == 0, actors.output()
    summary = learner.wait_for("seedrl done:", 1)
    assert "reached 3000 frames" in summary
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["frames"] >= 3000
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["total_frames"] == 3000


def test_sigterm_stops_learner_cleanly_and_actors_wait(tmp_path):
    """SIGTERM: final checkpoint, exit 0; actors (not told 'final') keep waiting to reconnect."""
    with learner_process(tmp_path, "--checkpoint-interval-s", "3600") as (learner, port):
        with running(actor_args(port, 1, 4)) as actors:
            wait_until(
                lambda: (read_records(tmp_path) or [{}])[-1].get("frames", 0) > 500,
                timeout=60,
                what="frames flowing",
            )
            learner.signal(signal.SIGTERM)
            assert learner.wait(timeout=20) == 0, learner.output()
            assert (tmp_path / "checkpoint.pt").exists()
            # The launcher is still up: its actors wait for the learner to come back.
            assert actors.popen.poll() is None


def test_ctrl_c_to_the_process_group_checkpoints_the_trainers_last_step(tmp_path):
    """Ctrl-C reaches the learner and its trainer process; the trainer waits to be stopped."""
    import torch

    with learner_process(tmp_path, "--checkpoint-interval-s", "3600") as (learner, port):
        with running(actor_args(port, 1, 8)):
            wait_until(
                lambda: (read_records(tmp_path) or [{}])[-1].get("learner_steps", 0) > 2,
                timeout=60,
                what="learner steps",
            )
            os.killpg(learner.popen.pid, signal.SIGINT)
            assert learner.wait(timeout=30) == 0, learner.output()
    result = json.loads((tmp_path / "result.json").read_text())
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert state["learner_steps"] == result["learner_steps"] > 2
    assert "exited with code" not in learner.output()


def test_actor_process_never_imports_torch(tmp_path):
    """Run a real actor loop in a fresh interpreter and check torch never got imported."""
    code = (
        "import sys\n"
        "from actors.actor import Actor\n"
        "from seedrl.config import ActorConfig\n"
        "import actors, actors.launcher\n"
        "cfg = ActorConfig(learner=sys.argv[1], envs_per_actor=4, max_frames=400)\n"
        "rc = Actor(cfg, 0).run()\n"
        "from seedrl.timing import process_rss_mb\n"
        "print('torch_loaded', 'torch' in sys.modules, 'rc', rc, 'rss_mb', process_rss_mb())\n"
    )
    with learner_process(tmp_path) as (_learner, port):
        with running([sys.executable, "-c", code, f"127.0.0.1:{port}"]) as actor:
            line = actor.wait_for("torch_loaded", 60)
    fields = line.split()
    assert fields[1] == "False", line
    assert fields[3] == "0", line
    assert float(fields[5]) < 120, f"actor RSS too large: {line}"


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux scheduling classes")
@pytest.mark.parametrize(
    ("flags", "policy"), [((), "SCHED_BATCH"), (("--no-sched-batch",), "SCHED_OTHER")]
)
def test_actor_processes_run_as_batch_work(flags, policy):
    """Actors put themselves in SCHED_BATCH (waking, they preempt nobody) unless told not to."""
    # No learner at this address: the actor keeps retrying, which is all this needs.
    args = [sys.executable, "-m", "actors", "actor", "--learner", "127.0.0.1:9", *flags]
    with running(args) as actor:
        expected = getattr(os, policy)
        wait_until(lambda: os.sched_getscheduler(actor.popen.pid) == expected, 30, what=policy)


@pytest.mark.slow
def test_cartpole_solved(tmp_path):
    """The full solve (make demo's job): mean return of the last 100 episodes >= 475."""
    extra = ["--target-return", "475", "--max-seconds", "600"]
    with learner_process(tmp_path, *extra) as (learner, port):
        with running(actor_args(port, 2, 32)):
            assert learner.wait(timeout=700) == 0, learner.output()
    assert json.loads((tmp_path / "result.json").read_text())["solved"]


def _returns_of_seeded_run(tmp_path, seed: int) -> list[float]:
    """Episode returns a single actor sees with a fixed seed (inference only, no training)."""
    import torch

    extra = ["--seed", str(seed), "--no-train", "--max-seconds", "60"]
    with learner_process(tmp_path, *extra) as (learner, port):
        actor = actor_args(port, 1, 4, "--seed", str(seed), "--max-frames", "1000")
        with running(actor) as actors:
            assert actors.wait(timeout=60) == 0, actors.output()
        learner.signal(signal.SIGTERM)
        assert learner.wait(timeout=30) == 0, learner.output()
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    return list(state["returns"])


def test_seed_makes_single_actor_run_reproducible(tmp_path):
    first = _returns_of_seeded_run(tmp_path / "a", seed=3)
    again = _returns_of_seeded_run(tmp_path / "b", seed=3)
    other = _returns_of_seeded_run(tmp_path / "c", seed=4)
    assert len(first) > 20
    assert first == again
    assert first != other
