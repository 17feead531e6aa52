"""The run's end and a full disk: result.json is written whatever the final checkpoint
or a metrics sink did, and a learner whose disk is full serves and trains on, fresh or
resumed (a real tmpfs filled to the last page; that needs root, as CI has)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import Proc, actor_args, learner_args, running, wait_until

from learner.checkpointing import Checkpointer
from learner.metrics import TensorBoardSink
from learner.run import serve
from learner.state import checkpoint
from seedrl.config import LearnerConfig
from seedrl.transport import free_port

ENOSPC = "[Errno 28] No space left on device"
PROGRESS = re.compile(r"frames\s+([\d,]+) .* steps\s+([\d,]+)")


def no_space(*args: Any, **kwargs: Any) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_the_runs_end_writes_result_json_whatever_the_checkpoint_and_a_sink_did(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(Checkpointer, "write", no_space)
    monkeypatch.setattr(TensorBoardSink, "close", no_space)
    config = LearnerConfig(
        logdir=str(tmp_path), port=0, max_seconds=0.3, log_interval_s=0.1, progress="off",
        trainer="thread", local_socket=False, tensorboard=True,
    )  # fmt: skip
    with caplog.at_level("ERROR"):
        result = asyncio.run(serve(config))
    done = json.loads((tmp_path / "result.json").read_text())
    assert done["reason"] == result.reason and done["final"] is True
    assert done["failures"] == [
        f"final checkpoint checkpoint.pt: {ENOSPC}",
        f"tensorboard close: {ENOSPC}",
    ]
    said = [r.getMessage() for r in caplog.records]
    assert any("could not write the final checkpoint" in m for m in said), said
    assert not (tmp_path / "checkpoint.pt").exists()


# ------------------------------------------------------------------ a real full disk


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
                   check=True, capture_output=True)  # fmt: skip
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def fill(disk: Path) -> Path:
    """Fill ``disk`` to its last byte; the filler file, to free it again."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for chunk in (1 << 16, 1 << 12, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * chunk)
    finally:
        os.close(fd)
    with pytest.raises(OSError, match="No space"), open(disk / "probe", "wb") as f:
        f.write(b"x")
        f.flush()
    return filler


def progress(proc: Proc) -> tuple[int, int]:
    """(frames, learner steps) on the learner's last progress line ((0, 0) before one)."""
    for line in reversed(list(proc.lines)):
        if match := PROGRESS.search(line):
            return int(match[1].replace(",", "")), int(match[2].replace(",", ""))
    return 0, 0


def trains_past(proc: Proc, frames: int, steps: int) -> None:
    wait_until(
        lambda: progress(proc)[0] > frames and progress(proc)[1] > steps, 120,
        what=f"training past {frames} frames and {steps} steps:\n{proc.output()}",
    )  # fmt: skip


def stop(proc: Proc) -> int:
    proc.signal(signal.SIGTERM)
    return proc.wait(60)


@pytest.mark.long
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_learner_on_a_full_disk_trains_on_and_resumed_on_it_serves(tmp_path):
    with tmpfs(tmp_path / "disk", "8m") as disk:
        port = free_port()
        args = learner_args(port, disk, "--tensorboard", "--checkpoint-interval-s", "1")
        actors = actor_args(port, 1, 4, "--max-backoff-s", "1")
        ckpt = disk / "checkpoint.pt"

        # A fresh run whose disk fills: checkpoints and metrics fail, serving and training do not.
        with running(args) as first, running(actors):
            first.wait_for("listening on", 60)
            wait_until(ckpt.exists, 60, what="a first checkpoint")
            filler = fill(disk)
            log_at = len(first.lines)
            saved = checkpoint.load(ckpt)
            first.wait_for("could not write checkpoint", 30)
            trains_past(first, *progress(first))
            assert stop(first) == 0, first.output()
            assert "could not write checkpoint" in "\n".join(first.lines[log_at:])
        done = json.loads((disk / "result.json").read_text())  # into the room kept for it
        assert f"final checkpoint checkpoint.pt: {ENOSPC}" in done["failures"], done
        assert done["frames"] > saved["frames"]
        lines = (disk / "metrics.jsonl").read_text().splitlines(keepends=True)
        assert lines and all(line.endswith("\n") and json.loads(line) for line in lines)

        # --resume on the still full disk: no sink starts, the learner serves and trains.
        (disk / "result.json").unlink()  # what the old one held is needed for no more
        fill(disk)
        resumed_from = checkpoint.load(ckpt)
        with running([*args, "--resume"]) as second, running(actors):
            second.wait_for("listening on", 60)
            second.wait_for("metrics sink tensorboard not started", 5)
            trains_past(second, resumed_from["frames"], resumed_from["learner_steps"])
            filler.unlink()  # room again for the run's end
            assert stop(second) == 0, second.output()
        done = json.loads((disk / "result.json").read_text())
        assert f"tensorboard not started: {ENOSPC}" in done["failures"], done
        assert done["frames"] > resumed_from["frames"]
