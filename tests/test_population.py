"""Population-based training (--population, docs/pbt.md): the members' share of the slots
as streams come and go, exploit copying one member's whole state into another, explore
within bounds, each member's frames in its own store only, the population through a
checkpoint, and a population training CartPole with real actor processes."""

from __future__ import annotations

import asyncio
import copy
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import torch
from support import actor_args, learner_process, read_records, running

from learner.agents.trained_policy import Policy
from learner.parts import Learner, build_learner, save_checkpoint
from learner.population.assignment import MemberSlots
from learner.population.pbt import (
    EVENT_KEY,
    POPULATION_KEY,
    Exploiter,
    LiveMember,
    choose_source,
    perturb,
)
from learner.run import choose_host, make_engine
from learner.state import checkpoint
from learner.state.trajectories import FinishedEpisodes
from learner.training.hosts import PolicyHosts, ThreadHost
from learner.training.trainer import Trainer
from seedrl import envs
from seedrl.config import PBT_BOUNDS, LearnerConfig

TESTS = Path(__file__).parent


def _config(tmp_path: Path, **changes: Any) -> LearnerConfig:
    settings: dict[str, Any] = {
        "env": "CartPole-v1", "population": 3, "logdir": str(tmp_path), "seed": 1,
        "unroll_length": 4, "batch_size": 4, "max_queue_unrolls": 4096,
        "hidden_sizes": (16,), "normalize_returns": True, "lr_schedule": "constant",
        **changes,
    }  # fmt: skip
    return LearnerConfig(**settings)


# ------------------------------------------------------------------ slots to members


def _even(slots: MemberSlots) -> None:
    shares = slots.shares()
    assert shares.max() - shares.min() <= 1, shares


def test_slots_are_shared_evenly_as_streams_join_and_leave() -> None:
    """New slots go to the members with the fewest; after a stream leaves, slots of the
    largest member are promised to the smallest and move only as their episodes end."""
    slots = MemberSlots(3)
    first, second = np.arange(0, 4), np.arange(4, 9)
    assert slots.members_of(first).tolist() == [0, 1, 2, 0]
    assert slots.members_of(second).tolist() == [1, 2, 0, 1, 2]
    assert slots.shares().tolist() == [3, 3, 3]
    slots.release(first)  # left: member 0 has 4, 6; member 1 has 4... by slot: 4:1 5:2 6:0 7:1 8:2
    assert slots.shares().tolist() == [2, 2, 1] or sorted(slots.shares().tolist()) == [1, 2, 2]
    _even(slots)
    slots.release(np.array([6]))  # member 0 is left with none: one of another's is promised
    _even(slots)
    (moving,) = slots.moving.items()
    slot, to = moving
    assert to == 0 and slots.member_S[slot] != 0, "a promised slot keeps its member until then"
    done_B = np.zeros(4, bool)
    rows = np.array([4, 5, 7, 8])
    assert slots.moves_due(rows, done_B).size == 0 and slots.member_S[slot] != 0
    done_B[rows.tolist().index(slot)] = True
    assert slots.moves_due(rows, done_B).tolist() == [slot]
    assert slots.member_S[slot] == 0 and not slots.moving
    assert np.bincount(slots.member_S[rows], minlength=3).tolist() == slots.shares().tolist()


def test_shares_stay_within_one_slot_under_random_churn() -> None:
    """Streams of random sizes join and leave, episodes end at random: after every event
    the promised shares are within one slot, and once every promised slot's episode has
    ended the slots' members are those shares."""
    rng = np.random.default_rng(5)
    slots = MemberSlots(4, capacity=8)
    streams: list[np.ndarray] = []
    next_slot = 0
    for _ in range(300):
        if streams and rng.random() < 0.4:
            slots.release(streams.pop(int(rng.integers(len(streams)))))
        else:
            size = int(rng.integers(1, 6))
            streams.append(np.arange(next_slot, next_slot + size))
            next_slot += size
            slots.members_of(streams[-1])
        _even(slots)
        live = np.concatenate(streams) if streams else np.zeros(0, np.int64)
        slots.moves_due(live, rng.random(len(live)) < 0.3)
        _even(slots)
    live = np.concatenate(streams)
    slots.moves_due(live, np.ones(len(live), bool))
    assert not slots.moving
    assert np.bincount(slots.member_S[live], minlength=4).tolist() == slots.shares().tolist()


# ------------------------------------------------------------------ explore and select


class Scripted:
    """Draws given in advance, so expected values are worked out by hand."""

    def __init__(
        self, randoms: list[float], uniforms: tuple[float, ...] = (), ints: tuple[int, ...] = ()
    ) -> None:
        self.randoms, self.uniforms, self.ints = list(randoms), list(uniforms), list(ints)

    def random(self) -> float:
        return self.randoms.pop(0)

    def uniform(self, low: float, high: float) -> float:
        share = self.uniforms.pop(0)
        return low + share * (high - low)

    def integers(self, high: int) -> int:
        return self.ints.pop(0) % high


def scripted(
    randoms: list[float], uniforms: tuple[float, ...] = (), ints: tuple[int, ...] = ()
) -> np.random.Generator:
    """:class:`Scripted` where a generator is taken (it draws what they draw)."""
    return cast(np.random.Generator, Scripted(randoms, uniforms, ints))


def test_explore_multiplies_or_resamples_within_bounds_by_hand() -> None:
    values = {"learning_rate": 1e-3, "entropy_cost": 0.09, "baseline_cost": 0.5}
    names = ("learning_rate", "entropy_cost", "baseline_cost")
    # lr: kept (0.9 >= 0.25), 0.3 < 0.5 -> x0.8; entropy: kept, 0.7 -> x1.2 = 0.108,
    # clipped to 0.1; baseline: 0.1 < 0.25 -> resampled at the log-midpoint of [0.05, 2].
    draws = scripted([0.9, 0.3, 0.9, 0.7, 0.1], uniforms=(0.5,))
    new = perturb(values, names, draws, resample=0.25)
    assert new["learning_rate"] == pytest.approx(8e-4)
    assert new["entropy_cost"] == pytest.approx(0.1)
    assert new["baseline_cost"] == pytest.approx(math.sqrt(0.05 * 2.0))
    assert values["learning_rate"] == 1e-3, "the source's values are left as they were"
    low = scripted([0.9, 0.1])  # x0.8 of the floor stays at the floor
    assert perturb({"learning_rate": 1e-5}, ("learning_rate",), low, 0.25) == {
        "learning_rate": 1e-5
    }


def test_explore_stays_in_bounds_and_repeats_with_its_seed() -> None:
    names = tuple(PBT_BOUNDS)
    walk = {name: PBT_BOUNDS[name][0] * 2 for name in names}
    seen = []
    rng = np.random.default_rng(3)
    for _ in range(2000):
        walk = perturb(walk, names, rng, resample=0.1)
        seen.append(walk)
        for name, (low, high) in PBT_BOUNDS.items():
            assert low <= walk[name] <= high
    again, rng = {name: PBT_BOUNDS[name][0] * 2 for name in names}, np.random.default_rng(3)
    for expected in seen[:50]:
        again = perturb(again, names, rng, resample=0.1)
        assert again == expected
    for name, (low, high) in PBT_BOUNDS.items():  # the walk reaches both ends
        assert min(v[name] for v in seen) == low and max(v[name] for v in seen) == high


def test_truncation_selection_by_hand() -> None:
    returns = {0: 10.0, 1: 5.0, 2: 7.0, 3: 1.0}
    assert choose_source(returns, 3, 0.25, scripted([], ints=(0,))) == 0
    for member in (0, 1, 2):  # not in the bottom quarter: keeps its own
        assert choose_source(returns, member, 0.25, scripted([])) is None
    # Half: bottom [3, 1], top [2, 0], the draw picks among the top.
    assert choose_source(returns, 1, 0.5, scripted([], ints=(0,))) == 2
    assert choose_source(returns, 1, 0.5, scripted([], ints=(1,))) == 0
    assert choose_source({0: 3.0, 1: 3.0}, 0, 0.25, scripted([], ints=(0,))) == 1, "ties: by index"
    assert choose_source({2: 1.0}, 2, 0.5, scripted([])) is None, "one ranked member: nothing"
    assert choose_source({0: 1.0, 1: 2.0}, 2, 0.5, scripted([])) is None, "unranked member"


# ------------------------------------------------------------------ exploit


def _episodes(learner: Learner, name: str, returns: list[float]) -> None:
    ended = FinishedEpisodes(np.array(returns, np.float32), np.full(len(returns), 10))
    learner.policies[name].stats.on_batch(10 * len(returns), ended)


def _trained(learner: Learner, steps: int = 2) -> dict[str, Trainer]:
    """Each member's trainer after ``steps`` updates on its own random unrolls, so that
    the optimizer moments and the return normaliser hold something."""
    from support import random_unrolls

    trainers = {name: Trainer(learner.trainer_parts(name)) for name in learner.policies}
    for seed, trainer in enumerate(trainers.values()):
        for step in range(steps):
            trainer.train_step(random_unrolls(4, 4, seed=10 * seed + step))
    return trainers


def _exploiter(learner: Learner, trainers: dict[str, Trainer]) -> Exploiter:
    assert learner.population is not None
    members = [
        LiveMember(learner.policies[n], trainers[n].retune, trainers[n].between_updates)
        for n in learner.policies
    ]
    return Exploiter(learner.population, learner.agent, members, learner.member_agent)


def _state(learner: Learner, name: str) -> dict[str, Any]:
    return learner.agent.state_dict(learner.policies[name].state)


def _assert_same(a: Any, b: Any) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _assert_same(a[key], b[key])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same(x, y)
    elif isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    else:
        assert a == b


def test_exploit_copies_the_chosen_members_whole_state_and_retunes(tmp_path) -> None:
    """The bottom member takes the source's weights, Adam moments and return normaliser
    exactly (copies, not shared tensors), then trains with the perturbed values: the new
    learning rate in its optimizer and the new entropy cost in its agent's loss."""
    learner = build_learner(_config(tmp_path, population=2, pbt_fraction=0.5))
    assert learner.population is not None
    for slot, own in zip(learner.policies.values(), learner.population.values, strict=True):
        assert [g["lr"] for g in slot.state.optimizer.param_groups] == [own["learning_rate"]]
    trainers = _trained(learner)
    source = _state(learner, "member0")
    assert source["optimizer"]["state"], "Adam holds moments after two steps"
    assert source["return_normalizer"] != _state(learner, "member1")["return_normalizer"]
    _episodes(learner, "member0", [50.0, 60.0])
    _episodes(learner, "member1", [10.0])
    exploiter = _exploiter(learner, trainers)
    learner.policies["member1"].stats.frames = learner.config.pbt_interval
    (event,) = exploiter.tick(frames=123)
    assert (event["member"], event["copied"], event["frames"]) == ("member1", "member0", 123)
    copied = _state(learner, "member1")
    source = _state(learner, "member0")
    _assert_same(
        {k: v for k, v in copied.items() if k != "optimizer"},
        {k: v for k, v in source.items() if k != "optimizer"},
    )
    _assert_same(copied["optimizer"]["state"], source["optimizer"]["state"])
    values = learner.population.values[1]
    assert values == event["values"] and event["copied_values"] == learner.population.values[0]
    assert values != learner.population.values[0], "explored, not a bare copy"
    member1 = learner.policies["member1"].state
    assert [g["lr"] for g in member1.optimizer.param_groups] == [values["learning_rate"]]
    retuned, kept = (cast(Any, trainers[n].agent) for n in ("member1", "member0"))
    assert retuned.entropy_cost(0.0) == pytest.approx(values["entropy_cost"])
    assert kept.entropy_cost(0.0) == pytest.approx(0.001)
    moments = member1.optimizer.state_dict()["state"][0]["exp_avg"].clone()
    trainers["member0"].train_step(__import__("support").random_unrolls(4, 4, seed=99))
    after = member1.optimizer.state_dict()["state"][0]["exp_avg"]
    torch.testing.assert_close(after, moments, rtol=0, atol=0)  # its own copy, not shared
    assert learner.population.copied_episodes[1] == learner.policies["member1"].stats.episodes
    assert exploiter.tick(frames=124) == [], "no member is due again yet"


def test_exploit_waits_for_the_members_update_in_flight(tmp_path) -> None:
    """A member's weights are written only between its trainer's updates: a backward pass
    under way still needs the weights it started from (torch fails it otherwise)."""
    import threading

    learner = build_learner(_config(tmp_path, population=2, pbt_fraction=0.5))
    trainers = _trained(learner, steps=1)
    _episodes(learner, "member0", [50.0])
    _episodes(learner, "member1", [10.0])
    exploiter = _exploiter(learner, trainers)
    learner.policies["member1"].stats.frames = learner.config.pbt_interval
    (planned,) = exploiter.due()
    assert planned[:2] == (1, 0)
    before = copy.deepcopy(learner.policies["member1"].state.model.state_dict())
    with trainers["member1"].between_updates:  # its update in flight
        copying = threading.Thread(target=exploiter.apply, args=([planned], 0))
        copying.start()
        copying.join(0.5)
        assert copying.is_alive(), "the copy waits for the update to end"
        _assert_same(learner.policies["member1"].state.model.state_dict(), before)
    copying.join(10)
    assert not copying.is_alive()
    _assert_same(
        learner.policies["member1"].state.model.state_dict(),
        learner.policies["member0"].state.model.state_dict(),
    )


def test_hyperparameters_take_effect_in_the_members_update(tmp_path) -> None:
    """A member retuned to a learning rate ten times another's takes a step ten times as
    long from the same state on the same batch (Adam's first step: lr-sized)."""
    from support import random_unrolls

    learner = build_learner(_config(tmp_path, population=2, max_grad_norm=100.0))
    trainers = {name: Trainer(learner.trainer_parts(name)) for name in learner.policies}
    exploiter = _exploiter(learner, trainers)
    population = learner.population
    assert population is not None
    population.values = [
        {"learning_rate": 1e-4, "entropy_cost": 0.0},
        {"learning_rate": 1e-3, "entropy_cost": 0.0},
    ]
    # The same state in both (the optimizer's rate with it), then each member's own values.
    learner.agent.load_state_dict(learner.policies["member1"].state, _state(learner, "member0"))
    for index, member in enumerate(exploiter.members):
        own = population.config_of(index)
        member.retune(learner.member_agent(own), own)
    before = [p.detach().clone() for p in learner.policies["member0"].state.model.parameters()]
    batch = random_unrolls(4, 4, seed=1)
    for trainer in trainers.values():
        trainer.train_step(batch)
    moved = [
        max(
            float((p.detach() - b).abs().max())
            for p, b in zip(slot.state.model.parameters(), before, strict=True)
        )
        for slot in learner.policies.values()
    ]
    assert moved[1] == pytest.approx(10 * moved[0], rel=1e-3)


# ------------------------------------------------------------------ each member's frames


def _logits_of_member(learner: Learner) -> None:
    """Every member's policy outputs its own constant logits [index, 0], whatever it sees."""
    for index, slot in enumerate(learner.policies.values()):
        with torch.no_grad():
            slot.state.model.policy.weight.zero_()
            slot.state.model.policy.bias.copy_(torch.tensor([float(index), 0.0]))


def _serve(learner: Learner, streams: list[Any], engine: Any, steps: int, vec: list[Any]) -> None:
    from learner.serving.batcher import PendingRequest
    from learner.serving.inference import FramePayload

    async def run() -> None:
        state = [(v.reset(seed=i)[0], np.zeros(v.num_envs, np.float32)) for i, v in enumerate(vec)]
        dones = [np.zeros(v.num_envs, bool) for v in vec]
        for _ in range(steps):
            requests = []
            for conn, (obs, reward), done in zip(streams, state, dones, strict=True):
                payload = FramePayload(
                    conn, np.ascontiguousarray(obs, np.float32).tobytes(), reward.tobytes(),
                    done.tobytes(), np.zeros_like(done).tobytes(),
                )  # fmt: skip
                future = asyncio.get_running_loop().create_future()
                requests.append(PendingRequest(payload, conn.num_envs, future))
            await engine.process(requests)
            for i, request in enumerate(requests):
                obs, reward, term, trunc, _ = vec[i].step(request.future.result().copy())
                state[i] = (obs, reward.astype(np.float32))
                dones[i] = term | trunc

    asyncio.run(run())


def test_no_frame_of_one_member_reaches_anothers_store(tmp_path) -> None:
    """Each member acts with logits of its own: every row of every unroll in a member's
    store carries that member's logits, through a stream leaving (its slots' members
    moving at their episodes' ends) and another joining; every member gets unrolls, and
    each member's trainer takes from its own store."""
    from learner.serving.inference import Connection

    learner = build_learner(_config(tmp_path))
    _logits_of_member(learner)
    host = choose_host(learner)
    assert isinstance(host, PolicyHosts)
    engine = make_engine(learner, host)
    assert engine.members is not None
    make = [envs.make_vector_env("CartPole-v1", {}, k) for k in (1, 2, 1, 2, 3)]
    conns = [Connection(f"a{i}", "run", "peer", v.num_envs, learner.builder.allocate(v.num_envs))
             for i, v in enumerate(make)]  # fmt: skip
    for joined in range(1, 5):  # members 0; 1, 2; 0; 1, 2 as the streams join
        _serve(learner, conns[:joined], engine, 10, make[:joined])
    member_S = engine.members.member_S
    assert [sorted(member_S[c.slot_ids].tolist()) for c in conns[:4]] == [[0], [1, 2], [0], [1, 2]]
    engine.release_later(conns[0])
    engine.release_later(conns[2])  # member 0 is left with none, the others two each
    staying = [conns[1], conns[3]]
    _serve(learner, staying, engine, 150, [make[1], make[3]])
    assert not engine.members.moving, "every promised slot moved at an episode's end"
    moved = np.concatenate([c.slot_ids for c in staying])
    assert sorted(engine.members.member_S[moved].tolist()) in ([0, 1, 1, 2], [0, 1, 2, 2])
    _serve(learner, [*staying, conns[4]], engine, 60, [make[1], make[3], make[4]])
    shares = engine.members.shares()
    assert shares.max() - shares.min() <= 1
    for index, (name, slot) in enumerate(learner.policies.items()):
        unrolls = slot.queue.get(len(slot.queue), timeout=1)
        assert unrolls is not None and len(unrolls) > 0, name
        logits = np.unique(unrolls.policy_params.reshape(-1, 2), axis=0)
        assert logits.tolist() == [[float(index), 0.0]], (name, logits)
        own = host.hosts[name]
        assert isinstance(own, ThreadHost)
        assert own.queue is slot.queue and own.trainer.state is slot.state


# ------------------------------------------------------------------ checkpoints


def test_a_population_survives_a_checkpoint_round_trip(tmp_path) -> None:
    """Members' weights, values, history and random state come back on --resume (each
    member's optimizer at its own restored rate); evaluate plays the best member by
    default, another with --member."""
    config = _config(tmp_path, population=3, pbt_fraction=0.34)
    learner = build_learner(config)
    trainers = _trained(learner)
    for name, returns in (("member0", [5.0]), ("member1", [80.0]), ("member2", [40.0])):
        _episodes(learner, name, returns)
    exploiter = _exploiter(learner, trainers)
    learner.policies["member0"].stats.frames = config.pbt_interval
    (event,) = exploiter.tick(frames=77)
    assert event["member"] == "member0" and event["copied"] == "member1"
    _episodes(learner, "member0", [1.0])  # member 1 stays the best since
    save_checkpoint(learner)
    population = learner.population
    assert population is not None
    saved = checkpoint.load(config.checkpoint_path)
    assert saved[POPULATION_KEY]["history"] == [event]

    resumed = build_learner(config.with_changes(resume=True))
    again = resumed.population
    assert again is not None
    assert again.values == population.values and again.history == population.history
    assert again.rng.random() == population.rng.random(), "the same draws follow"
    for name, slot in resumed.policies.items():
        _assert_same(_state(resumed, name), _state(learner, name))
        lr = resumed.trainer_parts(name).config.learning_rate
        assert [g["lr"] for g in slot.state.optimizer.param_groups] == [lr]
    assert (
        resumed.trainer_parts("member0").config.learning_rate
        == population.values[0]["learning_rate"]
    )
    best = Policy.load(config.checkpoint_path)
    assert best.member == "member1"
    member1 = learner.policies["member1"].state.model.state_dict()
    _assert_same(best.model.state_dict(), member1)
    assert Policy.load(config.checkpoint_path, member=2).member == "member2"
    with pytest.raises(checkpoint.CheckpointError, match="members 0 to 2"):
        Policy.load(config.checkpoint_path, member=3)
    with pytest.raises(checkpoint.CheckpointError, match="trained policies"):
        build_learner(config.with_changes(resume=True, population=2))


def test_evaluate_refuses_a_member_the_population_lacks_in_one_line(tmp_path, capsys) -> None:
    from population_support import population_checkpoint

    from learner.tools import evaluate

    path = population_checkpoint(tmp_path)
    for flags in (["--member", "3"], ["--member", "3", "--opponent", "random"]):
        with pytest.raises(SystemExit) as exited:
            evaluate.main(["--checkpoint", str(path), *flags])
        err = capsys.readouterr().err.strip()
        assert exited.value.code == 2 and len(err.splitlines()) == 1, err
        assert "--member 3: the population has members 0 to 2" in err


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"trainer": "process"}, "drop --trainer process"),
        ({"policy_mapping": ("a=pa",)}, "drop --policy-mapping"),
        ({"pbt_params": ("discount",)}, "--pbt-params: 'discount'"),
        ({"pbt_start": ("learning_rate=1e-3:2e-3",)}, "2 values for a --population of 3"),
        ({"pbt_start": ("baseline_cost=1:1:1",)}, "which --pbt-params does not list"),
    ],
)
def test_a_population_it_cannot_run_is_refused(tmp_path, changes, words) -> None:
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        _config(tmp_path, **changes)


def test_the_learner_refuses_it_in_one_line(tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "learner", "--population", "3", "--trainer", "process",
         "--logdir", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "drop --trainer process" in lines[0], result.stderr


# ------------------------------------------------------------------ end to end


@pytest.mark.long
@pytest.mark.parametrize("frontends", ["0", "2"], ids=["one process", "two frontends"])
def test_a_population_trains_cartpole_with_actor_processes(tmp_path, frontends) -> None:
    """Learner and two actor processes for a few seconds (served in one process, or by
    two frontend processes): every member trains on frames of its own, at least one
    exploit is logged (metrics.jsonl, the progress line) within bounds, the lineage plot
    is written, and the checkpoint's history is the log's."""
    args = ["--env", "CartPole-v1", "--population", "3", "--pbt-interval", "1500",
            "--pbt-fraction", "0.34", "--total-frames", "20000", "--unroll-length", "8",
            "--batch-size", "8", "--checkpoint-interval-s", "3600", "--seed", "3",
            "--serving-processes", frontends]  # fmt: skip
    env = {
        "PYTHONPATH": os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)
    }
    with learner_process(tmp_path, *args, env=env, timeout=120) as (learner, port):
        with running(actor_args(port, 2, 4), env=env):
            code = learner.wait(240)
    assert code == 0, "\n".join(learner.lines[-30:])
    served_by = [line for line in learner.lines if "serving by 2 frontends" in line]
    assert bool(served_by) == (frontends == "2"), "\n".join(learner.lines[:30])
    records = read_records(tmp_path)
    events = [event for record in records for event in record.get(EVENT_KEY, [])]
    assert events, "\n".join(learner.lines[-30:])
    assert any(" pbt member" in line and "<-member" in line for line in learner.lines)
    copied = [r for r in records if EVENT_KEY in r]
    for record in copied:  # the scalars TensorBoard gets: whom each member copied
        for event in record[EVENT_KEY]:
            source = float(event["copied"].removeprefix("member"))
            assert record[f"pbt/{event['member']}/copied"] == source
    for event in events:
        assert event["member"] != event["copied"]
        assert event["return"] <= event["copied_return"]
        for name, value in event["values"].items():
            low, high = PBT_BOUNDS[name]
            assert low <= value <= high
    last = records[-1]
    for name in ("member0", "member1", "member2"):
        assert last[f"policy/{name}/learner_steps"] > 0 and last[f"policy/{name}/frames"] > 0
    assert (tmp_path / "lineage.png").stat().st_size > 0
    saved = checkpoint.load(tmp_path / "checkpoint.pt")
    assert saved[POPULATION_KEY]["history"] == events


def test_the_pbt_suite_runs_each_population_beside_its_settings_alone() -> None:
    """Each env of the ``pbt`` suite: one population row whose members start at exactly
    the settings the other rows train alone, all at one budget, every config valid, and
    the population's curve the key the learner writes."""
    from benchmarks.learning.runner import run_overrides
    from benchmarks.learning.suites import PBT_CURVE_METRIC, SUITES
    from learner.population.pbt import BEST_RETURN_KEY
    from seedrl.config import pbt_start_values
    from seedrl.presets import build_config, load_preset

    assert PBT_CURVE_METRIC == BEST_RETURN_KEY
    suite = SUITES["pbt"]
    by_env: dict[str, list[Any]] = {}
    for spec in suite.envs:
        by_env.setdefault(spec.env, []).append(spec)
    assert set(by_env) == {"MinAtar/SpaceInvaders-v1", "CartPole-v1"}
    for specs in by_env.values():
        population, *alone = specs
        assert population.variant == "population" and len(alone) == 4
        assert len({spec.frames for spec in specs}) == 1
        configs = [
            build_config(
                LearnerConfig, run_overrides(s, None), load_preset(s.preset) if s.preset else {}
            )
            for s in specs
        ]
        starts = pbt_start_values(configs[0])
        assert configs[0].population == 4 and configs[0].pbt_interval > 0
        settings = [(c.learning_rate, c.entropy_cost) for c in configs[1:]]
        assert list(zip(starts["learning_rate"], starts["entropy_cost"], strict=True)) == settings
        assert len(set(settings)) == 4, "spread, not one setting four times"
