"""Atari, ``ALE/<Game>-v5`` (extra ``[atari]``): the DeepMind/IMPALA/SEED RL setting.

Done in ale-py's C++ vector env: frame skip 4 with max-pooling, 84x84 grayscale, a
stack of 4 frames as uint8 ``[4, 84, 84]``, up to 30 no-op starts, sticky actions
(0.25), raw rewards (clip them in the learner with ``--reward-clip 1``). Every key of
:data:`ATARI_DEFAULTS` can be overridden with ``--env-kwargs`` (``episodic_life``,
``frameskip``, ``stack_num``, ``noop_max``, ``repeat_action_probability``, ...). The raw
ALE env stays reachable as the factory ``ale_py.env:AtariEnv``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from seedrl.envs.family import EnvFamily

ATARI_DEFAULTS: dict[str, Any] = {
    "frameskip": 4,
    "maxpool": True,
    "img_height": 84,
    "img_width": 84,
    "grayscale": True,
    "stack_num": 4,
    "noop_max": 30,
    "repeat_action_probability": 0.25,
    "episodic_life": False,
    "use_fire_reset": False,
    "reward_clipping": False,
    "num_threads": 1,
}
"""Atari preprocessing (IMPALA/SEED RL); ``--env-kwargs`` override any key.

Rewards stay raw (the learner clips them, so reported returns are game scores) and
each actor process steps its envs on one thread (one actor process per core scales
better than threads fighting over cores)."""


def atari_kwargs(env_id: str, env_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """Keyword arguments of ale-py's ``AtariVectorEnv`` for an ``ALE/...`` id."""
    ale_py = FAMILY.import_requirement(env_id)
    gym.register_envs(ale_py)
    spec_kwargs = dict(gym.spec(env_id).kwargs)
    spec_kwargs.pop("obs_type", None)
    return {**spec_kwargs, **ATARI_DEFAULTS, **dict(env_kwargs or {})}


def frame_stack(env_id: str, env_kwargs: dict[str, Any]) -> int:
    """``stack_num``: ale-py's vector env stacks with seedrl's rule, with or without
    episodic lives."""
    return int(atari_kwargs(env_id, env_kwargs).get("stack_num", 1))


def make_vector(env_id: str, env_kwargs: dict[str, Any], num_envs: int) -> gym.vector.VectorEnv:
    from ale_py.vector_env import AtariVectorEnv

    kwargs = atari_kwargs(env_id, env_kwargs)
    return AtariVectorEnv(
        num_envs=num_envs, autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP, **kwargs
    )


class AtariEnv(gym.Env):
    """One preprocessed Atari env: ale-py's vector env with a single member.

    Built the same way as the actors' envs, so the learner's spaces and evaluation
    match training exactly. ``render_mode="rgb_array"`` renders the newest frame of
    the stack (what the agent sees), upscaled 3x.
    """

    metadata = {"render_modes": ["rgb_array"]}  # noqa: RUF012

    def __init__(
        self, env_id: str, env_kwargs: dict[str, Any] | None = None, render_mode: str | None = None
    ) -> None:
        self._vec = make_vector(env_id, dict(env_kwargs or {}), 1)
        self.observation_space = self._vec.single_observation_space
        self.action_space = self._vec.single_action_space
        self.render_mode = render_mode
        self._obs: np.ndarray | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self._vec.reset(seed=seed)
        self._obs = obs[0]
        return obs[0], {k: v[0] for k, v in info.items()}

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self._vec.step(np.asarray([action]))
        self._obs = obs[0]
        info_0 = {k: v[0] for k, v in info.items()}
        return obs[0], float(reward[0]), bool(terminated[0]), bool(truncated[0]), info_0

    def render(self) -> np.ndarray | None:
        if self.render_mode != "rgb_array" or self._obs is None:
            return None
        frame = self._obs[-1] if self._obs.ndim == 3 else self._obs[..., -1]
        if frame.ndim == 2:
            frame = np.repeat(frame[..., None], 3, axis=-1)
        return np.kron(frame, np.ones((3, 3, 1), dtype=np.uint8))

    def close(self) -> None:
        self._vec.close()


FAMILY = EnvFamily(
    name="atari",
    title="Atari (ALE)",
    ids="`ALE/<Game>-v5`",
    example="ALE/Pong-v5",
    prefix="ALE/",
    make=AtariEnv,
    make_vector=make_vector,
    preprocessing=(
        "IMPALA/SEED RL setting in ale-py's C++ vector env: frame skip 4 with max-pool, "
        "84×84 grayscale, 4-frame stack `uint8 [4,84,84]`, up to 30 no-op starts, sticky "
        "actions 0.25, raw rewards (any key overridable with `--env-kwargs`)"
    ),
    frame_stack=frame_stack,
    # Published Atari scores are whole games: a life lost ends no evaluation episode.
    evaluation_kwargs={"episodic_life": False},
    frames_per_step=ATARI_DEFAULTS["frameskip"],
    extra="atari",
    requires="ale_py",
    preset="atari",
)
