"""One prioritized-replay implementation timed at one replay size, in its own process:
``python benchmarks/replay_libs/driver.py --impl seedrl|cpprb|torchrl --capacity C``.

Run by ``python -m benchmarks.replay_libs`` with seedrl's interpreter for ``seedrl`` and
the comparison environment's for the libraries (they are no dependency of seedrl). It
imports nothing of seedrl's but the sum tree, so it runs where only numpy and the
library are installed, and prints one JSON line: the median microseconds of each
operation the R2D2 learner performs on its replay's priorities.

Every implementation gets the same work: filled to ``capacity`` sequences with random
priorities, then rounds of add ``--add`` new sequences at the maximum priority (what
inference puts between two learner steps), sample a batch of ``--batch`` with
importance weights (alpha 0.9, beta 0.6), and write the batch's new priorities back.
Only indices are stored: the sequences' own arrays are copied alike whatever keeps the
priorities, so the structure that keeps them is what is compared.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

ALPHA = 0.9
BETA = 0.6


class Impl(Protocol):
    """add / sample / update on one implementation's priority structure."""

    def add(self, n: int) -> None: ...
    def sample(self, n: int) -> np.ndarray: ...
    def update(self, index: np.ndarray, priority: np.ndarray) -> None: ...


class Seedrl:
    """seedrl's numpy sum tree, driven as ``PrioritizedReplay`` drives it."""

    def __init__(self, capacity: int, seed: int) -> None:
        root = Path(__file__).resolve().parents[2]
        sys.path.insert(0, str(root))
        from learner.agents.r2d2.replay import SumTree

        self.capacity = capacity
        self.tree = SumTree(capacity)
        self.priority = np.zeros(capacity)
        self.size = 0
        self.next = 0
        self.max_priority = 1.0
        self.rng = np.random.default_rng(seed)

    def add(self, n: int) -> None:
        slots = (self.next + np.arange(n)) % self.capacity
        self.priority[slots] = self.max_priority
        self.tree.update(slots, np.full(n, self.max_priority**ALPHA))
        self.next += n
        self.size = min(self.capacity, self.size + n)

    def sample(self, n: int) -> np.ndarray:
        total = self.tree.total
        slots = np.minimum(self.tree.find(self.rng.random(n) * total), self.size - 1)
        weight = (self.size * self.tree.leaves(slots) / total) ** -BETA
        weight /= weight.max()
        return slots

    def update(self, index: np.ndarray, priority: np.ndarray) -> None:
        self.priority[index] = priority
        self.tree.update(index, priority**ALPHA)
        self.max_priority = max(self.max_priority, float(priority.max()))


class Cpprb:
    """cpprb's PrioritizedReplayBuffer (C++ sum and min segment trees, Cython)."""

    def __init__(self, capacity: int, seed: int) -> None:
        import cpprb

        self.rb = cpprb.PrioritizedReplayBuffer(
            capacity, {"sequence": {"dtype": np.int64}}, alpha=ALPHA
        )
        self.next = 0

    def add(self, n: int) -> None:  # without priorities: at the maximum seen
        self.rb.add(sequence=self.next + np.arange(n))
        self.next += n

    def sample(self, n: int) -> np.ndarray:
        batch = self.rb.sample(n, beta=BETA)
        return np.asarray(batch["indexes"])

    def update(self, index: np.ndarray, priority: np.ndarray) -> None:
        self.rb.update_priorities(index, priority)


class Torchrl:
    """torchrl's ReplayBuffer with its PrioritizedSampler (C++ segment trees)."""

    def __init__(self, capacity: int, seed: int) -> None:
        import torch

        try:  # its segment trees are this C++ extension, built against one torch release
            import torchrl._torchrl  # noqa: F401
        except ImportError as exc:
            what = str(exc).split(": undefined symbol")[0].rsplit("/", 1)[-1]
            raise RuntimeError(
                f"torchrl's C++ extension ({what}) does not load with torch {torch.__version__}"
                f" ({'undefined symbol' if 'undefined symbol' in str(exc) else exc})"
            ) from exc
        from torchrl.data import LazyTensorStorage, PrioritizedSampler, ReplayBuffer

        torch.manual_seed(seed)
        self.torch = torch
        self.rb = ReplayBuffer(
            storage=LazyTensorStorage(capacity),
            sampler=PrioritizedSampler(capacity, alpha=ALPHA, beta=BETA),
        )
        self.next = 0

    def add(self, n: int) -> None:
        self.rb.extend(self.torch.arange(self.next, self.next + n))
        self.next += n

    def sample(self, n: int) -> np.ndarray:
        _, info = self.rb.sample(n, return_info=True)
        return np.asarray(info["index"])

    def update(self, index: np.ndarray, priority: np.ndarray) -> None:
        self.rb.update_priority(self.torch.from_numpy(index), self.torch.from_numpy(priority))


IMPLS: dict[str, Callable[[int, int], Impl]] = {
    "seedrl": Seedrl,
    "cpprb": Cpprb,
    "torchrl": Torchrl,
}


def library_version(name: str) -> str:
    if name == "seedrl":
        return "numpy " + np.__version__
    from importlib.metadata import version

    return f"{name} {version(name)}"


def measure(impl: Impl, capacity: int, add: int, batch: int, rounds: int, seed: int) -> dict:
    """Median microseconds of each operation over ``rounds`` rounds on a full replay."""
    rng = np.random.default_rng(seed)
    for start in range(0, capacity, 1024):  # fill, then spread the priorities out
        impl.add(min(1024, capacity - start))
    for start in range(0, capacity, 4096):
        index = np.arange(start, min(capacity, start + 4096))
        impl.update(index, rng.uniform(0.01, 2.0, len(index)))
    times: dict[str, list[float]] = {"add": [], "sample": [], "update": []}
    for _ in range(rounds):
        t0 = time.perf_counter()
        impl.add(add)
        t1 = time.perf_counter()
        index = impl.sample(batch)
        t2 = time.perf_counter()
        impl.update(np.asarray(index, np.int64), rng.uniform(0.01, 2.0, batch))
        t3 = time.perf_counter()
        times["add"].append(t1 - t0)
        times["sample"].append(t2 - t1)
        times["update"].append(t3 - t2)
    result: dict[str, Any] = {
        f"{op}_us": 1e6 * statistics.median(values) for op, values in times.items()
    }
    result["step_us"] = result["add_us"] + result["sample_us"] + result["update_us"]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", required=True, choices=sorted(IMPLS))
    parser.add_argument("--capacity", type=int, required=True)
    parser.add_argument("--add", type=int, default=16)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    impl = IMPLS[args.impl](args.capacity, args.seed)
    result = measure(impl, args.capacity, args.add, args.batch, args.rounds, args.seed)
    result.update(impl=args.impl, library=library_version(args.impl), capacity=args.capacity,
                  add=args.add, batch=args.batch, rounds=args.rounds)  # fmt: skip
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
