"""An admitted actor stream and one of its frames, as the servicer hands them to the serving core.

Kept out of :mod:`learner.serving.inference` so that they import no torch: the serving
tier's frontend processes run the servicer over them, and torch would cost each frontend
seconds to start and a couple of hundred MB.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(eq=False)
class Connection:
    """One admitted actor stream and the trajectory slots of its K envs."""

    actor_id: str
    run_id: str
    peer: str
    num_envs: int
    slot_ids: np.ndarray
    newest_frame_only: bool = False
    """The stream sends only the newest frame of each stacked observation."""
    frames: int = 0
    closed: bool = False
    slot_bytes: bytes = field(init=False, repr=False)
    """``slot_ids`` as int64 bytes: a batch joins them (many tiny arrays concatenate slowly)."""

    def __post_init__(self) -> None:
        self.slot_bytes = np.ascontiguousarray(self.slot_ids, np.int64).tobytes()


def stream_policies(agent_policy_A: np.ndarray, rows: int) -> np.ndarray:
    """Each of a stream's ``rows`` rows' policy: its rows come env by env, so row
    ``i * A + j`` is agent j's and plays agent j's policy (``agent_policy_A[j]``)."""
    return np.tile(agent_policy_A, rows // len(agent_policy_A))


class FramePayload:
    """One stream's frame as the raw bytes of its four tensors, already checked for layout.

    Arrays are built once per batch (one ``frombuffer`` per field for all streams), not
    per frame: at K = 1 that was most of the learner's Python per message.
    """

    __slots__ = ("acting", "conn", "observations", "rewards", "terminated", "truncated")

    def __init__(
        self,
        conn: Connection,
        observations: bytes,
        rewards: bytes,
        terminated: bytes,
        truncated: bytes,
        acting: bytes | None = None,
    ) -> None:
        self.conn = conn
        self.observations = observations
        self.rewards = rewards
        self.terminated = terminated
        self.truncated = truncated
        self.acting = acting
        """A multi-agent env's acting rows (bool bytes); None for a single-agent env."""
