"""Which population member plays each trajectory slot, kept even as actors come and go.

A new slot goes to the member with the fewest; when a stream leaves and the shares drift
more than one slot apart, a slot of the largest member is promised to the smallest and
moves when its env's episode ends (the old member's episode counts for the old member,
and the new one starts at an episode's first frame), dropping its partial unroll.

Shape suffixes: S slots (the builder's capacity), B rows in a batch.
"""

from __future__ import annotations

import numpy as np

UNASSIGNED = -1


class MemberSlots:
    """Slot -> member for a population of ``members``; :meth:`shares` are the members'
    slot counts once the promised moves are made, never more than one apart."""

    def __init__(self, members: int, capacity: int = 64) -> None:
        self.members = members
        self.member_S = np.full(capacity, UNASSIGNED, np.int64)
        self.moving: dict[int, int] = {}
        """Slot -> the member it moves to when its episode ends."""

    def shares(self) -> np.ndarray:
        """``[M]``: slots per member, promised moves counted at their destination."""
        member_S = self.member_S.copy()
        for slot, member in self.moving.items():
            member_S[slot] = member
        return np.bincount(member_S[member_S >= 0], minlength=self.members)

    def members_of(self, slot_B: np.ndarray) -> np.ndarray:
        """``[B]``: each row's member, a slot seen for the first time given to the member
        with the fewest (the lowest index among equals)."""
        if len(slot_B) and int(slot_B.max()) >= len(self.member_S):
            grown = np.full(max(2 * len(self.member_S), int(slot_B.max()) + 1), UNASSIGNED)
            grown[: len(self.member_S)] = self.member_S
            self.member_S = grown
        member_B = self.member_S[slot_B]
        if (member_B == UNASSIGNED).any():
            shares = self.shares()
            for slot in np.unique(slot_B[member_B == UNASSIGNED]).tolist():
                member = int(np.argmin(shares))
                self.member_S[slot] = member
                shares[member] += 1
            member_B = self.member_S[slot_B]
        return member_B

    def release(self, slots: np.ndarray) -> None:
        """Forget a closed stream's slots, then promise moves until the shares are even."""
        for slot in slots.tolist():
            self.moving.pop(slot, None)
        self.member_S[slots] = UNASSIGNED
        shares = self.shares()
        while shares.max() - shares.min() > 1:
            largest, smallest = int(np.argmax(shares)), int(np.argmin(shares))
            own = np.flatnonzero(self.member_S == largest)
            candidates = [s for s in own.tolist() if s not in self.moving]
            if candidates:
                self.moving[candidates[-1]] = smallest
            else:  # all of its share is on its way in: send one of those elsewhere
                slot = max(s for s, m in self.moving.items() if m == largest)
                self.moving[slot] = smallest
                if self.member_S[slot] == smallest:
                    del self.moving[slot]
            shares[largest] -= 1
            shares[smallest] += 1

    def moves_due(self, slot_B: np.ndarray, done_B: np.ndarray) -> np.ndarray:
        """The promised slots whose episode ended in this batch, now their new member's
        (the caller starts them afresh: :meth:`TrajectoryBuilder.restart`)."""
        if not self.moving:
            return np.zeros(0, np.int64)
        due = [s for s in np.unique(slot_B[done_B]).tolist() if s in self.moving]
        for slot in due:
            self.member_S[slot] = self.moving.pop(slot)
        return np.array(due, np.int64)
