"""The MLP over a dict/tuple observation's joined leaf features (``--leaf-trunk``): what it
lets the policy express, and that nothing else changes with it."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from learner.agents.models import ActorCritic, action_head, build_model
from learner.tools.trained_policy import model_spec_from_dict
from seedrl import codec
from seedrl.config import to_json_dict

spaces = gym.spaces
TWO_BITS = spaces.Dict({"a": spaces.Discrete(2), "b": spaces.Discrete(2)})


def _fit_xor(leaf_trunk: tuple[int, ...]) -> int:
    """Fit the policy's logits to ``a XOR b`` on the four observations by cross-entropy;
    returns how many of the four its most likely action then gets right."""
    torch.manual_seed(0)
    obs_spec = codec.space_to_spec(TWO_BITS)
    head = action_head(codec.space_to_spec(spaces.Discrete(2)))
    model = build_model(obs_spec, head, hidden_sizes=(16,), leaf_trunk=leaf_trunk)
    a, b = np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1])
    packing = codec.LeafPacking(codec.space_leaves(obs_spec))
    rows = torch.from_numpy(packing.pack_values([a, b]))[None]  # [T=1, B=4, row bytes]
    target = torch.from_numpy(a ^ b)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    first = torch.zeros(1, 4, dtype=torch.bool)
    for _ in range(300):
        logits = model(rows, first)[0][0]
        loss = torch.nn.functional.cross_entropy(logits, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        return int((model(rows, first)[0][0].argmax(-1) == target).sum())


def test_a_trunk_lets_the_policy_answer_what_two_leaves_mean_together() -> None:
    # Without it each leaf's features add up in the logits: a XOR b would need
    # f(0) + g(0) < 0 and f(1) + g(1) < 0 but f(0) + g(1) > 0 and f(1) + g(0) > 0, whose
    # two sums are the same number. So at most three of the four come out right.
    assert _fit_xor(()) <= 3
    assert _fit_xor((16,)) == 4


def test_the_trunk_counts_only_for_a_dict_or_tuple_observation() -> None:
    box = codec.space_to_spec(spaces.Box(-1.0, 1.0, (4,), np.float32))
    head = action_head(codec.space_to_spec(spaces.Discrete(2)))
    torch.manual_seed(0)
    plain = build_model(box, head)
    torch.manual_seed(0)
    asked = build_model(box, head, leaf_trunk=(64,))
    assert asked.spec == plain.spec and asked.spec.leaf_trunk == ()
    for (key, mine), (other_key, theirs) in zip(
        asked.state_dict().items(), plain.state_dict().items(), strict=True
    ):
        assert key == other_key and torch.equal(mine, theirs)


@pytest.mark.parametrize("leaf_trunk", [(), (32, 8)])
def test_a_spec_with_or_without_a_trunk_round_trips_and_an_older_one_has_none(
    leaf_trunk: tuple[int, ...],
) -> None:
    obs_spec = codec.space_to_spec(TWO_BITS)
    head = action_head(codec.space_to_spec(spaces.MultiDiscrete([3, 4])))
    model = build_model(obs_spec, head, leaf_trunk=leaf_trunk)
    saved = json.loads(json.dumps(to_json_dict(model.spec)))
    assert model_spec_from_dict(saved) == model.spec
    ActorCritic(model_spec_from_dict(saved)).load_state_dict(model.state_dict())
    assert model.torso.out_size == (leaf_trunk[-1] if leaf_trunk else 2 * 16)
    if not leaf_trunk:  # a checkpoint written before the trunk existed
        del saved["leaf_trunk"]
        ActorCritic(model_spec_from_dict(saved)).load_state_dict(model.state_dict())


def test_the_defaults_join_the_leaves_through_a_trunk_and_the_tuned_presets_keep_none() -> None:
    """Unset, a dict observation's leaves meet in a 64-wide trunk (what a user's own env
    starts from); the presets tuned without one still build none."""
    from learner.agents.vtrace.agent import VTraceAgent
    from seedrl.config import LearnerConfig
    from seedrl.presets import build_config, load_preset

    action = codec.space_to_spec(spaces.Discrete(2))
    cpu = torch.device("cpu")
    model = VTraceAgent(LearnerConfig(), action, cpu).build_model(
        codec.space_to_spec(TWO_BITS), "auto"
    )
    assert model.spec.leaf_trunk == (64,) and model.torso.out_size == 64
    for preset in ("minigrid", "connect4"):
        config = build_config(LearnerConfig, {}, load_preset(preset))
        assert config.leaf_trunk == (), preset
