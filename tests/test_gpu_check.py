"""The GPU check's steps are bounded (a step that runs out of time ends everything it
started), its dry run goes through every step of the GPU run, and what it would carry to
a lent host is sized first."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from benchmarks.gpu_check import CARRY_LIMIT_BYTES, Log, main, run, unpack_relay
from benchmarks.gpu_table import LOADGEN_BEGIN, LOADGEN_END

ROOT = Path(__file__).resolve().parent.parent
DRY_RUN_TIMEOUT_S = 240
"""Well past the dry run's own budget (its steps shrink or skip to fit that)."""

SPAWNS_A_SLEEPER = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
    "print(child.pid, flush=True)\n"
    "print('started', file=sys.stderr, flush=True)\n"
    "time.sleep(120)\n"
)


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for its parent counts as ended)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def test_a_timed_out_step_ends_the_processes_it_started(tmp_path: Path) -> None:
    began = time.monotonic()
    code, output = run([sys.executable, "-c", SPAWNS_A_SLEEPER], 8, Log(tmp_path / "log"))
    assert time.monotonic() - began < 60, "the step outlived its timeout by its child's life"
    assert code == 124
    assert "started" in output  # stderr printed before the timeout is kept
    grandchild = int(output.split()[0])
    deadline = time.monotonic() + 10
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(grandchild), "the step's own child outlived its timeout"


def test_a_step_that_finishes_gives_its_exit_code_and_output(tmp_path: Path) -> None:
    code, output = run(
        [sys.executable, "-c", "import sys; print('out'); sys.exit(3)"], 30, Log(tmp_path / "l")
    )
    assert (code, output.strip()) == (3, "out")


def run_dry(tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``benchmarks/gpu_check.sh --dry-run`` as a lent host runs it, with the packages
    installed here, in its own session (every process it starts ends with the test),
    writing under ``tmp_path``: its result and its output directory."""
    out, wheels = tmp_path / "out", tmp_path / "no-wheels"
    wheels.mkdir()
    cmd = ["bash", "benchmarks/gpu_check.sh", "--dry-run", "--relay", str(tmp_path / "relay")]
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(out), "WHEELS": str(wheels)}
    proc = subprocess.Popen(
        cmd, cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True, env=env,
    )  # fmt: skip
    try:
        text, _ = proc.communicate(timeout=DRY_RUN_TIMEOUT_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, text, ""), out


def block(text: str, begin: str, end: str) -> str:
    assert text.count(begin) == 1 and text.count(end) == 1, (begin, end)
    return text[text.index(begin) : text.index(end)]


@pytest.mark.long
def test_the_dry_run_goes_through_every_step_and_says_what_each_did(tmp_path: Path) -> None:
    """Load generator rows with the learner's CPU per frame, a leg of R2D2 MinAtar whose
    relay parts hold its run, and both docs tables regenerated in copies, the checkout's
    docs left as they were."""
    pytest.importorskip("minatar")
    pytest.importorskip("ale_py")
    docs_before = {p: (ROOT / "docs" / p).read_text() for p in ("performance.md", "learning.md")}
    done, out = run_dry(tmp_path)
    assert done.returncode == 0, done.stdout[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dry_run"] and summary["steps"] == ["info", "loadgen", "legs", "tables"]
    assert summary["carry"]["total_bytes"] == 0 and "refused" not in summary["carry"]
    if shutil.which("nvidia-smi") is None:
        assert "GPU utilisation is not sampled" in done.stdout

    loadgen = summary["loadgen"]
    assert loadgen["atari-cnn"]["skipped"] == "dry run"
    for name, mode in (("cartpole", "system"), ("atari-resnet", "inference")):
        (row,) = loadgen[name]["rows"]
        assert row["mode"] == mode and not row.get("error"), row
        assert row["fps_answered"] > 0 and row["learner_cpu_us_per_frame"] > 0, row
        assert row["trainer_cpu_us_per_frame"] >= 0 and "gpu" in row, row
        assert loadgen[name]["rc"] == {mode: 0}
        assert [p.name for p in out.glob(f"loadgen-{name}-*.json")] == loadgen[name]["out"]
    assert loadgen["cartpole"]["rows"][0]["trained_fps"] > 0
    assert loadgen["atari-resnet"]["model"] == "resnet"

    legs = summary["legs"]
    seed0 = legs["seed0"]
    assert seed0["rc"] in (0, 130) and seed0["games"] == ["Breakout"], seed0
    assert seed0["runs"]["MinAtar-Breakout-v1"]["frames"] > 0, seed0
    assert seed0["relay_parts"], seed0
    assert "skipped" in legs["seed1"] or legs["seed1"]["rc"] in (0, 130), legs["seed1"]
    parts = sorted(out.glob("relay.tar.*"))
    assert [p.name for p in parts] == sorted(
        legs["seed1"].get("relay_parts") or seed0["relay_parts"]
    )
    data = b"".join(p.read_bytes() for p in parts)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        names = tar.getnames()
    assert "./summary.json" in names and "./MinAtar-Breakout-v1/seed0/checkpoint.pt" in names

    tables = summary["tables"]
    assert tables["performance"] == {"rc": 0, "changed": True}, tables
    perf = (out / "docs" / "performance.md").read_text()
    gpu_block = block(perf, LOADGEN_BEGIN, LOADGEN_END)
    assert "| CartPole-v1, 2 × 1 | MLP | cpu | system |" in gpu_block
    assert "| ALE/Pong-v5, 2 × 1 | ResNet | cpu | inference |" in gpu_block
    assert tables["learning"]["rc"] == 0 and tables["learning"]["changed"], tables
    learning = (out / "docs" / "learning.md").read_text()
    r2d2 = block(learning, "<!-- bench-learning:minatar-r2d2:start -->",
                 "<!-- bench-learning:minatar-r2d2:end -->")  # fmt: skip
    assert "| MinAtar/Breakout-v1 |" in r2d2
    assert (out / "docs" / "learning" / "minatar-r2d2" / "MinAtar-Breakout-v1.png").exists()
    for page, text in docs_before.items():
        assert (ROOT / "docs" / page).read_text() == text, f"the dry run changed docs/{page}"


def test_a_carry_beyond_the_device_tools_limit_is_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wheels, relay, out = tmp_path / "whl", tmp_path / "relay", tmp_path / "out"
    wheels.mkdir()
    relay.mkdir()
    (relay / "summary.json").write_text("{}")
    with open(wheels / "big.whl", "wb") as f:  # sparse: the size counts, not the blocks
        f.truncate(CARRY_LIMIT_BYTES)
    args = ["--wheels", str(wheels), "--relay", str(relay)]
    assert main(["--carry-check", *args]) == 2
    assert "beyond the 64 MiB carry limit" in capsys.readouterr().out
    assert main(["--out", str(out), "--steps", "info", *args]) == 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["carry"]["total_bytes"] == CARRY_LIMIT_BYTES + 2
    assert "refused" in summary["carry"] and "info" not in summary
    os.truncate(wheels / "big.whl", CARRY_LIMIT_BYTES - 2)
    assert main(["--carry-check", *args]) == 0
    assert "64.0 MiB of the 64 MiB" in capsys.readouterr().out


def test_relay_parts_carried_as_they_came_back_are_put_together_first(tmp_path: Path) -> None:
    """A relay too big to carry unpacked travels as the compressed parts of its last leg."""
    source, relay = tmp_path / "source", tmp_path / "relay"
    (source / "MinAtar-Breakout-v1" / "seed0").mkdir(parents=True)
    (source / "MinAtar-Breakout-v1" / "seed0" / "checkpoint.pt").write_bytes(os.urandom(3000))
    (source / "summary.json").write_text('{"suite": "minatar-r2d2"}')
    packed = subprocess.run(["tar", "-czf", "-", "-C", str(source), "."], capture_output=True,
                            check=True).stdout  # fmt: skip
    relay.mkdir()
    (relay / "relay.tar.00").write_bytes(packed[:1000])
    (relay / "relay.tar.01").write_bytes(packed[1000:])
    assert unpack_relay(relay, Log(tmp_path / "log")) == ["relay.tar.00", "relay.tar.01"]
    assert sorted(p.name for p in relay.iterdir()) == ["MinAtar-Breakout-v1", "summary.json"]
    checkpoint = "MinAtar-Breakout-v1/seed0/checkpoint.pt"
    assert (relay / checkpoint).read_bytes() == (source / checkpoint).read_bytes()


def test_an_unknown_step_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--steps", "info,warp"])
    assert exc.value.code == 2
    assert "--steps: unknown ['warp']" in capsys.readouterr().err
