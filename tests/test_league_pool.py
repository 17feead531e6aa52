"""The opponent pool: snapshots frozen on schedule, the oldest evicted, opponents drawn
with the frequencies each rule promises (fixed seed), and a checkpoint round trip."""

from __future__ import annotations

import io
import math

import pytest
import torch

from learner.league.pool import Outcome, PoolConfig, SnapshotPool, pfsp_weight
from seedrl.config import LearnerConfig


def weights(value: float) -> dict[str, torch.Tensor]:
    return {"w": torch.full((2, 3), value), "b": torch.full((3,), -value)}


def pool_with(n: int, sampling: str = "uniform", size: int = 10, seed: int = 0) -> SnapshotPool:
    pool = SnapshotPool(
        PoolConfig(snapshot_every=1, pool_size=size, opponent_sampling=sampling), seed
    )
    for step in range(n):
        pool.add(step, weights(float(step)))
    return pool


def within(count: int, draws: int, p: float, sigmas: float = 5.0) -> bool:
    """A binomial count lies within ``sigmas`` standard deviations of its mean."""
    return abs(count - draws * p) <= sigmas * math.sqrt(draws * p * (1 - p)) + 1e-9


def assert_draws_follow(
    pool: SnapshotPool, expected: dict[int, float], draws: int = 20_000
) -> None:
    """Each opponent's count over ``draws`` seeded samples lies within 5 sigma of ``expected``."""
    samples = [pool.sample() for _ in range(draws)]
    for opponent_id, p in expected.items():
        count = samples.count(opponent_id)
        assert within(count, draws, p), (opponent_id, count, draws * p)


def test_snapshots_are_frozen_every_snapshot_every_steps() -> None:
    pool = SnapshotPool(PoolConfig(snapshot_every=100, pool_size=5), seed=0)
    added = [pool.maybe_add(step, weights(step)) for step in (0, 50, 99, 100, 150, 230, 330)]
    assert added == [0, None, None, 1, None, 2, 3]  # 230 - 100 >= 100; 330 - 230 >= 100
    assert [pool.learner_step(i) for i in pool.ids()] == [0, 100, 230, 330]


def test_a_snapshot_is_a_cpu_copy_the_model_cannot_change() -> None:
    model = torch.nn.Linear(3, 2)
    pool = pool_with(0)
    snapshot_id = pool.add(0, model.state_dict())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.add_(1.0)
    frozen = pool.weights(snapshot_id)
    assert all(torch.equal(frozen[k], before[k]) for k in before)
    assert all(t.device.type == "cpu" for t in frozen.values())
    assert pool.nbytes() == sum(t.numel() * 4 for t in before.values())


def test_the_oldest_snapshot_is_evicted_and_the_newest_kept() -> None:
    pool = pool_with(5, size=3)
    assert pool.ids() == [2, 3, 4]
    assert torch.equal(pool.weights(4)["w"], torch.full((2, 3), 4.0))
    with pytest.raises(KeyError, match="snapshot 0 is not in the pool"):
        pool.weights(0)
    pool.record(0, Outcome.WIN)  # an episode begun before the eviction: ignored
    with pytest.raises(KeyError, match="no snapshot 9 was ever"):
        pool.record(9, Outcome.WIN)
    one = pool_with(3, size=1)
    assert one.ids() == [2]


def test_latest_always_picks_the_newest() -> None:
    pool = pool_with(4, "latest")
    assert [pool.sample() for _ in range(20)] == [3] * 20
    pool.add(10, weights(10.0))
    assert pool.sample() == 4


def test_uniform_sampling_frequencies_fixed_seed() -> None:
    pool = pool_with(4, "uniform", seed=7)
    draws = 20_000
    samples = [pool.sample() for _ in range(draws)]
    for snapshot_id in range(4):
        assert within(samples.count(snapshot_id), draws, 0.25), samples.count(snapshot_id)
    again = pool_with(4, "uniform", seed=7)
    assert [again.sample() for _ in range(200)] == samples[:200]  # the seed fixes the draws


def test_pfsp_weights_follow_alphastar_f_hard() -> None:
    # Hand-computed: score smoothed by one prior draw, weight (1 - score)^2.
    # 3 wins: score (3 + 0.5) / 4 = 0.875 -> 0.125^2 = 0.015625
    # 3 losses: score 0.5 / 4 = 0.125 -> 0.875^2 = 0.765625
    # 1 win 1 draw 1 loss: score (1 + 0.5 + 0.5) / 4 = 0.5 -> 0.25; unplayed: 0.5 -> 0.25
    assert pfsp_weight(3, 0, 0, 2.0) == pytest.approx(0.015625)
    assert pfsp_weight(0, 0, 3, 2.0) == pytest.approx(0.765625)
    assert pfsp_weight(1, 1, 1, 2.0) == pytest.approx(0.25)
    assert pfsp_weight(0, 0, 0, 2.0) == pytest.approx(0.25)
    assert pfsp_weight(0, 0, 3, 0.0) == 1.0  # exponent 0 is uniform


def test_pfsp_sampling_frequencies_fixed_seed() -> None:
    pool = pool_with(4, "pfsp", seed=3)
    for outcome in (Outcome.WIN,) * 3:
        pool.record(0, outcome)
    for outcome in (Outcome.LOSS,) * 3:
        pool.record(1, outcome)
    for outcome in (Outcome.WIN, Outcome.DRAW, Outcome.LOSS):
        pool.record(2, outcome)
    assert pool.results() == {0: (3, 0, 0), 1: (0, 0, 3), 2: (1, 1, 1), 3: (0, 0, 0)}
    raw = {0: 0.015625, 1: 0.765625, 2: 0.25, 3: 0.25}
    total = sum(raw.values())
    expected = {i: w / total for i, w in raw.items()}
    assert pool.probabilities() == pytest.approx(expected)
    assert_draws_follow(pool, expected)


def test_sampling_an_empty_pool_says_so() -> None:
    with pytest.raises(LookupError, match="empty"):
        pool_with(0).sample()


def test_checkpoint_round_trip_keeps_snapshots_results_and_draws() -> None:
    pool = pool_with(6, "pfsp", size=4, seed=11)
    pool.record(3, Outcome.LOSS)
    pool.record(4, Outcome.DRAW)
    pool.record(5, Outcome.WIN)
    _ = [pool.sample() for _ in range(5)]
    buffer = io.BytesIO()
    torch.save({"league_pool": pool.state_dict()}, buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)["league_pool"]  # as checkpoints are read
    restored = SnapshotPool(pool.config, seed=999)
    restored.load_state_dict(state)
    assert restored.ids() == pool.ids() == [2, 3, 4, 5]
    assert restored.results() == pool.results()
    for i in pool.ids():
        assert restored.learner_step(i) == pool.learner_step(i)
        assert all(torch.equal(restored.weights(i)[k], pool.weights(i)[k]) for k in ("w", "b"))
    assert [restored.sample() for _ in range(50)] == [pool.sample() for _ in range(50)]
    assert restored.maybe_add(5, weights(0.0)) is None  # the schedule continues too
    assert restored.add(6, weights(6.0)) == 6  # ids go on counting, never reused


def test_resuming_with_a_smaller_pool_keeps_the_newest() -> None:
    pool = pool_with(6, size=6)
    small = SnapshotPool(PoolConfig(pool_size=2), seed=0)
    small.load_state_dict(pool.state_dict())
    assert small.ids() == [4, 5]


def test_pool_config_matches_the_learner_flags_and_refuses_bad_values() -> None:
    assert PoolConfig() == PoolConfig.of(LearnerConfig())
    assert PoolConfig.of(LearnerConfig(pool_size=3, opponent_sampling="latest")).pool_size == 3
    for bad, match in (
        ({"snapshot_every": 0}, "--snapshot-every"),
        ({"pool_size": 0}, "--pool-size"),
        ({"opponent_sampling": "best"}, "--opponent-sampling must be latest, uniform or pfsp"),
        ({"pfsp_exponent": float("nan")}, "--pfsp-exponent"),
    ):
        with pytest.raises(ValueError, match=match):
            PoolConfig(**bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=match):
            LearnerConfig(**bad)  # type: ignore[arg-type]


def fixed_pool(
    n: int, sampling: str, fixed: tuple[str, ...], seed: int = 0, share: float | None = None
) -> SnapshotPool:
    config = PoolConfig(
        snapshot_every=1,
        pool_size=3,
        opponent_sampling=sampling,
        fixed_opponents=fixed,
        fixed_opponent_share=share,
    )
    pool = SnapshotPool(config, seed)
    for step in range(n):
        pool.add(step, weights(float(step)))
    return pool


def test_fixed_opponents_stay_for_good_and_are_no_snapshots() -> None:
    pool = fixed_pool(5, "uniform", ("heuristic", "random"))
    assert pool.fixed_ids() == [-1, -2]
    assert [pool.fixed_name(i) for i in (-1, -2, 4)] == ["heuristic", "random", None]
    assert pool.ids() == [2, 3, 4] and len(pool) == 3  # the oldest snapshots evicted, not them
    assert pool.opponent_ids() == [-1, -2, 2, 3, 4]
    assert -1 in pool and 0 not in pool
    pool.record(-2, Outcome.WIN)
    pool.record(-2, Outcome.DRAW)
    pool.record(-1, Outcome.LOSS)
    assert pool.results() == {
        -1: (0, 0, 1),
        -2: (1, 1, 0),
        2: (0, 0, 0),
        3: (0, 0, 0),
        4: (0, 0, 0),
    }
    with pytest.raises(LookupError, match="empty"):  # a game needs a snapshot to exist
        fixed_pool(0, "uniform", ("random",)).sample()


def test_fixed_opponents_are_drawn_by_the_pools_rule() -> None:
    uniform = fixed_pool(2, "uniform", ("heuristic",))
    assert uniform.probabilities() == pytest.approx({-1: 1 / 3, 0: 1 / 3, 1: 1 / 3})
    latest = fixed_pool(3, "latest", ("heuristic", "random"))  # newest snapshot or any fixed
    assert latest.probabilities() == pytest.approx({-1: 1 / 3, -2: 1 / 3, 0: 0, 1: 0, 2: 1 / 3})
    pfsp = fixed_pool(2, "pfsp", ("heuristic", "random"), seed=5)
    for _ in range(3):
        pfsp.record(-1, Outcome.LOSS)  # the heuristic still beats the learner
        pfsp.record(-2, Outcome.WIN)  # the random player never does
    # (1 - score)^2 with score = (wins + draws / 2 + 1/2) / (games + 1), as for snapshots:
    raw = {-1: (1 - 0.5 / 4) ** 2, -2: (1 - 3.5 / 4) ** 2, 0: 0.25, 1: 0.25}
    expected = {i: w / sum(raw.values()) for i, w in raw.items()}
    assert pfsp.probabilities() == pytest.approx(expected)
    assert_draws_follow(pfsp, expected)


def test_a_fixed_opponent_share_splits_the_draws_between_the_two_sources() -> None:
    pfsp = fixed_pool(3, "pfsp", ("heuristic", "random"), seed=7, share=0.4)
    for _ in range(3):
        pfsp.record(-1, Outcome.LOSS)
        pfsp.record(-2, Outcome.WIN)
    for _ in range(5):
        pfsp.record(2, Outcome.WIN)  # the newest snapshot is beaten: played less
    # 0.4 split over the fixed pair by their pfsp weights, 0.6 over the snapshots by theirs:
    heuristic, rand = (1 - 0.5 / 4) ** 2, (1 - 3.5 / 4) ** 2
    old, newest = 0.25, (1 - 5.5 / 6) ** 2
    expected = {
        -1: 0.4 * heuristic / (heuristic + rand),
        -2: 0.4 * rand / (heuristic + rand),
        0: 0.6 * old / (2 * old + newest),
        1: 0.6 * old / (2 * old + newest),
        2: 0.6 * newest / (2 * old + newest),
    }
    assert pfsp.probabilities() == pytest.approx(expected)
    assert_draws_follow(pfsp, expected)
    latest = fixed_pool(3, "latest", ("heuristic",), share=0.9)  # the newest snapshot gets 0.1
    assert latest.probabilities() == pytest.approx({-1: 0.9, 0: 0, 1: 0, 2: 0.1})
    never = fixed_pool(2, "uniform", ("heuristic",), share=0.0)
    assert never.probabilities() == pytest.approx({-1: 0, 0: 0.5, 1: 0.5})
    assert {never.sample() for _ in range(200)} == {0, 1}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"fixed_opponents": ("random",), "fixed_opponent_share": 1.5}, r"in \[0, 1\]"),
        ({"fixed_opponents": ("random",), "fixed_opponent_share": float("nan")}, r"in \[0, 1\]"),
        ({"fixed_opponent_share": 0.5}, "needs --fixed-opponents"),
    ],
)
def test_a_fixed_opponent_share_out_of_range_or_without_fixed_opponents_is_refused(
    fields: dict, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        PoolConfig(**fields)
    with pytest.raises(ValueError, match=message):
        LearnerConfig(**fields)


def test_fixed_opponents_results_survive_a_checkpoint_by_name() -> None:
    pool = fixed_pool(2, "pfsp", ("heuristic", "random"))
    pool.record(-1, Outcome.LOSS)
    pool.record(-2, Outcome.WIN)
    state = pool.state_dict()
    same = fixed_pool(0, "pfsp", ("heuristic", "random"))
    same.load_state_dict(state)
    assert same.results() == pool.results()
    reordered = fixed_pool(0, "pfsp", ("random", "my.bots:greedy"))  # another run's list
    reordered.load_state_dict(state)
    assert reordered.results() == {-1: (1, 0, 0), -2: (0, 0, 0), 0: (0, 0, 0), 1: (0, 0, 0)}
    old = dict(state)
    del old["fixed"]  # a checkpoint from before fixed opponents
    fresh = fixed_pool(0, "pfsp", ("heuristic",))
    fresh.load_state_dict(old)
    assert fresh.results()[-1] == (0, 0, 0)


def test_a_fixed_opponent_named_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="--fixed-opponents names one twice"):
        PoolConfig(fixed_opponents=("random", "random"))
    assert PoolConfig.of(LearnerConfig(fixed_opponents=("random",))).fixed_opponents == ("random",)
