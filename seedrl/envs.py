"""Environment factory shared by the learner (to read spaces) and actors (to step).

An env is named by a registered gymnasium id (``CartPole-v1``) or by a
``module:callable`` factory returning a gymnasium Env, so users plug in their own
environments without editing seedrl. A ``module:...`` id named by someone else (the
learner's GetInfo, a checkpoint) is code to run, so a host builds it only when its own
user allowed that module (:func:`check_env_allowed`, ``--allow-env-module``).

Actors always step a vector env in gymnasium's NEXT_STEP autoreset mode: an env that
ends reports its final observation with the terminated/truncated flag, and the
following step resets it (reward 0, flags clear). That is exactly the wire contract, so
truncated episodes can bootstrap from the value of their true final observation.

Two families get seedrl's standard treatment, so the learner and every actor build the
same preprocessed env from nothing but the id and kwargs (the learner publishes both
in GetInfo):

- ``ALE/<Game>-v5`` (extra ``[atari]``): the DeepMind/IMPALA/SEED RL setting, done in
  ale-py's C++ vector env: frame skip 4 with max-pooling, 84x84 grayscale, a stack of 4
  frames as uint8 ``[4, 84, 84]``, up to 30 no-op starts, sticky actions (0.25), raw
  rewards (clip them in the learner with ``--reward-clip 1``). Every key of
  :data:`ATARI_DEFAULTS` can be overridden with ``--env-kwargs`` (``episodic_life``,
  ``frameskip``, ``stack_num``, ``noop_max``, ``repeat_action_probability``, ...).
  The raw ALE env stays reachable as the factory ``ale_py.env:AtariEnv``.
- ``MinAtar/<Game>-v0|v1`` (extra ``[minatar]``): MinAtar's gymnasium envs, with the
  boolean observation transposed to channels-first ``[C, 10, 10]`` so the CNN never has
  to guess the layout (Seaquest's ``10x10x10`` would be ambiguous).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Sequence
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

from seedrl import codec
from seedrl.proto import seedrl_pb2 as pb

ALLOW_ENV_MODULE_FLAG = "--allow-env-module"


class EnvNotAllowed(ValueError):
    """An env id, named by another party, that would import a module this host did not allow."""


def env_module(env_id: str) -> str | None:
    """The module that building ``env_id`` imports by name: the part before the ``:`` of a
    ``module:callable`` factory or of gymnasium's own ``module:EnvId-v0`` form; None for a
    plain id, which only looks up what installed packages registered."""
    module, sep, _ = env_id.partition(":")
    return module if sep else None


def env_allowed(env_id: str, allowed: Sequence[str]) -> bool:
    """Whether this host builds ``env_id`` when another party names it.

    Plain ids always; a ``module:...`` id only when an ``allowed`` entry is that exact id,
    or a module that is its module or a package above it (``mypkg`` allows
    ``mypkg.envs:make`` but not ``mypkgevil:make``).
    """
    module = env_module(env_id)
    if module is None:
        return True
    for entry in (e.strip() for e in allowed):
        if ":" in entry:
            if entry == env_id:
                return True
        elif entry and (module == entry or module.startswith(entry + ".")):
            return True
    return False


def check_env_allowed(env_id: str, allowed: Sequence[str], named_by: str) -> None:
    """Raise :class:`EnvNotAllowed` (one line naming the flag) unless :func:`env_allowed`.

    Called before anything is imported: a ``module:callable`` id runs that module's code
    and the callable with the kwargs that come with it, so only the host's own user may
    choose it (``named_by`` says who named it: "the learner", "the checkpoint").
    """
    if env_allowed(env_id, allowed):
        return
    module = env_module(env_id)
    raise EnvNotAllowed(
        f"{named_by} names env {env_id!r}, which would import and run module {module!r} "
        f"on this host: refused; if you trust it, allow it with "
        f"{ALLOW_ENV_MODULE_FLAG} {module or env_id}"
    )


def _factory(env_id: str) -> Callable[..., gym.Env] | None:
    """The callable behind a ``module:callable`` id, or None for a registered gymnasium id."""
    module_name, sep, attr = env_id.partition(":")
    if not sep or not module_name or not attr.isidentifier():
        return None  # a plain id, or gymnasium's own "module:EnvId-v0" form
    module = importlib.import_module(module_name)
    factory = getattr(module, attr, None)
    if factory is None:
        return None
    if not callable(factory):
        raise ValueError(f"{env_id}: {attr!r} in module {module_name!r} is not callable")
    return factory


ATARI_PREFIX = "ALE/"
MINATAR_PREFIX = "MinAtar/"

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
    try:
        import ale_py
    except ImportError as exc:
        raise ValueError(f"{env_id}: Atari needs ale-py: pip install 'seedrl[atari]'") from exc
    gym.register_envs(ale_py)
    spec_kwargs = dict(gym.spec(env_id).kwargs)
    spec_kwargs.pop("obs_type", None)
    return {**spec_kwargs, **ATARI_DEFAULTS, **dict(env_kwargs or {})}


def frame_stack(env_id: str, env_kwargs: dict[str, Any] | None) -> int:
    """D when an observation is D frames stacked along its first axis with seedrl's rule,
    else 1.

    The rule (ale-py's vector env keeps it, with or without episodic lives): each step
    shifts the stack by one frame and appends the newest, and an episode's first
    observation is zeros but for its newest frame. Knowing it, actors can send only the
    newest frame and the learner rebuild the rest. Envs that stack in some other way
    (a user's own wrapper) report 1 and send whole observations.
    """
    if not env_id.startswith(ATARI_PREFIX):
        return 1
    depth = int(atari_kwargs(env_id, env_kwargs).get("stack_num", 1))
    return depth if depth > 1 else 1


def _atari_vector_env(env_id: str, env_kwargs: dict[str, Any] | None, num_envs: int):
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
        self._vec = _atari_vector_env(env_id, env_kwargs, 1)
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


def _ensure_minatar(env_id: str) -> None:
    """Register MinAtar's gymnasium ids (its plugin is not auto-loaded by gymnasium 1.x)."""
    if env_id in gym.registry:
        return
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # minatar warns on import when seaborn (rendering) is absent
    try:
        import minatar.gym as minatar_gym
    except ImportError as exc:
        raise ValueError(f"{env_id}: MinAtar needs minatar: pip install 'seedrl[minatar]'") from exc
    finally:
        root.setLevel(level)
    minatar_gym.register_envs()


def _channels_first(env: gym.Env) -> gym.Env:
    """MinAtar's ``[10, 10, C]`` observations as ``[C, 10, 10]``."""
    space = env.observation_space
    assert isinstance(space, gym.spaces.Box)
    h, w, c = space.shape
    new_space = gym.spaces.Box(0, 1, shape=(c, h, w), dtype=space.dtype)
    return gym.wrappers.TransformObservation(
        env, lambda obs: np.ascontiguousarray(np.transpose(obs, (2, 0, 1))), new_space
    )


def make_env(
    env_id: str, env_kwargs: dict[str, Any] | None = None, render_mode: str | None = None
) -> gym.Env:
    """One environment instance (learner: spaces and evaluation)."""
    kwargs = dict(env_kwargs or {})
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    if env_id.startswith(ATARI_PREFIX):
        return AtariEnv(env_id, env_kwargs, render_mode)
    if env_id.startswith(MINATAR_PREFIX):
        _ensure_minatar(env_id)
        return _channels_first(gym.make(env_id, **kwargs))
    factory = _factory(env_id)
    if factory is not None:
        return factory(**kwargs)
    return gym.make(env_id, **kwargs)


NATIVE_VECTOR_MIN_ENVS = 6
"""Below this K, K scalar envs (:class:`ScalarEnvs`) step faster than a native vector env.

A native vector env pays a fixed cost per step in numpy calls on tiny arrays (and an
action-space check) whatever K is; K scalar envs pay per env, so the two costs cross at
a small K (for CartPole, between 4 and 8 envs; docs/performance.md).
"""


class ScalarEnvs(gym.vector.VectorEnv):
    """K scalar envs stepped in a plain loop into preallocated arrays, NEXT_STEP autoreset.

    What gymnasium's SyncVectorEnv computes (same seeds, same numbers), minus the
    generality an actor never uses: a deep copy of the observations, space-dispatched
    concatenation, fresh copies of the reward and flag arrays and merged info dicts on
    every step, which for a cheap env like CartPole is most of a step's cost. The
    arrays returned are reused by the next step; infos are always empty.
    """

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]]) -> None:
        self.envs = [make() for make in env_fns]
        first = self.envs[0]
        space = first.observation_space
        if not isinstance(space, gym.spaces.Box | gym.spaces.Discrete):
            self.close_extras()
            raise ValueError(f"seedrl steps Box and Discrete observations, got {space}")
        self.num_envs = len(self.envs)
        self.single_observation_space = space
        self.single_action_space = first.action_space
        self.observation_space = gym.vector.utils.batch_space(space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(first.action_space, self.num_envs)
        self.metadata = {**first.metadata, "autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}
        self.spec = first.spec
        self.render_mode = first.render_mode
        self._observations = np.zeros((self.num_envs, *(space.shape or ())), space.dtype)
        self._rewards = np.zeros(self.num_envs, np.float64)
        self._terminated = np.zeros(self.num_envs, np.bool_)
        self._truncated = np.zeros(self.num_envs, np.bool_)
        self._autoreset = [False] * self.num_envs

    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every env; an int seed seeds env i with seed + i, as SyncVectorEnv does."""
        if seed is None or isinstance(seed, int):
            seeds = [None if seed is None else seed + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
        for i, (env, env_seed) in enumerate(zip(self.envs, seeds, strict=True)):
            self._observations[i], _ = env.reset(seed=env_seed, options=options)
        self._autoreset = [False] * self.num_envs
        self._rewards[:] = 0.0
        self._terminated[:] = False
        self._truncated[:] = False
        return self._observations, {}

    def step(
        self, actions: Any
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """One step of every env; an env that ended on the previous step resets instead."""
        obs_KO, autoreset = self._observations, self._autoreset
        reward: SupportsFloat
        for i, env in enumerate(self.envs):
            if autoreset[i]:
                obs_KO[i], _ = env.reset()
                reward, terminated, truncated = 0.0, False, False
            else:
                obs_KO[i], reward, terminated, truncated, _ = env.step(actions[i])
            self._rewards[i] = reward
            self._terminated[i] = terminated
            self._truncated[i] = truncated
            autoreset[i] = terminated or truncated
        return obs_KO, self._rewards, self._terminated, self._truncated, {}

    def render(self) -> tuple[Any, ...] | None:
        return tuple(env.render() for env in self.envs)

    def close_extras(self, **kwargs: Any) -> None:
        for env in self.envs:
            env.close()


def make_vector_env(
    env_id: str, env_kwargs: dict[str, Any] | None, num_envs: int
) -> gym.vector.VectorEnv:
    """K environments stepped together in NEXT_STEP autoreset mode.

    Uses gymnasium's native vectorised implementation when the env has one and K is at
    least :data:`NATIVE_VECTOR_MIN_ENVS` (it steps all K in array operations, far
    cheaper than K separate envs at large K), else :class:`ScalarEnvs` (K scalar envs
    in a plain loop).
    """
    kwargs = dict(env_kwargs or {})
    next_step = gym.vector.AutoresetMode.NEXT_STEP
    if env_id.startswith(ATARI_PREFIX):
        return _atari_vector_env(env_id, kwargs, num_envs)
    if env_id.startswith(MINATAR_PREFIX):
        _ensure_minatar(env_id)
        return ScalarEnvs(
            [lambda: _channels_first(gym.make(env_id, **kwargs)) for _ in range(num_envs)]
        )
    factory = _factory(env_id)
    if factory is not None:
        vec: gym.vector.VectorEnv = ScalarEnvs([lambda: factory(**kwargs) for _ in range(num_envs)])
    elif gym.spec(env_id).vector_entry_point is not None and num_envs >= NATIVE_VECTOR_MIN_ENVS:
        vec = gym.make_vec(
            env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **kwargs
        )
    else:
        vec = ScalarEnvs([lambda: gym.make(env_id, **kwargs) for _ in range(num_envs)])
    mode = vec.metadata.get("autoreset_mode")
    if mode is not None and mode != next_step:
        vec.close()
        raise ValueError(f"{env_id}: vector env autoreset mode {mode}, seedrl needs NEXT_STEP")
    return vec


def describe_env(env_id: str, env_kwargs: dict[str, Any] | None = None) -> pb.EnvSpec:
    """Build one env, read its spaces and close it: what the learner publishes in GetInfo."""
    env = make_env(env_id, env_kwargs)
    try:
        return codec.env_spec(
            env_id, dict(env_kwargs or {}), env.observation_space, env.action_space
        )
    finally:
        env.close()
