"""``python -m learner evaluate --opponent``: two-player games in both seats, results
counted per seat, on Connect Four."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from league_support import CONNECT_FOUR, connect_four_checkpoint

from learner.league.arena import ScriptedPlayer, make_aec_env, play_match
from learner.tools import evaluate


def column(c: int) -> ScriptedPlayer:
    return ScriptedPlayer(lambda obs: c)


def test_seats_and_outcomes_are_counted_from_the_policys_side() -> None:
    # Column 0 against column 1: whoever moves first stacks four in a column on its 4th
    # move, before the other (also stacking) gets its 4th. So the policy wins every game
    # it starts and loses every game it answers.
    env = make_aec_env(CONNECT_FOUR)
    result = play_match(env, column(0), column(1), games=3, opponent_name="column-1")
    assert (result.seats["first"].wins, result.seats["first"].losses) == (3, 0)
    assert (result.seats["second"].wins, result.seats["second"].losses) == (0, 3)
    assert result.agents == ("player_0", "player_1")
    assert result.to_dict()["total"]["win"] == 0.5


def test_a_game_cut_at_the_step_cap_is_a_draw() -> None:
    env = make_aec_env(CONNECT_FOUR)
    result = play_match(env, column(0), column(1), games=1, max_steps=4)
    assert result.seats["first"].draws == 1 and result.seats["first"].cut == 1


@pytest.fixture(scope="module")
def untrained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return connect_four_checkpoint(tmp_path_factory.mktemp("c4") / "checkpoint.pt")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert evaluate.main(list(argv)) == 0
    return capsys.readouterr().out


def test_evaluate_against_random_is_repeatable_and_counts_every_game(
    untrained: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    args = ["--checkpoint", str(untrained), "--opponent", "random", "--games", "6"]
    out = run(capsys, *args, "--json", str(tmp_path / "r.json"))
    assert "against random, 6 games per seat (greedy)" in out
    assert "first  (player_0)" in out and "second (player_1)" in out
    data = json.loads((tmp_path / "r.json").read_text())
    for seat in ("first", "second"):
        counts = data["seats"][seat]
        assert counts["wins"] + counts["draws"] + counts["losses"] == 6
    assert data["total"]["wins"] + data["total"]["draws"] + data["total"]["losses"] == 12
    assert run(capsys, *args).splitlines()[1:] == out.splitlines()[1:]  # same seed, same games


def test_evaluate_against_itself_and_a_users_callable(
    untrained: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Greedy against its own copy, the same game is played every time: what the first
    # seat wins, the second seat loses.
    path = tmp_path / "self.json"
    argv = ["--checkpoint", str(untrained), "--games", "2", "--json", str(path)]
    run(capsys, *argv, "--opponent", str(untrained.parent))  # a logdir is a checkpoint too
    seats = json.loads(path.read_text())["seats"]
    assert seats["first"]["wins"] == seats["second"]["losses"] in (0, 2)
    assert seats["first"]["losses"] == seats["second"]["wins"]
    out = run(capsys, *argv, "--opponent", "league_support:first_legal")
    assert "against league_support:first_legal" in out


@pytest.mark.parametrize(
    ("opponent", "message"),
    [
        ("nonsense", "not random, heuristic, an existing checkpoint or module:callable"),
        ("no_such_module_xyz:f", "cannot import"),
    ],
)
def test_a_bad_opponent_exits_2_with_one_line(
    untrained: Path, capsys: pytest.CaptureFixture[str], opponent: str, message: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        evaluate.main(["--checkpoint", str(untrained), "--opponent", opponent])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_heuristic_needs_connect_four_and_games_must_be_positive(
    untrained: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        evaluate.main(["--checkpoint", str(untrained), "--opponent", "random", "--games", "0"])
    assert "--games must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        evaluate.main(["--checkpoint", str(untrained), "--opponent", "random", "--video", "x.gif"])
    assert "--video records single-agent episodes" in capsys.readouterr().err
    with pytest.raises(ValueError, match="heuristic reads a Connect Four board"):
        evaluate._opponent("heuristic", "classic/tictactoe-v3", seed=0, greedy=True)
    with pytest.raises(SystemExit):  # another game's spaces than the checkpoint's
        evaluate.main([
            "--checkpoint", str(untrained), "--opponent", "random", "--env", "classic/tictactoe-v3",
        ])  # fmt: skip
    assert "observation_space" in capsys.readouterr().err
