"""The serving-tier benchmark's slot transport answers every frame into its own slot.

A model process and two frontend processes meet in a small shared-memory slot table under
the tag policy (each frame's action is its own slot and sequence number), for each
doorbell: every frame's action must come back to the slot that sent it, every slot must be
answered exactly as often as it asked (nothing lost, nothing answered twice), and every
child process must have ended on its own. Loopback and time-bounded; no timed assertion.
"""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest

from benchmarks.serving_tier.run import run_once
from benchmarks.serving_tier.slots import BELLS, RunSpec, TableSpec, tag_policy


@pytest.mark.parametrize("bell", BELLS)
@pytest.mark.parametrize(
    ("obs_shape", "obs_dtype"), [((4,), "float32"), ((84, 84), "uint8")], ids=["vector", "pixels"]
)
def test_each_frame_answered_once_into_its_own_slot(bell, obs_shape, obs_dtype):
    # Five slots over two frontends (3 + 2) and a quorum below them: batches of mixed
    # owners and sizes, some closed by the deadline.
    spec = RunSpec(
        TableSpec(5, obs_shape, obs_dtype, frontends=2), bell, "tag", quorum=3,
        deadline_s=0.001,
    )  # fmt: skip
    result = run_once(spec, warmup_s=0.05, measure_s=0.3)

    assert result["errors"] == []
    assert result["unanswered"] == 0
    assert result["served_S"] == result["requested_S"]
    assert min(result["requested_S"]) > 1  # every slot made round trips
    assert result["exit_codes"] == [0, 0, 0]
    assert mp.active_children() == []


def test_tag_policy_reads_the_frontends_tag():
    obs = np.zeros((2, 84, 84), np.uint8)
    obs[1].reshape(-1)[:8] = np.frombuffer(((7 << 32) | 9).to_bytes(8, "little"), np.uint8)
    assert tag_policy(obs).tolist() == [0, (7 << 32) | 9]
