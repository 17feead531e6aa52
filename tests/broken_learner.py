"""seedrl's learner with one protocol rule broken, for the conformance suite's own tests.

    python tests/broken_learner.py [learner flags]

runs ``python -m learner`` with its Hello check taking an empty ``run_id`` (a stream
then shares slots with any other empty-id stream), so a test can show that the
learner-side suite fails ``rejects-bad-hello`` and says why.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from learner.__main__ import main
from learner.serving import servicer as server
from seedrl.proto import seedrl_pb2 as pb

_check_hello = server.LearnerServicer._check_hello


def _check_hello_without_run_id(self: server.LearnerServicer, hello: pb.Hello) -> str | None:
    named = pb.Hello()
    named.CopyFrom(hello)
    named.run_id = named.run_id or "any"
    return _check_hello(self, named)


if __name__ == "__main__":
    server.LearnerServicer._check_hello = _check_hello_without_run_id  # type: ignore[method-assign]
    sys.exit(main(sys.argv[1:]))
