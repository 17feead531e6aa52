"""The serving event loop: uvloop's when asked and installed, asyncio's otherwise."""

from __future__ import annotations

import asyncio
import sys

import pytest

from seedrl.cli import parse_config
from seedrl.config import LearnerConfig
from seedrl.transport import run_event_loop

uvloop = pytest.importorskip("uvloop")


async def _loop_type() -> type:
    await asyncio.sleep(0)
    return type(asyncio.get_running_loop())


def test_servers_run_on_uvloop_by_default():
    assert LearnerConfig().uvloop is True
    assert issubclass(run_event_loop(_loop_type()), uvloop.Loop)


def test_no_uvloop_runs_asyncios_own_loop():
    assert not issubclass(run_event_loop(_loop_type(), use_uvloop=False), uvloop.Loop)
    config = parse_config(LearnerConfig, ["--no-uvloop"], "learner", "")
    assert config.uvloop is False


def test_without_uvloop_installed_asyncio_serves(monkeypatch):
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop -> ImportError
    assert not issubclass(run_event_loop(_loop_type()), uvloop.Loop)
