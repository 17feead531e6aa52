"""Elo ratings against the closed form and hand-computed updates."""

from __future__ import annotations

import math

import pytest

from learner.league.ratings import EloRatings, expected_score, fit_elo, snapshot_name


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


def test_fit_elo_recovers_bradley_terry_strengths_exactly() -> None:
    # A 2:1 over B, B 2:1 over C, A 4:1 over C fit strengths 4 : 2 : 1 exactly (each
    # player's expected wins under them equal its actual wins), so each step is
    # 400 log10(2) = 120.41 Elo, centred on 1000.
    ratings = fit_elo(
        {("A", "B"): (2, 0, 1), ("B", "C"): (2, 0, 1), ("A", "C"): (4, 0, 1)}, prior_draws=0
    )
    step = 400 * math.log10(2)
    assert ratings == pytest.approx({"A": 1000 + step, "B": 1000.0, "C": 1000 - step})
    # One pair scoring 3/4 (a draw is half a win): 400 log10(3) = 190.85 apart.
    pair = fit_elo({("A", "B"): (28, 4, 8)}, prior_draws=0)
    assert pair["A"] - pair["B"] == pytest.approx(400 * math.log10(3))
    # Whoever won every game stays finite with the prior: 5 wins + 1 virtual draw = 5.5 : 0.5.
    shut_out = fit_elo({("A", "B"): (5, 0, 0)})
    assert shut_out["A"] - shut_out["B"] == pytest.approx(400 * math.log10(11))
    with pytest.raises(ValueError, match="B scored nothing"):
        fit_elo({("A", "B"): (5, 0, 0)}, prior_draws=0)


def test_fit_elo_meets_the_likelihood_equations_with_the_prior() -> None:
    # At the maximum-likelihood fit each player's expected score over its games (the
    # closed form above) equals its actual score. With one virtual draw per pair:
    # games A-B 4, B-C 5, A-C 4; scores A 3 + .5 + 1 + .5 = 5, B .5 + 2 + .5 + .5 = 3.5,
    # C 1 + .5 + .5 + 2 + .5 = 4.5.
    results = {("A", "B"): (3, 0, 0), ("B", "C"): (2, 1, 1), ("A", "C"): (1, 0, 2)}
    ratings = fit_elo(results, prior_draws=1.0)
    games = {("A", "B"): 4, ("B", "C"): 5, ("A", "C"): 4}
    scores = {"A": 5.0, "B": 3.5, "C": 4.5}
    for player, score in scores.items():
        expected = sum(
            n * expected_score(ratings[a if a == player else b], ratings[b if a == player else a])
            for (a, b), n in games.items()
            if player in (a, b)
        )
        assert expected == pytest.approx(score, abs=1e-6), player
