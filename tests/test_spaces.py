"""Structured spaces on the wire: dict, tuple, multi-discrete and multi-binary spaces as
SpaceSpec, one tensor per leaf in a Frame (and in Actions), checked and packed by the
learner; flat spaces keep their messages byte for byte."""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.actor import StepWire
from learner.serving.inference import Connection
from learner.serving.servicer import LearnerServicer
from seedrl import codec
from seedrl.config import LearnerConfig
from seedrl.proto import seedrl_pb2 as pb

spaces = gym.spaces

shapes = st.lists(st.integers(1, 3), min_size=0, max_size=3).map(tuple)
leaf_spaces = st.one_of(
    st.builds(lambda n: spaces.Discrete(n), st.integers(1, 9)),
    st.builds(
        lambda shape, dtype: spaces.Box(-2, 2, shape, dtype),
        shapes,
        st.sampled_from([np.float32, np.float64, np.int16]),
    ),
    st.builds(lambda shape: spaces.Box(0, 255, shape, np.uint8), shapes),
    st.builds(
        lambda nvec: spaces.MultiDiscrete(nvec),
        st.lists(st.integers(1, 6), min_size=1, max_size=4),
    ),
    st.builds(lambda n: spaces.MultiBinary(n), st.integers(1, 5)),
)
keys = st.text("abcxyz_", min_size=1, max_size=4)
gym_spaces = st.recursive(
    leaf_spaces,
    lambda children: st.one_of(
        st.dictionaries(keys, children, min_size=1, max_size=3).map(spaces.Dict),
        st.lists(children, min_size=1, max_size=3).map(lambda c: spaces.Tuple(tuple(c))),
    ),
    max_leaves=6,
)
structured_spaces = st.one_of(
    st.dictionaries(keys, gym_spaces, min_size=1, max_size=3).map(spaces.Dict),
    st.lists(gym_spaces, min_size=1, max_size=3).map(lambda c: spaces.Tuple(tuple(c))),
)


def _batch(space: gym.Space, spec: pb.SpaceSpec, k: int, seed: int) -> list[np.ndarray]:
    """K samples of ``space`` as one array per leaf ``[K, *leaf_shape]``."""
    space.seed(seed)
    per_env = [codec.flatten_values(spec, space.sample()) for _ in range(k)]
    leaves = codec.space_leaves(spec)
    return [
        np.stack([np.asarray(env[i], leaf.dtype) for env in per_env]).reshape(k, *leaf.shape)
        for i, leaf in enumerate(leaves)
    ]


def _env_spec(observation: gym.Space, action: gym.Space) -> pb.EnvSpec:
    return codec.env_spec("spaces_envs:any", {}, observation, action)


def _servicer(spec: pb.EnvSpec, **config: object) -> LearnerServicer:
    stub = object()
    return LearnerServicer(LearnerConfig(**config), spec, stub, stub, stub, stub)  # type: ignore[arg-type]


def _conn(k: int) -> Connection:
    return Connection("a", "run", "peer", k, np.arange(k))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(space=gym_spaces)
def test_every_space_kind_round_trips_as_a_spec(space: gym.Space) -> None:
    spec = codec.space_to_spec(space)
    again = pb.SpaceSpec.FromString(spec.SerializeToString())
    assert codec.specs_match(spec, again)
    assert codec.spec_summary(again) == codec.spec_summary(spec)
    leaves = codec.space_leaves(spec)
    assert len(leaves) == len(codec.flatten_values(spec, space.sample()))
    assert len({x.name for x in leaves}) == len(leaves)  # names tell leaves apart
    assert codec.specs_match(codec.space_to_spec(space), spec)  # describing is deterministic


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(space=structured_spaces, k=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_structured_frames_round_trip_through_both_learner_paths(
    space: gym.Space, k: int, seed: int
) -> None:
    """What an actor sends is what the learner keeps: the template path and the full
    parse agree, and unpacking the learner's rows gives every leaf back."""
    spec = _env_spec(space, spaces.Discrete(2))
    values = _batch(space, spec.observation_space, k, seed)
    wire = StepWire(spec, k)
    reward = np.arange(k, dtype=np.float32)
    terminated, truncated = np.zeros(k, bool), np.ones(k, bool)
    raw = wire.frame(
        codec.unflatten_values(spec.observation_space, values), reward, terminated, truncated
    )

    servicer = _servicer(spec)
    layout = servicer.frame_layout(k)
    payloads = layout.wire.split(raw)
    assert payloads is not None and layout.make_payload is not None
    fast = layout.make_payload(_conn(k), *payloads)
    parsed = pb.ActorMessage.FromString(raw)
    assert [np.asarray(t.shape).tolist() for t in parsed.frame.observation_leaves] == [
        [k, *v.shape[1:]] for v in values
    ]
    full = servicer.frame_payload(_conn(k), layout, parsed.frame)
    assert fast.observations == full.observations
    assert fast.rewards == reward.tobytes()
    packing = codec.LeafPacking(codec.space_leaves(spec.observation_space))
    rows = np.frombuffer(fast.observations, np.uint8).reshape(k, packing.row_bytes)
    for got, want in zip(packing.unpack(rows), values, strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(packing.pack_values(values), rows)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(space=structured_spaces, k=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_structured_actions_round_trip(space: gym.Space, k: int, seed: int) -> None:
    """One tensor per action leaf, through the template and through a plain encoder."""
    spec = _env_spec(spaces.Box(-1, 1, (2,), np.float32), space)
    leaves = codec.space_leaves(spec.action_space, action=True)
    values = [v.astype(leaf.dtype) for v, leaf in zip(
        _batch(space, spec.action_space, k, seed), leaves, strict=True)]  # fmt: skip
    wire = StepWire(spec, k)
    template = codec.actions_leaves_template(codec.leaf_layouts(k, leaves))
    plain = pb.LearnerMessage(
        actions=pb.Actions(action_leaves=[codec.encode_tensor(v) for v in values])
    ).SerializeToString()
    for raw in (template.fill([v.tobytes() for v in values]), plain):
        got = codec.flatten_values(spec.action_space, wire.actions(raw))
        for a, b, leaf in zip(got, values, leaves, strict=True):
            low, high = codec.action_bounds(leaf.spec)
            np.testing.assert_array_equal(a, b if low is None else np.clip(b, low, high))


def test_flat_spaces_keep_their_messages_byte_for_byte() -> None:
    """A Box or Discrete env's frames, actions and specs are the messages of protocol 1
    before structured spaces: nothing of the new fields is written."""
    for observation, action in [
        (spaces.Box(-1, 1, (4,), np.float32), spaces.Discrete(2)),
        (spaces.Discrete(5), spaces.Box(-2, 2, (3,), np.float32)),
    ]:
        spec = _env_spec(observation, action)
        for field in ("observation_space", "action_space"):
            space = getattr(spec, field)
            assert not space.children and not space.name and not space.nvec
        k = 3
        obs = np.stack([np.asarray(observation.sample()) for _ in range(k)])
        reward, flags = np.ones(k, np.float32), np.zeros(k, bool)
        expected = pb.ActorMessage(
            frame=pb.Frame(
                observations=codec.encode_tensor(obs.astype(observation.dtype)),
                rewards=codec.encode_tensor(reward),
                terminated=codec.encode_tensor(flags),
                truncated=codec.encode_tensor(flags),
            )
        ).SerializeToString()
        assert StepWire(spec, k).frame(obs, reward, flags, flags) == expected
        assert _servicer(spec).frame_layout(k).make_payload is None  # today's fast path


MASKED = spaces.Dict(
    {
        "action_mask": spaces.MultiBinary(4),
        "image": spaces.Box(0, 255, (2, 3), np.uint8),
        "pos": spaces.Box(-1, 1, (2,), np.float32),
    }
)


def _frame(k: int, **leaves: pb.Tensor) -> pb.Frame:
    values = {
        "action_mask": np.ones((k, 4), np.int8),
        "image": np.zeros((k, 2, 3), np.uint8),
        "pos": np.zeros((k, 2), np.float32),
    }
    tensors = {name: codec.encode_tensor(v) for name, v in values.items()}
    tensors.update(leaves)
    return pb.Frame(
        rewards=codec.encode_tensor(np.zeros(k, np.float32)),
        terminated=codec.encode_tensor(np.zeros(k, bool)),
        truncated=codec.encode_tensor(np.zeros(k, bool)),
        observation_leaves=list(tensors.values()),
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"pos": codec.encode_tensor(np.zeros((2, 2), np.float64))}, "dtype float64"),
        ({"image": codec.encode_tensor(np.zeros((2, 3, 2), np.uint8))}, "shape [2, 3, 2]"),
        ({"image": codec.encode_tensor(np.zeros((3, 2, 3), np.uint8))}, "K cannot change"),
        ({"pos": codec.encode_tensor(np.array([[0, np.nan]] * 2, np.float32))}, "NaN"),
        ({"action_mask": codec.encode_tensor(np.array([[1, 0, 0, 0], [0, 0, 0, 0]], np.int8))},
         "allows no action"),
    ],
)  # fmt: skip
def test_bad_leaves_are_refused_with_what_was_wrong(change: dict, message: str) -> None:
    spec = _env_spec(MASKED, spaces.Discrete(4))
    servicer = _servicer(spec)
    layout = servicer.frame_layout(2)
    servicer.frame_payload(_conn(2), layout, _frame(2))  # the unchanged frame passes
    with pytest.raises(codec.WireError, match=re.escape(message)):
        servicer.frame_payload(_conn(2), layout, _frame(2, **change))


def test_frames_must_carry_every_leaf_and_no_whole_observation() -> None:
    spec = _env_spec(MASKED, spaces.Discrete(4))
    servicer = _servicer(spec)
    layout = servicer.frame_layout(2)
    short = _frame(2)
    del short.observation_leaves[-1]
    with pytest.raises(codec.WireError, match="2 tensors but the observation space has 3"):
        servicer.frame_payload(_conn(2), layout, short)
    both = _frame(2)
    both.observations.CopyFrom(codec.encode_tensor(np.zeros((2, 3), np.float32)))
    with pytest.raises(codec.WireError, match="observations must be unset"):
        servicer.frame_payload(_conn(2), layout, both)
    flat = _servicer(_env_spec(spaces.Box(-1, 1, (4,), np.float32), spaces.Discrete(2)))
    with pytest.raises(codec.WireError, match="observation_leaves are for dict/tuple"):
        flat.frame_payload(_conn(2), flat.frame_layout(2), _frame(2))


def test_hello_spaces_must_match_leaf_for_leaf() -> None:
    ours = _env_spec(MASKED, spaces.MultiDiscrete([2, 3]))
    servicer = _servicer(ours)
    renamed = spaces.Dict({**MASKED.spaces, "position": MASKED.spaces["pos"]})
    del renamed.spaces["pos"]
    for observation, action in [
        (renamed, spaces.MultiDiscrete([2, 3])),
        (MASKED, spaces.MultiDiscrete([2, 4])),
        (spaces.Tuple(tuple(MASKED.spaces.values())), spaces.MultiDiscrete([2, 3])),
    ]:
        hello = pb.Hello(
            protocol_version=1, run_id="r", num_envs=1, env=_env_spec(observation, action)
        )
        assert "differs from the learner's" in servicer._check_hello(hello)
    same = pb.Hello(protocol_version=1, run_id="r", num_envs=1, env=ours)
    assert servicer._check_hello(same) is None


@pytest.mark.parametrize(
    "space",
    [
        spaces.Dict({}),
        spaces.Dict({"a.b": spaces.Discrete(2)}),
        spaces.Box(0, 1, (0, 3)),
        spaces.MultiDiscrete([2, 3], start=[1, 0]),
        spaces.Text(5),
        spaces.Sequence(spaces.Discrete(2)),
    ],
    ids=str,
)
def test_spaces_the_wire_cannot_carry_are_refused(space: gym.Space) -> None:
    with pytest.raises(codec.UnsupportedSpace):
        codec.space_to_spec(space)


def test_dict_observations_travel_whole_even_where_the_env_stacks(monkeypatch) -> None:
    """Frame-once stacking is one tensor's rule: a learner never offers it for a dict/tuple
    observation (its leaves travel whole) and refuses a Hello that asks for it."""
    import asyncio

    from learner.state import trajectories

    monkeypatch.setattr(trajectories.envs, "frame_stack", lambda env_id, kwargs: 4)
    flat = _servicer(_env_spec(spaces.Box(0, 255, (4, 5, 5), np.uint8), spaces.Discrete(2)))
    assert flat.frame_stack == 4  # what a stacking family gets
    spec = _env_spec(MASKED, spaces.Discrete(4))
    servicer = _servicer(spec)
    assert servicer.frame_stack == 1
    info = asyncio.run(servicer.GetInfo(pb.GetInfoRequest(), None))
    assert info.frame_stack == 0
    hello = pb.Hello(protocol_version=1, run_id="r", num_envs=1, env=spec, frame_stack=4)
    assert "send whole observations (frame_stack 0)" in (servicer._check_hello(hello) or "")


@pytest.mark.parametrize(
    ("action", "columns", "want"),
    [
        (spaces.Dict({"choice": spaces.Discrete(3), "switches": spaces.MultiBinary(2)}),
         np.array([[2, 1, 0], [0, 0, 1]], np.int64),
         {"choice": [2, 0], "switches": [[1, 0], [0, 1]]}),
        (spaces.Tuple((spaces.Box(-1, 1, (2,), np.float32), spaces.Box(0, 4, (1,), np.float32))),
         np.array([[0.5, -3.0, 9.0], [0.0, 0.25, 1.0]], np.float32),
         (([[0.5, -1.0], [0.0, 0.25]]), [[4.0], [1.0]])),
    ],
    ids=["product", "gaussian"],
)  # fmt: skip
def test_the_learner_replies_dict_actions_one_tensor_per_leaf(action, columns, want) -> None:
    """The head's columns, split per leaf by the servicer, are what an actor steps with
    (Box leaves clipped to their own bounds)."""
    spec = _env_spec(spaces.Box(-1, 1, (2,), np.float32), action)
    got = StepWire(spec, 2).actions(_servicer(spec).reply_encoder(2)(columns))
    got_leaves = codec.flatten_values(spec.action_space, got)
    for value, expected, leaf in zip(
        got_leaves, codec.flatten_values(spec.action_space, want),
        codec.space_leaves(spec.action_space, action=True), strict=True,
    ):  # fmt: skip
        assert value.dtype == leaf.dtype
        np.testing.assert_array_equal(value, np.asarray(expected, leaf.dtype))
