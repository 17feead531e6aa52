"""``--mirror``: each unroll is also trained on as its left-right mirror image
(``learner.agents.mirror``). The expected images come from the game itself: Connect Four
played with every move mirrored must show the mirrored board and mask."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from learner.agents.mirror import Mirror
from learner.agents.models import UnsupportedSetup, action_head, build_model
from seedrl import codec
from seedrl.config import LearnerConfig
from seedrl.proto import seedrl_pb2 as pb

connect_four_v3 = pytest.importorskip("pettingzoo.classic.connect_four_v3")

MOVES = [3, 3, 4, 0, 6, 5, 5, 1, 2]
"""An opening with pieces in six of the seven columns, none of them symmetric."""


def _played(moves: list[int]) -> tuple[list[dict], pb.SpaceSpec]:
    """The observation of the player to move after each move of ``moves``."""
    env = connect_four_v3.env()
    env.reset(seed=0)
    seen = []
    for move in moves:
        env.step(move)
        seen.append(env.observe(env.agent_selection))
    return seen, codec.space_to_spec(env.observation_space(env.agents[0]))


def _packed(observations: list[dict], spec: pb.SpaceSpec) -> torch.Tensor:
    leaves = codec.space_leaves(spec)
    values = [np.stack([obs[leaf.name] for obs in observations]) for leaf in leaves]
    return torch.from_numpy(codec.LeafPacking(leaves).pack_values(values))


def _connect_four_mirror() -> tuple[Mirror, pb.SpaceSpec]:
    _, spec = _played([])
    head = action_head(pb.SpaceSpec(kind="discrete", n=7), masked=True)
    model = build_model(spec, head, "auto", mask_leaf="action_mask")
    return Mirror(model.spec, head), spec


def test_a_mirrored_game_shows_the_mirrored_board_and_mask():
    mirror, spec = _connect_four_mirror()
    played, _ = _played(MOVES)
    flipped, _ = _played([6 - move for move in MOVES])
    rows = _packed(played, spec).reshape(len(MOVES), 1, -1)  # [T, B, row bytes]
    expected = _packed(flipped, spec).reshape(len(MOVES), 1, -1)
    assert not torch.equal(rows, expected)  # the opening is not its own mirror image
    assert torch.equal(mirror.obs(rows), expected)


def test_the_mirror_image_is_played_with_the_same_probabilities():
    """Action a under logits and mask becomes 6 - a under the reversed ones, at the same
    log-probability, so V-trace's importance weights carry over."""
    mirror, _ = _connect_four_mirror()
    head = action_head(pb.SpaceSpec(kind="discrete", n=7), masked=True)
    logits = torch.randn(5, 2, 7)
    mask = torch.tensor([1.0, 0, 1, 1, 1, 1, 1]).expand(5, 2, 7)
    params = torch.cat([logits, mask], dim=-1)
    action = torch.tensor([0, 2, 3, 4, 6]).reshape(5, 1).expand(5, 2)
    batch = {
        "obs": torch.zeros(5, 2, 7 + 84, dtype=torch.uint8),
        "first": torch.zeros(5, 2, dtype=torch.bool),
        "action": action,
        "behaviour_params": params,
    }
    doubled = mirror(batch)
    assert {key: value.shape[1] for key, value in doubled.items()} == dict.fromkeys(batch, 4)
    for key, value in batch.items():  # the batch as played comes first, unchanged
        assert torch.equal(doubled[key][:, :2], value)
    image_action, image_params = doubled["action"][:, 2:], doubled["behaviour_params"][:, 2:]
    assert torch.equal(image_action, 6 - action)
    assert torch.equal(image_params[..., 7:], mask.flip(-1))
    torch.testing.assert_close(
        head.log_prob(image_params, image_action), head.log_prob(params, action)
    )


def test_a_channels_first_image_flips_its_last_axis():
    head = action_head(pb.SpaceSpec(kind="discrete", n=3))
    spec = pb.SpaceSpec(kind="box", shape=[4, 10, 10], dtype="uint8")
    mirror = Mirror(build_model(spec, head, "auto").spec, head)
    frames = torch.arange(2 * 3 * 400, dtype=torch.int64).reshape(2, 3, 4, 10, 10)
    mirrored = mirror.obs(frames)
    assert torch.equal(mirrored[..., 0], frames[..., 9])
    assert torch.equal(mirrored[:, :, :, 4, :], frames[:, :, :, 4, :].flip(-1))


@pytest.mark.parametrize(
    ("obs_spec", "action_spec", "lstm_size", "refusal"),
    [
        (pb.SpaceSpec(kind="box", shape=[4], dtype="float32"),
         pb.SpaceSpec(kind="discrete", n=2), 0, "image observation"),
        (pb.SpaceSpec(kind="box", shape=[4, 10, 10], dtype="uint8"),
         pb.SpaceSpec(kind="discrete", n=3), 16, "--lstm"),
        (pb.SpaceSpec(kind="box", shape=[4, 10, 10], dtype="uint8"),
         codec.space_to_spec(gym.spaces.MultiDiscrete([3, 3])), 0, "Discrete"),
    ],
)  # fmt: skip
def test_what_has_no_known_mirror_image_is_refused(obs_spec, action_spec, lstm_size, refusal):
    head = action_head(action_spec)
    model = build_model(obs_spec, head, "auto", lstm_size=lstm_size)
    with pytest.raises(UnsupportedSetup, match=refusal):
        Mirror(model.spec, head)


def test_a_vector_leaf_beside_the_board_is_refused():
    spec = codec.space_to_spec(gym.spaces.Dict({
        "board": gym.spaces.Box(0, 1, (6, 7, 2), np.int8),
        "score": gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
    }))  # fmt: skip
    head = action_head(pb.SpaceSpec(kind="discrete", n=7))
    with pytest.raises(UnsupportedSetup, match="'score' is neither an image"):
        Mirror(build_model(spec, head, "auto").spec, head)


def test_only_v_trace_trains_on_mirror_images():
    assert LearnerConfig(mirror=True).mirror
    with pytest.raises(ValueError, match="--agent r2d2"):
        LearnerConfig(mirror=True, agent="r2d2")


def test_a_mirror_run_trains_on_the_game_and_its_mirrored_replay():
    """V-trace's loss with --mirror on one game is its loss without it on the game beside
    the game replayed with every move mirrored, boards and masks from the env itself (and
    the behaviour logits reversed: the mirror-image policy played the replay)."""
    from learner.agents.vtrace.agent import VTraceAgent
    from learner.common.schedules import StepClock

    played, spec = _played(MOVES)
    replayed, _ = _played([6 - move for move in MOVES])
    rows = len(MOVES)
    torch.manual_seed(0)
    logits = torch.randn(rows, 1, 7)
    # Each row's action is the move the game went on with; the last row's is any legal one.
    actions = torch.tensor([*MOVES[1:], 3]).reshape(rows, 1)

    def batch_of(observations: list[dict], logits: torch.Tensor, actions: torch.Tensor) -> dict:
        masks = np.stack([obs["action_mask"] for obs in observations]).astype(np.float32)
        mask = torch.from_numpy(masks).reshape(rows, 1, 7)
        flags = torch.zeros(rows, 1, dtype=torch.bool)
        return {
            "obs": _packed(observations, spec).reshape(rows, 1, -1),
            "first": flags, "terminated": flags, "truncated": flags,
            "reward": torch.linspace(-1.0, 1.0, rows).reshape(rows, 1),
            "action": actions,
            "behaviour_params": torch.cat([logits, mask], dim=-1),
        }  # fmt: skip

    game = batch_of(played, logits, actions)
    replay = batch_of(replayed, logits.flip(-1), 6 - actions)
    both = {key: torch.cat([game[key], replay[key]], dim=1) for key in game}
    action_space = pb.SpaceSpec(kind="discrete", n=7)
    settings = {"normalize_returns": False, "entropy_cost": 0.01}
    cpu = torch.device("cpu")
    mirrored = VTraceAgent(LearnerConfig(mirror=True, **settings), action_space, cpu, masked=True)
    plain = VTraceAgent(LearnerConfig(**settings), action_space, cpu, masked=True)
    model = plain.build_model(spec, "auto")
    state = plain.state_for(model)
    total, terms = mirrored.loss(state, game, (), StepClock(0, 0.0))
    expected, expected_terms = plain.loss(state, both, (), StepClock(0, 0.0))
    torch.testing.assert_close(total, expected)
    torch.testing.assert_close(terms["entropy"], expected_terms["entropy"])
    alone, _ = plain.loss(state, game, (), StepClock(0, 0.0))
    assert not torch.isclose(alone, expected)  # the replay is not the game again
