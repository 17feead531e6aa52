"""MiniGrid, ``MiniGrid-<Name>-v0`` (extra ``[minigrid]``): MiniGrid's dict observation,
served as the grid image and the agent's direction.

The image (object, colour, state per cell of the agent's 7x7 view) is served channels-first
as float32 ``[3, 7, 7]`` holding MiniGrid's small integer codes as they are, which the
per-leaf model reads with its small CNN (the published PPO agents read the same integers);
as uint8 it would be scaled by 1/255 like camera pixels. The mission text is dropped:
for the envs of the suite it is one sentence per env, so it carries nothing to learn from.
With the env kwarg ``action_mask: true`` the observation also carries an ``action_mask``
leaf that allows only the actions that change something (turns always; forward onto a
cell that can be entered; pickup of an object with empty hands; toggle of a box, of an
unlocked door, or of a locked one with the key of its colour; never drop or done, which
MiniGrid's docs mark unused), and the env refuses a masked action, so a learning run shows
that the masks are respected.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from seedrl.envs.family import EnvFamily
from seedrl.envs.vector import ScalarEnvs

VIEW = 7
"""MiniGrid's default agent view: 7x7 cells."""
ACTIONS = ("left", "right", "forward", "pickup", "drop", "toggle", "done")
"""MiniGrid's actions, in its order."""


class MiniGridObservation(gym.Wrapper):
    """MiniGrid's observation as ``{direction, image}`` (plus ``action_mask`` when
    ``masked``), the image channels-first float32."""

    def __init__(self, env: gym.Env, masked: bool = False) -> None:
        super().__init__(env)
        self.masked = masked
        leaves: dict[str, gym.Space] = {
            "direction": gym.spaces.Discrete(4),
            "image": gym.spaces.Box(0.0, 255.0, (3, VIEW, VIEW), np.float32),
        }
        if masked:
            leaves["action_mask"] = gym.spaces.MultiBinary(len(ACTIONS))
        self.observation_space = gym.spaces.Dict(leaves)
        self._mask = np.ones(len(ACTIONS), np.int8)

    def _observe(self, obs: dict[str, Any]) -> dict[str, Any]:
        image = np.ascontiguousarray(np.transpose(obs["image"], (2, 0, 1)), np.float32)
        out = {"direction": int(obs["direction"]), "image": image}
        if self.masked:
            self._mask = self._allowed()
            out["action_mask"] = self._mask.copy()
        return out

    def _allowed(self) -> np.ndarray:
        """1 for each action that can change something in front of the agent."""
        grid_env: Any = self.env.unwrapped
        front = grid_env.grid.get(*grid_env.front_pos)
        allowed = np.zeros(len(ACTIONS), np.int8)
        allowed[ACTIONS.index("left")] = allowed[ACTIONS.index("right")] = 1
        allowed[ACTIONS.index("forward")] = front is None or front.can_overlap()
        if front is not None:
            carrying = grid_env.carrying
            allowed[ACTIONS.index("pickup")] = front.can_pickup() and carrying is None
            if front.type == "box":
                allowed[ACTIONS.index("toggle")] = 1
            elif front.type == "door":  # a locked door opens only to the key of its colour
                has_key = carrying is not None and carrying.type == "key"
                key_fits = has_key and carrying.color == front.color
                allowed[ACTIONS.index("toggle")] = not front.is_locked or key_fits
        return allowed

    def reset(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        return self._observe(obs), info

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        if self.masked and not self._mask[int(action)]:
            raise ValueError(
                f"masked action {ACTIONS[int(action)]!r} taken (mask {self._mask.tolist()})"
            )
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self._observe(obs), float(reward), terminated, truncated, info


def make(env_id: str, env_kwargs: dict[str, Any], render_mode: str | None = None) -> gym.Env:
    FAMILY.import_requirement(env_id)  # importing minigrid registers its ids
    kwargs = dict(env_kwargs)
    masked = bool(kwargs.pop("action_mask", False))
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    return MiniGridObservation(gym.make(env_id, **kwargs), masked)


def make_vector(env_id: str, env_kwargs: dict[str, Any], num_envs: int) -> gym.vector.VectorEnv:
    return ScalarEnvs([lambda: make(env_id, env_kwargs)] * num_envs)


FAMILY = EnvFamily(
    name="minigrid",
    title="MiniGrid",
    ids="`MiniGrid-<Name>-v0`",
    example="MiniGrid-DoorKey-5x5-v0",
    prefix="MiniGrid-",
    make=make,
    make_vector=make_vector,
    preprocessing="dict of `direction` and the `[3,7,7]` float32 view; mission text dropped; "
    "`action_mask: true` adds a mask of the useful actions",
    extra="minigrid",
    requires="minigrid",
    preset="minigrid",
)
