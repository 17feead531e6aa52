"""The conformance cases: one per rule of docs/wire-protocol.md, for each side of the wire.

A case has a stable id (the anchor ``docs/conformance.md#<id>`` that the protocol page
links from the rule), the side it tests, the section of ``docs/wire-protocol.md`` that
states the rule, and one line saying what passing means. The checks live with the side
that runs them (:mod:`seedrl.conformance.actor_suite`, :mod:`seedrl.conformance.learner_suite`);
this registry is what both they and the docs are held to. A new space kind or message
adds its rows here and its checks there.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Case:
    id: str
    side: str
    """``actor`` (a scripted learner tests an actor) or ``learner`` (a scripted actor tests
    a learner)."""
    rule: str
    """The section of docs/wire-protocol.md that states the rule (its anchor)."""
    summary: str
    """What passing means, in one line."""


def _cases(side: str, rows: list[tuple[str, str, str]]) -> tuple[Case, ...]:
    return tuple(Case(case_id, side, rule, summary) for case_id, rule, summary in rows)


ACTOR_CASES = _cases(
    "actor",
    [
        ("getinfo-first", "services",
         "calls GetInfo before every Act stream (the learner's env may have changed)"),
        ("auth-metadata", "authentication-and-tls",
         "every GetInfo and Act call carries `authorization: Bearer <token>`"),
        ("hello-first", "one-act-stream",
         "the first message of every stream is a Hello, and no other message is"),
        ("hello-fields", "one-act-stream",
         "the Hello says protocol version 1, a non-empty actor_id and K in [1, 4096]"),
        ("hello-env", "one-act-stream",
         "the Hello's env is GetInfo's: env_id, kwargs and both spaces"),
        ("fresh-run-id", "one-act-stream",
         "every connection carries a new, non-empty run_id"),
        ("reset-frame-first", "one-act-stream",
         "the first frame of every stream holds reset observations, reward 0, flags clear"),
        ("k-constant", "one-act-stream", "every frame carries the Hello's K envs"),
        ("tensor-layout", "tensors",
         "observations, rewards and flags have the wire dtype, shape and byte length"),
        ("observation-leaves", "one-act-stream",
         "a dict/tuple observation travels as one tensor per leaf in leaf order, each of "
         "its leaf's dtype and [K, *leaf_shape], with observations unset (structured envs)"),
        ("finite-values", "one-act-stream", "observations and rewards are finite"),
        ("next-step-autoreset", "one-act-stream",
         "an env that ended sends its reset observation one frame later, reward 0, flags clear"),
        ("actions-applied", "one-act-stream",
         "each env's next frame is its dynamics under the action sent for it "
         "(needs a model of the env)"),
        ("time-limit-truncation", "one-act-stream",
         "an episode that reaches the env's time limit ends truncated, not terminated "
         "(needs a model of the env)"),
        ("box-actions-clipped", "one-act-stream",
         "Box actions are clipped to [low, high] before the env steps (needs a Box-action "
         "model)"),
        ("agent-rows", "several-agents",
         "every tensor of a frame has K x A rows and acting is bool [K x A]; the Hello's env "
         "carries GetInfo's agents in order (multi-agent envs)"),
        ("acting-rows", "several-agents",
         "acting marks exactly the rows whose action the env applies next: its turn order, "
         "its live agents (needs a multi-agent model)"),
        ("agent-actions-applied", "several-agents",
         "each env's next rows (observations, rewards) follow its rules under the actions sent "
         "for its acting rows (needs a multi-agent model)"),
        ("agent-episode-ends", "several-agents",
         "an agent's final row comes once, flagged and not acting, then reward 0, flags clear "
         "and not acting until it acts again; once all have ended, the env's reset frame "
         "(multi-agent envs)"),
        ("frame-stack-offered", "learnerinfo",
         "with LearnerInfo.frame_stack D, Hello.frame_stack is 0 or D and frames carry "
         "whole observations or newest frames to match (stacked envs)"),
        ("frame-stack-not-offered", "learnerinfo",
         "without the offer, Hello.frame_stack is 0 and frames carry whole observations "
         "(stacked envs)"),
        ("shutdown-ends-stream", "one-act-stream",
         "after a Shutdown the actor sends nothing more and ends its side within 2 s"),
        ("shutdown-restart-reconnects", "one-act-stream",
         "Shutdown{final: false}: the actor connects again"),
        ("shutdown-final-exits", "one-act-stream",
         "Shutdown{final: true}: the actor exits with status 0 and does not reconnect"),
        ("retry-unreachable", "errors",
         "an actor started before its learner listens connects once it does"),
        ("retry-unavailable", "errors", "UNAVAILABLE from GetInfo or Act is retried"),
        ("retry-resource-exhausted", "errors", "RESOURCE_EXHAUSTED is retried"),
        ("backoff-capped", "errors", "no wait between attempts exceeds the backoff cap"),
        ("backoff-jittered", "errors",
         "the waits at the cap differ (jitter), so actors do not retry in step"),
        ("backoff-waits", "errors",
         "the first wait is at most half the cap, and once at the cap the waits average "
         "at least a sixth of it (no tight loop)"),
        ("stop-invalid-argument", "errors",
         "INVALID_ARGUMENT ends the actor with a non-zero status and no retry"),
        ("stop-unauthenticated", "errors",
         "UNAUTHENTICATED ends the actor with a non-zero status and no retry"),
    ],
)  # fmt: skip

LEARNER_CASES = _cases(
    "learner",
    [
        ("info-valid", "learnerinfo",
         "GetInfo answers protocol version 1, a well-formed EnvSpec, a learner_run_id, "
         "max_message_bytes > 0 and a frame_stack that fits the observation space"),
        ("health-serving", "services",
         "grpc.health.v1 Check answers SERVING without a token"),
        ("auth-required", "authentication-and-tls",
         "with no token or a wrong one, GetInfo and Act end with UNAUTHENTICATED "
         "(needs --auth-token)"),
        ("hello-accepted", "one-act-stream",
         "a valid Hello gets an Accept carrying GetInfo's learner_run_id"),
        ("actions-reply", "one-act-stream",
         "every frame gets one Actions reply of K valid actions with the wire dtype, shape "
         "and byte length"),
        ("episode-ends-served", "one-act-stream",
         "frames with terminated or truncated set, and the reset frames after them, are "
         "served"),
        ("reconnect-served", "one-act-stream",
         "a new stream with a new run_id is served after the previous one closed"),
        ("rejects-bad-hello", "errors",
         "a bad first message ends the stream with INVALID_ARGUMENT and a message"),
        ("rejects-bad-frame", "errors",
         "a bad frame ends the stream with INVALID_ARGUMENT and a message"),
        ("rejects-bad-leaves", "errors",
         "a dict/tuple observation sent whole, with a leaf missing, with leaves swapped or "
         "with a leaf of another dtype ends the stream with INVALID_ARGUMENT (structured "
         "envs)"),
        ("rejects-missing-agents", "several-agents",
         "a Hello whose env lacks the learner's agents, or has them in another order, ends "
         "the stream with INVALID_ARGUMENT (multi-agent envs)"),
        ("rejects-bad-acting", "several-agents",
         "a frame without acting, with acting of another length or dtype (multi-agent envs), "
         "or with acting for a single-agent env ends the stream with INVALID_ARGUMENT"),
        ("agent-actions-reply", "several-agents",
         "frames of turns, waiting rows and per-agent ends each get K x A valid actions, the "
         "acting rows' within their action mask, every element of a MultiDiscrete action "
         "(multi-agent envs)"),
        ("oversized-message", "errors",
         "a message above max_message_bytes ends the stream with RESOURCE_EXHAUSTED"),
        ("field-order-served", "encoding-on-the-hot-path",
         "a valid Frame whose fields come in another order is served like any other"),
        ("bad-stream-isolated", "errors",
         "a good stream is served throughout while the bad ones are refused"),
        ("frame-stack-accepted", "learnerinfo",
         "with a frame_stack offer, frames of newest frames and of whole stacks are both "
         "served (stacked envs)"),
        ("shutdown-message", "one-act-stream",
         "when the learner stops, an open stream gets a Shutdown and then ends "
         "(needs --wait-shutdown-s)"),
    ],
)  # fmt: skip

CASES: dict[str, Case] = {case.id: case for case in (*ACTOR_CASES, *LEARNER_CASES)}


class Status(enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"


@dataclass
class Verdict:
    case: Case
    status: Status
    detail: str = ""
    """For a failure, what was wrong; for a skip, why it could not be checked."""


class Skip(Exception):
    """Raised by a check that cannot judge its case here (the reason is the message)."""


@dataclass
class Report:
    """The verdicts of one suite run, in case order, and what was run against."""

    side: str
    target: str
    env: str
    verdicts: list[Verdict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """Context for a failure: the actor's last output lines, a session that timed out."""

    def of(self, case_id: str) -> Verdict:
        return next(v for v in self.verdicts if v.case.id == case_id)

    @property
    def failed(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.status is Status.FAIL]

    @property
    def ok(self) -> bool:
        return not self.failed

    def counts(self) -> dict[str, int]:
        return {s.value: sum(v.status is s for v in self.verdicts) for s in Status}

    def text(self) -> str:
        """The report as the command prints it: one line per case, failures explained."""
        width = max((len(v.case.id) for v in self.verdicts), default=10)
        lines = [f"seedrl conformance, {self.side} side: {self.target} (env {self.env})"]
        for v in self.verdicts:
            line = f"  {v.status.name:4}  {v.case.id:{width}}  {v.case.summary}"
            lines.append(line)
            if v.detail:
                prefix = "" if v.status is Status.SKIP else "see docs/wire-protocol.md#"
                more = f"        {v.detail}"
                if prefix:
                    more += f" ({prefix}{v.case.rule})"
                lines.append(more)
        lines += [f"  note: {note}" for note in self.notes]
        c = self.counts()
        lines.append(f"{c['pass']} passed, {c['fail']} failed, {c['skip']} skipped")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": "seedrl-conformance/1",
            "side": self.side,
            "target": self.target,
            "env": self.env,
            "counts": self.counts(),
            "cases": [
                {"id": v.case.id, "status": v.status.value, "detail": v.detail, "rule": v.case.rule}
                for v in self.verdicts
            ],
            "notes": self.notes,
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1) + "\n"


def select(side: str, only: str) -> list[Case]:
    """The cases of ``side`` named in ``only`` (comma-separated ids; empty: all of them)."""
    mine = [c for c in CASES.values() if c.side == side]
    wanted = [name.strip() for name in only.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in {c.id for c in mine}]
    if unknown:
        raise ValueError(
            f"--only: no {side} case {', '.join(unknown)}; the {side} cases are "
            f"{', '.join(c.id for c in mine)}"
        )
    return [c for c in mine if not wanted or c.id in wanted]


BEGIN = "<!-- conformance-cases:begin -->"
END = "<!-- conformance-cases:end -->"
UPDATE_COMMAND = "python -m seedrl.conformance cases --update docs/conformance.md"


def markdown() -> str:
    """The case tables of docs/conformance.md, one per side, from this registry."""
    lines = [f"<!-- Generated by `{UPDATE_COMMAND}`; a test fails while it is stale. -->"]
    for cases, title in (
        (ACTOR_CASES, "Actor cases: `python -m seedrl.conformance actor -- CMD`"),
        (
            LEARNER_CASES,
            "Learner cases: `python -m seedrl.conformance learner HOST:PORT`",
        ),
    ):
        lines += ["", f"### {title}", "", "| case | rule | passes when |", "|---|---|---|"]
        for case in cases:
            anchor = f'<a id="{case.id}"></a>`{case.id}`'
            rule = f"[{case.rule}](wire-protocol.md#{case.rule})"
            lines.append(f"| {anchor} | {rule} | {case.summary.replace('|', chr(92) + '|')} |")
    return "\n".join(lines) + "\n"


def update_page(page: str, block: str) -> str:
    """``page`` with the text between the markers replaced by ``block``."""
    start, end = page.find(BEGIN), page.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the page has no {BEGIN} ... {END} block")
    return page[: start + len(BEGIN)] + "\n" + block + page[end:]
