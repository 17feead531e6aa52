"""Self-play's stacked snapshots: every row's policy parameters under its own member's
weights, in one call, must equal what that member's model computes on its own."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from learner.agents.ensemble import VMAP_FROM, StackedModels
from learner.agents.models import ActorCritic, action_head, build_model
from learner.agents.policy import TorchPolicy
from learner.agents.r2d2.policy import EpsilonGreedyPolicy
from seedrl import codec

# Every leaf encoder a snapshot can have: mask, embedding, CNN and MLP.
LEAVES = spaces.Dict(
    {
        "action_mask": spaces.MultiBinary(5),
        "pos": spaces.Box(-1, 1, (3,), np.float32),
        "direction": spaces.Discrete(4),
        "image": spaces.Box(0, 255, (1, 6, 6), np.uint8),
    }
)


def _model(seed: int, lstm_size: int = 0) -> ActorCritic:
    torch.manual_seed(seed)
    head = action_head(codec.space_to_spec(spaces.Discrete(5)), masked=True)
    obs_spec = codec.space_to_spec(LEAVES)
    return build_model(
        obs_spec, head, "auto", (16,), lstm_size, mask_leaf="action_mask", cnn_channels=(8, 8)
    )


def _rows(n: int, seed: int) -> np.ndarray:
    spec = codec.space_to_spec(LEAVES)
    LEAVES.seed(seed)
    samples = [codec.flatten_values(spec, LEAVES.sample()) for _ in range(n)]
    leaves = codec.space_leaves(spec)
    values = [np.stack([np.asarray(s[i], x.dtype) for s in samples]) for i, x in enumerate(leaves)]
    values[0][:, 0] = 1  # one legal move at least
    return codec.LeafPacking(leaves).pack_values(values)


def _alone(model: ActorCritic, rows: np.ndarray) -> torch.Tensor:
    """The member's own forward pass on its rows: what each stacked row must equal."""
    with torch.no_grad():
        params, _ = model.act(
            torch.from_numpy(rows)[None], torch.zeros((1, len(rows)), dtype=torch.bool)
        )
    return params[0]


@pytest.mark.parametrize("members", [2, VMAP_FROM + 2])
def test_each_row_gets_its_own_members_parameters_in_any_row_order(members: int) -> None:
    """A pass per member below VMAP_FROM members, one vmapped pass from there: either way
    each row's parameters are its own member's, wherever the row sits in the batch."""
    models = {10 * (i + 1): _model(i + 1) for i in range(members)}
    stacked = StackedModels(_model(0))
    for member, model in models.items():
        stacked.add(member, model.state_dict())
    # Unequal groups (1, 3, 5, ... rows), interleaved.
    member_B = np.concatenate([[m] * (2 * i + 1) for i, m in enumerate(models)])
    member_B = member_B[np.random.default_rng(5).permutation(len(member_B))]
    rows = _rows(len(member_B), seed=4)
    got = stacked.act(rows, member_B)
    assert got.shape == (len(member_B), 10)
    for member, model in models.items():
        mine = member_B == member
        want = _alone(model, rows[mine])
        torch.testing.assert_close(got[torch.from_numpy(mine)], want, rtol=1e-5, atol=1e-5)
    # The members really differ: one member's weights on another's rows do not match.
    assert not torch.allclose(_alone(models[10], rows), _alone(models[20], rows), atol=1e-3)


def test_a_removed_members_place_is_reused_by_the_next_and_the_stack_keeps_the_rest() -> None:
    stacked = StackedModels(_model(0))
    for member in range(4):  # the stack grows by doubling: now exactly full
        stacked.add(member, _model(member + 1).state_dict())
    capacity = len(next(iter(stacked._stack.values())))
    assert capacity == 4
    stacked.remove(2)
    assert 2 not in stacked and len(stacked) == 3
    newcomer = _model(99)
    stacked.add(7, newcomer.state_dict())
    assert len(next(iter(stacked._stack.values()))) == capacity, "the freed place reused"
    rows = _rows(6, seed=1)
    torch.testing.assert_close(stacked.act(rows, np.full(6, 7)), _alone(newcomer, rows))
    torch.testing.assert_close(stacked.act(rows, np.full(6, 3)), _alone(_model(4), rows))
    with pytest.raises(ValueError, match="already held"):
        stacked.add(7, newcomer.state_dict())


def test_weights_of_another_architecture_or_a_recurrent_template_are_refused() -> None:
    stacked = StackedModels(_model(0))
    other = build_model(
        codec.space_to_spec(spaces.Box(-1, 1, (4,), np.float32)),
        action_head(codec.space_to_spec(spaces.Discrete(2))),
        "mlp",
        (8,),
    )
    with pytest.raises(ValueError, match="do not match the template"):
        stacked.add(0, other.state_dict())
    with pytest.raises(ValueError, match="feed-forward"):
        StackedModels(_model(0, lstm_size=8))


def test_choose_is_the_second_half_of_a_policy_call() -> None:
    """Self-play computes the snapshots' parameters itself and asks the agent's policy to
    ``choose``: the same draws as a whole call, per-slot epsilons included."""
    model, rows = _model(1), _rows(40, seed=2)
    first = np.zeros(40, bool)
    head = action_head(codec.space_to_spec(gym.spaces.Discrete(5)), masked=True)
    policy = TorchPolicy(model, head, torch.device("cpu"))
    torch.manual_seed(0)
    whole, params, _ = policy(rows, first, ())
    torch.manual_seed(0)
    assert np.array_equal(policy.choose(torch.from_numpy(params)), whole)
    epsilons = np.array([0.0, 1.0])  # slot 0 greedy, slot 1 uniformly random
    slot_B = np.arange(40) % 2
    greedy = EpsilonGreedyPolicy(model, torch.device("cpu"), epsilons, seed=3)
    whole, q, _ = greedy(rows, first, (), slot_B)
    again = EpsilonGreedyPolicy(model, torch.device("cpu"), epsilons, seed=3)
    chosen = again.choose(torch.from_numpy(q), slot_B)
    assert np.array_equal(chosen, whole)
    assert np.array_equal(chosen[::2], q[::2].argmax(axis=1)), "slot 0 acts greedily"
    assert not np.array_equal(chosen[1::2], q[1::2].argmax(axis=1)), "slot 1 explores"
