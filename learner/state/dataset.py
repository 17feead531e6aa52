"""Episodes kept as a Minari dataset (``--record-dataset DIR``), the offline-RL format
Farama's ``minari.load_dataset`` and TorchRL's Minari loader read.

Two producers share one writer (:class:`DatasetWriter`): ``evaluate`` hands it whole
episodes it played, and the learner's :class:`EpisodeRecorder` rebuilds the training
stream's episodes from the finished unrolls, on its own thread. The serving loop only
offers each batch's finished unrolls (arrays it made anyway) to a bounded queue: no
per-frame object, no wait; when the recorder falls behind, the offer is dropped and
counted, and the episodes it cut are left out whole.

An unroll's rows are frames; row 0 of a slot's later unrolls repeats frames the previous
one held (``1 + overlap`` of them), so :class:`EpisodeStitcher` keeps each slot's episode
in progress as chunks of new rows and closes it at its done frame. An episode of frames
``f_0 .. f_L`` (``f_0`` its reset frame, ``f_L`` done) is stored as Minari's ``L + 1``
observations, the ``L`` actions taken at ``f_0 .. f_{L-1}`` and the ``L`` rewards and
flags that came with ``f_1 .. f_L``.

The dataset lives in DIR (``DIR/data``), and DIR's last part is its id:
``MINARI_DATASETS_PATH=$(dirname DIR) minari.load_dataset(basename DIR)``.

Shape suffixes: N unrolls, R rows (frames).
"""

from __future__ import annotations

import logging
import queue
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from learner.common.spaces import UnsupportedSetup
from learner.state.trajectories import Unrolls, stack_unroll_frames
from seedrl import codec, envs
from seedrl.config import LearnerConfig
from seedrl.proto import seedrl_pb2 as pb

log = logging.getLogger(__name__)

DATASET_NAME = re.compile(r"[\w.-]+-v\d+")
"""What Minari accepts as a dataset id without a namespace: NAME-vN."""
MISSING = "--record-dataset needs minari with HDF5: pip install -e '.[dataset]'"
PENDING_BATCHES = 1024
"""Batches of finished unrolls the recorder may fall behind by before offers drop."""
FLUSH_EPISODES = 64
"""Episodes collected before one write to the file (each write opens the HDF5 file)."""


class DatasetError(UnsupportedSetup):
    """A ``--record-dataset`` request that cannot be met: refused with one line."""


def dataset_target(directory: str | Path) -> tuple[Path, str]:
    """(the data directory, the dataset id) of ``--record-dataset DIR``; refuses a name
    Minari cannot load and a directory that holds a dataset already."""
    path = Path(directory)
    if not DATASET_NAME.fullmatch(path.name):
        raise DatasetError(
            f"--record-dataset {directory}: its last part is the Minari dataset id and must "
            "read NAME-vN (e.g. runs/datasets/cartpole-v0)"
        )
    if (path / "data").exists():
        raise DatasetError(f"--record-dataset {directory}: a dataset is there already")
    return path / "data", path.name


def refuse_unsupported(env_spec: pb.EnvSpec) -> None:
    """Multi-agent envs are refused: a Minari episode is one agent's."""
    if len(env_spec.agents):
        raise DatasetError(
            f"--record-dataset records single-agent envs; {env_spec.env_id} has agents "
            f"{list(env_spec.agents)}"
        )


def _rebuildable_spec(env: Any) -> Any:
    """The env's gymnasium EnvSpec when ``gymnasium.make`` of it gives the same spaces
    (so the dataset can rebuild the env), else None."""
    import gymnasium as gym

    spec = getattr(env, "spec", None)
    if spec is None:
        return None
    try:
        rebuilt = gym.make(spec)
    except Exception:  # a wrapper or plugin the spec does not name
        return None
    try:
        same = (
            rebuilt.observation_space == env.observation_space
            and rebuilt.action_space == env.action_space
        )
    finally:
        rebuilt.close()
    return spec if same else None


@dataclass
class Episode:
    """One episode in Minari's layout (observations and actions in the env's structure)."""

    observations: Any  # [L+1, ...] per leaf
    actions: Any  # [L, ...] per leaf
    rewards: np.ndarray  # [L]
    terminations: np.ndarray  # [L] bool
    truncations: np.ndarray  # [L] bool


class DatasetWriter:
    """A new Minari dataset at DIR, episodes appended in batches, metadata on close."""

    def __init__(
        self, directory: str | Path, env: Any, env_spec: pb.EnvSpec, algorithm: str
    ) -> None:
        """``env``: one env as the actors build it (its spaces, and its spec when it can
        be rebuilt); ``env_spec``: the learner's description of it."""
        try:
            import h5py  # noqa: F401  # minari's HDF5 storage needs it, imported late
            from minari import __version__
            from minari.dataset.minari_storage import MinariStorage
        except ImportError as exc:
            raise DatasetError(MISSING) from exc
        refuse_unsupported(env_spec)
        data_path, self.dataset_id = dataset_target(directory)
        data_path.parent.mkdir(parents=True, exist_ok=True)
        gym_spec = _rebuildable_spec(env)
        self.storage = MinariStorage.new(
            data_path,
            observation_space=env.observation_space,
            action_space=env.action_space,
            env_spec=gym_spec,
            data_format="hdf5",
            jpeg_encoding=False,  # lossless: offline RL trains on exactly these frames
        )
        self.storage.update_metadata(
            {
                "dataset_id": self.dataset_id,
                "minari_version": __version__,
                "algorithm_name": algorithm,
                "description": f"episodes of {env_spec.env_id} recorded by seedrl",
            }
        )
        self._pending: list[Episode] = []
        self.episodes = 0

    def add(self, episode: Episode) -> None:
        self._pending.append(episode)
        self.episodes += 1
        if len(self._pending) >= FLUSH_EPISODES:
            self.flush()

    def flush(self) -> None:
        from minari.data_collector.episode_buffer import EpisodeBuffer

        if not self._pending:
            return
        self.storage.update_episodes(
            [
                EpisodeBuffer(
                    observations=e.observations,
                    actions=e.actions,
                    rewards=e.rewards.astype(np.float64),
                    terminations=e.terminations,
                    truncations=e.truncations,
                )
                for e in self._pending
            ]
        )
        self._pending.clear()

    def close(self) -> None:
        self.flush()
        self.storage.update_metadata({"dataset_size": self.storage.get_size()})


class RowConverter:
    """The learner's stored rows back into the env's structures (packed dict/tuple
    observation leaves unpacked, action columns split into leaves)."""

    def __init__(self, env_spec: pb.EnvSpec) -> None:
        self.obs_spec = env_spec.observation_space
        self.action_spec = env_spec.action_space
        self.packing = None
        if codec.is_structured(self.obs_spec):
            self.packing = codec.LeafPacking(codec.space_leaves(self.obs_spec))
        self.low, self.high = codec.action_bounds(self.action_spec)

    def observations(self, obs_R: np.ndarray) -> Any:
        if self.packing is None:
            return obs_R
        return codec.unflatten_values(self.obs_spec, self.packing.unpack(obs_R))

    def actions(self, action_R: np.ndarray) -> Any:
        if codec.is_structured(self.action_spec):
            leaves = codec.action_leaves_of(self.action_spec, action_R)
            return codec.unflatten_values(self.action_spec, leaves)
        if self.low is not None:  # the actors clip a Box action before the env sees it
            return np.clip(action_R, self.low, self.high).astype(np.float32)
        return action_R


@dataclass
class _SlotEpisode:
    next_unroll: int = 0
    started: bool = False
    chunks: list[dict[str, np.ndarray]] = field(default_factory=list)


ROW_FIELDS = ("obs", "first", "reward", "terminated", "truncated", "action")


class EpisodeStitcher:
    """Finished unrolls (with the slot and number of each) -> the episodes they complete."""

    def __init__(self, converter: RowConverter, overlap: int) -> None:
        self.converter = converter
        self.overlap = overlap
        self._slots: dict[int, _SlotEpisode] = {}
        self.cut = 0
        """Episodes left out unfinished: an offer dropped, or the slot's stream ended."""

    def add(self, unrolls: Unrolls, slot_N: np.ndarray, index_N: np.ndarray) -> list[Episode]:
        obs = unrolls.obs
        if unrolls.frame_stack > 1:  # single frames back into the stacks the env returned
            obs = stack_unroll_frames(obs, unrolls.first)
        arrays = {
            "obs": obs,
            "first": unrolls.first,
            "reward": unrolls.reward,
            "terminated": unrolls.terminated,
            "truncated": unrolls.truncated,
            "action": unrolls.action,
        }
        finished: list[Episode] = []
        for n, (slot, index) in enumerate(zip(slot_N.tolist(), index_N.tolist(), strict=True)):
            state = self._slots.setdefault(slot, _SlotEpisode())
            if index != state.next_unroll:  # a fresh slot, or unrolls of it were dropped
                if index != 0 or state.started:
                    self.cut += int(state.started)
                state.started, state.chunks = False, []
            state.next_unroll = index + 1
            start = 0 if index == 0 else 1 + self.overlap  # the rows before repeat old frames
            rows = {name: array[n, start:] for name, array in arrays.items()}
            self._feed(state, rows, finished)
        return finished

    def _feed(self, state: _SlotEpisode, rows: dict[str, np.ndarray], out: list[Episode]) -> None:
        first_R = rows["first"]
        done_R = rows["terminated"] | rows["truncated"]
        pos, count = 0, len(first_R)
        while pos < count:
            if not state.started:  # an episode is kept from its reset frame only
                starts = np.flatnonzero(first_R[pos:])
                if not len(starts):
                    return
                pos += int(starts[0])
                state.started, state.chunks = True, []
            ends = np.flatnonzero(done_R[pos:])
            if not len(ends):
                state.chunks.append({k: v[pos:] for k, v in rows.items()})
                return
            end = pos + int(ends[0]) + 1
            state.chunks.append({k: v[pos:end] for k, v in rows.items()})
            if sum(len(c["first"]) for c in state.chunks) > 1:  # a step at least (Minari's)
                out.append(self._episode(state.chunks))
            state.started, state.chunks = False, []
            pos = end

    def _episode(self, chunks: list[dict[str, np.ndarray]]) -> Episode:
        frames = {name: np.concatenate([c[name] for c in chunks]) for name in ROW_FIELDS}
        return Episode(
            observations=self.converter.observations(frames["obs"]),
            actions=self.converter.actions(frames["action"][:-1]),
            rewards=frames["reward"][1:],
            terminations=frames["terminated"][1:],
            truncations=frames["truncated"][1:],
        )


class EpisodeRecorder:
    """The learner's side: offered finished unrolls, writes every ``every``-th episode
    they complete, on a thread of its own."""

    def __init__(self, writer: DatasetWriter, stitcher: EpisodeStitcher, every: int) -> None:
        self.writer = writer
        self.stitcher = stitcher
        self.every = every
        self.finished = 0
        """Episodes the stream completed (recorded or skipped by ``every``)."""
        self.dropped = 0
        """Offers dropped because the recorder had fallen PENDING_BATCHES behind."""
        self._queue: queue.Queue[tuple[Unrolls, np.ndarray, np.ndarray] | None] = queue.Queue(
            PENDING_BATCHES
        )
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="dataset-recorder", daemon=True)
        self._thread.start()

    def offer(self, unrolls: Unrolls, slot_N: np.ndarray, index_N: np.ndarray) -> None:
        """From the serving loop: never waits."""
        try:
            self._queue.put_nowait((unrolls, slot_N, index_N))
        except queue.Full:
            self.dropped += 1

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if self.error is not None:
                continue  # keep draining, so offers never back up into serving
            try:
                for episode in self.stitcher.add(*item):
                    if self.finished % self.every == 0:
                        self.writer.add(episode)
                    self.finished += 1
            except Exception as exc:  # a full disk stops the dataset, never the training
                self.error = exc
                log.error("--record-dataset stopped: %s", exc)

    def close(self) -> None:
        """Write what is pending; the run's partial episodes are left out."""
        self._queue.put(None)
        self._thread.join()
        if self.error is None:
            self.writer.close()
        log.info(
            "dataset %s: %d episodes written (%d cut by dropped unrolls)",
            self.writer.dataset_id, self.writer.episodes, self.stitcher.cut,
        )  # fmt: skip


def learner_recorder(
    config: LearnerConfig, env_spec: pb.EnvSpec, overlap: int
) -> EpisodeRecorder | None:
    """The recorder of ``--record-dataset`` (None without it), or DatasetError (one line)."""
    if not config.record_dataset:
        return None
    if config.normalize_observations:
        raise DatasetError(
            "--record-dataset keeps what the env returned, and with --normalize-observations "
            "the learner keeps only normalized frames (record with evaluate --record-dataset)"
        )
    refuse_unsupported(env_spec)
    dataset_target(config.record_dataset)
    env = envs.make_env(config.env, config.env_kwargs)
    try:
        writer = DatasetWriter(config.record_dataset, env, env_spec, f"seedrl {config.agent}")
    finally:
        env.close()
    stitcher = EpisodeStitcher(RowConverter(env_spec), overlap)
    return EpisodeRecorder(writer, stitcher, config.record_every)
