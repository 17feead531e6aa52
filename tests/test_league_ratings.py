"""Elo ratings against the closed form and hand-computed updates."""

from __future__ import annotations

import pytest

from learner.league.ratings import EloRatings, expected_score, snapshot_name


def test_expected_score_closed_form() -> None:
    # 1 / (1 + 10^((Rb - Ra) / 400)): equal ratings 0.5; +400 -> 10/11; -400 -> 1/11.
    assert expected_score(1000, 1000) == 0.5
    assert expected_score(1400, 1000) == pytest.approx(10 / 11)
    assert expected_score(1000, 1400) == pytest.approx(1 / 11)
    assert expected_score(1200, 1000) == pytest.approx(1 / (1 + 10**-0.5))


def test_hand_computed_updates() -> None:
    elo = EloRatings(k=32.0, initial=1000.0)
    elo.update("learner", "snapshot-0", 1.0)  # equal: +32 * (1 - 0.5) = +16
    assert elo.table() == {"learner": 1016.0, "snapshot-0": 984.0}
    # 1016 vs 984: E = 1 / (1 + 10^-0.08) = 1 / 1.831764 = 0.545922; a draw moves 32 * (0.5 - E).
    e = 1 / (1 + 10 ** (-32 / 400))
    elo.update("learner", "snapshot-0", 0.5)
    assert elo.rating("learner") == pytest.approx(1016 + 32 * (0.5 - e))
    assert elo.rating("snapshot-0") == pytest.approx(984 - 32 * (0.5 - e))
    assert 1016 - elo.rating("learner") == pytest.approx(1.4695, abs=1e-4)  # 32 * 0.045922
    elo.update("snapshot-0", "learner", 1.0)  # the upset costs the favourite more
    assert sum(elo.table().values()) == pytest.approx(2000.0)  # ratings are conserved
    assert elo.games("learner") == 3


def test_a_snapshot_starts_at_the_learners_rating() -> None:
    elo = EloRatings()
    elo.update("learner", snapshot_name(0), 1.0)
    elo.add(snapshot_name(1), like="learner")
    assert elo.rating("snapshot-1") == elo.rating("learner") == 1008.0
    assert elo.rating("never-seen") == 1000.0
    assert elo.table() == {"learner": 1008.0, "snapshot-0": 992.0, "snapshot-1": 1008.0}


def test_state_round_trip_and_bad_scores() -> None:
    elo = EloRatings(k=20)
    elo.update("learner", "snapshot-0", 0.0)
    other = EloRatings(k=20)
    other.load_state_dict(elo.state_dict())
    assert other.table() == elo.table() and other.games("snapshot-0") == 1
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        elo.update("learner", "snapshot-0", 2.0)
    with pytest.raises(ValueError, match="itself"):
        elo.update("learner", "learner", 1.0)
