"""Wire codec: tensors as {dtype, shape, bytes} and gymnasium spaces as SpaceSpec."""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from seedrl import codec
from seedrl.proto import seedrl_pb2 as pb

ROUND_TRIP_DTYPES = ["float32", "uint8", "int64", "bool"]
ROUND_TRIP_SHAPES = [(), (3,), (2, 4, 84), (0, 5)]


def _sample(dtype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype == "float32":
        return rng.standard_normal(shape).astype(np.float32)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


def _tensor(dtype: str, shape: list[int], data: bytes) -> pb.Tensor:
    return pb.Tensor(dtype=dtype, shape=shape, data=data)


# ---------------------------------------------------------------- round trip


@pytest.mark.parametrize("dtype", ROUND_TRIP_DTYPES)
@pytest.mark.parametrize("shape", ROUND_TRIP_SHAPES, ids=str)
def test_round_trip(dtype: str, shape: tuple[int, ...]) -> None:
    array = _sample(dtype, shape)
    msg = codec.encode_tensor(array)
    assert msg.dtype == dtype
    assert tuple(msg.shape) == shape
    assert len(msg.data) == array.nbytes

    out = codec.decode_tensor(msg, "x", dtype=dtype, shape=shape)
    assert out.dtype == np.dtype(dtype)
    assert out.shape == shape
    np.testing.assert_array_equal(out, array)


@pytest.mark.parametrize("dtype", ROUND_TRIP_DTYPES)
def test_round_trip_non_contiguous(dtype: str) -> None:
    base = _sample(dtype, (4, 84, 2), seed=1)
    view = base.transpose(2, 0, 1)  # (2, 4, 84), not C-contiguous
    assert not view.flags.c_contiguous
    out = codec.decode_tensor(codec.encode_tensor(view), "obs", dtype, (2, 4, 84))
    np.testing.assert_array_equal(out, view)

    strided = base[::2, ::3, 1]
    out = codec.decode_tensor(codec.encode_tensor(strided), "obs")
    np.testing.assert_array_equal(out, strided)


def test_encode_fills_given_message_and_overwrites_it() -> None:
    msg = codec.encode_tensor(np.zeros((2, 3), np.float32))
    same = codec.encode_tensor(np.arange(4, dtype=np.int64), out=msg)
    assert same is msg
    assert msg.dtype == "int64"
    assert list(msg.shape) == [4]
    np.testing.assert_array_equal(codec.decode_tensor(msg, "x"), np.arange(4))


def test_decode_without_expectations_accepts_any_allowed() -> None:
    array = np.arange(6, dtype=np.int16).reshape(2, 3)
    out = codec.decode_tensor(codec.encode_tensor(array), "x")
    assert out.dtype == np.int16
    np.testing.assert_array_equal(out, array)


def test_decoded_array_is_read_only_view() -> None:
    out = codec.decode_tensor(codec.encode_tensor(np.ones(3, np.float32)), "x")
    assert not out.flags.writeable
    with pytest.raises(ValueError):
        out[0] = 2.0


def test_round_trip_big_endian_input() -> None:
    array = np.arange(3, dtype=">f4")
    out = codec.decode_tensor(codec.encode_tensor(array), "x")
    np.testing.assert_array_equal(out, array)


# ---------------------------------------------------------------- decode rejects


def test_decode_rejects_wrong_dtype_naming_field() -> None:
    msg = codec.encode_tensor(np.zeros(3, np.float64))
    with pytest.raises(codec.WireError, match=r"^rewards: dtype float64 but expected float32"):
        codec.decode_tensor(msg, "rewards", dtype=np.float32, shape=(3,))


def test_decode_rejects_wrong_shape_naming_field() -> None:
    msg = codec.encode_tensor(np.zeros((2, 4), np.float32))
    expected = r"^observations: shape \[2, 4\] but expected \[4, 2\]"
    with pytest.raises(codec.WireError, match=expected):
        codec.decode_tensor(msg, "observations", dtype="float32", shape=(4, 2))
    # same number of elements is not enough: the shape itself must match
    with pytest.raises(codec.WireError, match="observations"):
        codec.decode_tensor(msg, "observations", shape=(8,))


@pytest.mark.parametrize("delta", [-1, 1, 4])
def test_decode_rejects_byte_length_mismatch(delta: int) -> None:
    good = codec.encode_tensor(np.zeros((2, 3), np.float32))
    data = good.data[:delta] if delta < 0 else good.data + b"\x00" * delta
    msg = _tensor("float32", [2, 3], data)
    with pytest.raises(codec.WireError, match=rf"^terminated: {len(data)} bytes .* need 24"):
        codec.decode_tensor(msg, "terminated")


def test_decode_rejects_scalar_with_no_bytes() -> None:
    with pytest.raises(codec.WireError, match=r"^x: 0 bytes"):
        codec.decode_tensor(_tensor("float32", [], b""), "x")


@pytest.mark.parametrize("dtype", ["object", "complex64", "float128", "str", "", "<f4", "O"])
def test_decode_rejects_disallowed_dtype(dtype: str) -> None:
    msg = _tensor(dtype, [1], b"\x00" * 8)
    with pytest.raises(codec.WireError, match=r"^actions: dtype .* is not one of"):
        codec.decode_tensor(msg, "actions")


@pytest.mark.parametrize("shape", [[-1], [2, -3], [-1, -4]])
def test_decode_rejects_negative_dims(shape: list[int]) -> None:
    msg = _tensor("uint8", shape, b"abcd")
    with pytest.raises(codec.WireError, match=r"^obs: dimension out of range"):
        codec.decode_tensor(msg, "obs")


@pytest.mark.parametrize(
    "shape",
    [[0, 2**62, 4], [0, 2**63 - 1], [1] * 65],
    ids=["zero-size-overflow", "zero-size-int64-max", "65-dims"],
)
def test_decode_rejects_unrepresentable_shape_with_wire_error(shape: list[int]) -> None:
    data = b"" if 0 in shape else b"x"
    with pytest.raises(codec.WireError, match=r"^x: "):
        codec.decode_tensor(_tensor("uint8", shape, data), "x")


# ---------------------------------------------------------------- all_finite


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_all_finite_is_false_with_nan_or_inf(bad: float, dtype: str) -> None:
    array = np.zeros((2, 3), dtype)
    array[1, 2] = bad
    assert not codec.all_finite(array)


@pytest.mark.parametrize("dtype", ["uint8", "int64", "bool", "float32"])
def test_all_finite_accepts_finite_and_integers(dtype: str) -> None:
    assert codec.all_finite(np.zeros((2, 3), dtype))
    assert codec.all_finite(np.full(4, np.iinfo(np.int64).max, np.int64))
    assert codec.all_finite(np.array([np.finfo(np.float32).max], np.float32))
    assert codec.all_finite(np.zeros((0,), np.float32))


# ---------------------------------------------------------------- spaces


def test_space_to_spec_box() -> None:
    space = gym.spaces.Box(low=-1.0, high=2.0, shape=(2, 3), dtype=np.float32)
    spec = codec.space_to_spec(space)
    assert spec.kind == "box"
    assert codec.spec_shape(spec) == (2, 3)
    assert spec.dtype == "float32"
    np.testing.assert_array_equal(codec.decode_tensor(spec.low, "low"), np.full((2, 3), -1.0))
    np.testing.assert_array_equal(codec.decode_tensor(spec.high, "high"), np.full((2, 3), 2.0))
    assert codec.spec_summary(spec) == "Box(shape=[2, 3], dtype=float32)"


def test_space_to_spec_image_box() -> None:
    space = gym.spaces.Box(0, 255, shape=(4, 84, 84), dtype=np.uint8)
    spec = codec.space_to_spec(space)
    assert (spec.kind, spec.dtype, codec.spec_shape(spec)) == ("box", "uint8", (4, 84, 84))
    assert codec.decode_tensor(spec.high, "high", np.uint8, (4, 84, 84)).max() == 255


def test_space_to_spec_discrete() -> None:
    spec = codec.space_to_spec(gym.spaces.Discrete(4))
    assert spec.kind == "discrete"
    assert spec.n == 4
    assert spec.dtype == "int64"
    assert codec.spec_shape(spec) == ()
    assert codec.spec_summary(spec) == "Discrete(4)"


def test_space_to_spec_discrete_must_start_at_zero() -> None:
    with pytest.raises(ValueError, match="start"):
        codec.space_to_spec(gym.spaces.Discrete(4, start=1))


@pytest.mark.parametrize(
    "space",
    [
        gym.spaces.Text(5),
        gym.spaces.Sequence(gym.spaces.Discrete(2)),
        gym.spaces.Graph(gym.spaces.Discrete(2), None),
    ],
    ids=["Text", "Sequence", "Graph"],
)
def test_space_to_spec_unsupported_space(space: gym.Space) -> None:
    with pytest.raises(ValueError, match=r"unsupported space .*Box, Discrete, MultiDiscrete"):
        codec.space_to_spec(space)


def _spec(space: gym.Space) -> pb.SpaceSpec:
    return codec.space_to_spec(space)


def test_specs_match() -> None:
    box = _spec(gym.spaces.Box(-1, 1, (4,), np.float32))
    assert codec.specs_match(box, box)
    # bounds are not part of the match
    assert codec.specs_match(box, _spec(gym.spaces.Box(-5, 5, (4,), np.float32)))
    assert not codec.specs_match(box, _spec(gym.spaces.Box(-1, 1, (5,), np.float32)))
    assert not codec.specs_match(box, _spec(gym.spaces.Box(-1, 1, (4,), np.float64)))
    assert not codec.specs_match(box, _spec(gym.spaces.Box(-1, 1, (2, 2), np.float32)))

    d2, d3 = _spec(gym.spaces.Discrete(2)), _spec(gym.spaces.Discrete(3))
    assert codec.specs_match(d2, _spec(gym.spaces.Discrete(2)))
    assert not codec.specs_match(d2, d3)
    assert not codec.specs_match(d2, box)


def test_env_spec_carries_kwargs_and_spaces() -> None:
    spec = codec.env_spec(
        "CartPole-v1", {"b": 1, "a": 2}, gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2)
    )
    assert spec.env_id == "CartPole-v1"
    assert spec.env_kwargs_json == '{"a": 2, "b": 1}'
    assert codec.spec_summary(spec.observation_space) == "Box(shape=[4], dtype=float32)"
    assert codec.spec_summary(spec.action_space) == "Discrete(2)"


# ---------------------------------------------------------------- properties

_allowed_dtypes = st.sampled_from(sorted(codec.ALLOWED_DTYPES)).map(np.dtype)


@settings(max_examples=100, deadline=None, database=None)
@given(
    hnp.arrays(
        dtype=_allowed_dtypes,
        shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5),
    )
)
def test_property_round_trip(array: np.ndarray) -> None:
    out = codec.decode_tensor(codec.encode_tensor(array), "x", array.dtype, array.shape)
    assert out.dtype == array.dtype
    assert out.shape == array.shape
    # NaN == NaN and -0.0 vs 0.0 differences are caught by comparing raw bytes
    assert out.tobytes() == np.ascontiguousarray(array).tobytes()


_dtype_names = st.one_of(
    st.sampled_from(sorted(codec.ALLOWED_DTYPES)),
    st.sampled_from(["object", "complex64", "float128", "str", "U4", "<f4", "V8", "int"]),
    st.text(max_size=10),
)


@settings(max_examples=200, deadline=None, database=None)
@given(
    dtype=_dtype_names,
    shape=st.lists(st.integers(min_value=-3, max_value=1000), max_size=6),
    data=st.binary(max_size=64),
    expect_dtype=st.one_of(st.none(), st.sampled_from(sorted(codec.ALLOWED_DTYPES))),
    expect_shape=st.one_of(st.none(), st.lists(st.integers(0, 4), max_size=3)),
)
def test_property_decode_arbitrary_input(
    dtype: str,
    shape: list[int],
    data: bytes,
    expect_dtype: str | None,
    expect_shape: list[int] | None,
) -> None:
    msg = _tensor(dtype, shape, data)
    try:
        out = codec.decode_tensor(msg, "field", expect_dtype, expect_shape)
    except codec.WireError as exc:
        assert str(exc).startswith("field: ")
        return
    assert out.nbytes == len(data)
    assert out.shape == tuple(shape)
    assert out.dtype.name == dtype
    assert out.tobytes() == data


# ---------------------------------------------------------------- checked_bytes


def test_checked_bytes_returns_the_payload_of_a_matching_tensor() -> None:
    array = np.arange(8, dtype=np.float32).reshape(2, 4)
    layout = codec.tensor_layout(np.float32, (2, 4))
    assert layout == codec.TensorLayout("float32", [2, 4], 32)
    data = codec.checked_bytes(codec.encode_tensor(array), "observations", layout)
    np.testing.assert_array_equal(np.frombuffer(data, np.float32).reshape(2, 4), array)


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        (pb.Tensor(dtype="float64", shape=[2, 4], data=bytes(64)), "dtype float64 but expected"),
        (pb.Tensor(dtype="float32", shape=[4, 2], data=bytes(32)), "shape [4, 2] but expected"),
        (pb.Tensor(dtype="float32", shape=[2, 4], data=bytes(31)), "31 bytes but dtype"),
        (pb.Tensor(dtype="V8", shape=[2, 4], data=bytes(32)), "is not one of"),
    ],
)
def test_checked_bytes_names_what_differs(tensor: pb.Tensor, message: str) -> None:
    with pytest.raises(codec.WireError, match=re.escape(message)):
        codec.checked_bytes(tensor, "observations", codec.tensor_layout(np.float32, (2, 4)))


# ---------------------------------------------------------------- wire templates


def _protobuf_frame(
    obs_KO: np.ndarray, reward_K: np.ndarray, terminated_K: np.ndarray, truncated_K: np.ndarray
) -> pb.ActorMessage:
    """A Frame built field by field with protobuf: what the templates must reproduce."""
    message = pb.ActorMessage()
    for field, array in zip(
        ("observations", "rewards", "terminated", "truncated"),
        (obs_KO, reward_K, terminated_K, truncated_K),
        strict=True,
    ):
        codec.encode_tensor(array, getattr(message.frame, field))
    return message


@pytest.mark.parametrize(
    ("k", "obs_shape", "obs_dtype"),
    [(1, (4,), "float32"), (3, (4,), "float32"), (2, (84, 84, 4), "uint8"), (200, (6,), "float64")],
)
def test_frame_template_splits_what_an_actor_sends(k, obs_shape, obs_dtype) -> None:
    template = codec.frame_template(*codec.frame_layouts(k, obs_dtype, obs_shape))
    sample_dtype = "float32" if obs_dtype == "float64" else obs_dtype
    obs = _sample(sample_dtype, (k, *obs_shape), 1).astype(obs_dtype)
    reward = _sample("float32", (k,), 2)
    terminated, truncated = _sample("bool", (k,), 3), _sample("bool", (k,), 4)
    raw = _protobuf_frame(obs, reward, terminated, truncated).SerializeToString()
    payloads = [a.tobytes() for a in (obs, reward, terminated, truncated)]
    assert template.size == len(raw)
    assert template.split(raw) == tuple(payloads)
    assert template.fill(payloads) == raw


def test_frame_template_misses_anything_else() -> None:
    """Other layouts, other field orders, truncation: None, so the caller parses in full."""
    template = codec.frame_template(*codec.frame_layouts(2, "float32", (4,)))
    obs, reward, flags = np.ones((2, 4), np.float32), np.ones(2, np.float32), np.zeros(2, bool)
    raw = _protobuf_frame(obs, reward, flags, flags).SerializeToString()
    assert template.split(raw) is not None
    assert template.split(raw[:-1]) is None
    assert template.split(raw + b"\x00") is None
    assert template.split(bytes(len(raw))) is None
    # The same Frame with its fields in reverse order: valid protobuf of the same length,
    # not the canonical bytes. (ActorMessage field 2, length-delimited: tag 0x12.)
    frame = pb.ActorMessage.FromString(raw).frame
    fields = b"".join(
        pb.Frame(**{name: getattr(frame, name)}).SerializeToString()
        for name in ("truncated", "terminated", "rewards", "observations")
    )
    assert len(fields) < 128  # a one-byte length varint
    reordered = b"\x12" + bytes([len(fields)]) + fields
    assert len(reordered) == len(raw) and reordered != raw
    assert pb.ActorMessage.FromString(reordered) == pb.ActorMessage.FromString(raw)
    assert template.split(reordered) is None
    # A 3-env frame against the 2-env template.
    three = _protobuf_frame(
        np.ones((3, 4), np.float32), np.ones(3, np.float32), *[np.zeros(3, bool)] * 2
    )
    assert template.split(three.SerializeToString()) is None


@settings(max_examples=300, deadline=None)
@given(edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4))
def test_frame_template_split_agrees_with_a_full_parse(edits) -> None:
    """Whatever bytes split accepts parse to a Frame of exactly the payloads it returned."""
    layouts = codec.frame_layouts(2, "float32", (4,))
    template = codec.frame_template(*layouts)
    obs, reward = _sample("float32", (2, 4), 5), _sample("float32", (2,), 6)
    raw = bytearray(
        _protobuf_frame(
            obs, reward, np.array([True, False]), np.array([False, True])
        ).SerializeToString()
    )
    for position, value in edits:
        raw[position % len(raw)] = value
    payloads = template.split(bytes(raw))
    if payloads is None:
        return
    frame = pb.ActorMessage.FromString(bytes(raw)).frame
    fields = (frame.observations, frame.rewards, frame.terminated, frame.truncated)
    checked = [
        codec.checked_bytes(field, "field", layout)
        for field, layout in zip(fields, (*layouts, layouts[2]), strict=True)
    ]
    assert tuple(checked) == payloads


@pytest.mark.parametrize(
    ("dtype", "shape"),
    [(np.int64, (1,)), (np.int64, (32,)), (np.float32, (4, 2)), (np.uint8, (3,))],
)
def test_actions_template_builds_what_encode_tensor_builds(dtype, shape) -> None:
    actions = _sample(np.dtype(dtype).name, shape, 7)
    expected = pb.LearnerMessage()
    codec.encode_tensor(actions, expected.actions.actions)
    template = codec.actions_template(actions.dtype, actions.shape)
    assert template.fill([actions.tobytes()]) == expected.SerializeToString()


def test_actions_template_refuses_foreign_byte_order() -> None:
    with pytest.raises(ValueError, match="native byte order"):
        codec.actions_template(np.dtype(">i8" if np.little_endian else "<i8"), (2,))


def test_space_mismatch_names_the_first_space_that_differs_with_both_summaries() -> None:
    box4 = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    box3 = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    cartpole = codec.env_spec("A-v0", {}, box4, gym.spaces.Discrete(2))
    same = codec.env_spec("B-v0", {}, box4, gym.spaces.Discrete(2))
    other_actions = codec.env_spec("A-v0", {}, box4, gym.spaces.Discrete(3))
    both_differ = codec.env_spec("A-v0", {}, box3, gym.spaces.Discrete(3))

    assert codec.space_mismatch(cartpole, same) is None  # the env id is not a space
    name, theirs, ours = codec.space_mismatch(cartpole, other_actions) or ("", "", "")
    assert name == "action_space"
    assert (theirs, ours) == (
        codec.spec_summary(cartpole.action_space),
        codec.spec_summary(other_actions.action_space),
    )
    assert theirs != ours
    mismatch = codec.space_mismatch(cartpole, both_differ)
    assert mismatch is not None and mismatch[0] == "observation_space"
