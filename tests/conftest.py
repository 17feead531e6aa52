"""Suite-wide: learners started in the test process serve as on a 2-core host.

``--serving-processes auto`` resolves from the host's usable cores, so without this the
suite's in-process learners would serve through frontends on some hosts and not on
others; tests about the tier ask for their frontends by number, and the resolver's own
tests give it cores. Learner subprocesses get ``--serving-processes 0`` from
:func:`support.learner_args`.
"""

from __future__ import annotations

import pytest

from learner.serving import auto


@pytest.fixture(autouse=True)
def _serve_in_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auto, "usable_cores", lambda: 2)
