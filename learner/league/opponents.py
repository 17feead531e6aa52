"""Scripted opponents for two-player games, and the ``module:callable`` ones users bring.

An opponent is a function from one agent's observation, as the PettingZoo env gives it
(for Connect Four ``{"observation": int8 [6, 7, 2], "action_mask": int8 [7]}``, channel 0
the mover's pieces, channel 1 the other's, row 0 the top), to an action. The built-in
ones carry their own seeded generator, so a match is repeatable.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from seedrl import codec
from seedrl.proto import seedrl_pb2 as pb

Opponent = Callable[[Any], Any]
"""An agent's observation (its action mask included) -> its action."""

ROWS, COLUMNS, CONNECT = 6, 7, 4
_DIRECTIONS = ((0, 1), (1, 0), (1, 1), (1, -1))  # row, column steps: -, |, \, /


def legal_actions(obs: Any) -> np.ndarray:
    """Indices the observation's ``action_mask`` allows (ValueError when none is there)."""
    if not isinstance(obs, Mapping) or "action_mask" not in obs:
        raise ValueError("a scripted opponent needs an observation dict with an 'action_mask'")
    legal = np.flatnonzero(np.asarray(obs["action_mask"]))
    if legal.size == 0:
        raise ValueError("the action mask allows no action")
    return legal


class RandomOpponent:
    """Uniform over the legal moves the action mask allows."""

    def __init__(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(seed)

    def __call__(self, obs: Any) -> int:
        return int(self.rng.choice(legal_actions(obs)))


def _lines() -> np.ndarray:
    """Every line of four on the board, as flat cell indices ``[69, 4]``."""
    lines = []
    for row in range(ROWS):
        for column in range(COLUMNS):
            for d_row, d_col in _DIRECTIONS:
                cells = [(row + i * d_row, column + i * d_col) for i in range(CONNECT)]
                if all(0 <= r < ROWS and 0 <= c < COLUMNS for r, c in cells):
                    lines.append([r * COLUMNS + c for r, c in cells])
    return np.array(lines)


LINES = _lines()


def winning_columns(mine_BRC: np.ndarray, theirs_BRC: np.ndarray) -> np.ndarray:
    """bool ``[B, columns]``: where a piece of ``mine`` dropped now completes four, for a
    batch of boards (bool ``[B, rows, columns]``, row 0 the top)."""
    boards = len(mine_BRC)
    mine = mine_BRC.reshape(boards, -1)
    occupied = mine | theirs_BRC.reshape(boards, -1)
    # A line is won by one more piece when three of its cells are mine and one is empty.
    open_BL = (mine[:, LINES].sum(axis=-1) == CONNECT - 1) & (
        occupied[:, LINES].sum(axis=-1) == CONNECT - 1
    )
    board_i, line_i = np.nonzero(open_BL)
    cells_N4 = LINES[line_i]
    empty_N = cells_N4[~occupied[board_i[:, None], cells_N4]]  # one per open line
    wins_B = np.zeros_like(occupied)
    wins_B[board_i, empty_N] = True
    # A piece dropped in a column lands on its lowest empty row (none when it is full).
    rows_R1 = np.arange(ROWS)[:, None]
    empty_BRC = ~occupied.reshape(boards, ROWS, COLUMNS)
    landing_BC = np.where(empty_BRC, rows_R1, -1).max(axis=1)
    columns = np.arange(COLUMNS)
    lands_BC = wins_B.reshape(boards, ROWS, COLUMNS)[
        np.arange(boards)[:, None], np.maximum(landing_BC, 0), columns
    ]
    return lands_BC & (landing_BC >= 0)


class ConnectFourHeuristic:
    """One-step lookahead for Connect Four: win if it can, block the other's immediate win
    if it must, else a random legal move (issue 57's benchmark opponent).

    :meth:`batch` plays many boards at once (self-play's fixed opponent acts for a whole
    batch of rows); one observation is a batch of one.
    """

    def __init__(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(seed)

    def __call__(self, obs: Any) -> int:
        legal_actions(obs)
        one = {key: np.asarray(obs[key])[None] for key in ("observation", "action_mask")}
        return int(self.batch(one)[0])

    def batch(self, obs: Mapping[str, np.ndarray]) -> np.ndarray:
        """Actions ``[B]`` for observations whose leaves are stacked along a first axis."""
        board = np.asarray(obs["observation"])
        if board.shape[1:] != (ROWS, COLUMNS, 2):
            raise ValueError(
                f"the Connect Four heuristic reads a {ROWS}x{COLUMNS}x2 board, "
                f"got {board.shape[1:]}"
            )
        legal_BC = np.asarray(obs["action_mask"]).reshape(len(board), COLUMNS) != 0
        if not legal_BC.any(axis=1).all():
            raise ValueError("the action mask allows no action")
        mine, theirs = board[..., 0] != 0, board[..., 1] != 0
        win_BC = winning_columns(mine, theirs) & legal_BC
        block_BC = winning_columns(theirs, mine) & legal_BC
        # Win first, then block, else any legal move; uniform among the row's choices.
        choice_BC = np.where(
            win_BC.any(axis=1, keepdims=True),
            win_BC,
            np.where(block_BC.any(axis=1, keepdims=True), block_BC, legal_BC),
        )
        return np.where(choice_BC, self.rng.random(choice_BC.shape), -1.0).argmax(axis=1)


SCRIPTED: dict[str, Callable[[int | None], Opponent]] = {
    "random": RandomOpponent,
    "heuristic": ConnectFourHeuristic,
}
"""Built-in opponents by the name ``--opponent`` takes; each is built with a seed."""
HEURISTIC_ENVS = ("connect_four",)
"""Env ids (substrings) the heuristic reads the board of."""


def load_callable(spec: str, flag: str = "--opponent") -> Opponent:
    """The function a ``module:callable`` names (``pkg.mod:Class.method`` too), imported now:
    the user chose it on their own command line. ValueError in one line when it is not
    there or not callable."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{flag} {spec!r}: expected module:callable")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{flag} {spec}: cannot import {module_name!r} ({exc})") from exc
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ValueError(f"{flag} {spec}: module {module_name!r} has no {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"{flag} {spec}: {attr!r} is not callable")
    return target


def build(spec: str, env_id: str, seed: int, flag: str = "--opponent") -> Opponent:
    """A scripted opponent by name (``random``, ``heuristic``) or ``module:callable``;
    ValueError in one line, naming ``flag``, for a name it is not or the heuristic on
    another game."""
    if spec in SCRIPTED:
        if spec == "heuristic" and not any(g in env_id for g in HEURISTIC_ENVS):
            raise ValueError(
                f"{flag} heuristic reads a Connect Four board; {env_id} is not Connect Four "
                "(bring your own as module:callable)"
            )
        return SCRIPTED[spec](seed)
    if ":" in spec:
        return load_callable(spec, flag)
    raise ValueError(f"{flag} {spec!r}: not random, heuristic or module:callable")


class ScriptedRows:
    """A scripted opponent over the learner's observation rows: each row is turned back
    into the observation the env gave the agent (a dict or tuple of leaves, or one array)
    and the opponent's action is the row's."""

    def __init__(self, opponent: Opponent, observation: pb.SpaceSpec) -> None:
        self.opponent = opponent
        self.space = observation
        structured = observation.kind in codec.CONTAINER_KINDS
        self.packing = codec.LeafPacking(codec.space_leaves(observation)) if structured else None

    def __call__(self, obs_BO: np.ndarray) -> np.ndarray:
        """Observation rows (raw, as the actor sent them) -> one action per row; in one
        call for an opponent with a ``batch`` method (the Connect Four heuristic)."""
        if self.packing is None:
            return np.asarray([self.opponent(row) for row in obs_BO])
        leaves = self.packing.unpack(obs_BO)
        batch = getattr(self.opponent, "batch", None)
        if batch is not None:
            return np.asarray(batch(codec.unflatten_values(self.space, leaves)))
        return np.asarray(
            [
                self.opponent(codec.unflatten_values(self.space, [leaf[i] for leaf in leaves]))
                for i in range(len(obs_BO))
            ]
        )
