"""A Connect Four checkpoint built the way the learner builds its model for the game's
per-agent spaces (dict observation with an ``action_mask`` leaf, masked categorical head),
for the evaluate tests."""

from __future__ import annotations

from pathlib import Path

import torch

from learner.agents.models import action_head, build_model, choose_torso
from learner.league.arena import make_aec_env
from learner.league.league import League
from learner.league.pool import PoolConfig
from learner.league.tournament import SELF_PLAY_KEY
from learner.state import checkpoint
from seedrl import codec
from seedrl.config import LearnerConfig, to_json_dict

CONNECT_FOUR = "pettingzoo.classic.connect_four_v3"


def connect_four_checkpoint(path: Path, seed: int = 0, pool_seeds: tuple[int, ...] = ()) -> Path:
    """An untrained policy for Connect Four, saved as a learner checkpoint; with
    ``pool_seeds`` also a self-play pool of untrained networks from those seeds, frozen
    at learner steps 10, 20, ..."""
    env = make_aec_env(CONNECT_FOUR)
    obs_space, action_space = env.observation_space("player_0"), env.action_space("player_0")
    env_spec = codec.env_spec(CONNECT_FOUR, {}, obs_space, action_space)
    config = LearnerConfig()
    head = action_head(env_spec.action_space, masked=True)
    torch.manual_seed(seed)
    torso = choose_torso(env_spec.observation_space, config.model)
    model = build_model(
        env_spec.observation_space, head, torso, config.hidden_sizes, mask_leaf=config.action_mask
    )
    extra = {}
    if pool_seeds:
        league = League(PoolConfig(snapshot_every=1, pool_size=len(pool_seeds)), seed)
        for i, pool_seed in enumerate(pool_seeds):
            torch.manual_seed(pool_seed)
            other = build_model(
                env_spec.observation_space, head, torso, config.hidden_sizes,
                mask_leaf=config.action_mask,
            )  # fmt: skip
            league.add(10 * (i + 1), other.state_dict())
        extra[SELF_PLAY_KEY] = league.state_dict()
    training = checkpoint.TrainingState(model.state_dict(), {}, 10 * (len(pool_seeds) + 1))
    state = checkpoint.snapshot(
        training,
        frames=0,
        config=to_json_dict(config),
        env_spec=env_spec.SerializeToString(),
        model_spec=to_json_dict(model.spec),
        **extra,
    )
    checkpoint.save(path, state)
    return path


def first_legal(obs: dict) -> int:
    """A module:callable opponent: the leftmost legal column."""
    return int(obs["action_mask"].nonzero()[0][0])
