"""The serving event loop: uvloop where installed, asyncio's own loop on request or without it."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest
from support import actor_args, learner_process, running

from learner import event_loop
from seedrl.config import LearnerConfig

uvloop = pytest.importorskip("uvloop")  # in the learner extra on every platform CI runs


async def _loop_name() -> str:
    await asyncio.sleep(0)
    return event_loop.running_loop_name()


def test_auto_and_uvloop_run_on_uvloop():
    assert event_loop.loop_factory("auto") is uvloop.new_event_loop
    assert event_loop.run(_loop_name(), "auto") == "uvloop"
    assert event_loop.run(_loop_name(), "uvloop") == "uvloop"


def test_asyncio_runs_on_the_standard_loop():
    assert event_loop.loop_factory("asyncio") is None
    assert event_loop.run(_loop_name(), "asyncio") == "asyncio"


def test_auto_falls_back_to_asyncio_without_uvloop(monkeypatch):
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now raises ImportError
    assert event_loop.run(_loop_name(), "auto") == "asyncio"


def test_asking_for_uvloop_without_it_says_what_to_do(monkeypatch):
    monkeypatch.setitem(sys.modules, "uvloop", None)
    with pytest.raises(RuntimeError, match="pip install uvloop"):
        event_loop.loop_factory("uvloop")


def test_unknown_event_loop_is_rejected():
    with pytest.raises(ValueError, match="event loop must be one of"):
        event_loop.loop_factory("trio")
    with pytest.raises(ValueError, match="event_loop must be auto, uvloop or asyncio"):
        LearnerConfig(event_loop="trio")


def test_run_raises_the_coroutines_error():
    async def fail() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        event_loop.run(fail(), "uvloop")


@pytest.mark.parametrize("choice", ["uvloop", "asyncio"])
def test_learner_serves_actors_on_either_loop(tmp_path, choice):
    """The whole learner (gRPC aio server, batcher, trainer feed, shutdown) on each loop."""
    with learner_process(tmp_path, "--total-frames", "2000", "--event-loop", choice) as (
        learner,
        port,
    ):
        assert f"event loop {choice})" in learner.wait_for("listening on", 1)
        # One actor process: a second one starting late could miss the final Shutdown
        # (see test_total_frames_stop_and_summary).
        with running(actor_args(port, 1, 8)) as actors:
            assert learner.wait(timeout=60) == 0, learner.output()
            assert actors.wait(timeout=30) == 0, actors.output()
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["frames"] >= 2000
