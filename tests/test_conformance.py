"""The conformance suite passes seedrl's own actor and learner, and fails broken ones.

Each broken actor is seedrl's actor with one rule corrupted by one line
(tests/broken_actor.py); the suite must fail exactly the case guarding that rule, with a
message naming what went wrong. The cheapest (``FAST``) run in ``make test``, the rest with
``make test-slow``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
from support import ROOT, learner_process, running

from seedrl import codec
from seedrl.conformance import probe
from seedrl.conformance.__main__ import main as conformance_main
from seedrl.conformance.actor_suite import run_actor_suite
from seedrl.conformance.cases import ACTOR_CASES, CASES, LEARNER_CASES, Status
from seedrl.conformance.config import ActorSuiteConfig, LearnerSuiteConfig
from seedrl.conformance.learner_suite import run_learner_suite
from seedrl.conformance.models import (
    BoxProbeModel,
    DictProbeModel,
    MultiDiscreteProbeModel,
    SimulProbeModel,
    StackedProbeModel,
    TurnProbeModel,
)
from seedrl.conformance.scripted import leaf_record

ACTOR_FLAGS = ["--learner", "{learner}", "--envs-per-actor", "{num_envs}",
               "--max-backoff-s", "{max_backoff_s}",
               "--allow-env-module", "seedrl.conformance.probe"]  # fmt: skip
"""seedrl's actor builds a ``module:callable`` env a learner names only when allowed to:
the probe envs are."""
PYTHON_ACTOR = [sys.executable, "-m", "actors", "actor", *ACTOR_FLAGS]
STACKED = "seedrl.conformance.probe:StackedProbe"
BOX = "seedrl.conformance.probe:BoxProbe"
DICT = "seedrl.conformance.probe:DictProbe"
MULTI = "seedrl.conformance.probe:MultiDiscreteProbe"
TURN = "seedrl.conformance.probe:TurnProbe"
SIMUL = "seedrl.conformance.probe:SimulProbe"
AGENT_ACTOR_CASES = ["agent-rows", "acting-rows", "agent-actions-applied", "agent-episode-ends"]
"""The actor cases that only a multi-agent env shows (single-agent envs skip them)."""


def broken(name: str) -> list[str]:
    return [sys.executable, str(ROOT / "tests" / "broken_actor.py"), name, *ACTOR_FLAGS]


def test_seedrl_actor_passes_every_case_on_cartpole():
    report = run_actor_suite(PYTHON_ACTOR, ActorSuiteConfig())
    assert report.ok, report.text()
    skipped = {v.case.id for v in report.verdicts if v.status is Status.SKIP}
    assert skipped == {"box-actions-clipped", "frame-stack-offered", "frame-stack-not-offered",
                       "observation-leaves", *AGENT_ACTOR_CASES}  # fmt: skip
    assert len(report.verdicts) == len(ACTOR_CASES)
    assert "CartPole-v1 is single-agent" in report.of("acting-rows").detail


@pytest.mark.parametrize(
    ("env", "cases"),
    [
        (STACKED, ["frame-stack-offered", "frame-stack-not-offered", "actions-applied",
                   "time-limit-truncation", "next-step-autoreset", "reset-frame-first"]),
        (BOX, ["box-actions-clipped", "actions-applied", "time-limit-truncation"]),
        (DICT, ["observation-leaves", "actions-applied", "time-limit-truncation",
                "next-step-autoreset", "reset-frame-first", "finite-values"]),
        (MULTI, ["actions-applied", "time-limit-truncation", "next-step-autoreset"]),
        (TURN, [*AGENT_ACTOR_CASES, "reset-frame-first", "observation-leaves", "tensor-layout",
                "k-constant", "hello-env"]),
        (SIMUL, [*AGENT_ACTOR_CASES, "reset-frame-first", "tensor-layout", "hello-env"]),
    ],
)  # fmt: skip
def test_seedrl_actor_passes_the_probe_envs(env, cases, monkeypatch):
    """The cases CartPole cannot show: frame-once stacks (uint8), Box actions clipped, a dict
    observation's leaves, MultiDiscrete actions, an AEC game's turns, a Parallel game's
    joins and leaves."""
    from seedrl.conformance import actor_suite

    kept = {}
    stream_session = actor_suite.stream_session

    def keep(ctx):  # type: ignore[no-untyped-def]
        kept["stream"] = stream_session(ctx)
        return kept["stream"]

    monkeypatch.setitem(actor_suite.SESSION_RUNNERS, "stream", keep)
    report = run_actor_suite(PYTHON_ACTOR, ActorSuiteConfig(env=env, only=",".join(cases)))
    assert [v.status for v in report.verdicts] == [Status.PASS] * len(cases), report.text()
    first, second = kept["stream"].learner.streams[:2]
    if env == STACKED:  # the offer was taken: newest frames first, whole stacks after
        assert first.info.frame_stack == probe.STACK and second.info.frame_stack == 0
        assert (first.hello.frame_stack, second.hello.frame_stack) == (probe.STACK, 0)
    if env == TURN:  # K x A rows, and every agent ended at least twice in the first stream
        assert list(first.hello.env.agents) == list(probe.TURN_AGENTS)
        frames = first.frames
        assert all(f.acting_R.shape == (3 * len(probe.TURN_AGENTS),) for f in frames)
        ends = sum(f.terminated_K | f.truncated_K for f in frames)
        assert ends.min() >= 2, ends
    if env == SIMUL:  # all act at once; every agent ended twice, s2 joined mid-episode twice
        a = len(probe.SIMUL_AGENTS)
        acting = np.array([f.acting_R for f in first.frames]).reshape(-1, 3, a)
        assert (acting.sum(axis=2) >= 2).any(), "no step where agents acted at once"
        ends = sum(f.terminated_K | f.truncated_K for f in first.frames)
        assert ends.min() >= 2, ends
        joined = acting[1:, :, 2] & ~acting[:-1, :, 2] & acting[:-1, :, 0]
        assert (joined.sum(axis=0) >= 2).all(), "s2 did not join a running episode twice"


@pytest.mark.parametrize(
    "env",
    ["multiagent_envs:JoinLeave", "multiagent_envs:turn_game", "multiagent_envs:MaskedChoices"],
)
def test_seedrl_actor_passes_multi_agent_envs_without_a_model(env, monkeypatch):
    """tests/multiagent_envs.py: a Parallel env whose agents join and leave mid-episode, an
    AEC game whose leaver is stepped dead, a Parallel env that refuses a masked
    MultiDiscrete action (the scripted learner, like a learner, never sends one). The rules
    that need no model are judged; the model cases skip, saying why."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "tests"))
    command = [*PYTHON_ACTOR, "--allow-env-module", "multiagent_envs"]
    report = run_actor_suite(command, ActorSuiteConfig(env=env, only=",".join(AGENT_ACTOR_CASES)))
    status = {v.case.id: v.status for v in report.verdicts}
    assert status == {"agent-rows": Status.PASS, "acting-rows": Status.SKIP,
                      "agent-actions-applied": Status.SKIP,
                      "agent-episode-ends": Status.PASS}, report.text()  # fmt: skip
    assert "the suite has no model of" in report.of("acting-rows").detail


# (break, env, the case it must fail, words its message must hold)
CP = "CartPole-v1"
BROKEN = [
    ("reuse-run-id", CP, "fresh-run-id", "reused run_id"),
    ("reset-reward", CP, "reset-frame-first", "first frame's rewards are [1.0, 1.0, 1.0]"),
    ("swap-actions", CP, "actions-applied", "actions applied to the wrong env?"),
    ("truncation-as-termination", CP, "time-limit-truncation",
     "reached the 500-step limit but is terminated"),
    ("reward-after-reset", STACKED, "next-step-autoreset", "reward 1.0, not 0"),
    ("k-changes", CP, "k-constant", "carry 2 envs but the Hello said K=3"),
    ("leaves-reversed", DICT, "observation-leaves",
     "leaf 'cells': dtype int8 but expected uint8 (leaves in leaf order: cells, pos, status.0"),
    ("float64-rewards", CP, "tensor-layout", "rewards: dtype float64 but expected float32"),
    ("nan-observation", CP, "finite-values", "observations hold NaN or inf"),
    ("no-clip", BOX, "box-actions-clipped", "is outside [[-1.,  0.], [1., 2.]]"),
    ("stack-unoffered", STACKED, "frame-stack-not-offered",
     "Hello.frame_stack 3 but GetInfo offered 0"),
    ("wrong-stack", STACKED, "frame-stack-offered", "Hello.frame_stack 4 but GetInfo offered 3"),
    ("no-auth", CP, "auth-metadata", "carried no authorization metadata"),
    ("wrong-kwargs", CP, "hello-env", "env_kwargs_json"),
    ("wrong-version", CP, "hello-fields", "protocol_version 2, not 1"),
    ("second-hello", CP, "hello-first", "is 'hello', not a Frame"),
    ("skip-getinfo", CP, "getinfo-first", "opened with no GetInfo answered"),
    ("late-half-close", CP, "shutdown-ends-stream", "had not ended its side 3 s later"),
    ("ignore-final", CP, "shutdown-final-exits", "after Shutdown{final: true}"),
    ("exit-on-restart", CP, "shutdown-restart-reconnects", "no new stream"),
    ("no-retry", CP, "retry-unreachable", "then never reached it"),
    ("no-retry-unavailable", CP, "retry-unavailable",
     "after UNAVAILABLE (nothing listening yet) the actor exited with status 2"),
    ("no-retry-exhausted", CP, "retry-resource-exhausted", "never tried again"),
    ("retry-everything", CP, "stop-invalid-argument", "more call(s) after INVALID_ARGUMENT"),
    ("retry-everything", CP, "stop-unauthenticated", "more call(s) after UNAUTHENTICATED"),
    ("no-jitter", CP, "backoff-jittered", "lie within 15 ms of each other: no jitter"),
    ("no-cap", CP, "backoff-capped", "exceed the cap of 0.5 s"),
    ("no-backoff", CP, "backoff-waits", "a tight retry loop"),
    ("agents-reversed", TURN, "agent-rows",
     "agents ['p2', 'p1', 'p0'], but GetInfo said ['p0', 'p1', 'p2']"),
    ("acting-shifted", TURN, "acting-rows",
     "env 0, frame 0: acting marks ['p1'], but the env applies the action of ['p0'] next"),
    ("agent-actions-rolled", TURN, "agent-actions-applied",
     "an action applied to the wrong agent?"),
    ("end-flags-kept", TURN, "agent-episode-ends",
     "row 0, frame 5 (its agent ended earlier): an end flag is set again"),
    ("agent-actions-rolled", SIMUL, "agent-actions-applied",
     "frame 1, s0 (row 0): observation [ 0. ,  1. ,  0.5,  0.5,  1. ,  1. , -1. ], but the env's "
     "rules under the actions sent give [ 0. ,  1. ,  1.5,  1.5,  2. ,  1. , -1. ]; it is what "
     "the env gives with s1's action applied to s0: an action applied to the wrong agent?"),
    ("end-flags-kept", SIMUL, "agent-episode-ends",
     "row 1, frame 4 (its agent ended earlier): an end flag is set again"),
]  # fmt: skip
FAST = {"reset-reward", "swap-actions", "agent-actions-rolled"}
SLOW = pytest.mark.slow
"""Run in ``make test`` (reuse-run-id runs there through the command line, below)."""


def _broken_params() -> list[object]:
    return [
        pytest.param(
            *row,
            id=f"{row[0]}:{row[2]}" + (":simul" if row[1] == SIMUL else ""),
            marks=() if row[0] in FAST else pytest.mark.slow,
        )
        for row in BROKEN
    ]


@pytest.mark.parametrize(("name", "env", "case", "words"), _broken_params())
def test_a_broken_actor_fails_the_case_guarding_its_rule(name, env, case, words):
    config = ActorSuiteConfig(env=env, only=case, session_timeout_s=15 if name == "no-cap" else 60)
    verdict = run_actor_suite(broken(name), config).of(case)
    assert verdict.status is Status.FAIL, (name, verdict)
    assert words in verdict.detail, verdict.detail


def test_every_actor_case_has_a_broken_actor():
    """Each rule is shown to fail once (make test-slow runs them all)."""
    assert {case for _, _, case, _ in BROKEN} == {c.id for c in ACTOR_CASES}


def test_the_command_line_fails_a_reused_run_id(tmp_path):
    """Exit 1, the case named with what was wrong, and the JSON report beside it."""
    out = tmp_path / "report.json"
    args = [sys.executable, "-m", "seedrl.conformance", "actor", "--only", "fresh-run-id",
            "--report-json", str(out), "--", *broken("reuse-run-id")]  # fmt: skip
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL  fresh-run-id" in done.stdout
    assert "stream 1 of the stream session reused run_id '0000000000000000000000000000003b'" in (
        done.stdout
    )
    report = json.loads(out.read_text())
    assert report["counts"] == {"pass": 0, "fail": 1, "skip": 0}


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["actor", "--", sys.executable, "-m", "actors"], "must contain {learner}"),
        (["actor", sys.executable], "give the actor command after --"),
        (["actor", "--only", "no-such-case", "--", "x", "{learner}"], "no actor case no-such-case"),
        (["actor", "--num-envs", "0", "--", "x"], "--num-envs must be in [1, 4096]"),
        (["learner"], "give HOST:PORT first"),
    ],
)
def test_usage_errors_exit_2_with_one_line(args, words, capsys):
    try:
        code = conformance_main(args)
    except SystemExit as exit_:  # the flag parser exits by itself
        code = exit_.code
    stderr = capsys.readouterr().err
    assert code == 2
    assert words in stderr
    assert len(stderr.strip().splitlines()) == 1, stderr


# ---------------------------------------------------------------------- the learner side


def test_seedrl_learner_passes_the_learner_side(tmp_path):
    """A real learner with a token, stopping on its own at --total-frames."""
    token = "conformance-token"
    extra = ["--auth-token", token, "--total-frames", "600", "--no-train"]
    with learner_process(tmp_path, *extra) as (learner, port):
        config = LearnerSuiteConfig(auth_token=token, wait_shutdown_s=60)
        report = run_learner_suite(f"127.0.0.1:{port}", config)
        assert learner.wait(timeout=60) == 0, learner.output()
    assert report.ok, report.text()
    skipped = {v.case.id for v in report.verdicts if v.status is Status.SKIP}
    assert skipped == {"frame-stack-accepted", "rejects-bad-leaves", "rejects-missing-agents",
                       "agent-actions-reply"}  # fmt: skip
    assert len(report.verdicts) == len(LEARNER_CASES)


LEAF_LEARNER_CASES = ("info-valid", "hello-accepted", "actions-reply", "episode-ends-served",
                      "reconnect-served", "rejects-bad-hello", "rejects-bad-frame",
                      "rejects-bad-leaves", "field-order-served", "oversized-message",
                      "bad-stream-isolated")  # fmt: skip


@pytest.mark.parametrize("env", [DICT, pytest.param(MULTI, marks=pytest.mark.slow)])
def test_seedrl_learner_passes_the_leaf_probe_envs(tmp_path, env):
    """Frames of observation leaves, MultiDiscrete actions: served, and bad ones refused."""
    extra = ["--env", env, "--total-frames", "100000", "--no-train"]
    with learner_process(tmp_path, *extra) as (_learner, port):
        report = run_learner_suite(
            f"127.0.0.1:{port}", LearnerSuiteConfig(only=",".join(LEAF_LEARNER_CASES))
        )
    skipped = {v.case.id for v in report.verdicts if v.status is Status.SKIP}
    assert report.ok and skipped == ({"rejects-bad-leaves"} if env == MULTI else set()), (
        report.text()
    )


AGENT_LEARNER_CASES = ("rejects-missing-agents", "rejects-bad-acting", "agent-actions-reply")


def test_seedrl_learner_passes_the_multi_agent_probe(tmp_path):
    """A multi-agent learner (TurnProbe: three agents, a dict observation with an action
    mask): the several-agents cases pass, and the older cases speak K x A rows to it."""
    extra = ["--env", TURN, "--total-frames", "100000", "--no-train"]
    with learner_process(tmp_path, *extra) as (_learner, port):
        report = run_learner_suite(
            f"127.0.0.1:{port}",
            LearnerSuiteConfig(only=",".join((*LEAF_LEARNER_CASES, *AGENT_LEARNER_CASES))),
        )
    assert report.ok, report.text()
    assert not [v for v in report.verdicts if v.status is Status.SKIP], report.text()


MASKED = "multiagent_envs:MaskedChoices"
TESTS_ENV = {
    "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT / "tests"), os.environ.get("PYTHONPATH"))))
}
"""What a learner needs to build tests/multiagent_envs.py's envs."""


def test_seedrl_learner_masks_every_element_of_multi_discrete_actions(tmp_path):
    """Several agents with MultiDiscrete actions under one action mask (sum(nvec) entries,
    element 0's choices first): no acting row's action has an element its mask forbids."""
    extra = ["--env", MASKED, "--total-frames", "100000", "--no-train"]
    with learner_process(tmp_path, *extra, env=TESTS_ENV) as (_learner, port):
        report = run_learner_suite(
            f"127.0.0.1:{port}", LearnerSuiteConfig(only=",".join(AGENT_LEARNER_CASES))
        )
    assert report.ok, report.text()
    assert not [v for v in report.verdicts if v.status is Status.SKIP], report.text()


# (break, env, the case it must fail, words its message must hold)
BROKEN_LEARNERS = [
    ("empty-run-id", "CartPole-v1", "rejects-bad-hello", "an empty run_id: ended with"),
    ("agents-unchecked", TURN, "rejects-missing-agents",
     "a Hello without agents: ended with OK"),
    ("acting-ignored", "CartPole-v1", "rejects-bad-acting",
     "acting set for a single-agent env: ended with OK"),
    ("mask-all-rows", TURN, "agent-actions-reply",
     "frame 0 (of episode frame 0): the stream ended with INVALID_ARGUMENT"),
    ("multi-mask-first-only", MASKED, "agent-actions-reply", "'s element 1 is "),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "env", "case", "words"),
    [pytest.param(*row, id=f"{row[0]}:{row[2]}", marks=SLOW) for row in BROKEN_LEARNERS],
)
def test_a_broken_learner_fails_the_case_guarding_its_rule(tmp_path, name, env, case, words):
    """seedrl's learner with one rule removed by one line (tests/broken_learner.py)."""
    script = ROOT / "tests" / "broken_learner.py"
    args = [sys.executable, str(script), name, "--port", "0", "--logdir", str(tmp_path),
            "--no-train", "--progress", "plain", "--no-tensorboard", "--env", env]  # fmt: skip
    with running(args, TESTS_ENV) as learner:
        line = learner.wait_for("listening on", 60)
        port = int(re.search(r"listening on \S*:(\d+) ", line)[1])
        report = run_learner_suite(f"127.0.0.1:{port}", LearnerSuiteConfig(only=case))
    verdict = report.of(case)
    assert verdict.status is Status.FAIL, report.text()
    assert words in verdict.detail, verdict.detail


# ---------------------------------------------------------------------- the parts


@pytest.mark.parametrize(("make_env", "make_model"), [
    (probe.StackedProbe, StackedProbeModel), (probe.BoxProbe, BoxProbeModel),
    (probe.DictProbe, DictProbeModel), (probe.MultiDiscreteProbe, MultiDiscreteProbeModel),
])  # fmt: skip
def test_probe_models_predict_their_envs_exactly(make_env, make_model):
    """The models are written apart from the envs; 300 random steps must agree bit for bit
    (a dict observation as the scripted learner records it: one record of its leaves)."""
    env, model = make_env(), make_model()
    spec = codec.space_to_spec(env.observation_space)

    def recorded(obs):  # type: ignore[no-untyped-def]
        if not codec.is_structured(spec):
            return obs
        leaves = codec.space_leaves(spec)
        record = np.zeros((), leaf_record(leaves))
        for leaf, value in zip(leaves, codec.flatten_values(spec, obs), strict=True):
            record[leaf.name] = value
        return record

    rng = np.random.default_rng(3)
    obs = recorded(env.reset(seed=5)[0])
    assert model.is_reset(obs)
    ends = 0
    for _ in range(300):
        action = model.choose(obs, int(rng.integers(3)), rng)
        want = model.step(obs, action)
        if isinstance(env.action_space, gym.spaces.Box):  # as a conforming actor clips
            action = np.clip(action, env.action_space.low, env.action_space.high)
        raw, reward, terminated, truncated, _ = env.step(action)
        obs = recorded(raw)
        assert model.same(want.obs, obs) and want.reward == reward
        assert want.terminated == terminated
        if terminated or truncated:
            ends += 1
            obs = recorded(env.reset()[0])
            assert model.is_reset(obs)
    assert ends > 10


def test_turn_probe_is_a_pettingzoo_aec_env():
    """PettingZoo's own API test passes it (where PettingZoo is installed)."""
    api_test = pytest.importorskip("pettingzoo.test").api_test
    api_test(probe.TurnProbe(), num_cycles=30)


def test_simul_probe_is_a_pettingzoo_parallel_env():
    """PettingZoo's own Parallel API test passes it, without a warning (a live agent left
    out of a step's dicts, or one given them after it left, warns)."""
    parallel_api_test = pytest.importorskip("pettingzoo.test").parallel_api_test
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        parallel_api_test(probe.SimulProbe(), num_cycles=30)


@pytest.mark.parametrize(
    ("make_env", "make_model", "steps"),
    [(probe.TurnProbe, TurnProbeModel, 200), (probe.SimulProbe, SimulProbeModel, 300)],
)
def test_multi_agent_probe_models_predict_seedrl_rows_exactly(make_env, make_model, steps):
    """The models are written apart from the envs; two envs stepped as rows by seedrl's
    AgentEnvs (the AEC turns, the Parallel joins and leaves) must agree with them bit for
    bit: observations, rewards, flags, acting."""
    from seedrl.envs.agents import AgentEnvs

    envs = AgentEnvs("probe", [make_env, make_env])
    model = make_model()
    a = len(model.agents)
    rng = np.random.default_rng(3)
    obs, _ = envs.reset()
    want = [model.reset(), model.reset()]
    ends = resets = 0

    def row(r):  # type: ignore[no-untyped-def]
        return {name: leaf[r] for name, leaf in obs.items()} if isinstance(obs, dict) else obs[r]

    for _ in range(steps):
        for i in range(2):
            span = slice(i * a, (i + 1) * a)
            w = want[i]
            assert np.array_equal(envs.acting[span], w.acting)
            assert np.array_equal(envs.rewards[span], w.reward)
            assert np.array_equal(envs.terminated[span], w.terminated)
            assert np.array_equal(envs.truncated[span], w.truncated)
            for j in range(a):
                if w.obs[j] is not None:
                    assert model.same(w.obs[j], row(i * a + j))
            ends += int(w.terminated.sum() + w.truncated.sum())
        actions = np.array([model.choose(row(r), r, rng) for r in range(2 * a)])
        obs, *_ = envs.step(actions)
        resets += sum(w.over for w in want)
        want = [model.reset() if w.over else model.step(w, actions[i * a : (i + 1) * a])
                for i, w in enumerate(want)]  # fmt: skip
    assert ends > 40 and resets > 15


def test_cases_are_unique_and_each_has_a_check():
    from seedrl.conformance import actor_suite, learner_suite

    assert len(CASES) == len(ACTOR_CASES) + len(LEARNER_CASES)
    assert set(actor_suite.CHECKS) == {c.id for c in ACTOR_CASES}
    assert set(learner_suite.CHECKS) == {c.id for c in LEARNER_CASES}


# ---------------------------------------------------------------------- the documents

WIRE = ROOT / "docs" / "wire-protocol.md"
PAGE = ROOT / "docs" / "conformance.md"


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def test_the_protocol_links_every_case_and_only_cases():
    linked = set(re.findall(r"conformance\.md#([a-z0-9-]+)", WIRE.read_text()))
    assert linked == set(CASES), (set(CASES) - linked, linked - set(CASES))


def test_every_case_names_a_section_of_the_protocol():
    sections = {_slug(line[3:]) for line in WIRE.read_text().splitlines() if line.startswith("## ")}
    assert {case.rule for case in CASES.values()} <= sections


def test_the_conformance_page_lists_the_cases_as_generated():
    from seedrl.conformance.cases import UPDATE_COMMAND, markdown, update_page

    text = PAGE.read_text()
    assert update_page(text, markdown()) == text, f"docs/conformance.md is stale: {UPDATE_COMMAND}"
    for case_id in CASES:
        assert f'<a id="{case_id}"></a>' in text
