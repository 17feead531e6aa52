"""Several policies in one learner (--policy-mapping): each agent group is served by its
own network and trained by its own trainer on its own agents' frames only.

:class:`~multiagent_envs.TwoTargets` rewards agent a for action 0 and agent b for action
1; untagged, both see the same observations, so only two networks can each learn their
own target. The learner is built as ``serve`` builds it (``build_learner``, the trainer
hosts, ``make_engine``) and fed frames without a transport, bounded in time.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from multiagent_envs import TARGETS
from support import actor_args, learner_process, read_records, running

from learner.agents.models import UnsupportedSetup
from learner.agents.policy import TorchPolicy
from learner.parts import Learner, assign_policies, build_learner, save_checkpoint
from learner.run import choose_host, make_engine
from learner.state import checkpoint
from seedrl import envs
from seedrl.config import LearnerConfig
from seedrl.envs.agents import AgentEnvs

TESTS = Path(__file__).resolve().parent
ENV = {"PYTHONPATH": os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)}


@pytest.fixture(autouse=True)
def _tests_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))


def _config(tmp_path: Path, tagged: bool = False, **changes: Any) -> LearnerConfig:
    settings: dict[str, Any] = {
        "env": "multiagent_envs:two_targets", "env_kwargs": {"tagged": tagged},
        "policy_mapping": ("a=pa", "b=pb"), "trainer": "thread", "logdir": str(tmp_path),
        "unroll_length": 4, "batch_size": 8, "max_queue_unrolls": 64, "seed": 1,
        "hidden_sizes": (16,), "entropy_cost": 0.0, "normalize_returns": False,
        **changes,
    }  # fmt: skip
    return LearnerConfig(**settings)


def _feed(
    learner: Learner,
    envs_per_stream: int,
    done: Callable[[], bool],
    limit_s: float,
    watch: Callable[[str, Any], None] | None = None,
) -> np.ndarray:
    """Serve one stream of ``envs_per_stream`` envs through the real engine, with each
    policy's trainer running, until ``done()`` or ``limit_s``; ``watch(policy, unrolls)``
    sees every batch a policy's trainer takes from its store. Returns the stream's slots
    (row by row: env-major, agent-minor)."""
    from learner.serving.batcher import PendingRequest
    from learner.serving.inference import Connection, FramePayload

    if watch is not None:
        for name, slot in learner.policies.items():
            get = slot.queue.get

            def taken(n: int, timeout: float | None = None, _get=get, _name=name) -> Any:
                unrolls = _get(n, timeout)
                if unrolls is not None:
                    watch(_name, unrolls)
                return unrolls

            slot.queue.get = taken  # type: ignore[method-assign]
    host = choose_host(learner)
    engine = make_engine(learner, host)
    config = learner.config
    vec = envs.make_vector_env(config.env, config.env_kwargs, envs_per_stream)
    assert isinstance(vec, AgentEnvs)
    rows = vec.num_rows
    conn = Connection("actor", "run", "peer", rows, learner.builder.allocate(rows))

    async def run() -> None:
        obs, _ = vec.reset(seed=0)
        reward = np.zeros(rows, np.float32)
        terminated, truncated = np.zeros(rows, bool), np.zeros(rows, bool)
        deadline = time.monotonic() + limit_s
        while not done() and time.monotonic() < deadline:
            payload = FramePayload(
                conn, np.ascontiguousarray(obs, np.float32).tobytes(), reward.tobytes(),
                terminated.tobytes(), truncated.tobytes(), vec.acting.tobytes(),
            )  # fmt: skip
            future = asyncio.get_running_loop().create_future()
            await engine.process([PendingRequest(payload, rows, future)])
            obs, reward, terminated, truncated, _ = vec.step(future.result().copy())
            reward = reward.astype(np.float32)
            terminated, truncated = terminated.copy(), truncated.copy()
            await asyncio.sleep(0)

    host.start()
    try:
        asyncio.run(run())
    finally:
        host.stop()
    assert host.error is None, host.error
    return conn.slot_ids


def _greedy(learner: Learner, policy: str) -> int:
    """The policy's most likely action on the agents' shared observation."""
    model = learner.policies[policy].state.model
    act = TorchPolicy(model, learner.head, learner.device, "fp32", True)
    action, _, _ = act(np.array([[1.0, 0.0]], np.float32), np.array([False]), (), None)
    return int(action[0])


def test_each_group_learns_its_own_target(tmp_path) -> None:
    """a=pa, b=pb on agents that look alike: each policy's greedy action is its own agent's
    target (one network could not learn both), each trained by its own trainer."""
    learner = build_learner(_config(tmp_path, seed=7))
    assert list(learner.policies) == ["pa", "pb"]
    assert (_greedy(learner, "pa"), _greedy(learner, "pb")) == (1, 0), "both start off target"
    assert learner.policies["pa"].state.model is not learner.policies["pb"].state.model

    def learned() -> bool:
        steps = [slot.step_counter.value for slot in learner.policies.values()]
        return min(steps) >= 60 and _greedy(learner, "pa") == 0 and _greedy(learner, "pb") == 1

    _feed(learner, 8, learned, limit_s=120)
    assert _greedy(learner, "pa") == TARGETS["a"]
    assert _greedy(learner, "pb") == TARGETS["b"]
    assert all(slot.step_counter.value > 0 for slot in learner.policies.values())
    assert learner.learner_steps == sum(s.step_counter.value for s in learner.policies.values())


def test_a_groups_frames_never_reach_the_other_policys_trainer(tmp_path) -> None:
    """Tagged observations name each row's agent: every unroll a policy's trainer takes
    holds its own agent's rows only, and both trainers take some."""
    learner = build_learner(_config(tmp_path, tagged=True))
    tags: dict[str, set[float]] = {"pa": set(), "pb": set()}
    frames: dict[str, int] = {"pa": 0, "pb": 0}

    def watch(policy: str, unrolls: Any) -> None:
        tags[policy].update(np.unique(unrolls.obs[..., 1]).tolist())
        frames[policy] += unrolls.first.size

    def enough() -> bool:
        return min(slot.step_counter.value for slot in learner.policies.values()) >= 5

    offered: list[tuple[np.ndarray, np.ndarray]] = []  # what --record-dataset would get

    class Recorder:
        def offer(self, unrolls: Any, slot_N: np.ndarray, index_N: np.ndarray) -> None:
            offered.append((unrolls.obs[:, 0, 1].copy(), slot_N.copy()))

    learner.recorder = Recorder()  # type: ignore[assignment]
    slots = _feed(learner, 4, enough, limit_s=60, watch=watch)
    assert frames["pa"] > 0 and frames["pb"] > 0
    assert tags == {"pa": {0.0}, "pb": {1.0}}
    agent_of_slot = {int(slot): row % 2 for row, slot in enumerate(slots)}
    assert offered and all(
        [agent_of_slot[int(s)] for s in slot_N] == tag_N.tolist() for tag_N, slot_N in offered
    ), "each recorded unroll named by its own slots"
    assert learner.policies["pa"].stats.frames > 0 and learner.policies["pb"].stats.frames > 0
    assert learner.stats.frames == sum(s.stats.frames for s in learner.policies.values())


def test_several_policies_survive_a_checkpoint_round_trip(tmp_path) -> None:
    """Each policy under its name in the checkpoint (no top-level model), each restored
    with its step count on --resume; a resume with another mapping, and the tools that
    play one policy, refuse it in one line."""
    config = _config(tmp_path)
    learner = build_learner(config)
    _feed(learner, 4, lambda: learner.policies["pb"].step_counter.value >= 3, limit_s=60)
    save_checkpoint(learner)
    saved = checkpoint.load(config.checkpoint_path)
    assert "model" not in saved and set(saved[checkpoint.POLICIES]) == {"pa", "pb"}
    steps = {name: slot.step_counter.value for name, slot in learner.policies.items()}
    assert saved["learner_steps"] == sum(steps.values())
    resumed = build_learner(config.with_changes(resume=True))
    for name, slot in resumed.policies.items():
        assert slot.step_counter.value == steps[name]
        theirs = learner.policies[name].state.model.state_dict()
        for key, value in slot.state.model.state_dict().items():
            torch.testing.assert_close(value, theirs[key])
    pa, pb = (resumed.policies[n].state.model.state_dict() for n in ("pa", "pb"))
    assert any(not torch.equal(pa[k], pb[k]) for k in pa), "two networks, not one saved twice"
    with pytest.raises(checkpoint.CheckpointError, match="trained policies"):
        build_learner(config.with_changes(resume=True, policy_mapping=()))
    from learner.agents.trained_policy import Policy

    with pytest.raises(checkpoint.CheckpointError, match="holds several policies"):
        Policy.load(config.checkpoint_path)


def test_one_policy_keeps_todays_checkpoint_keys(tmp_path) -> None:
    """Without --policy-mapping the learner has one policy, and its checkpoint the keys
    it always had (old checkpoints load, old tools read new ones)."""
    config = _config(tmp_path, policy_mapping=())
    learner = build_learner(config)
    assert list(learner.policies) == ["default"] and learner.agent_policy is None
    assert learner.policies["default"].state is learner.state
    save_checkpoint(learner)
    saved = checkpoint.load(config.checkpoint_path)
    assert checkpoint.POLICIES not in saved
    assert {"model", "optimizer", "learner_steps", "torch_rng"} <= set(saved)
    with pytest.raises(checkpoint.CheckpointError, match="trained one policy"):
        build_learner(config.with_changes(resume=True, policy_mapping=("a=pa", "b=pb")))
    build_learner(config.with_changes(resume=True))
    one = build_learner(config.with_changes(resume=True, policy_mapping=("a=pa", "*=pa")))
    assert list(one.policies) == ["default"] and one.agent_policy is None, "one policy, as ever"


def test_a_mapping_that_does_not_fit_is_refused_in_one_line() -> None:
    spec = envs.describe_env("multiagent_envs:two_targets")
    star = LearnerConfig(policy_mapping=("a=pa", "*=rest"))
    names, agent_policy = assign_policies(star, spec)
    assert names == ["pa", "rest"] and agent_policy is not None
    assert agent_policy.tolist() == [0, 1]
    first = LearnerConfig(policy_mapping=("b=pb",))  # unmapped agents: the first policy named
    assert np.array_equal(assign_policies(first, spec)[1], [0, 0])  # type: ignore[arg-type]
    misfits: list[tuple[tuple[str, ...], str]] = [
        (("a=pa", "z=pb"), "names agent 'z'; multiagent_envs:two_targets has agents"),
        (("a=pa", "b=pb", "*=pc"), "policy 'pc' has no agent"),
    ]
    for mapping, words in misfits:
        with pytest.raises(UnsupportedSetup, match=words):
            assign_policies(
                LearnerConfig(env="multiagent_envs:two_targets", policy_mapping=mapping), spec
            )
    with pytest.raises(UnsupportedSetup, match="has one agent"):
        assign_policies(LearnerConfig(policy_mapping=("a=pa",)), envs.describe_env("CartPole-v1"))
    malformed: list[tuple[tuple[str, ...], str]] = [
        (("a",), "takes agent_id=policy items"),
        (("a=pa", "a=pb"), "names agent 'a' twice"),
    ]
    for mapping, words in malformed:
        with pytest.raises(ValueError, match=words):
            LearnerConfig(policy_mapping=mapping)
    with pytest.raises(ValueError, match="--policy-mapping and --self-play"):
        LearnerConfig(policy_mapping=("a=pa",), self_play=True)


@pytest.mark.parametrize(
    ("extra", "environ", "words"),
    [
        (["--policy-mapping", "a=pa,z=pb"], {}, "--policy-mapping names agent 'z'"),
        (["--policy-mapping", "a=pa,b=pb"], {"WORLD_SIZE": "2", "RANK": "0"},
         "--policy-mapping cannot run under torchrun"),
    ],
)  # fmt: skip
def test_the_learner_stops_with_one_line(tmp_path, extra, environ, words) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "learner", "--env", "multiagent_envs:two_targets",
         "--logdir", str(tmp_path), *extra],
        env={**os.environ, **ENV, **environ}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], result.stderr


@pytest.mark.long
@pytest.mark.parametrize("serving", [[], ["--serving-processes", "1"]], ids=["one", "frontend"])
def test_two_policies_train_from_the_commands(tmp_path, serving) -> None:
    """Learner (each policy's trainer a child process) and actor processes: each policy's
    metrics under policy/NAME/, both trained, the checkpoint holds both, and evaluate
    refuses it in one line; also served by a frontend, whose unrolls and episodes reach
    each policy's own store and stats."""
    args = ["--env", "multiagent_envs:two_targets", "--policy-mapping", "a=pa,b=pb",
            "--total-frames", "3000", "--unroll-length", "4", "--batch-size", "8",
            "--checkpoint-interval-s", "3600", "--trainer", "process", *serving]  # fmt: skip
    with learner_process(tmp_path, *args, env=ENV, timeout=180) as (learner, port):
        allow = ["--allow-env-module", "multiagent_envs"]
        with running(actor_args(port, 1, 4, *allow), env=ENV) as actors:
            code = learner.wait(240)
    assert code == 0, "\n".join(learner.lines[-30:])
    if serving:
        assert "serving by 1 frontend" in learner.output()
        assert not any("Traceback" in line for line in learner.lines), learner.output()
    assert not any("Traceback" in line for line in actors.lines), "\n".join(actors.lines[-30:])
    last = read_records(tmp_path)[-1]
    for name in ("pa", "pb"):
        assert last[f"policy/{name}/learner_steps"] > 0
        assert last[f"policy/{name}/frames"] > 0
    assert (
        last["learner_steps"] == last["policy/pa/learner_steps"] + last["policy/pb/learner_steps"]
    )
    queued = last["policy/pa/queue_unrolls"] + last["policy/pb/queue_unrolls"]
    assert last["queue_unrolls"] == queued
    saved = checkpoint.load(tmp_path / "checkpoint.pt")
    assert set(saved[checkpoint.POLICIES]) == {"pa", "pb"}
    result = subprocess.run(
        [sys.executable, "-m", "learner", "evaluate", "--checkpoint", str(tmp_path),
         "--episodes", "1"],
        env={**os.environ, **ENV}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "holds several policies" in lines[0], result.stderr
