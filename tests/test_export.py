"""``python -m learner export``: the exported file acts as the learner does.

Each case builds a learner from a config, gives its observation statistics something to
fold in, writes the checkpoint with the learner's own writer, exports it, and runs the
file (onnxruntime for ONNX, ``torch.jit.load`` for TorchScript) against the learner's own
inference (:func:`learner.agents.policy.inference_policy` after its normaliser) on
observations recorded from the env: the same greedy actions, parameters within 1e-5,
and for the LSTM the same core state carried step after step. A population's checkpoint
exports its best member, ``--member N`` another.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from population_support import BEST, observations, population_checkpoint

from learner.__main__ import main as learner_main
from learner.agents.policy import inference_policy
from learner.parts import build_learner, save_checkpoint
from learner.tools import export as export_module
from learner.tools.trained_policy import Policy
from seedrl import codec
from seedrl.config import LearnerConfig

ort = pytest.importorskip("onnxruntime")

ENVS = 3
STEPS = 12
CASES = {
    "mlp": {"env": "CartPole-v1", "normalize_observations": True},
    "cnn": {"env": "MinAtar/Breakout-v1"},
    "lstm": {"env": "CartPole-v1", "lstm": True, "lstm_size": 16, "normalize_observations": True},
    "masked-dict": {"env": "spaces_envs:masked_choice", "normalize_observations": True},
    "dict-trunk": {"env": "spaces_envs:masked_choice", "leaf_trunk": (16,)},
    "r2d2-lstm": {"env": "CartPole-v1", "agent": "r2d2", "lstm": True, "lstm_size": 16},
}


def _checkpoint(tmp_path: Path, **overrides: Any) -> tuple[Path, LearnerConfig]:
    config = LearnerConfig(logdir=str(tmp_path / "run"), **overrides)
    learner = build_learner(config)
    if learner.normalizer is not None:  # statistics far from (0, 1), so folding them matters
        rows = _rows(Policy(learner.model, learner.head, learner.env_spec), 64, seed=5)
        learner.normalizer.update(rows * 3.0 + 2.0 if rows.dtype.kind == "f" else rows)
    save_checkpoint(learner)
    return config.checkpoint_path, config


def _recorded(policy: Policy, count: int, seed: int) -> list[Any]:
    """Observations the env returns under random actions (reset when an episode ends)."""
    env = policy.make_env()
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    seen = [obs]
    while len(seen) < count:
        if isinstance(obs, dict) and "action_mask" in obs:
            action = int(np.flatnonzero(obs["action_mask"])[0])
        else:
            action = env.action_space.sample()
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            obs, _ = env.reset()
        seen.append(obs)
    env.close()
    return seen


def _rows(policy: Policy, count: int, seed: int) -> np.ndarray:
    """Recorded observations as the learner's rows (packed for a dict space)."""
    space = policy.env_spec.observation_space
    seen = _recorded(policy, count, seed)
    if not codec.is_structured(space):
        return np.stack([np.asarray(o, np.dtype(space.dtype)) for o in seen])
    leaves = [codec.flatten_values(space, o) for o in seen]
    columns = [np.stack([np.asarray(x[i]) for x in leaves]) for i in range(len(leaves[0]))]
    packing = codec.LeafPacking(codec.space_leaves(space))
    leaves_of = zip(columns, packing.leaves, strict=True)
    return packing.pack_values([c.astype(leaf.dtype) for c, leaf in leaves_of])


def _inputs(policy: Policy, rows_BR: np.ndarray) -> dict[str, np.ndarray]:
    """The exported file's observation inputs for the learner's rows."""
    space = policy.env_spec.observation_space
    if not codec.is_structured(space):
        return {"obs": rows_BR}
    packing = codec.LeafPacking(codec.space_leaves(space))
    return {
        leaf.name: values
        for leaf, values in zip(packing.leaves, packing.unpack(rows_BR), strict=True)
    }


def _learner_steps(policy: Policy, rows_TBR: np.ndarray) -> list[tuple[np.ndarray, ...]]:
    """(greedy action, params, core state after) per step, as the learner's inference runs."""
    run = inference_policy(policy.model, policy.head, torch.device("cpu"), "torch", 0)
    state = tuple(s.numpy() for s in policy.model.initial_state(rows_TBR.shape[1]))
    first = np.zeros(rows_TBR.shape[1], bool)
    out = []
    for rows_BR in rows_TBR:
        obs = rows_BR if policy.normalizer is None else policy.normalizer.normalize(rows_BR)
        _, params_BP, state = run(obs, first, state)
        greedy = policy.head.greedy(torch.from_numpy(params_BP)).numpy()
        out.append((greedy, params_BP, *state))
    return out


def _onnx_steps(path: Path, policy: Policy, rows_TBR: np.ndarray) -> list[list[np.ndarray]]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    hidden = policy.model.spec.lstm_size
    state = [np.zeros((rows_TBR.shape[1], hidden), np.float32)] * (2 if hidden else 0)
    out = []
    for rows_BR in rows_TBR:
        feeds = _inputs(policy, rows_BR)
        if hidden:
            feeds.update(zip(export_module.STATE_NAMES, state, strict=True))
        got = session.run(None, feeds)
        state = got[2:]
        out.append(got)
    return out


def _torchscript_steps(path: Path, policy: Policy, rows_TBR: np.ndarray) -> list[list[np.ndarray]]:
    module = torch.jit.load(str(path))
    hidden = policy.model.spec.lstm_size
    state = [torch.zeros(rows_TBR.shape[1], hidden)] * (2 if hidden else 0)
    out = []
    for rows_BR in rows_TBR:
        leaves = _inputs(policy, rows_BR).values()
        feeds = [torch.from_numpy(np.ascontiguousarray(v)) for v in leaves]
        with torch.no_grad():
            got = module(*feeds, *state)
        state = list(got[2:])
        out.append([t.numpy() for t in got])
    return out


@pytest.mark.parametrize("fmt", export_module.FORMATS)
@pytest.mark.parametrize("case", list(CASES))
def test_exported_policy_acts_as_the_learner(tmp_path: Path, case: str, fmt: str) -> None:
    path, _ = _checkpoint(tmp_path, **CASES[case])
    out = tmp_path / f"policy.{fmt}"
    args = ["export", "--checkpoint", str(path), "--format", fmt, "--out", str(out)]
    assert learner_main(args) == 0
    policy = Policy.load(path)
    rows = _rows(policy, ENVS * STEPS, seed=1)
    rows_TBR = rows.reshape(STEPS, ENVS, *rows.shape[1:])
    expected = _learner_steps(policy, rows_TBR)
    steps = _onnx_steps if fmt == "onnx" else _torchscript_steps
    got = steps(out, policy, rows_TBR)
    for want, have in zip(expected, got, strict=True):
        np.testing.assert_array_equal(have[0], want[0])  # greedy actions
        for w, h in zip(want[1:], have[1:], strict=True):  # params, then core state
            np.testing.assert_allclose(h, w, rtol=0, atol=1e-5)
    if policy.normalizer is not None:  # the statistics must matter, or folding is untested
        raw = _learner_steps(Policy(policy.model, policy.head, policy.env_spec), rows_TBR)
        assert not np.allclose(raw[0][1], expected[0][1], atol=1e-5)


def test_sidecar_describes_inputs_outputs_and_spaces(tmp_path: Path) -> None:
    path, _ = _checkpoint(tmp_path, **CASES["lstm"])
    out = tmp_path / "policy.onnx"
    assert learner_main(["export", "--checkpoint", str(path), "--out", str(out)]) == 0
    described = json.loads(out.with_name("policy.onnx.json").read_text())
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    for entry, node in zip(described["inputs"], session.get_inputs(), strict=True):
        assert entry["name"] == node.name and entry["shape"][1:] == node.shape[1:]
    assert [o["name"] for o in described["outputs"]] == [o.name for o in session.get_outputs()]
    assert described["action_space"] == {"kind": "discrete", "shape": [], "dtype": "int64", "n": 2}
    assert described["inputs"][0] == {"name": "obs", "dtype": "float32", "shape": ["batch", 4]}
    assert described["normalization"].startswith("folded in")


def test_masked_actions_are_never_chosen(tmp_path: Path) -> None:
    """A mask that allows one action only: the export picks it whatever the logits say."""
    path, _ = _checkpoint(tmp_path, **CASES["masked-dict"])
    out = tmp_path / "policy.onnx"
    assert learner_main(["export", "--checkpoint", str(path), "--out", str(out)]) == 0
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    mask = np.zeros((6, 6), np.int8)
    mask[np.arange(6), np.arange(6)[::-1]] = 1
    cue = np.eye(6, dtype=np.float32)
    action, params = session.run(None, {"action_mask": mask, "cue": cue})
    np.testing.assert_array_equal(action, np.arange(6)[::-1])
    np.testing.assert_array_equal(params[:, 6:], mask)


def test_export_refuses_a_missing_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = learner_main(
        ["export", "--checkpoint", str(tmp_path / "none.pt"), "--out", str(tmp_path / "p.onnx")]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "no checkpoint file" in err


@pytest.mark.parametrize(("flags", "member"), [([], BEST), (["--member", "1"], 1)])
def test_a_population_exports_its_best_member_or_the_one_asked_for(
    tmp_path: Path, flags: list[str], member: int
) -> None:
    """Member k of the checkpoint always chooses action k: the file chooses the chosen
    member's action for every observation, and its sidecar names the member."""
    path = population_checkpoint(tmp_path / "run")
    out = tmp_path / "policy.pt"
    args = ["export", "--checkpoint", str(path), "--format", "torchscript", "--out", str(out)]
    assert learner_main([*args, *flags]) == 0
    action = torch.jit.load(str(out))(torch.from_numpy(observations(16)))[0]
    assert action.tolist() == [member] * 16
    assert json.loads(out.with_name("policy.pt.json").read_text())["member"] == f"member{member}"


def test_a_bad_member_is_refused_in_one_line_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    population = population_checkpoint(tmp_path / "population")
    alone, _ = _checkpoint(tmp_path, env="CartPole-v1")
    for path, member, words in (
        (population, "3", "--member 3: the population has members 0 to 2"),
        (population, "-1", "--member -1: the population has members 0 to 2"),
        (alone, "0", "--member 0 picks a member of a population"),
    ):
        out = tmp_path / "p.pt"
        code = learner_main(
            ["export", "--checkpoint", str(path), "--member", member, "--out", str(out)]
        )
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and words in err, err
        assert not out.exists()


def _doc_runner() -> str:
    """The runner that docs/usage.md shows, as the code block under its heading."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "usage.md").read_text()
    section = text.split("## Exporting a policy", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "docs/usage.md: no python block under 'Exporting a policy'"
    return match.group(1)


def test_documented_runner_plays_an_exported_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The doc's runner, verbatim (but for a few steps), needs only onnxruntime and numpy."""
    path, _ = _checkpoint(tmp_path, env="CartPole-v1")
    out = tmp_path / "policy.onnx"
    assert learner_main(["export", "--checkpoint", str(path), "--out", str(out)]) == 0
    code = _doc_runner()
    imported = set(re.findall(r"^(?:import|from) (\w+)", code, re.M))
    assert imported == {"sys", "gymnasium", "numpy", "onnxruntime"}
    assert len([line for line in code.splitlines() if line.strip()]) <= 15
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", ["runner", str(out), "3"])
    printed: list[str] = []
    namespace: dict[str, Any] = {"print": lambda *a: printed.append(" ".join(map(str, a)))}
    exec(compile(code, "docs/usage.md", "exec"), namespace)
    returns = [float(line.split()[-1]) for line in printed if line.startswith("return")]
    assert len(returns) == 3 and all(r >= 1 for r in returns)
