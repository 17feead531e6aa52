"""Scripted Connect Four opponents: the one-step-lookahead heuristic wins and blocks on
crafted boards, and random players keep to the action mask."""

from __future__ import annotations

import numpy as np
import pytest

from learner.league.opponents import ConnectFourHeuristic, RandomOpponent, load_callable


def board(rows: list[str]) -> dict[str, np.ndarray]:
    """The mover's observation from a picture, top row first: ``x`` the mover's pieces,
    ``o`` the other's, ``.`` empty; the mask allows the columns with room."""
    grid = np.array([list(r) for r in rows])
    assert grid.shape == (6, 7)
    obs = np.stack([grid == "x", grid == "o"], axis=-1).astype(np.int8)
    mask = (grid[0] == ".").astype(np.int8)
    return {"observation": obs, "action_mask": mask}


def moves(obs: dict[str, np.ndarray], n: int = 50, seed: int = 0) -> set[int]:
    heuristic = ConnectFourHeuristic(seed)
    return {heuristic(obs) for _ in range(n)}


def test_it_wins_when_it_can_rather_than_block() -> None:
    obs = board([
        ".......",
        ".......",
        ".......",
        "......o",
        "......o",
        "xxx...o",
    ])  # fmt: skip
    assert moves(obs) == {3}  # a win at column 3 beats blocking column 6


def test_it_blocks_a_vertical_threat() -> None:
    obs = board([
        ".......",
        ".......",
        ".......",
        ".....o.",
        "x....o.",
        "x...xo.",
    ])  # fmt: skip
    assert moves(obs) == {5}


def test_it_finds_a_diagonal_win_that_lands_on_support() -> None:
    # x on (5,0), (4,1), (3,2): column 3 holds three pieces, so a drop lands on (2,3) and
    # completes the diagonal. o's diagonal (5,1), (4,2), (3,3) needs (2,4), out of reach.
    obs = board([
        ".......",
        ".......",
        ".......",
        "..xo...",
        ".xox...",
        "xoox...",
    ])  # fmt: skip
    assert moves(obs) == {3}


def test_a_win_in_a_square_not_yet_reachable_is_not_taken() -> None:
    # x x x . on row 4, but column 3 is empty below it: a piece there lands on row 5 and
    # wins nothing, and o threatens nothing, so any column may be played.
    obs = board([
        ".......",
        ".......",
        ".......",
        ".......",
        "xxx....",
        "oox.o..",
    ])  # fmt: skip
    assert moves(obs, n=300) == set(range(7))
    filled = board([
        ".......",
        ".......",
        ".......",
        ".......",
        "xxx....",
        "ooxoo..",
    ])  # fmt: skip
    assert moves(filled) == {3}  # now (4, 3) is where column 3 lands: the win


def test_with_nothing_to_win_or_block_it_plays_every_legal_column_and_no_full_one() -> None:
    obs = board([
        "x......",
        "o......",
        "x......",
        "o......",
        "x......",
        "o......",
    ])  # fmt: skip
    assert moves(obs, n=300) == {1, 2, 3, 4, 5, 6}


def test_random_keeps_to_the_mask_with_even_frequencies() -> None:
    mask = np.array([0, 1, 0, 1, 1, 0, 0], dtype=np.int8)
    player = RandomOpponent(seed=5)
    draws = [player({"action_mask": mask}) for _ in range(3000)]
    counts = np.bincount(draws, minlength=7)
    assert counts[mask == 0].sum() == 0
    # 1000 expected each; binomial sd = sqrt(3000 * 1/3 * 2/3) ~ 25.8: 5 sd = 129.
    assert np.all(np.abs(counts[mask == 1] - 1000) < 129), counts
    with pytest.raises(ValueError, match="action_mask"):
        player(np.zeros(3))


def test_module_callable_loader() -> None:
    assert load_callable("league_support:first_legal")({"action_mask": np.array([0, 0, 1])}) == 2
    assert load_callable("os.path:join")("a", "b") == "a/b"  # dotted attributes resolve
    for bad, match in (
        ("no_colon", "expected module:callable"),
        ("no_such_module_xyz:f", "cannot import"),
        ("league_support:missing", "has no 'missing'"),
        ("league_support:CONNECT_FOUR", "not callable"),
    ):
        with pytest.raises(ValueError, match=match):
            load_callable(bad)


def test_scripted_rows_read_the_learners_packed_rows_back_into_the_envs_dicts() -> None:
    """The learner keeps a dict observation as packed byte rows; a fixed opponent in the
    pool gets each row back as the dict the env gave, so the heuristic wins and blocks."""
    import gymnasium as gym

    from learner.league.opponents import ScriptedRows
    from seedrl import codec

    space = gym.spaces.Dict({
        "observation": gym.spaces.Box(0, 1, (6, 7, 2), np.int8),
        "action_mask": gym.spaces.Box(0, 1, (7,), np.int8),
    })  # fmt: skip
    spec = codec.space_to_spec(space)
    win = board([".......", ".......", ".......", "......o", "......o", "xxx...o"])
    block = board([".......", ".......", ".......", "o......", "o......", "o.xx..."])
    leaves = codec.space_leaves(spec)
    packing = codec.LeafPacking(leaves)
    rows = packing.pack_values(
        [np.stack([obs[leaf.name] for obs in (win, block)]) for leaf in leaves]
    )
    seen: list[dict[str, np.ndarray]] = []

    def watched(obs: dict[str, np.ndarray]) -> int:
        seen.append(obs)
        return ConnectFourHeuristic(0)(obs)

    assert ScriptedRows(watched, spec)(rows).tolist() == [3, 0]
    for got, sent in zip(seen, (win, block), strict=True):
        assert set(got) == set(sent)
        assert all(np.array_equal(got[k], sent[k]) for k in sent)
    flat = codec.space_to_spec(gym.spaces.Box(-1, 1, (3,), np.float32))
    values = np.array([[0.5, -1, 1], [0, 0, 0]], np.float32)
    assert ScriptedRows(lambda obs: int(obs.sum() > 0), flat)(values).tolist() == [1, 0]


def test_build_names_the_flag_it_was_given() -> None:
    from learner.league.opponents import build

    assert build("random", "anything", 0)({"action_mask": np.array([0, 1])}) == 1
    with pytest.raises(ValueError, match=r"^--fixed-opponents heuristic reads a Connect Four"):
        build("heuristic", "pettingzoo.mpe.simple_v3", 0, "--fixed-opponents")
    with pytest.raises(ValueError, match=r"^--fixed-opponents 'best': not random, heuristic"):
        build("best", "x", 0, "--fixed-opponents")
    with pytest.raises(ValueError, match=r"^--fixed-opponents no_such_module_xyz:f: cannot"):
        build("no_such_module_xyz:f", "x", 0, "--fixed-opponents")


def _random_boards(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(mover's pieces, other's pieces), bool [count, 6, 7]: games of random drops, each
    stopped after a random number of moves (possibly past a four: any board will do)."""
    rng = np.random.default_rng(seed)
    mine = np.zeros((count, 6, 7), bool)
    theirs = np.zeros((count, 6, 7), bool)
    for b in range(count):
        for move in range(int(rng.integers(0, 30))):
            open_columns = np.flatnonzero(~(mine[b] | theirs[b])[0])
            column = rng.choice(open_columns)
            row = np.flatnonzero(~(mine[b] | theirs[b])[:, column])[-1]
            (mine if move % 2 else theirs)[b, row, column] = True
    return mine, theirs


def _wins_slowly(mine: np.ndarray, theirs: np.ndarray) -> set[int]:
    """Columns where one more piece of ``mine`` makes four, by dropping it and counting the
    run through it along each direction: another route than the heuristic's line table."""
    wins = set()
    for column in range(7):
        empty = np.flatnonzero(~(mine | theirs)[:, column])
        if not empty.size:
            continue
        row = empty[-1]
        for d_row, d_col in ((0, 1), (1, 0), (1, 1), (1, -1)):
            run = 1
            for sign in (1, -1):
                r, c = row + sign * d_row, column + sign * d_col
                while 0 <= r < 6 and 0 <= c < 7 and mine[r, c]:
                    run, r, c = run + 1, r + sign * d_row, c + sign * d_col
            if run >= 4:
                wins.add(column)
    return wins


def test_winning_columns_of_a_batch_match_a_slow_run_count_on_random_boards() -> None:
    from learner.league.opponents import winning_columns

    mine, theirs = _random_boards(400, seed=3)
    got = winning_columns(mine, theirs)
    expected = [_wins_slowly(mine[b], theirs[b]) for b in range(len(mine))]
    assert [set(np.flatnonzero(row).tolist()) for row in got] == expected
    assert sum(len(e) for e in expected) > 50, "the boards hold enough wins to test"


def test_a_batch_plays_each_board_as_one_move_would() -> None:
    """Row by row: a win when there is one, else a block, else any legal move; over many
    draws every choice of a row's set comes up, and a single observation agrees."""
    mine, theirs = _random_boards(200, seed=4)
    legal = ~(mine | theirs)[:, 0]
    keep = legal.any(axis=1)
    mine, theirs, legal = mine[keep], theirs[keep], legal[keep]
    obs = {
        "observation": np.stack([mine, theirs], axis=-1).astype(np.int8),
        "action_mask": legal.astype(np.int8),
    }
    heuristic = ConnectFourHeuristic(0)
    seen = [set() for _ in range(len(mine))]
    for _ in range(150):
        for b, action in enumerate(heuristic.batch(obs)):
            seen[b].add(int(action))
    single = ConnectFourHeuristic(1)
    for b in range(len(mine)):
        allowed = set(np.flatnonzero(legal[b]).tolist())
        wins = _wins_slowly(mine[b], theirs[b]) & allowed
        blocks = _wins_slowly(theirs[b], mine[b]) & allowed
        want = wins or blocks or allowed
        assert seen[b] == want, b
        one = {"observation": obs["observation"][b], "action_mask": obs["action_mask"][b]}
        assert single(one) in want


def test_self_plays_scripted_rows_hand_the_heuristic_a_whole_batch() -> None:
    """The learner's packed rows go to the heuristic's batch in one call, each row back as
    its board: two crafted boards, one with a win in column 3, one with a block in 5."""
    from gymnasium import spaces

    from learner.league.opponents import ScriptedRows
    from seedrl import codec

    space = spaces.Dict(
        {
            "observation": spaces.Box(0, 1, (6, 7, 2), np.int8),
            "action_mask": spaces.Box(0, 1, (7,), np.int8),
        }
    )
    spec = codec.space_to_spec(space)
    boards = [
        board([".......", ".......", ".......", "......o", "......o", "xxx...o"]),
        board([".......", ".......", ".......", ".....o.", "x....o.", "x...xo."]),
    ]
    leaves = codec.space_leaves(spec)
    values = [np.stack([codec.flatten_values(spec, b)[i] for b in boards]) for i in range(2)]
    rows = codec.LeafPacking(leaves).pack_values(values)
    calls = []

    class Counting(ConnectFourHeuristic):
        def batch(self, obs):
            calls.append(len(obs["observation"]))
            return super().batch(obs)

    assert ScriptedRows(Counting(0), spec)(rows).tolist() == [3, 5]
    assert calls == [2]
