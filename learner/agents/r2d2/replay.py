"""Prioritized sequence replay (Schaul et al. 2016; Ape-X, R2D2) for the R2D2 agent.

Sequences arrive from inference as finished unrolls (``put``, which never waits: the
oldest sequences are evicted first once the capacity in frames or bytes is reached),
enter at the highest priority seen so far, and are sampled by the trainer host in
proportion to ``priority ** alpha`` (``get``), with importance weights
``(N * P(i)) ** -beta`` normalised by the batch's largest. The trainer's new priorities
come back through ``feedback``; a sequence evicted meanwhile keeps none of them.

Copies out of the ring happen outside the lock, so a ``put`` never waits behind a batch
being gathered; a sequence overwritten during its copy is handed out with weight 0.

``save`` writes the stored sequences, their ids and priorities and the counters to an
uncompressed ``.npz`` beside the checkpoint (again copying outside the lock, and leaving
out any sequence overwritten meanwhile), and ``load`` puts them back, so a resumed run
samples from where it stopped instead of refilling from nothing; the sum tree is rebuilt
from the priorities, the same sums in the same order.

Shape suffixes: C capacity in sequences, N sampled sequences.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from learner.agents.base import SavedStoreError
from learner.state.files import Lease, atomic_file
from learner.state.trajectories import Unrolls

if TYPE_CHECKING:
    from seedrl.config import LearnerConfig

REPLAY_FORMAT = "seedrl-replay"
REPLAY_VERSION = 1


class SumTree:
    """Priorities of ``capacity`` leaves with O(log C) prefix-sum search, in numpy."""

    def __init__(self, capacity: int) -> None:
        self.size = 1 << max(0, (capacity - 1).bit_length())
        self.tree = np.zeros(2 * self.size, np.float64)  # node i: children 2i, 2i+1; root 1

    @property
    def total(self) -> float:
        return float(self.tree[1])

    def leaves(self, index: np.ndarray) -> np.ndarray:
        return self.tree[self.size + index]

    def update(self, index: np.ndarray, value: np.ndarray) -> None:
        """Set leaves ``index`` to ``value`` and every sum above them."""
        nodes = self.size + np.asarray(index, np.int64)
        self.tree[nodes] = value
        nodes = np.unique(nodes // 2)
        while nodes[0] >= 1:
            self.tree[nodes] = self.tree[2 * nodes] + self.tree[2 * nodes + 1]
            if nodes[0] == 1:
                break
            nodes = np.unique(nodes // 2)

    def find(self, mass: np.ndarray) -> np.ndarray:
        """The leaf whose prefix-sum interval holds each of ``mass`` (in [0, total))."""
        node = np.ones(len(mass), np.int64)
        mass = mass.astype(np.float64, copy=True)
        while node[0] < self.size:
            left = 2 * node
            right = mass >= self.tree[left]
            mass -= np.where(right, self.tree[left], 0.0)
            node = left + right
        return node - self.size


@dataclasses.dataclass
class ReplayCounters:
    """What the replay has seen, for the replay ratio and the metrics."""

    inserted_sequences: int = 0
    inserted_frames: int = 0
    sampled_sequences: int = 0


class PrioritizedReplay:
    """A bounded FIFO ring of sequences sampled by priority (the R2D2 agent's store)."""

    def __init__(
        self,
        max_frames: int,
        max_bytes: int,
        min_frames: int,
        replay_ratio: float,
        new_frames_per_sequence: int,
        trained_frames_per_sequence: int,
        priority_exponent: float = 0.9,
        importance_exponent: float = 0.6,
        seed: int = 0,
        insert_lead_frames: int | None = None,
    ) -> None:
        """``new_frames_per_sequence`` frames a sequence adds beyond what it shares with
        its predecessor (counted as inserted); ``trained_frames_per_sequence`` transitions
        a sampled one trains on (counted against ``replay_ratio``). ``insert_lead_frames``:
        how far inserts may run ahead of what the trainer has sampled at ``replay_ratio``
        before ``put`` waits (None: never); at least the minimum fill plus one batch's
        frames at the ratio, or inserts and samples would wait on each other."""
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self.min_frames = min_frames
        self.replay_ratio = replay_ratio
        self.insert_lead_frames = insert_lead_frames if replay_ratio > 0 else None
        self.new_frames = new_frames_per_sequence
        self.trained_frames = trained_frames_per_sequence
        self.alpha = priority_exponent
        self.beta = importance_exponent
        self.rng = np.random.default_rng(seed)
        self.counters = ReplayCounters()
        self.capacity = 0
        self.rows = 0
        self.bytes_per_sequence = 0
        self._ring: Unrolls | None = None
        self._tree: SumTree | None = None
        self._ids_C = np.zeros(0, np.int64)
        self._priority_C = np.zeros(0, np.float64)
        self._size = 0
        self._next_id = 0
        """The id of the next sequence put (ids count puts; slot = id mod capacity)."""
        self._max_priority = 1.0
        self._closed = False
        self._cond = threading.Condition()
        self.epsilon_range: tuple[float, float] | None = None
        """The exploration rates inference used last (set by the R2D2 policy)."""

    # ----------------------------------------------------------------- the store API

    def __len__(self) -> int:
        return self._size

    @property
    def stored_frames(self) -> int:
        return self._size * self.rows

    def has_room(self) -> bool:
        """False while inserts are further ahead of the trainer than the lead allows."""
        if self.insert_lead_frames is None or self._closed:
            return True
        sampled_frames = self.counters.sampled_sequences * self.trained_frames
        lead = self.counters.inserted_frames - sampled_frames / self.replay_ratio
        return lead <= self.insert_lead_frames

    def put(self, unrolls: Unrolls, timeout: float | None = None) -> bool:
        """Insert each sequence at the current max priority, evicting the oldest; waits
        while the trainer is behind (``insert_lead_frames``). False if it timed out or
        the replay is closed."""
        with self._cond:
            if not self._cond.wait_for(self.has_room, timeout) or self._closed:
                return False
            if self._ring is None:
                self._allocate(unrolls)
            assert self._ring is not None and self._tree is not None
            n = len(unrolls)
            ids_N = self._next_id + np.arange(n, dtype=np.int64)
            if n > self.capacity:  # only the newest fit
                unrolls = unrolls.split(n - self.capacity)[1]
                ids_N = ids_N[n - self.capacity :]
            slots_N = ids_N % self.capacity
            _write(self._ring, slots_N, unrolls)
            self._ids_C[slots_N] = ids_N
            self._priority_C[slots_N] = self._max_priority
            self._tree.update(slots_N, np.full(len(slots_N), self._max_priority**self.alpha))
            self._size = min(self.capacity, self._size + n)
            self._next_id += n
            self.counters.inserted_sequences += n
            self.counters.inserted_frames += n * self.new_frames
            self._cond.notify_all()
            return True

    def get(self, n: int, timeout: float | None = None) -> Unrolls | None:
        """``n`` sequences drawn with replacement in proportion to priority ** alpha, once
        the replay holds its minimum and the ratio allows; None on timeout or close."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._ready(n) or self._closed, timeout):
                return None
            if self._closed:
                return None
            slots_N, weight_N = self._draw(n)
            ids_N = self._ids_C[slots_N].copy()
            ring = self._ring
            self.counters.sampled_sequences += n
            self._cond.notify_all()  # a put waiting for the trainer to catch up
        assert ring is not None
        batch = _read(ring, slots_N)
        with self._cond:  # a sequence overwritten while it was copied trains on nothing
            torn_N = self._ids_C[slots_N] != ids_N
        batch.sample_id = ids_N
        batch.sample_weight = np.where(torn_N, 0.0, weight_N).astype(np.float32)
        return batch

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def feedback(self, sample_id: np.ndarray, priority: np.ndarray) -> None:
        """New priorities of sampled sequences still stored (evicted ones are skipped)."""
        with self._cond:
            if self._tree is None:
                return
            slots = sample_id % self.capacity
            kept = self._ids_C[slots] == sample_id
            if not kept.any():
                return
            slots, value = slots[kept], priority[kept].astype(np.float64)
            self._priority_C[slots] = value
            self._tree.update(slots, value**self.alpha)
            self._max_priority = max(self._max_priority, float(value.max()))

    def metrics(self) -> dict[str, float]:
        with self._cond:
            stored = self._priority_C[: self._size]
            counters = dataclasses.replace(self.counters)
            record = {
                "replay_sequences": float(self._size),
                "replay_frames": float(self.stored_frames),
                "replay_bytes": float(self._size * self.bytes_per_sequence),
                "replay_priority_mean": float(stored.mean()) if len(stored) else 0.0,
                "replay_priority_max": float(stored.max()) if len(stored) else 0.0,
            }
        if counters.inserted_frames:
            record["replay_ratio"] = (
                counters.sampled_sequences * self.trained_frames / counters.inserted_frames
            )
        if self.epsilon_range is not None:
            record["epsilon_min"], record["epsilon_max"] = self.epsilon_range
        return record

    def save(self, path: Path, lease: Lease | None = None) -> int:
        """Write the stored sequences, ids, priorities and counters to ``path`` (an
        ``.npz``, atomically, renamed only while ``lease`` holds); the bytes written (0
        and no file while nothing is stored)."""
        with self._cond:
            if self._ring is None or not self._size:
                return 0
            size, ring = self._size, self._ring
            ids_S = self._ids_C[:size].copy()
            priority_S = self._priority_C[:size].copy()
            meta = {
                "format": REPLAY_FORMAT,
                "version": REPLAY_VERSION,
                "max_priority": self._max_priority,
                "counters": dataclasses.asdict(self.counters),
            }
        with atomic_file(path, lease) as f, zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as archive:
            # Slots [0, size) are the filled ones (ids fill them in order, then wrap).
            for name, array in _arrays(ring):
                _write_member(archive, f"ring.{name}", array[:size])
            with self._cond:  # overwritten while written: left out (id -1)
                torn_S = self._ids_C[:size] != ids_S
            _write_member(archive, "ids", np.where(torn_S, -1, ids_S))
            _write_member(archive, "priority", priority_S)
            _write_member(archive, "meta", np.frombuffer(json.dumps(meta).encode(), np.uint8))
        return Path(path).stat().st_size

    def load(self, path: Path, template: Unrolls) -> int:
        """Put back what :meth:`save` wrote to ``path`` into this (empty) replay, keeping
        the newest sequences its capacity holds; ``template`` (one sequence of this run's
        shapes) must match the saved ones. Returns the sequences restored."""
        meta, ids_S, priority_S, fields = _read_saved(path, template)
        kept_S = np.flatnonzero(ids_S >= 0)
        kept_S = kept_S[np.argsort(ids_S[kept_S], kind="stable")]
        with self._cond:
            if self._ring is not None:
                raise SavedStoreError(f"{path}: the replay already holds sequences")
            self._allocate(template)
            assert self._ring is not None and self._tree is not None
            kept_S = kept_S[-self.capacity :]  # the newest that fit this run's capacity
            # Oldest first into slots 0..n-1 under new ids 0..n-1, so the ring is laid out
            # as if they had just been put (the capacity may differ from the saved run's).
            n = len(kept_S)
            for (name, dst), _ in zip(_arrays(self._ring), _arrays(template), strict=True):
                dst[:n] = fields[name][kept_S]
            self._ids_C[:n] = np.arange(n)
            self._priority_C[:n] = priority_S[kept_S]
            if n:  # every id -1 (all torn while written): nothing to sum
                self._tree.update(np.arange(n), self._priority_C[:n] ** self.alpha)
            self._size = self._next_id = n
            self._max_priority = float(meta["max_priority"])
            self.counters = ReplayCounters(**{k: int(v) for k, v in meta["counters"].items()})
            self._cond.notify_all()
            return n

    # ----------------------------------------------------------------- internals

    def _ready(self, n: int) -> bool:
        if self._size == 0 or self.stored_frames < self.min_frames:
            return False
        if self.replay_ratio <= 0:
            return True
        wanted = (self.counters.sampled_sequences + n) * self.trained_frames
        return wanted <= self.replay_ratio * self.counters.inserted_frames

    def _draw(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Slots drawn by priority ** alpha and their normalised importance weights."""
        assert self._tree is not None
        total = self._tree.total
        mass_N = self.rng.random(n) * total
        slots_N = np.minimum(self._tree.find(mass_N), self._size - 1)
        prob_N = self._tree.leaves(slots_N) / total
        weight_N = (self._size * prob_N) ** -self.beta
        return slots_N, weight_N / weight_N.max()

    def _allocate(self, unrolls: Unrolls) -> None:
        """The ring, sized by the first sequences' shapes to fit both capacity bounds."""
        one = unrolls.split(1)[0]
        self.rows = int(one.first.shape[1])
        self.bytes_per_sequence = _nbytes(one)
        by_frames = self.max_frames // self.rows
        by_bytes = self.max_bytes // max(1, self.bytes_per_sequence)
        self.capacity = max(1, min(by_frames, by_bytes))
        self._ring = _zeros_like(one, self.capacity)
        self._tree = SumTree(self.capacity)
        self._ids_C = np.full(self.capacity, -1, np.int64)
        self._priority_C = np.zeros(self.capacity, np.float64)


Saved = tuple[dict[str, Any], np.ndarray, np.ndarray, dict[str, np.ndarray]]
"""What a replay file holds: its meta, ids, priorities and ring fields by name."""


def replayed_frames_per_batch(config: LearnerConfig) -> float:
    """New frames one training batch stands for when batches are sampled from a replay: a
    batch trains on batch x unroll frames, a replay ratio r of them per new frame."""
    trained = float(config.batch_size * config.unroll_length)
    return trained / config.replay_ratio if config.replay_ratio > 0 else trained


def replay_for(config: LearnerConfig, new_frames_per_sequence: int) -> PrioritizedReplay:
    """The replay an agent's ``--replay-*`` and priority knobs describe, for sequences
    that each bring ``new_frames_per_sequence`` new frames and train ``--unroll-length``."""
    lead = None
    if config.replay_hold_actors and config.replay_ratio > 0:
        # Room for the fill and two batches' new frames, so the trainer never waits for
        # an insert the limit holds back.
        lead = config.replay_min_frames + math.ceil(2 * replayed_frames_per_batch(config))
    return PrioritizedReplay(
        max_frames=config.replay_frames,
        max_bytes=config.replay_bytes,
        min_frames=config.replay_min_frames,
        replay_ratio=config.replay_ratio,
        new_frames_per_sequence=new_frames_per_sequence,
        trained_frames_per_sequence=config.unroll_length,
        priority_exponent=config.priority_exponent,
        importance_exponent=config.importance_exponent,
        seed=config.seed,
        insert_lead_frames=lead,
    )


def _read_saved(path: Path, template: Unrolls) -> Saved:
    """``path``'s contents, checked to fit together and ``template`` before any of it
    reaches the replay; SavedStoreError says what does not (the run then refills)."""
    try:
        with np.load(path, allow_pickle=False) as saved:
            meta = json.loads(saved["meta"].tobytes())
            if not isinstance(meta, dict) or (meta.get("format"), meta.get("version")) != (
                REPLAY_FORMAT,
                REPLAY_VERSION,
            ):
                raise SavedStoreError(f"{path}: not a seedrl replay, version {REPLAY_VERSION}")
            ids_S, priority_S = saved["ids"], saved["priority"]
            fields = {name: saved[f"ring.{name}"] for name, _ in _arrays(template)}
    except SavedStoreError:
        raise
    except Exception as exc:  # a damaged zip or .npy fails in many ways; none may crash a resume
        reason = f"{type(exc).__name__}: {exc}"
        raise SavedStoreError(f"{path}: unreadable replay ({reason})") from exc
    for name, array in _arrays(template):
        got = fields[name]
        if got.shape[1:] != array.shape[1:] or got.dtype != array.dtype:
            raise SavedStoreError(
                f"{path}: its sequences' {name} is {got.dtype}{list(got.shape[1:])}, this "
                f"run's is {array.dtype}{list(array.shape[1:])} (another --unroll-length, "
                "--burn-in, model or env)"
            )
    damage = _damage(meta, ids_S, priority_S, fields)
    if damage is not None:
        raise SavedStoreError(f"{path}: unreadable replay ({damage})")
    return meta, ids_S, priority_S, fields


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _damage(
    meta: dict[str, Any], ids_S: np.ndarray, priority_S: np.ndarray, fields: dict[str, np.ndarray]
) -> str | None:
    """What in a replay file cannot be as :meth:`PrioritizedReplay.save` wrote it (None:
    nothing): lengths that differ, ids, counters or priorities out of range."""
    if ids_S.ndim != 1 or not np.issubdtype(ids_S.dtype, np.integer):
        return f"ids are {ids_S.dtype}{list(ids_S.shape)}, not one integer per sequence"
    size = len(ids_S)
    if priority_S.shape != (size,) or not np.issubdtype(priority_S.dtype, np.floating):
        return f"priorities are {priority_S.dtype}{list(priority_S.shape)} for {size} ids"
    for name, array in fields.items():
        if len(array) != size:
            return f"{len(array)} sequences' {name} for {size} ids"
    if not (np.isfinite(priority_S).all() and (priority_S >= 0).all()):
        return "a priority that is negative, NaN or infinite"
    counters = meta.get("counters")
    names = {f.name for f in dataclasses.fields(ReplayCounters)}
    if not isinstance(counters, dict) or set(counters) != names:
        return f"counters {counters!r}, not {sorted(names)}"
    if not all(_is_count(v) for v in counters.values()):
        return f"counters {counters!r} are not all counts"
    top = meta.get("max_priority")
    if isinstance(top, bool) or not isinstance(top, int | float) or not 0 < top < math.inf:
        return f"max_priority {top!r} is not a positive number"
    kept = ids_S[ids_S >= 0]
    if (ids_S < -1).any() or len(np.unique(kept)) != len(kept):
        return "ids below -1 or repeated"
    if len(kept) and kept.max() >= counters["inserted_sequences"]:
        return f"id {kept.max()} past the {counters['inserted_sequences']} sequences inserted"
    if len(kept) and not priority_S[ids_S >= 0].sum() > 0:
        return "every stored priority is 0: nothing could be sampled"
    return None


def _arrays(unrolls: Unrolls) -> list[tuple[str, np.ndarray]]:
    """(name, array) of every stored per-row field; core state parts as core_state.i."""
    named = [
        (f.name, getattr(unrolls, f.name))
        for f in dataclasses.fields(unrolls)
        if f.name not in ("core_state", "sample_id", "sample_weight")
        and getattr(unrolls, f.name) is not None
    ]
    named += [(f"core_state.{i}", s) for i, s in enumerate(unrolls.core_state)]
    return named


def _write_member(archive: zipfile.ZipFile, name: str, array: np.ndarray) -> None:
    """``array`` as ``name``.npy in the archive, streamed (np.load reads it back)."""
    with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
        np.lib.format.write_array(member, np.ascontiguousarray(array), allow_pickle=False)


def _nbytes(unrolls: Unrolls) -> int:
    return sum(a.nbytes for _, a in _arrays(unrolls))


def _zeros_like(one: Unrolls, capacity: int) -> Unrolls:
    fields = {
        name: np.zeros((capacity, *a.shape[1:]), a.dtype)
        for name, a in _arrays(one)
        if not name.startswith("core_state.")
    }
    core = tuple(np.zeros((capacity, *s.shape[1:]), s.dtype) for s in one.core_state)
    return Unrolls(core_state=core, **fields)


def _write(ring: Unrolls, slots_N: np.ndarray, unrolls: Unrolls) -> None:
    for (_, dst), (_, src) in zip(_arrays(ring), _arrays(unrolls), strict=True):
        dst[slots_N] = src


def _read(ring: Unrolls, slots_N: np.ndarray) -> Unrolls:
    fields = {name: a[slots_N] for name, a in _arrays(ring) if not name.startswith("core_state.")}
    return Unrolls(core_state=tuple(s[slots_N] for s in ring.core_state), **fields)
