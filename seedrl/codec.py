"""Wire codec: numpy arrays <-> ``seedrl.v1.Tensor`` and gymnasium spaces <-> ``SpaceSpec``.

Tensors travel as ``{dtype, shape, raw C-order bytes}`` and are decoded with
``numpy.frombuffer`` (zero copy). Every decode validates dtype, shape and byte length
against what the receiver expects, and raises :class:`WireError` with a message that
says what was wrong; the server turns that into ``INVALID_ARGUMENT`` for that stream.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
from google.protobuf.message import Message
from numpy.typing import DTypeLike

from seedrl.proto import seedrl_pb2 as pb

MAX_RANK = 32
MAX_DIM = 2**31 - 1

ALLOWED_DTYPES = frozenset(
    {"bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64"}
)


class WireError(ValueError):
    """A message from the other side does not match the contract."""


def encode_tensor(array: np.ndarray, out: pb.Tensor | None = None) -> pb.Tensor:
    """Fill (or create) a Tensor message from ``array``; non-contiguous input is copied."""
    msg = pb.Tensor() if out is None else out
    native, name = _wire_dtype(array.dtype)
    msg.dtype = name
    msg.shape[:] = array.shape
    msg.data = np.ascontiguousarray(array, dtype=native).tobytes()
    return msg


@functools.lru_cache(maxsize=64)
def _wire_dtype(dtype: np.dtype) -> tuple[np.dtype, str]:
    """The native-byte-order dtype and its name: the wire never carries ">f4"."""
    native = dtype.newbyteorder("=")
    return native, native.name


def decode_tensor(
    msg: pb.Tensor,
    name: str,
    dtype: DTypeLike | None = None,
    shape: Sequence[int] | None = None,
) -> np.ndarray:
    """Return a read-only view of ``msg`` as a numpy array, checked against expectations.

    ``dtype``/``shape`` of None accept anything allowed; the byte length must always
    match the declared dtype and shape exactly.
    """
    if dtype is not None and shape is not None:
        # The per-frame path: one comparison per field against cached expectations.
        np_dtype, dtype_name, nbytes, shape_tuple = _expectation(dtype, tuple(shape))
        data = msg.data
        if msg.dtype == dtype_name and len(data) == nbytes and tuple(msg.shape) == shape_tuple:
            return np.frombuffer(data, dtype=np_dtype).reshape(shape_tuple)
    return _decode_checked(msg, name, dtype, shape)


_Expectation = tuple[np.dtype, str, int, tuple[int, ...]]
_expectations: dict[tuple[Any, tuple[int, ...]], _Expectation] = {}


def _expectation(dtype: Any, shape: tuple[int, ...]) -> _Expectation:
    """(dtype, its name, byte length, shape), cached: ``np.dtype(...).name`` is slow."""
    key = (dtype, shape)
    found = _expectations.get(key)  # (an unhashable dtype-like raises: callers pass types)
    if found is None:
        if len(_expectations) > 1024:  # one entry per (field, K) seen; never unbounded
            _expectations.clear()
        np_dtype = np.dtype(dtype)
        found = np_dtype, np_dtype.name, math.prod(shape) * np_dtype.itemsize, shape
        _expectations[key] = found
    return found


def _decode_checked(
    msg: pb.Tensor, name: str, dtype: DTypeLike | None, shape: Sequence[int] | None
) -> np.ndarray:
    """Full validation, with a message naming what is wrong."""
    if msg.dtype not in ALLOWED_DTYPES:
        raise WireError(f"{name}: dtype {msg.dtype!r} is not one of {sorted(ALLOWED_DTYPES)}")
    if dtype is not None and msg.dtype != np.dtype(dtype).name:
        raise WireError(f"{name}: dtype {msg.dtype} but expected {np.dtype(dtype).name}")
    got_shape = tuple(msg.shape)
    if len(got_shape) > MAX_RANK:
        raise WireError(f"{name}: rank {len(got_shape)} exceeds the limit of {MAX_RANK}")
    if any(d < 0 or d > MAX_DIM for d in got_shape):
        raise WireError(f"{name}: dimension out of range in shape {list(got_shape)}")
    if shape is not None and got_shape != tuple(shape):
        raise WireError(f"{name}: shape {list(got_shape)} but expected {list(shape)}")
    np_dtype = np.dtype(msg.dtype)
    expected_bytes = math.prod(got_shape) * np_dtype.itemsize
    if len(msg.data) != expected_bytes:
        raise WireError(
            f"{name}: {len(msg.data)} bytes but dtype {msg.dtype} and shape "
            f"{list(got_shape)} need {expected_bytes}"
        )
    return np.frombuffer(msg.data, dtype=np_dtype).reshape(got_shape)


class TensorLayout(NamedTuple):
    """What one tensor field must look like on the wire, precomputed once per stream."""

    dtype: str
    shape: list[int]  # a list: protobuf's repeated field compares equal to a list, not a tuple
    nbytes: int


def tensor_layout(dtype: DTypeLike, shape: Sequence[int]) -> TensorLayout:
    """The layout :func:`checked_bytes` expects for an array of ``dtype`` and ``shape``."""
    np_dtype = np.dtype(dtype)
    return TensorLayout(
        np_dtype.name, [int(d) for d in shape], math.prod(shape) * np_dtype.itemsize
    )


def checked_bytes(msg: pb.Tensor, name: str, layout: TensorLayout) -> bytes:
    """The raw payload of ``msg`` when its dtype, shape and byte length match ``layout``.

    The per-frame path: three comparisons and no array; the learner builds one
    array per field for the whole batch. Anything else raises :class:`WireError` saying
    what differs.
    """
    data = msg.data
    if msg.dtype == layout.dtype and len(data) == layout.nbytes and msg.shape == layout.shape:
        return data
    _decode_checked(msg, name, layout.dtype, layout.shape)
    raise WireError(f"{name}: expected dtype {layout.dtype} and shape {layout.shape}")


class WireTemplate:
    """A message's wire bytes when only fixed-length ``bytes`` payloads vary.

    Protobuf writes known fields in field-number order, so every Frame our actors send
    for one layout (K, dtypes, shapes) has the same bytes outside its four tensor
    payloads. Comparing those bytes checks a Frame and slicing splits it, with no parse
    and no message objects; joining them builds a reply the same way. The template is
    found by serializing the real message, never written by hand. Bytes that do not
    match it (another encoder's field order, a wrong layout, garbage) are no error here:
    :meth:`split` returns None and the caller takes the full parse, which says what is
    wrong.
    """

    __slots__ = ("_checks", "_fixed", "_fixed_at", "_payloads_at", "_pieces", "_spans", "size")

    def __init__(self, build: Callable[[list[bytes]], Message], sizes: Sequence[int]) -> None:
        base = build([bytes(n) for n in sizes]).SerializeToString()
        base_u8 = np.frombuffer(base, np.uint8)
        spans: list[tuple[int, int]] = []
        for field, size in enumerate(sizes):
            marked = [b"\xff" * n if i == field else bytes(n) for i, n in enumerate(sizes)]
            marked_u8 = np.frombuffer(build(marked).SerializeToString(), np.uint8)
            same_size = len(marked_u8) == len(base)
            moved = np.flatnonzero(marked_u8 != base_u8) if same_size else np.zeros(0, np.intp)
            if size < 1 or len(moved) != size or moved[-1] - moved[0] != size - 1:
                raise ValueError(f"payload {field} is not one contiguous run of {size} bytes")
            spans.append((int(moved[0]), int(moved[0]) + size))
        if any(end > start for (_, end), (start, _) in itertools.pairwise(spans)):
            raise ValueError("payloads must appear in order on the wire")
        self.size = len(base)
        bounds = [0, *(p for span in spans for p in span), len(base)]
        fixed = [(bounds[i], base[bounds[i] : bounds[i + 1]]) for i in range(0, len(bounds), 2)]
        self._checks = tuple((at, piece) for at, piece in fixed if piece)
        self._spans = tuple(spans)
        self._pieces = tuple(piece for _, piece in fixed)
        # Slicing by itemgetter runs in C: a split is two calls and one tuple compare.
        self._fixed = tuple(piece for _, piece in self._checks)
        self._fixed_at = _slicer([slice(at, at + len(piece)) for at, piece in self._checks])
        self._payloads_at = _slicer([slice(start, end) for start, end in spans])

    def split(self, raw: bytes) -> tuple[bytes, ...] | None:
        """The payloads of ``raw`` when it matches the template, else None (a few slices)."""
        if len(raw) != self.size or self._fixed_at(raw) != self._fixed:
            return None
        return self._payloads_at(raw)

    def fill_one(self, payload: bytes) -> bytes:
        """:meth:`fill` for a template of one payload (a reply's actions): one join."""
        head, tail = self._pieces
        return b"".join((head, payload, tail))

    def fill(self, payloads: Sequence[bytes]) -> bytes:
        """The message's bytes with these payloads (each of its template's size)."""
        pieces = self._pieces
        out = [pieces[0]]
        for payload, piece in zip(payloads, pieces[1:], strict=True):
            out += (payload, piece)
        return b"".join(out)


def _slicer(slices: Sequence[slice]) -> Callable[[bytes], tuple[bytes, ...]]:
    """``raw -> tuple(raw[s] for s in slices)``, in C where there are two or more."""
    if len(slices) >= 2:
        return operator.itemgetter(*slices)
    return lambda raw: tuple(raw[s] for s in slices)


def frame_layouts(
    num_envs: int, obs_dtype: DTypeLike, obs_shape: Sequence[int]
) -> tuple[TensorLayout, TensorLayout, TensorLayout]:
    """The layouts of a K-env Frame's observations, rewards and (both) flag tensors."""
    return (
        tensor_layout(obs_dtype, (num_envs, *obs_shape)),
        tensor_layout(np.float32, (num_envs,)),
        tensor_layout(np.bool_, (num_envs,)),
    )


def frame_template(
    observations: TensorLayout,
    rewards: TensorLayout,
    flags: TensorLayout,
    acting: TensorLayout | None = None,
) -> WireTemplate:
    """The wire bytes of an ``ActorMessage`` carrying one Frame of this layout; ``acting``
    (a multi-agent env's rows) adds the acting flags as the last payload."""

    def build(data: list[bytes]) -> pb.ActorMessage:
        def tensor(layout: TensorLayout, payload: bytes) -> pb.Tensor:
            return pb.Tensor(dtype=layout.dtype, shape=layout.shape, data=payload)

        frame = pb.Frame(
            observations=tensor(observations, data[0]),
            rewards=tensor(rewards, data[1]),
            terminated=tensor(flags, data[2]),
            truncated=tensor(flags, data[3]),
        )
        if acting is not None:
            frame.acting.CopyFrom(tensor(acting, data[4]))
        return pb.ActorMessage(frame=frame)

    sizes = [observations.nbytes, rewards.nbytes, flags.nbytes, flags.nbytes]
    if acting is not None:
        sizes.append(acting.nbytes)
    return WireTemplate(build, sizes)


def action_dtype(space: pb.SpaceSpec) -> np.dtype:
    """The dtype actions of this space travel in: int64 for Discrete, else float32."""
    return np.dtype(np.int64 if space.kind == "discrete" else np.float32)


def action_columns(spec: pb.SpaceSpec) -> list[int]:
    """How many columns each leaf of a dict/tuple action space takes in the learner's flat
    actions ``[K, sum(columns)]``: its elements (1 for a Discrete)."""
    return [max(1, math.prod(leaf.shape)) for leaf in space_leaves(spec, action=True)]


def action_leaves_of(spec: pb.SpaceSpec, actions_KC: np.ndarray) -> list[np.ndarray]:
    """A dict/tuple action space's flat actions ``[K, C]`` (leaves side by side, in leaf
    order) -> one array ``[K, *leaf_shape]`` per leaf, in the leaf's action dtype."""
    k = len(actions_KC)
    flat = np.asarray(actions_KC).reshape(k, -1)
    starts = [0, *itertools.accumulate(action_columns(spec))]
    return [
        np.ascontiguousarray(flat[:, a:b], leaf.dtype).reshape(k, *leaf.shape)
        for leaf, a, b in zip(space_leaves(spec, action=True), starts, starts[1:], strict=False)
    ]


def actions_template(dtype: np.dtype, shape: Sequence[int]) -> WireTemplate:
    """The wire bytes of a ``LearnerMessage`` answering a frame with actions of this layout."""
    native, name = _wire_dtype(np.dtype(dtype))
    if native != dtype:
        raise ValueError(f"actions must be in native byte order, got {dtype}")
    layout = tensor_layout(native, shape)

    def build(data: list[bytes]) -> pb.LearnerMessage:
        tensor = pb.Tensor(dtype=name, shape=layout.shape, data=data[0])
        return pb.LearnerMessage(actions=pb.Actions(actions=tensor))

    return WireTemplate(build, [layout.nbytes])


def structured_frame_template(
    leaves: Sequence[TensorLayout],
    rewards: TensorLayout,
    flags: TensorLayout,
    acting: TensorLayout | None = None,
) -> WireTemplate:
    """The wire bytes of an ``ActorMessage`` carrying one Frame of a "dict"/"tuple"
    observation space: payloads rewards, terminated, truncated, then each leaf (wire order),
    then with ``acting`` (a multi-agent env's rows) the acting flags."""

    def build(data: list[bytes]) -> pb.ActorMessage:
        def tensor(layout: TensorLayout, payload: bytes) -> pb.Tensor:
            return pb.Tensor(dtype=layout.dtype, shape=layout.shape, data=payload)

        frame = pb.Frame(
            rewards=tensor(rewards, data[0]),
            terminated=tensor(flags, data[1]),
            truncated=tensor(flags, data[2]),
            observation_leaves=[
                tensor(x, d) for x, d in zip(leaves, data[3 : 3 + len(leaves)], strict=True)
            ],
        )
        if acting is not None:
            frame.acting.CopyFrom(tensor(acting, data[3 + len(leaves)]))
        return pb.ActorMessage(frame=frame)

    sizes = [rewards.nbytes, flags.nbytes, flags.nbytes, *(x.nbytes for x in leaves)]
    if acting is not None:
        sizes.append(acting.nbytes)
    return WireTemplate(build, sizes)


def leaf_layouts(num_envs: int, leaves: Sequence[Leaf]) -> list[TensorLayout]:
    """The layout of each leaf's tensor ``[K, *leaf_shape]`` in a frame or a reply."""
    return [tensor_layout(leaf.dtype, (num_envs, *leaf.shape)) for leaf in leaves]


def actions_leaves_template(layouts: Sequence[TensorLayout]) -> WireTemplate:
    """The wire bytes of a ``LearnerMessage`` answering with one tensor per action leaf."""

    def build(data: list[bytes]) -> pb.LearnerMessage:
        tensors = [
            pb.Tensor(dtype=x.dtype, shape=x.shape, data=d)
            for x, d in zip(layouts, data, strict=True)
        ]
        return pb.LearnerMessage(actions=pb.Actions(action_leaves=tensors))

    return WireTemplate(build, [x.nbytes for x in layouts])


class LeafPacking:
    """Structured observations as one ``uint8`` row per env, each leaf's bytes side by side.

    The learner keeps such observations in the same arrays as flat ones (batching,
    unrolls, checkpoints need no per-leaf code) and the model reads the leaves back out
    of the row, as PufferLib's emulation layer does.
    """

    def __init__(self, leaves: Sequence[Leaf]) -> None:
        self.leaves = list(leaves)
        self.leaf_bytes = [math.prod(x.shape) * x.dtype.itemsize for x in self.leaves]
        self.offsets = [0, *itertools.accumulate(self.leaf_bytes)]
        self.row_bytes = self.offsets[-1]

    def pack(self, payloads: Sequence[bytes], num_envs: int) -> bytes:
        """K envs' leaf payloads (each ``[K, *leaf_shape]``) -> K packed rows, as bytes."""
        if len(payloads) == 1:
            return payloads[0]
        parts = [np.frombuffer(p, np.uint8).reshape(num_envs, -1) for p in payloads]
        return np.concatenate(parts, axis=1).tobytes()

    def pack_values(self, values: Sequence[np.ndarray]) -> np.ndarray:
        """Leaf arrays ``[N, *leaf_shape]`` -> packed rows ``[N, row_bytes]`` (uint8)."""
        n = len(values[0])
        parts = [
            np.ascontiguousarray(v, dtype=leaf.dtype).reshape(n, -1).view(np.uint8)
            for v, leaf in zip(values, self.leaves, strict=True)
        ]
        return np.concatenate(parts, axis=1)

    def unpack(self, rows_NR: np.ndarray) -> list[np.ndarray]:
        """Packed rows ``[N, row_bytes]`` -> each leaf's values ``[N, *leaf_shape]``."""
        n = len(rows_NR)
        return [
            np.ascontiguousarray(rows_NR[:, start:end]).view(leaf.dtype).reshape(n, *leaf.shape)
            for leaf, start, end in zip(
                self.leaves, self.offsets[:-1], self.offsets[1:], strict=True
            )
        ]


def all_finite(array: np.ndarray) -> bool:
    """False when a floating array holds NaN or inf (integer and bool arrays always pass)."""
    return array.dtype.kind != "f" or bool(np.isfinite(array).all())


# ---------------------------------------------------------------- spaces

LEAF_KINDS = ("box", "discrete", "multi_discrete", "multi_binary")
"""Spaces that travel as one tensor each."""
CONTAINER_KINDS = ("dict", "tuple")
"""Spaces that travel as their leaves, depth first (a dict's in its key order)."""
LEAF_SEPARATOR = "."
"""Joins dict keys and tuple indices into a leaf's name (``"robot.camera"``, ``"1"``)."""


class UnsupportedSpace(ValueError):
    """A gymnasium space seedrl cannot carry on the wire (the message says which)."""


def space_to_spec(space: Any) -> pb.SpaceSpec:
    """Describe a gymnasium space for the wire: Box, Discrete, MultiDiscrete, MultiBinary,
    and Dict and Tuple of these (nested to any depth)."""
    from gymnasium import spaces

    if isinstance(space, spaces.Discrete):
        if int(space.start) != 0:
            raise UnsupportedSpace(f"Discrete spaces must start at 0, got start={space.start}")
        return pb.SpaceSpec(kind="discrete", shape=[], dtype="int64", n=int(space.n))
    if isinstance(space, spaces.Box):
        _check_leaf_size(space)
        spec = pb.SpaceSpec(kind="box", shape=list(space.shape), dtype=space.dtype.name)
        encode_tensor(np.asarray(space.low), spec.low)
        encode_tensor(np.asarray(space.high), spec.high)
        return spec
    if isinstance(space, spaces.MultiDiscrete):
        _check_leaf_size(space)
        if np.any(space.start != 0):
            raise UnsupportedSpace(f"MultiDiscrete spaces must start at 0, got start={space.start}")
        return pb.SpaceSpec(
            kind="multi_discrete",
            shape=list(space.shape),
            dtype=space.dtype.name,
            nvec=[int(n) for n in np.ravel(space.nvec)],
        )
    if isinstance(space, spaces.MultiBinary):
        _check_leaf_size(space)
        return pb.SpaceSpec(kind="multi_binary", shape=list(space.shape), dtype=space.dtype.name)
    if isinstance(space, spaces.Dict):
        if not space.spaces:
            raise UnsupportedSpace("an empty Dict space carries nothing: drop it")
        children = []
        for key, child in space.spaces.items():
            if not isinstance(key, str) or not key or LEAF_SEPARATOR in key:
                raise UnsupportedSpace(
                    f"Dict keys must be non-empty strings without '.', got {key!r}"
                )
            children.append(space_to_spec(child))
            children[-1].name = key
        return pb.SpaceSpec(kind="dict", children=children)
    if isinstance(space, spaces.Tuple):
        if not space.spaces:
            raise UnsupportedSpace("an empty Tuple space carries nothing: drop it")
        return pb.SpaceSpec(kind="tuple", children=[space_to_spec(s) for s in space.spaces])
    raise UnsupportedSpace(
        f"unsupported space {space!r}: seedrl supports Box, Discrete, MultiDiscrete, "
        "MultiBinary, and Dict and Tuple of them (wrap others into these)"
    )


def _check_leaf_size(space: Any) -> None:
    if math.prod(space.shape) == 0:
        raise UnsupportedSpace(f"{space!r} holds no values: drop it")


def is_structured(spec: pb.SpaceSpec) -> bool:
    """True for "dict" and "tuple" spaces, which travel as one tensor per leaf."""
    return spec.kind in CONTAINER_KINDS


class Leaf(NamedTuple):
    """One tensor of a space on the wire: its name, its spec, and the values' dtype and shape."""

    name: str
    spec: pb.SpaceSpec
    dtype: np.dtype
    shape: tuple[int, ...]


def space_leaves(spec: pb.SpaceSpec, action: bool = False) -> list[Leaf]:
    """The leaves of a space, depth first; a leaf space is its own single leaf (name "").

    ``action``: the dtype actions of the leaf travel in (float32 for a Box, whatever the
    env's Box dtype), else the dtype its observations travel in (the spec's).
    """
    leaves: list[Leaf] = []

    def walk(node: pb.SpaceSpec, path: tuple[str, ...]) -> None:
        if node.kind in CONTAINER_KINDS:
            for index, child in enumerate(node.children):
                walk(child, (*path, child.name if node.kind == "dict" else str(index)))
        else:
            dtype = "float32" if action and node.kind == "box" else node.dtype
            leaves.append(Leaf(LEAF_SEPARATOR.join(path), node, np.dtype(dtype), spec_shape(node)))

    walk(spec, ())
    return leaves


def flatten_values(spec: pb.SpaceSpec, values: Any) -> list[Any]:
    """A (batch of) structured values -> its leaves' values, in :func:`space_leaves` order.

    Dicts are read by key, so an env's own key order does not matter.
    """
    if spec.kind == "dict":
        return [v for child in spec.children for v in flatten_values(child, values[child.name])]
    if spec.kind == "tuple":
        return [v for child, part in zip(spec.children, values, strict=True) for v in
                flatten_values(child, part)]  # fmt: skip
    return [values]


def unflatten_values(spec: pb.SpaceSpec, leaves: Sequence[Any]) -> Any:
    """The inverse of :func:`flatten_values`: dicts (key order of the spec) and tuples."""
    it = iter(leaves)

    def build(node: pb.SpaceSpec) -> Any:
        if node.kind == "dict":
            return {child.name: build(child) for child in node.children}
        if node.kind == "tuple":
            return tuple(build(child) for child in node.children)
        return next(it)

    out = build(spec)
    if next(it, None) is not None:
        raise ValueError("more leaf values than the space has leaves")
    return out


def spec_summary(spec: pb.SpaceSpec) -> str:
    """A one-line human description, used in error messages."""
    if spec.kind == "discrete":
        return f"Discrete({spec.n})"
    if spec.kind == "multi_discrete":
        return f"MultiDiscrete(nvec={list(spec.nvec)}, shape={list(spec.shape)})"
    if spec.kind == "multi_binary":
        return f"MultiBinary(shape={list(spec.shape)})"
    if spec.kind == "dict":
        return "Dict(" + ", ".join(f"{c.name}: {spec_summary(c)}" for c in spec.children) + ")"
    if spec.kind == "tuple":
        return "Tuple(" + ", ".join(spec_summary(c) for c in spec.children) + ")"
    return f"Box(shape={list(spec.shape)}, dtype={spec.dtype})"


def specs_match(a: pb.SpaceSpec, b: pb.SpaceSpec) -> bool:
    """True when two spaces agree on kind, shape, dtype, number of actions and, for
    containers, on every child and key."""
    if (a.kind, tuple(a.shape), a.dtype, a.n, tuple(a.nvec), a.name) != (
        b.kind, tuple(b.shape), b.dtype, b.n, tuple(b.nvec), b.name
    ):  # fmt: skip
        return False
    if len(a.children) != len(b.children):
        return False
    return all(specs_match(x, y) for x, y in zip(a.children, b.children, strict=True))


def space_mismatch(theirs: pb.EnvSpec, ours: pb.EnvSpec) -> tuple[str, str, str] | None:
    """The first of the two env descriptions' observation and action spaces that differ,
    as (``observation_space`` or ``action_space``, their summary, our summary); None when
    both match. Every place that compares an env with another's words its own message."""
    for name in ("observation_space", "action_space"):
        a, b = getattr(theirs, name), getattr(ours, name)
        if not specs_match(a, b):
            return name, spec_summary(a), spec_summary(b)
    return None


def spec_shape(spec: pb.SpaceSpec) -> tuple[int, ...]:
    return tuple(int(d) for d in spec.shape)


def env_spec(
    env_id: str,
    env_kwargs: dict[str, Any],
    observation_space: Any,
    action_space: Any,
    agents: Sequence[str] = (),
) -> pb.EnvSpec:
    """Build the EnvSpec message the learner publishes and actors echo in their Hello;
    ``agents``: a multi-agent env's agent ids (every one with these spaces)."""
    return pb.EnvSpec(
        env_id=env_id,
        env_kwargs_json=json.dumps(env_kwargs, sort_keys=True),
        observation_space=space_to_spec(observation_space),
        action_space=space_to_spec(action_space),
        agents=list(agents),
    )


def rows_per_env(spec: pb.EnvSpec) -> int:
    """Rows each env has in a Frame: one per agent of a multi-agent env, else one."""
    return max(1, len(spec.agents))


def action_bounds(spec: pb.SpaceSpec) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The (low, high) float32 bounds of a Box action space, or (None, None) for any other
    (actors and trained policies clip their actions to them)."""
    if spec.kind != "box" or not spec.low.data:
        return None, None
    low = decode_tensor(spec.low, "action low").astype(np.float32)
    high = decode_tensor(spec.high, "action high").astype(np.float32)
    return low, high
