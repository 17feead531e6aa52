"""The serving tier's model-side batch: ready lanes -> table rows -> one serve -> reply rows.

A batch of the slot table is gathered by index, not stream by stream: each lane's rows
are kept as arrays (:class:`LaneRows`), so the rows of every ready lane come from one
vector expression, the frame fields from one fancy index each, and the actions go back
with one assignment. Python runs per batch and per lane only where a frame is bad
(NaN or inf: that lane's status says why and its stream alone ends).

Shape suffixes: R table rows, L lanes, B rows of the batch, A action dims.
"""

from __future__ import annotations

import numpy as np

from learner.serving.inference import InferenceEngine, nonfinite_problem
from learner.serving.rows import FrameBatch
from learner.serving.slots import OK, REJECTED, SlotTable
from learner.serving.streams import stream_policies

_REJECTED_BY_PROBLEM = {problem: status for status, problem in REJECTED.items()}


class LaneRows:
    """Each lane's table rows and owner, and each row's slot in the model's builder."""

    def __init__(
        self,
        table: SlotTable,
        obs_dtype: np.dtype,
        frame_shape: tuple[int, ...],
        multi_agent: bool = False,
        agent_policy: np.ndarray | None = None,
        played_R: np.ndarray | None = None,
    ) -> None:
        spec = table.spec
        self.table = table
        self.begin_L = np.zeros(spec.lanes, np.int64)
        self.count_L = np.zeros(spec.lanes, np.int64)
        self.owner_L = np.full(spec.lanes, -1, np.int64)
        self.slot_R = np.zeros(spec.rows, np.int64)
        self.obs_RO = table.obs_bytes.view(obs_dtype).reshape(spec.rows, *frame_shape)
        self.reward_R = table.reward_bytes.view(np.float32)
        self.terminated_R = table.terminated_bytes.view(np.bool_)
        self.truncated_R = table.truncated_bytes.view(np.bool_)
        self.acting_R = table.acting_bytes.view(np.bool_) if multi_agent else None
        """A multi-agent env's rows that act (None: every row acts)."""
        self.agent_policy = agent_policy
        """With --policy-mapping, each agent's policy by its index (None: one policy)."""
        self.policy_R = None if agent_policy is None else np.zeros(spec.rows, np.int64)
        """Each row's policy: a lease's rows come env by env, agent by agent."""
        self.played_R = played_R
        """With several policies, where each answered row's policy goes (the reply rows
        the frontends tag unrolls and episodes by)."""

    def open(self, lane: int, begin: int, count: int, owner: int, slot_K: np.ndarray) -> None:
        self.begin_L[lane], self.count_L[lane], self.owner_L[lane] = begin, count, owner
        self.slot_R[begin : begin + count] = slot_K
        if self.policy_R is not None:
            assert self.agent_policy is not None
            self.policy_R[begin : begin + count] = stream_policies(self.agent_policy, count)

    def rows_of(self, lane_B: np.ndarray) -> np.ndarray:
        """The table rows of lanes ``lane_B``, lane by lane, each lane's in order."""
        count_B = self.count_L[lane_B]
        begin_B = self.begin_L[lane_B]
        if (count_B == 1).all():
            return begin_B
        offset_B = np.cumsum(count_B) - count_B
        return np.repeat(begin_B - offset_B, count_B) + np.arange(int(count_B.sum()))

    def gather(self, row_B: np.ndarray) -> FrameBatch:
        """The rows as the serving core takes them (copies: the observations writable)."""
        return FrameBatch(
            slot_B=self.slot_R[row_B],
            obs_BO=self.obs_RO[row_B],
            reward_B=self.reward_R[row_B],
            terminated_B=self.terminated_R[row_B],
            truncated_B=self.truncated_R[row_B],
            acting_B=None if self.acting_R is None else self.acting_R[row_B],
        )

    def serve(self, engine: InferenceEngine, lane_B: np.ndarray) -> np.ndarray:
        """Serve the ready lanes ``lane_B`` and write their actions into the table; each
        lane's status (OK, or why its frame was rejected)."""
        engine.begin_batch()
        status_B = np.full(len(lane_B), OK, np.int64)
        row_B = self.rows_of(lane_B)
        rows = self.gather(row_B)
        if nonfinite_problem(rows) is not None:  # one check per batch; the search is rare
            status_B = self._statuses(lane_B)
            lane_B = lane_B[status_B == OK]
            if not len(lane_B):
                return status_B
            row_B = self.rows_of(lane_B)
            rows = self.gather(row_B)
        policy_B = None if self.policy_R is None else self.policy_R[row_B]
        action_BA, played_B = engine.serve_rows(rows, policy_B)
        self.table.action_RA[row_B] = action_BA
        if self.played_R is not None and played_B is not None:
            self.played_R[row_B] = played_B
        return status_B

    def _statuses(self, lane_B: np.ndarray) -> np.ndarray:
        """Each lane's status by its own frame's check."""
        status_B = np.full(len(lane_B), OK, np.int64)
        for i, lane in enumerate(lane_B.tolist()):
            problem = nonfinite_problem(self.gather(self.rows_of(np.array([lane]))))
            if problem is not None:
                status_B[i] = _REJECTED_BY_PROBLEM[problem]
        return status_B
