"""The load generator: its frames are what an actor sends, and a tiny run reports sanely."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from support import ROOT

from benchmarks.loadgen.synthetic import FrameSource, record_tape
from benchmarks.loadgen.table import BEGIN, END
from learner.serving.servicer import LearnerServicer
from learner.state.stats import SERVING_PHASES
from seedrl import codec, envs
from seedrl.config import LearnerConfig
from seedrl.proto import seedrl_pb2 as pb


def _servicer(env_id: str) -> LearnerServicer:
    config = LearnerConfig(env=env_id)
    spec = envs.describe_env(config.env, config.env_kwargs)
    return LearnerServicer(config, spec, None, None, None, None)  # layouts need no parts


def _info(servicer: LearnerServicer) -> pb.LearnerInfo:
    stack = servicer.frame_stack
    return pb.LearnerInfo(env=servicer.env_spec, frame_stack=stack if stack > 1 else 0)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "ALE/Pong-v5"])
def test_synthetic_frames_are_an_actors_frames(env_id):
    """Each frame takes the learner's no-parse path for its stream's layout (the newest
    frame only where the learner stacks), carries K envs from their own tape offsets, and
    over one pass of the tape every env ends as many episodes as the env really did."""
    family = envs.family_of(env_id)
    if family.requires:
        pytest.importorskip(family.requires)
    atari = family.name == "atari"
    servicer = _servicer(env_id)
    info = _info(servicer)
    tape = record_tape(info, steps=200 if atari else 300)
    assert tape.episodes >= 1 or atari
    k = 3
    source = FrameSource(tape, k, first_offset=17)
    newest = tape.newest_of_stack > 1
    assert newest == (servicer.frame_stack > 1)
    layout = servicer.frame_layout(k, newest_frame_only=newest)
    ends = np.zeros(k, np.int64)
    for step in range(tape.steps):
        raw = source.next()
        assert layout.wire.split(raw) is not None, "missed the learner's frame template"
        frame = pb.ActorMessage.FromString(raw).frame
        obs = codec.decode_tensor(
            frame.observations, "observations", layout.observations.dtype,
            layout.observations.shape,
        )  # fmt: skip
        for j in range(k):
            expected = tape.obs[(17 + j * (tape.steps // k) + step) % tape.steps]
            assert obs[j].tobytes() == expected
        terminated = np.frombuffer(frame.terminated.data, np.bool_)
        truncated = np.frombuffer(frame.truncated.data, np.bool_)
        ends += terminated | truncated
    assert ends.tolist() == [tape.episodes] * k


@pytest.mark.long
def test_a_tiny_loadgen_run_reports_answered_frames_and_phases(tmp_path):
    out = tmp_path / "loadgen.json"
    cmd = [
        sys.executable, "-m", "benchmarks.loadgen", "--streams", "3", "--envs", "2",
        "--modes", "echo,phases", "--repeats", "1", "--warmup-s", "0.3", "--measure-s", "1",
        "--tape-steps", "64", "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["schema"] == "seedrl-loadgen/1"
    assert result["settings"]["streams"] == 3 and result["settings"]["envs"] == 2
    rows = {row["mode"]: row for row in result["results"]}
    assert set(rows) == {"echo", "phases"}
    for mode, row in rows.items():
        assert "error" not in row, row
        assert row["frames_answered"] > 0 and row["frames_answered"] % 2 == 0, (mode, row)
        assert row["fps_answered"] > 0 and row["fps_taken"] > 0, (mode, row)
        assert row["learner_cpu_us_per_frame"] > 0, (mode, row)
        assert 0 < row["rtt_p50_ms"] <= row["rtt_p99_ms"], (mode, row)
        assert row["window_s"] >= 1.0
    phases = rows["phases"]
    assert phases["trained_fps"] > 0, "the phases mode trains"
    split = phases["phases_us_per_frame"]
    assert set(split) == {*SERVING_PHASES, "loop_rest", "other_threads"}
    assert all(split[p] > 0 for p in ("decode", "batch_assembly", "forward", "reply"))
    assert rows["echo"]["trained_fps"] is None  # the echo server trains nothing
    summary = result["summary"]
    assert summary["phases"]["phases_us_per_frame"]["forward"] == split["forward"]
    assert result["beyond_echo_us_per_frame"]["system"] is None  # no system mode ran

    doc = tmp_path / "performance.md"
    doc.write_text(f"# page\n\n{BEGIN}\nold\n{END}\n\nafter\n")
    cmd = [sys.executable, "-m", "benchmarks.loadgen", "table", str(out), "--update", str(doc)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    text = doc.read_text()
    assert "old" not in text and text.endswith(f"{END}\n\nafter\n")
    assert "| CartPole-v1, 3 × 2 | phases |" in text
    assert "Where the learner's CPU per frame goes" in text
