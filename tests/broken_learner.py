"""seedrl's learner with one protocol rule broken, for the conformance suite's own tests.

    python tests/broken_learner.py BREAK [learner flags]

runs ``python -m learner`` after a one-line corruption named by BREAK (see ``BREAKS``),
so a test can show that the learner-side suite fails the case guarding that rule and
says why.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from learner.__main__ import main
from learner.agents.models import MultiCategoricalHead
from learner.serving import servicer as server
from seedrl.proto import seedrl_pb2 as pb

_check_hello = server.LearnerServicer._check_hello
_mask_check = server.LearnerServicer._mask_check
_acting_bytes = server._acting_bytes


def empty_run_id() -> None:
    """The Hello check takes an empty run_id (the stream then shares slots with any other
    empty-id stream)."""

    def check(self: server.LearnerServicer, hello: pb.Hello) -> str | None:
        named = pb.Hello()
        named.CopyFrom(hello)
        named.run_id = named.run_id or "any"
        return _check_hello(self, named)

    server.LearnerServicer._check_hello = check  # type: ignore[method-assign]


def agents_unchecked() -> None:
    """The Hello check takes any agents: the actor's are read as the learner's."""

    def check(self: server.LearnerServicer, hello: pb.Hello) -> str | None:
        theirs = pb.Hello()
        theirs.CopyFrom(hello)
        theirs.env.agents[:] = self.env_spec.agents
        return _check_hello(self, theirs)

    server.LearnerServicer._check_hello = check  # type: ignore[method-assign]


def acting_ignored() -> None:
    """A single-agent env's frame may carry acting flags: they are dropped."""

    def acting(frame: pb.Frame, layout: server.FrameLayout) -> bytes | None:
        return None if layout.acting is None else _acting_bytes(frame, layout)

    server._acting_bytes = acting  # type: ignore[assignment]


def mask_all_rows() -> None:
    """The action mask is checked on every row, waiting ones included."""

    def mask_check(self: server.LearnerServicer, leaves: Sequence, num_envs: int):  # type: ignore[no-untyped-def]
        check = _mask_check(self, leaves, num_envs)
        return None if check is None else lambda obs, acting=None: check(obs, None)

    server.LearnerServicer._mask_check = mask_check  # type: ignore[method-assign]


def multi_mask_first_only() -> None:
    """A MultiDiscrete action's mask covers its first element only; the rest are unmasked."""
    groups = MultiCategoricalHead._groups

    def first_only(self: MultiCategoricalHead, params):  # type: ignore[no-untyped-def]
        logits, masks = groups(self, params)
        unmasked = params[..., : self.num_logits].split(self.nvec, -1)
        return [logits[0], *unmasked[1:]], [masks[0], *[None] * (len(masks) - 1)]

    MultiCategoricalHead._groups = first_only  # type: ignore[method-assign]


BREAKS: dict[str, Callable[[], None]] = {
    "empty-run-id": empty_run_id,
    "agents-unchecked": agents_unchecked,
    "acting-ignored": acting_ignored,
    "mask-all-rows": mask_all_rows,
    "multi-mask-first-only": multi_mask_first_only,
}


if __name__ == "__main__":
    BREAKS[sys.argv[1]]()
    sys.exit(main(sys.argv[2:]))
