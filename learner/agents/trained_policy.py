"""A trained policy loaded from a checkpoint: ``Policy.load(path).act(obs)``.

What ``learner.train`` returns and ``python -m learner evaluate`` runs: a checkpoint
carries the env spec (id, kwargs, spaces) and the model spec, so the network and the
env are rebuilt exactly as they were trained, with no other flags.

Shape suffixes: O observation dims, A action dims, P policy parameters, H core state.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from learner.agents import registry
from learner.agents.models import ActionHead, CoreState, ModelSpec
from learner.state import checkpoint
from learner.state.normalize import Normalizer, make_normalizer
from seedrl import codec, envs
from seedrl.proto import seedrl_pb2 as pb


def model_spec_from_dict(data: dict[str, Any]) -> ModelSpec:
    """A ModelSpec from its JSON form in a checkpoint (lists back to tuples)."""
    fields = {f.name for f in dataclasses.fields(ModelSpec)}
    kwargs: dict[str, Any] = {k: _tuples(v) for k, v in data.items() if k in fields}
    return ModelSpec(**kwargs)


def network_from_spec(
    spec: ModelSpec, action_space: pb.SpaceSpec, masked: bool = False, agent: str | None = None
) -> tuple[Any, ActionHead]:
    """The inference network (fresh weights) and head a checkpoint's spec describes, as
    its agent (``--agent`` of the run; None: told by the spec) rebuilds them."""
    return registry.trained_network(agent, spec, action_space, masked)


def _tuples(value: Any) -> Any:
    """JSON lists back to (nested) tuples."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


class Policy:
    """A trained policy for one env at a time: keeps its own recurrent state.

    ``act(obs)`` takes one observation (as the env returns it) and returns one action
    (an int for discrete spaces, a clipped float array for Box spaces). Call
    ``reset()`` at the start of every episode.
    """

    def __init__(
        self,
        model: Any,
        head: ActionHead,
        env_spec: pb.EnvSpec,
        greedy: bool = True,
        normalizer: Normalizer | None = None,
        checkpoint_info: checkpoint.CheckpointInfo | None = None,
    ) -> None:
        self.model = model.eval()
        self.checkpoint_info = checkpoint_info
        """Which checkpoint this policy came from (None: built in memory)."""
        self.normalizer = normalizer
        """A run trained with --normalize-observations: its final statistics, frozen."""
        self.head = head
        self.env_spec = env_spec
        self.greedy = greedy
        self._low, self._high = codec.action_bounds(env_spec.action_space)
        self._state: CoreState = ()
        self._first = True
        self.member: str | None = None
        """Of a population's checkpoint: which member this is."""

    @classmethod
    def load(cls, path: str | Path, greedy: bool = True, member: int | None = None) -> Policy:
        """The policy a checkpoint holds; of a population's, member ``member`` (None: the
        best one by its recent return)."""
        from learner.population.pbt import member_checkpoint

        state = member_checkpoint(path, checkpoint.load(path), member)
        checkpoint.require_one_policy(path, state)
        env_spec = pb.EnvSpec.FromString(state["env_spec"])
        spec = model_spec_from_dict(state["model_spec"])
        mask_leaf = next((x[0] for x in spec.leaf_inputs if x[3] == "mask"), None)
        agent = (state.get("config") or {}).get("agent")
        model, head = network_from_spec(spec, env_spec.action_space, mask_leaf is not None, agent)
        model.load_state_dict(state["model"])
        normalizer = None
        if "obs_normalizer" in state:
            normalizer = make_normalizer(env_spec.observation_space, mask_leaf or "")
            normalizer.load_state_dict(state["obs_normalizer"])
        info = checkpoint.CheckpointInfo.of(path, state)
        policy = cls(model, head, env_spec, greedy, normalizer, info)
        policy.member = state.get("member")
        return policy

    @property
    def env_id(self) -> str:
        return self.env_spec.env_id

    @property
    def env_kwargs(self) -> dict[str, Any]:
        return dict(json.loads(self.env_spec.env_kwargs_json or "{}"))

    def make_env(self, render_mode: str | None = None) -> Any:
        """The env this policy was trained on, built as the actors built it."""
        return envs.make_env(self.env_id, self.env_kwargs, render_mode=render_mode)

    def reset(self) -> None:
        self._state = self.model.initial_state(1)
        self._first = True

    def act(self, obs: Any) -> Any:
        space = self.env_spec.observation_space
        if codec.is_structured(space):  # the packed rows the learner trained on
            leaves = codec.space_leaves(space)
            values = [np.asarray(v)[None] for v in codec.flatten_values(space, obs)]
            obs_1O = codec.LeafPacking(leaves).pack_values(values)
        else:
            obs_1O = np.asarray(obs, dtype=np.dtype(space.dtype))[None]
        if self.normalizer is not None:
            obs_1O = self.normalizer.normalize(obs_1O)
        obs_11O = torch.from_numpy(obs_1O[None])
        first_11 = torch.tensor([[self._first]])
        if self._first and not self._state:
            self._state = self.model.initial_state(1)
        with torch.no_grad():
            params_11P, self._state = self.model.act(obs_11O, first_11, self._state)
        self._first = False
        params_P = params_11P[0, 0]
        action = self.head.greedy(params_P) if self.greedy else self.head.sample(params_P)
        actions = self.env_spec.action_space
        if codec.is_structured(actions):  # a dict/tuple of the leaves, clipped as actors clip
            chosen: list[Any] = []
            for got, leaf in zip(
                codec.action_leaves_of(actions, action.numpy()[None]),
                codec.space_leaves(actions, action=True),
                strict=True,
            ):
                low, high = codec.action_bounds(leaf.spec)
                one = got[0] if low is None else np.clip(got[0], low, high)
                chosen.append(int(one) if leaf.spec.kind == "discrete" else one)
            return codec.unflatten_values(actions, chosen)
        if self.head.continuous:
            action_A = action.numpy().astype(np.float32)
            return action_A if self._low is None else np.clip(action_A, self._low, self._high)
        if self.head.action_shape:  # MultiDiscrete, MultiBinary: an array like the space's
            return action.numpy()
        return int(action)
