"""``python -m learner tournament``: a self-play checkpoint's pool in a round robin, every
pair in both seats, Elo fitted to all the results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from league_support import CONNECT_FOUR, connect_four_checkpoint

from learner.league.arena import ScriptedPlayer, make_aec_env
from learner.league.tournament import Entrant, main, round_robin


def test_round_robin_plays_each_pair_in_both_seats() -> None:
    # A column-0 stacker against a column-1 stacker: the first mover wins every game, so
    # each wins exactly the games it starts.
    players = [
        Entrant(name, step, ScriptedPlayer(lambda obs, c=c: c))  # type: ignore[arg-type]
        for name, step, c in (("zero", 1, 0), ("one", 2, 1), ("two", 3, 2))
    ]
    results = round_robin(make_aec_env(CONNECT_FOUR), players, games=3)
    assert results == {
        ("zero", "one"): (3.0, 0.0, 3.0),
        ("zero", "two"): (3.0, 0.0, 3.0),
        ("one", "two"): (3.0, 0.0, 3.0),
    }


def test_tournament_rates_every_snapshot_and_the_learner(tmp_path: Path, capsys) -> None:
    connect_four_checkpoint(tmp_path / "checkpoint.pt", seed=0, pool_seeds=(1, 2, 3))
    out_json, png = tmp_path / "t.json", tmp_path / "t.png"
    argv = ["--checkpoint", str(tmp_path), "--games", "2", "--json", str(out_json)]
    assert main([*argv, "--png", str(png)]) == 0
    text = capsys.readouterr().out
    assert "4 players, 6 pairs x 4 games (sampled)" in text
    data = json.loads(out_json.read_text())
    assert [p["name"] for p in data["players"]] == [
        "snapshot-0", "snapshot-1", "snapshot-2", "learner",
    ]  # fmt: skip
    assert [p["learner_step"] for p in data["players"]] == [10, 20, 30, 40]
    assert all(sum(r[2:]) == 4 for r in data["results"])  # 2 games x 2 seats per pair
    assert sum(data["ratings"].values()) == pytest.approx(4000.0)  # centred on 1000
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert main([*argv, "--max-players", "2"]) == 0  # the oldest and the learner
    assert [p["name"] for p in json.loads(out_json.read_text())["players"]] == [
        "snapshot-0", "learner",
    ]  # fmt: skip


def test_a_checkpoint_without_a_pool_exits_2(tmp_path: Path, capsys) -> None:
    path = connect_four_checkpoint(tmp_path / "checkpoint.pt")
    with pytest.raises(SystemExit) as exit_info:
        main(["--checkpoint", str(path)])
    assert exit_info.value.code == 2
    assert "no self-play pool" in capsys.readouterr().err
