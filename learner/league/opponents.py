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


def drop_row(occupied_RC: np.ndarray, column: int) -> int | None:
    """The row a piece dropped in ``column`` lands on (the lowest empty one), None when full."""
    empty = np.flatnonzero(~occupied_RC[:, column])
    return int(empty[-1]) if empty.size else None


def completes_four(pieces_RC: np.ndarray, row: int, column: int) -> bool:
    """Whether a piece at (row, column) joins ``pieces_RC`` (bool [rows, columns]) into a
    line of four: count the run through it along each direction."""
    rows, columns = pieces_RC.shape
    for d_row, d_col in _DIRECTIONS:
        run = 1
        for sign in (1, -1):
            r, c = row + sign * d_row, column + sign * d_col
            while 0 <= r < rows and 0 <= c < columns and pieces_RC[r, c]:
                run += 1
                r, c = r + sign * d_row, c + sign * d_col
        if run >= CONNECT:
            return True
    return False


def winning_moves(mine_RC: np.ndarray, theirs_RC: np.ndarray, legal: np.ndarray) -> list[int]:
    """Legal columns where a piece of ``mine`` would complete four at once."""
    occupied = mine_RC | theirs_RC
    moves = []
    for column in legal:
        row = drop_row(occupied, int(column))
        if row is not None and completes_four(mine_RC, row, int(column)):
            moves.append(int(column))
    return moves


class ConnectFourHeuristic:
    """One-step lookahead for Connect Four: win if it can, block the other's immediate win
    if it must, else a random legal move (issue 57's benchmark opponent)."""

    def __init__(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(seed)

    def __call__(self, obs: Any) -> int:
        legal = legal_actions(obs)
        board = np.asarray(obs["observation"])
        if board.shape != (ROWS, COLUMNS, 2):
            raise ValueError(
                f"the Connect Four heuristic reads a {ROWS}x{COLUMNS}x2 board, got {board.shape}"
            )
        mine, theirs = board[..., 0] != 0, board[..., 1] != 0
        for player, other in ((mine, theirs), (theirs, mine)):  # win first, then block
            moves = winning_moves(player, other, legal)
            if moves:
                return int(self.rng.choice(moves))
        return int(self.rng.choice(legal))


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
        """Observation rows (raw, as the actor sent them) -> one action per row."""
        if self.packing is None:
            return np.asarray([self.opponent(row) for row in obs_BO])
        leaves = self.packing.unpack(obs_BO)
        return np.asarray(
            [
                self.opponent(codec.unflatten_values(self.space, [leaf[i] for leaf in leaves]))
                for i in range(len(obs_BO))
            ]
        )
