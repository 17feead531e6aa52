"""``--record-dataset``: episodes kept as a Minari dataset, by evaluate and by the learner.

The stitching of unrolls back into episodes is checked frame by frame on a trajectory
builder fed synthetic frames (overlapping unrolls too, and a dropped offer); evaluate's and
a short training run's datasets are opened with ``minari.load_dataset`` and compared with
the episodes evaluate played and the learner logged to ``episodes.jsonl``.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from learner.__main__ import main as learner_main
from learner.parts import build_learner, save_checkpoint
from learner.state import dataset
from learner.state.trajectories import TrajectoryBuilder
from learner.tools.evaluate import evaluate
from learner.tools.trained_policy import Policy
from seedrl.config import LearnerConfig
from seedrl.proto import seedrl_pb2 as pb

minari = pytest.importorskip("minari")
pytest.importorskip("h5py")


def _spec() -> pb.EnvSpec:
    space = pb.SpaceSpec(kind="box", shape=[1], dtype="float32")
    return pb.EnvSpec(
        env_id="synthetic", observation_space=space,
        action_space=pb.SpaceSpec(kind="discrete", dtype="int64", n=3),
    )  # fmt: skip


def _stream(overlap: int, lengths: dict[int, list[int]], drop: set[int] = frozenset()):
    """Feed each slot's episodes (of ``lengths``) through a builder frame by frame; return
    the stitched episodes, the builder's own finished episodes and each frame's values."""
    slots = len(lengths)
    builder = TrajectoryBuilder(
        unroll_length=4, obs_shape=(1,), obs_dtype=np.float32, action_shape=(),
        action_dtype=np.int64, param_size=3, overlap=overlap,
    )  # fmt: skip
    slot_B = builder.allocate(slots)
    stitcher = dataset.EpisodeStitcher(dataset.RowConverter(_spec()), overlap)
    # Per slot, its frames: (obs id, reward, terminated, truncated); ids unique per frame.
    frames: dict[int, list[tuple[float, float, bool, bool]]] = {}
    for s, episode_lengths in lengths.items():
        rows = []
        for e, length in enumerate(episode_lengths):
            rows.append((1000.0 * s + len(rows), 0.0, False, False))
            for t in range(1, length + 1):
                end = t == length
                rows.append(
                    (1000.0 * s + len(rows), 0.5 * t, end and e % 2 == 0, end and e % 2 == 1)
                )
        frames[int(slot_B[s])] = rows
    stitched, logged, batches = [], [], 0
    for step in range(max(len(rows) for rows in frames.values())):
        live = np.array([s for s in slot_B if step < len(frames[int(s)])], np.int64)
        if not len(live):
            break
        values = [frames[int(s)][step] for s in live]
        obs = np.array([[v[0]] for v in values], np.float32)
        first = builder.first_flags(live)
        unrolls, episodes = builder.record(
            live, obs, np.array([v[1] for v in values], np.float32),
            np.array([v[2] for v in values]), np.array([v[3] for v in values]), first,
            (obs[:, 0].astype(np.int64) % 3), np.zeros((len(live), 3), np.float32), (), (), 0,
        )  # fmt: skip
        if episodes is not None:
            logged += list(zip(episodes.returns.tolist(), episodes.lengths.tolist(), strict=True))
        if unrolls is not None:
            batches += 1
            if batches not in drop:
                stitched += stitcher.add(unrolls, *builder.last_origin)
    return stitched, logged, frames, stitcher


@pytest.mark.parametrize("overlap", [0, 2])
def test_unrolls_stitch_back_into_their_episodes(overlap: int) -> None:
    lengths = {0: [3, 7, 4, 9], 1: [12, 2, 5], 2: [4, 4, 4, 4]}
    stitched, logged, frames, _ = _stream(overlap, lengths)
    assert stitched, "no episode completed"
    # Every stitched episode is one that the slot played, frame for frame.
    played = {}
    for rows in frames.values():
        starts = [i for i, r in enumerate(rows) if i == 0 or rows[i - 1][2] or rows[i - 1][3]]
        for begin in starts:
            end = next(i for i in range(begin + 1, len(rows)) if rows[i][2] or rows[i][3])
            played[rows[begin][0]] = rows[begin : end + 1]
    for episode in stitched:
        want = played[float(episode.observations[0, 0])]
        np.testing.assert_array_equal(episode.observations[:, 0], [r[0] for r in want])
        np.testing.assert_array_equal(episode.rewards, [r[1] for r in want[1:]])
        np.testing.assert_array_equal(episode.terminations, [r[2] for r in want[1:]])
        np.testing.assert_array_equal(episode.truncations, [r[3] for r in want[1:]])
        np.testing.assert_array_equal(episode.actions, [int(r[0]) % 3 for r in want[:-1]])
    # The same returns and lengths as the builder's own episode statistics, less the
    # episodes still in a partial unroll when the stream ended (at most one per slot).
    got = Counter((float(e.rewards.sum()), len(e.rewards)) for e in stitched)
    assert not got - Counter(logged)
    assert sum(Counter(logged).values()) - sum(got.values()) <= len(lengths)


def test_a_dropped_offer_cuts_episodes_whole() -> None:
    lengths = {0: [3, 7, 4, 9], 1: [12, 2, 5]}
    whole, _, _, _ = _stream(0, lengths)
    stitched, _, _, stitcher = _stream(0, lengths, drop={3})
    assert stitcher.cut >= 1 and len(stitched) < len(whole)
    starts = {float(e.observations[0, 0]): e for e in whole}
    for episode in stitched:  # each kept episode is exactly one that was played
        np.testing.assert_array_equal(
            episode.observations, starts[float(episode.observations[0, 0])].observations
        )


def _checkpoint(tmp_path: Path, **overrides: Any) -> Path:
    config = LearnerConfig(logdir=str(tmp_path / "run"), **overrides)
    save_checkpoint(build_learner(config))
    return config.checkpoint_path


def _load(monkeypatch: pytest.MonkeyPatch, directory: Path) -> Any:
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(directory.parent))
    return minari.load_dataset(directory.name)


def test_evaluate_records_the_episodes_it_played(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = Policy.load(_checkpoint(tmp_path))
    target = tmp_path / "datasets" / "cartpole-v0"
    result = evaluate(policy, 4, seed=3, record_dataset=target)
    data = _load(monkeypatch, target)
    episodes = list(data.iterate_episodes())
    assert [float(e.rewards.sum()) for e in episodes] == result.returns
    assert [len(e.rewards) for e in episodes] == result.lengths
    assert all(e.observations.shape == (len(e.rewards) + 1, 4) for e in episodes)
    assert data.spec.env_spec.id == "CartPole-v1"  # rebuildable: the spec is kept
    assert data.recover_environment().observation_space.shape == (4,)


def test_evaluate_records_dict_observations_leaf_by_leaf(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = Policy.load(_checkpoint(tmp_path, env="spaces_envs:masked_choice"))
    target = tmp_path / "datasets" / "masked-v1"
    result = evaluate(policy, 2, record_dataset=target)
    data = _load(monkeypatch, target)
    episodes = list(data.iterate_episodes())
    assert [len(e.rewards) for e in episodes] == result.lengths
    masks = episodes[0].observations["action_mask"]
    assert masks.shape == (result.lengths[0] + 1, 6)
    taken = episodes[0].actions
    assert all(masks[t, a] for t, a in enumerate(taken))  # a masked action is never recorded
    assert data.spec.env_spec is None  # a module:callable env: nothing to rebuild it from


def test_a_dataset_name_minari_cannot_load_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _checkpoint(tmp_path)
    args = ["evaluate", "--checkpoint", str(path), "--record-dataset", str(tmp_path / "no-version")]
    with pytest.raises(SystemExit) as exited:  # evaluate exits through argparse
        learner_main(args)
    err = capsys.readouterr().err.strip()
    assert exited.value.code == 2 and len(err.splitlines()) == 1 and "NAME-vN" in err
    assert not (tmp_path / "no-version").exists()


def test_multi_agent_episodes_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "datasets" / "game-v0"
    args = ["--env", "multiagent_envs:two_player", "--logdir", str(tmp_path / "run"),
            "--record-dataset", str(target), "--port", "0", "--max-seconds", "20"]  # fmt: skip
    assert learner_main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "single-agent" in err
    assert not target.exists()


@pytest.mark.long
@pytest.mark.parametrize("serving_processes", [0, 2], ids=["one process", "two frontends"])
def test_the_learner_records_the_training_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, serving_processes: int
) -> None:
    """With frontends the unrolls reach the recorder through their rings, each frontend's
    builder slots numbered apart from the other's."""
    import learner

    target = tmp_path / "datasets" / "stream-v0"
    num_actors, envs_per_actor = 2, 2
    learner.train(
        "CartPole-v1", total_frames=3000, num_actors=num_actors, envs_per_actor=envs_per_actor,
        logdir=tmp_path / "run", unroll_length=10, batch_size=8, record_dataset=str(target),
        serving_processes=serving_processes,
    )  # fmt: skip
    logged = [
        json.loads(line) for line in (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()
    ]
    data = _load(monkeypatch, target)
    got = Counter((float(e.rewards.sum()), len(e.rewards)) for e in data.iterate_episodes())
    want = Counter((float(r["return"]), int(r["length"])) for r in logged)
    assert sum(got.values()) >= 20
    assert not got - want  # every recorded episode is one the learner logged
    # Only the episodes still in a partial unroll at the end are missing: one per env.
    assert sum(want.values()) - sum(got.values()) <= num_actors * envs_per_actor


def test_an_episode_cut_at_max_steps_is_stored_truncated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The env did not end it: an offline learner must bootstrap there, not stop."""
    policy = Policy.load(_checkpoint(tmp_path))
    target = tmp_path / "datasets" / "cut-v0"
    result = evaluate(policy, 2, max_steps=5, record_dataset=target)
    assert result.truncated == 2
    for episode in _load(monkeypatch, target).iterate_episodes():
        assert len(episode.rewards) == 5 and episode.truncations[-1]
        assert not episode.terminations.any()


class _Kept:
    """A writer that keeps what it is given (the recorder's side, without a file)."""

    dataset_id = "kept-v0"

    def __init__(self) -> None:
        self.kept: list[dataset.Episode] = []
        self.closed = False

    @property
    def episodes(self) -> int:
        return len(self.kept)

    def add(self, episode: dataset.Episode) -> None:
        self.kept.append(episode)

    def close(self) -> None:
        self.closed = True


def test_record_every_keeps_one_episode_in_n() -> None:
    lengths = {0: [3, 7, 4, 9, 2, 5], 1: [12, 2, 5, 3, 3]}
    stitched, _, _, _ = _stream(0, lengths)
    writer = _Kept()
    stitcher = _Replay(stitched)
    recorder = dataset.EpisodeRecorder(writer, stitcher, every=3)  # type: ignore[arg-type]
    recorder.offer(None, np.zeros(0), np.zeros(0))  # type: ignore[arg-type]
    recorder.close()
    assert writer.closed and recorder.finished == len(stitched)
    assert [e.observations[0, 0] for e in writer.kept] == [
        e.observations[0, 0] for e in stitched[::3]
    ]


class _Replay:
    """A stitcher that hands over episodes made beforehand, all on the first offer."""

    cut = 0

    def __init__(self, episodes: list[dataset.Episode]) -> None:
        self.episodes = episodes

    def add(self, *_: Any) -> list[dataset.Episode]:
        episodes, self.episodes = self.episodes, []
        return episodes


def test_a_reset_frame_that_is_done_makes_no_episode() -> None:
    """A frame both first and done holds no step: Minari cannot store it, so it is skipped."""
    builder = TrajectoryBuilder(
        unroll_length=4, obs_shape=(1,), obs_dtype=np.float32, action_shape=(),
        action_dtype=np.int64, param_size=3,
    )  # fmt: skip
    slot_B = builder.allocate(1)
    stitcher = dataset.EpisodeStitcher(dataset.RowConverter(_spec()), 0)
    episodes = []
    for step, done in enumerate([True, False, False, True, False]):
        unrolls, _ = builder.record(
            slot_B, np.full((1, 1), step, np.float32), np.ones(1, np.float32),
            np.array([done]), np.zeros(1, bool), builder.first_flags(slot_B),
            np.zeros(1, np.int64), np.zeros((1, 3), np.float32), (), (), 0,
        )  # fmt: skip
        if unrolls is not None:
            episodes += stitcher.add(unrolls, *builder.last_origin)
    assert [e.observations[:, 0].tolist() for e in episodes] == [[1.0, 2.0, 3.0]]
