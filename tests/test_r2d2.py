"""R2D2 with prioritized replay: each rule checked against a slow loop or a closed form."""

from __future__ import annotations

import dataclasses
import json
import math
import threading

import numpy as np
import pytest
import torch

from learner.agents.base import SAMPLE_PRIORITY
from learner.agents.r2d2.agent import TARGET_KEY, R2D2Agent
from learner.agents.r2d2.policy import EpsilonGreedyPolicy, ape_x_epsilons
from learner.agents.r2d2.replay import PrioritizedReplay, ReplayCounters, SumTree
from learner.agents.r2d2.targets import (
    inverse_value_rescale,
    n_step_double_q_targets,
    sequence_priorities,
    value_rescale,
)
from learner.common.schedules import StepClock
from learner.state.trajectories import TrajectoryBuilder, Unrolls
from learner.training.trainer import to_time_major
from seedrl.config import LearnerConfig
from seedrl.presets import build_config, load_preset
from seedrl.proto import seedrl_pb2 as pb

EPS = 1e-3


def discrete(n: int) -> pb.SpaceSpec:
    return pb.SpaceSpec(kind="discrete", n=n)


# ------------------------------------------------------------------ value rescaling


def test_value_rescale_matches_its_formula_and_inverts() -> None:
    x = torch.tensor(
        [-1e4, -37.5, -1.0, -1e-3, 0.0, 2e-4, 0.5, 3.0, 80.0, 1e5], dtype=torch.float64
    )
    expected = [math.copysign(math.sqrt(abs(v) + 1) - 1, v) + EPS * v for v in x.tolist()]
    torch.testing.assert_close(value_rescale(x, EPS), torch.tensor(expected, dtype=torch.float64))
    torch.testing.assert_close(inverse_value_rescale(value_rescale(x, EPS), EPS), x)
    y = torch.linspace(-300, 300, 101, dtype=torch.float64)
    torch.testing.assert_close(value_rescale(inverse_value_rescale(y, EPS), EPS), y)


# ------------------------------------------------------------------ n-step double-Q targets


def slow_targets(reward, terminated, truncated, online_q, target_q, gamma, n):
    """Transition by transition, as the R2D2 paper writes it (numpy, float64)."""
    rows, batch = reward.shape
    out = np.zeros((rows - 1, batch))
    for b in range(batch):
        for t in range(rows - 1):
            total, scale, k = 0.0, 1.0, 0
            while True:
                k += 1
                row = t + k
                total += scale * reward[row, b]
                scale *= gamma
                if terminated[row, b]:
                    boot = 0.0
                    break
                if truncated[row, b] or k == n or row == rows - 1:
                    a = int(np.argmax(online_q[row, b]))
                    h_inv = inverse_value_rescale(torch.tensor(float(target_q[row, b, a])), EPS)
                    boot = scale * float(h_inv)
                    break
            out[t, b] = float(value_rescale(torch.tensor(total + boot, dtype=torch.float64), EPS))
    return out


def test_n_step_double_q_targets_match_a_slow_loop_across_an_end_and_a_truncation() -> None:
    rng = np.random.default_rng(3)
    rows, batch, actions, n, gamma = 12, 3, 4, 5, 0.97
    reward = rng.normal(size=(rows, batch)).astype(np.float32)
    terminated = np.zeros((rows, batch), bool)
    truncated = np.zeros((rows, batch), bool)
    terminated[4, 0] = True  # episode end inside the first transitions' windows
    truncated[7, 1] = True  # truncation: bootstraps from row 7's final observation
    terminated[2, 2], truncated[9, 2] = True, True
    online_q = rng.normal(size=(rows, batch, actions)).astype(np.float32)
    target_q = rng.normal(size=(rows, batch, actions)).astype(np.float32)
    got = n_step_double_q_targets(
        torch.from_numpy(reward), torch.from_numpy(terminated), torch.from_numpy(truncated),
        torch.from_numpy(online_q), torch.from_numpy(target_q), gamma, n, EPS,
    )  # fmt: skip
    expected = slow_targets(reward, terminated, truncated, online_q, target_q, gamma, n)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_sequence_priority_mixes_max_and_mean_of_trained_steps() -> None:
    abs_td = torch.tensor([[1.0, 4.0], [3.0, 9.0], [2.0, 5.0]])
    weight = torch.tensor([[1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    got = sequence_priorities(abs_td, weight, eta=0.9)
    torch.testing.assert_close(got, torch.tensor([0.9 * 3 + 0.1 * 2, 0.9 * 9 + 0.1 * 7]))


# ------------------------------------------------------------------ prioritized replay


def sequences(n: int, rows: int = 4, first_id: int = 0) -> Unrolls:
    """n one-float-per-row sequences whose observations carry their insertion number."""
    marker = np.arange(first_id, first_id + n, dtype=np.float32)
    return Unrolls(
        obs=np.repeat(marker[:, None, None], rows, axis=1),
        first=np.zeros((n, rows), bool),
        reward=np.zeros((n, rows), np.float32),
        terminated=np.zeros((n, rows), bool),
        truncated=np.zeros((n, rows), bool),
        action=np.zeros((n, rows), np.int64),
        policy_params=np.zeros((n, rows, 2), np.float32),
        core_state=(np.zeros((n, 3), np.float32),),
        acted_step=np.zeros((n, rows), np.int64),
    )


def replay(**kwargs) -> PrioritizedReplay:
    settings = dict(
        max_frames=10_000, max_bytes=1 << 30, min_frames=0, replay_ratio=0.0,
        new_frames_per_sequence=3, trained_frames_per_sequence=3, seed=7,
    )  # fmt: skip
    settings.update(kwargs)
    return PrioritizedReplay(**settings)  # type: ignore[arg-type]


def test_sampling_frequencies_follow_priority_to_the_alpha() -> None:
    store = replay()
    store.put(sequences(5))
    priority = np.array([0.5, 1.0, 2.0, 4.0, 0.25])
    store.feedback(np.arange(5), priority)
    draws = 40_000
    batch = store.get(draws, timeout=1.0)
    assert batch is not None
    freq = np.bincount(batch.sample_id, minlength=5) / draws
    expected = priority**0.9 / (priority**0.9).sum()
    np.testing.assert_allclose(freq, expected, atol=0.01)
    # The sampled rows are the stored sequences of those ids.
    np.testing.assert_array_equal(batch.obs[:, 0, 0], batch.sample_id.astype(np.float32))


def test_importance_weights_are_n_p_to_minus_beta_over_their_max() -> None:
    store = replay()
    store.put(sequences(4))
    priority = np.array([1.0, 3.0, 0.5, 2.0])
    store.feedback(np.arange(4), priority)
    batch = store.get(64, timeout=1.0)
    assert batch is not None and batch.sample_weight is not None
    prob = priority**0.9 / (priority**0.9).sum()
    raw = (4 * prob[batch.sample_id]) ** -0.6
    np.testing.assert_allclose(batch.sample_weight, raw / raw.max(), rtol=1e-6)


def test_new_sequences_enter_at_the_max_priority_seen() -> None:
    store = replay()
    store.put(sequences(2))
    store.feedback(np.array([0, 1]), np.array([5.0, 0.1]))
    store.put(sequences(1, first_id=2))
    assert store.metrics()["replay_priority_max"] == 5.0
    np.testing.assert_allclose(store._priority_C[:3], [5.0, 0.1, 5.0])


def test_capacity_bound_and_fifo_eviction_under_a_stream_of_inserts() -> None:
    rows = 4
    one = sequences(1, rows)
    per_sequence = sum(a.nbytes for a in (one.obs, one.first, one.reward, one.terminated,
                       one.truncated, one.action, one.policy_params, one.acted_step,
                       one.core_state[0]))  # fmt: skip
    store = replay(max_frames=10 * rows, max_bytes=7 * per_sequence)
    inserted = 0
    for n in [3, 1, 5, 2, 9, 4, 1]:
        store.put(sequences(n, rows, first_id=inserted))
        inserted += n
        assert len(store) == min(inserted, 7)
        assert store.stored_frames <= 10 * rows
        assert store.metrics()["replay_bytes"] <= 7 * per_sequence
    # The oldest went first: exactly the newest seven remain, each under its own id.
    held = sorted(store._ids_C.tolist())
    assert held == list(range(inserted - 7, inserted))
    stored_markers = store._ring.obs[:, 0, 0]  # type: ignore[union-attr]
    np.testing.assert_array_equal(stored_markers, store._ids_C.astype(np.float32))
    # Feedback for an evicted sequence changes nothing.
    before = store._priority_C.copy()
    store.feedback(np.array([0]), np.array([99.0]))
    np.testing.assert_array_equal(store._priority_C, before)


def test_min_fill_and_replay_ratio_gate_sampling() -> None:
    store = replay(min_frames=8, replay_ratio=2.0, new_frames_per_sequence=3)
    store.put(sequences(1))  # 4 stored frames < 8
    assert store.get(1, timeout=0.01) is None
    store.put(sequences(1, first_id=1))  # 8 stored; 6 inserted: 12 trained frames allowed
    assert store.get(4, timeout=0.01) is not None  # 4 x 3 = 12
    assert store.get(1, timeout=0.01) is None  # 15 > 12
    store.put(sequences(1, first_id=2))  # 9 inserted: 18 allowed
    assert store.get(2, timeout=0.01) is not None
    assert store.metrics()["replay_ratio"] == pytest.approx(2.0)


def test_inserts_wait_while_the_trainer_is_behind_the_replay_ratio() -> None:
    """Inserts may lead what the trainer sampled (at the ratio) by the lead, no more; a
    sample makes room and wakes a waiting insert. Each put inserts 3 frames; a sample of
    n sequences covers 3 n trained frames, that is 3 n / 2 inserted ones at ratio 2."""
    store = replay(min_frames=6, replay_ratio=2.0, insert_lead_frames=9)
    for i in range(4):  # leads before each put: 0, 3, 6, 9 (<= 9)
        assert store.put(sequences(1, first_id=i), timeout=0.01)
    assert not store.has_room()  # lead 12
    assert not store.put(sequences(1, first_id=4), timeout=0.01) and len(store) == 4
    assert store.get(2, timeout=0.01) is not None  # lead 12 - 6 / 2 = 9
    assert store.put(sequences(1, first_id=4), timeout=0.01)  # lead 12 again
    waiting = threading.Thread(target=store.put, args=(sequences(1, first_id=5), 10.0))
    waiting.start()
    waiting.join(0.2)
    assert waiting.is_alive() and len(store) == 5
    assert store.get(2, timeout=0.01) is not None  # lead 15 - 12 / 2 = 9: room
    waiting.join(2.0)
    assert not waiting.is_alive() and len(store) == 6
    store.close()  # a closed replay holds no insert back
    assert store.has_room()


def test_inserts_never_wait_without_a_lead_or_a_ratio() -> None:
    for store in (replay(replay_ratio=2.0), replay(replay_ratio=0.0, insert_lead_frames=3)):
        for i in range(20):
            assert store.put(sequences(1, first_id=i), timeout=0.01)
        assert len(store) == 20


def test_the_agent_sizes_the_insert_lead_from_the_fill_and_two_batches() -> None:
    """classic-r2d2: 2000 frames of fill; 16 sequences x 8 trained rows at ratio 8 are
    16 inserted frames a batch, two of them 32."""
    config = build_config(LearnerConfig, {}, load_preset("classic-r2d2"))
    space = discrete(2)
    agent = R2D2Agent(config, space, torch.device("cpu"))
    assert agent.make_store().insert_lead_frames == 2032
    free = dataclasses.replace(config, replay_hold_actors=False)
    assert R2D2Agent(free, space, torch.device("cpu")).make_store().insert_lead_frames is None


def test_sum_tree_finds_the_leaf_of_each_prefix_interval() -> None:
    tree = SumTree(5)
    tree.update(np.arange(5), np.array([1.0, 0.0, 2.0, 3.0, 0.5]))
    assert tree.total == pytest.approx(6.5)
    found = tree.find(np.array([0.0, 0.99, 1.0, 2.99, 3.0, 5.99, 6.0, 6.49]))
    np.testing.assert_array_equal(found, [0, 0, 2, 2, 3, 3, 4, 4])


# ------------------------------------------------------------------ exploration


def test_ape_x_epsilon_ladder_formula() -> None:
    got = ape_x_epsilons(0.4, 7.0, 8)
    for i in range(8):
        assert got[i] == pytest.approx(0.4 ** (1 + 7.0 * i / 7))
    assert got[0] == pytest.approx(0.4) and got[-1] == pytest.approx(0.4**8)
    np.testing.assert_allclose(ape_x_epsilons(0.4, 7.0, 1), [0.4])


def test_each_slot_explores_at_its_rung_and_is_greedy_otherwise() -> None:
    config = LearnerConfig(agent="r2d2", hidden_sizes=(8,), epsilon=0.9, epsilon_alpha=3.0,
                           epsilon_slots=4)  # fmt: skip
    agent = R2D2Agent(config, discrete(5), torch.device("cpu"))
    obs_space = pb.SpaceSpec(kind="box", shape=[3], dtype="float32")
    model = agent.build_model(obs_space, "mlp")
    policy = agent.inference_policy(model, 0)
    rows = 20_000
    slot_B = np.arange(rows) % 8  # slots 4..7 take rungs 0..3 again
    obs = np.zeros((rows, 3), np.float32)
    action, q, _ = policy(obs, np.zeros(rows, bool), (), slot_B)
    greedy = int(np.argmax(q[0]))
    for slot in range(8):
        rung = slot % 4
        eps = 0.9 ** (1 + 3.0 * rung / 3)
        off_greedy = np.mean(action[slot_B == slot] != greedy)
        # A random action is the greedy one a fifth of the time.
        assert off_greedy == pytest.approx(eps * 4 / 5, abs=0.03)


def test_by_default_the_ladder_spans_the_slots_handed_out_so_far() -> None:
    """One actor of 8 envs: the 8-rung ladder, 0.4 down to 0.4 ** 8. A second connects
    (slots 8..15): the ladder stretches to 16 rungs, the first actor's slots move up it,
    and a slot seen again later keeps the 16-rung rate (the span never shrinks)."""
    agent = R2D2Agent(LearnerConfig(agent="r2d2"), discrete(3), torch.device("cpu"))
    ladder = agent.epsilons
    first = np.arange(8)
    expected = [0.4 ** (1 + 7 * i / 7) for i in range(8)]
    np.testing.assert_allclose(ladder(first), expected)
    both = np.arange(16)
    expected = [0.4 ** (1 + 7 * i / 15) for i in range(16)]
    np.testing.assert_allclose(ladder(both), expected)
    np.testing.assert_allclose(ladder(np.array([3, 15])), [expected[3], 0.4**8])
    np.testing.assert_allclose(ladder(np.array([0])), [0.4])  # one slot: eps itself
    assert ladder(np.array([], np.int64)).shape == (0,)


# ------------------------------------------------------------------ sequences


def test_overlapping_sequences_share_rows_start_states_and_never_cross_an_unmasked_end() -> None:
    t, k, h = 6, 3, 2
    builder = TrajectoryBuilder(
        unroll_length=t, obs_shape=(1,), obs_dtype=np.float32, action_shape=(),
        action_dtype=np.int64, param_size=1, core_state_sizes=(h,), overlap=k,
    )  # fmt: skip
    slot = builder.allocate(1)
    done_at = {5: "term", 11: "trunc", 13: "term"}
    emitted: list[Unrolls] = []
    for i in range(30):
        ending = done_at.get(i)
        first = builder.first_flags(slot)
        before = (np.full((1, h), i, np.float32),)
        after = (np.full((1, h), i + 1, np.float32),)
        out, _ = builder.record(
            slot, np.array([[i]], np.float32), np.array([float(i)], np.float32),
            np.array([ending == "term"]), np.array([ending == "trunc"]), first,
            np.array([i]), np.zeros((1, 1), np.float32), before, after, 0,
        )  # fmt: skip
        if out is not None:
            emitted.append(out)
    starts = [int(u.obs[0, 0, 0]) for u in emitted]
    assert starts == [0, 3, 6, 9, 12, 15, 18, 21]  # stride T - k
    for u in emitted:
        frame = u.obs[0, :, 0].astype(int)
        np.testing.assert_array_equal(frame, np.arange(frame[0], frame[0] + t + 1))
        np.testing.assert_array_equal(u.core_state[0][0], np.full(h, frame[0]))  # state before
        done = u.terminated[0] | u.truncated[0]
        for row in np.flatnonzero(done[:-1]):
            assert u.first[0, row + 1]  # the next row starts an episode: the LSTM resets
        from learner.agents.r2d2.targets import valid_transitions

        valid = valid_transitions(torch.from_numpy(u.terminated.T), torch.from_numpy(u.truncated.T))
        np.testing.assert_array_equal(valid[:, 0].numpy(), ~done[:-1])


# ------------------------------------------------------------------ the loss


def r2d2_setup(burn_in: int = 3, length: int = 4):
    config = LearnerConfig(
        agent="r2d2", lstm=True, lstm_size=6, hidden_sizes=(8,), burn_in=burn_in,
        unroll_length=length, sequence_overlap=1, n_step=2, target_update_interval=3,
    )  # fmt: skip
    agent = R2D2Agent(config, discrete(3), torch.device("cpu"))
    obs_space = pb.SpaceSpec(kind="box", shape=[2], dtype="float32")
    torch.manual_seed(0)
    model = agent.build_model(obs_space, "mlp")
    rows, batch = burn_in + length + 1, 2
    rng = np.random.default_rng(1)
    unrolls = Unrolls(
        obs=rng.normal(size=(batch, rows, 2)).astype(np.float32),
        first=np.zeros((batch, rows), bool),
        reward=rng.normal(size=(batch, rows)).astype(np.float32),
        terminated=np.zeros((batch, rows), bool),
        truncated=np.zeros((batch, rows), bool),
        action=rng.integers(0, 3, size=(batch, rows)),
        policy_params=np.zeros((batch, rows, 3), np.float32),
        core_state=tuple(rng.normal(size=(batch, 6)).astype(np.float32) for _ in range(2)),
        acted_step=np.zeros((batch, rows), np.int64),
        sample_id=np.arange(batch),
        sample_weight=np.array([1.0, 0.5], np.float32),
    )
    data = to_time_major(unrolls, torch.device("cpu"))
    core = tuple(torch.from_numpy(s) for s in unrolls.core_state)
    return agent, agent.state_for(model), data, core


def test_burn_in_rows_get_no_gradient() -> None:
    agent, state, batch, core = r2d2_setup()
    batch["obs"] = batch["obs"].clone().requires_grad_(True)
    total, terms = agent.loss(state, batch, core, StepClock(0, 0.0))
    total.backward()
    grad = batch["obs"].grad
    assert grad is not None
    assert torch.count_nonzero(grad[:3]) == 0
    assert torch.count_nonzero(grad[3:-1]) > 0
    assert terms[SAMPLE_PRIORITY].shape == (2,)


def test_loss_weights_each_sequence_by_its_importance_weight() -> None:
    agent, state, batch, core = r2d2_setup()
    weighted, _ = agent.loss(state, batch, core, StepClock(0, 0.0))
    per_sequence = []
    for b in range(2):
        one = {
            k: (v[b : b + 1] if k == "sample_weight" else v[:, b : b + 1]) for k, v in batch.items()
        }
        one["sample_weight"] = torch.ones(1)
        loss_b, _ = agent.loss(state, one, tuple(s[b : b + 1] for s in core), StepClock(0, 0.0))
        per_sequence.append(loss_b)
    # Each sequence has `length` valid transitions: the batch loss is their weighted mean.
    expected = (1.0 * per_sequence[0] + 0.5 * per_sequence[1]) / 2
    torch.testing.assert_close(weighted, expected)


def test_target_network_refreshes_every_k_steps_and_survives_a_checkpoint() -> None:
    agent, state, batch, core = r2d2_setup()
    model, target = state.model, state.extras[TARGET_KEY]
    agent.loss(state, batch, core, StepClock(0, 0.0))
    assert target.network is not None
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    agent.loss(state, batch, core, StepClock(2, 0.0))  # 2 < 3: not yet
    stale = [p.clone() for p in target.network.parameters()]
    assert not torch.equal(stale[0], next(model.parameters()))
    saved = agent.state_dict(state)

    restored, state2, _, _ = r2d2_setup()
    with torch.no_grad():  # the resumed online weights are not the saved target's
        for p in state2.model.parameters():
            p.add_(2.0)
    online = [p.clone() for p in state2.model.parameters()]
    restored.load_state_dict(state2, {**saved, "model": state2.model.state_dict()})
    restored.target_network(state2, 2)
    target2 = state2.extras[TARGET_KEY]
    assert target2.network is not None and target2.step == 0
    for a, b in zip(target2.network.parameters(), stale, strict=True):
        torch.testing.assert_close(a, b)
    for a, b in zip(state2.model.parameters(), online, strict=True):
        torch.testing.assert_close(a, b)

    agent.loss(state, batch, core, StepClock(3, 0.0))  # due: copied from the online net
    for a, b in zip(target.network.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    assert target.step == 3


def test_r2d2_needs_discrete_actions() -> None:
    box = pb.SpaceSpec(kind="box", shape=[1], dtype="float32")
    with pytest.raises(ValueError, match="discrete"):
        R2D2Agent(LearnerConfig(agent="r2d2"), box, torch.device("cpu"))


def test_epsilon_greedy_policy_without_slots_uses_the_first_rung() -> None:
    config = LearnerConfig(agent="r2d2", hidden_sizes=(4,), epsilon=0.0)
    agent = R2D2Agent(config, discrete(3), torch.device("cpu"))
    obs_space = pb.SpaceSpec(kind="box", shape=[2], dtype="float32")
    model = agent.build_model(obs_space, "mlp")
    policy = agent.inference_policy(model, 0)
    assert isinstance(policy, EpsilonGreedyPolicy)
    obs = np.random.default_rng(0).normal(size=(50, 2)).astype(np.float32)
    action, q, _ = policy(obs, np.zeros(50, bool), ())
    np.testing.assert_array_equal(action, q.argmax(axis=1))


def held_by_age(store: PrioritizedReplay) -> tuple[np.ndarray, np.ndarray]:
    """(markers, priorities) of the stored sequences, oldest first."""
    size = len(store)
    order = np.argsort(store._ids_C[:size], kind="stable")
    markers = store._ring.obs[:size, 0, 0][order]  # type: ignore[union-attr]
    return markers, store._priority_C[:size][order]


def test_replay_round_trip_keeps_sequences_priorities_counters_and_the_tree(tmp_path) -> None:
    rows = 4
    store = replay(max_frames=7 * rows)
    for first_id, n in [(0, 5), (5, 4), (9, 3)]:  # 12 puts into 7 slots: the ring wrapped
        store.put(sequences(n, rows, first_id=first_id))
    store.feedback(store._ids_C.copy(), np.linspace(0.5, 3.5, 7))
    assert store.get(6, timeout=1.0) is not None
    markers, priority = held_by_age(store)
    assert markers.tolist() == list(range(5, 12))
    written = store.save(tmp_path / "replay.npz")
    assert written == (tmp_path / "replay.npz").stat().st_size > 7 * rows * 4

    resumed = replay(max_frames=7 * rows, seed=3)
    assert resumed.load(tmp_path / "replay.npz", sequences(1, rows)) == 7
    got_markers, got_priority = held_by_age(resumed)
    np.testing.assert_array_equal(got_markers, markers)
    np.testing.assert_array_equal(got_priority, priority)
    assert resumed.counters == store.counters
    assert resumed._max_priority == store._max_priority == 3.5
    # The sum tree is the one these priorities build, leaf by leaf and in every sum.
    fresh = SumTree(resumed.capacity)
    fresh.update(np.arange(7), resumed._priority_C**0.9)
    np.testing.assert_array_equal(resumed._tree.tree, fresh.tree)  # type: ignore[union-attr]
    # FIFO goes on: the next put evicts the oldest restored sequence (marker 5).
    resumed.put(sequences(1, rows, first_id=12))
    assert sorted(held_by_age(resumed)[0].tolist()) == list(range(6, 13))


def test_replay_restored_into_a_smaller_capacity_keeps_the_newest(tmp_path) -> None:
    store = replay(max_frames=6 * 4)
    store.put(sequences(6))
    store.feedback(np.arange(6), np.arange(1.0, 7.0))
    store.save(tmp_path / "replay.npz")
    smaller = replay(max_frames=4 * 4)
    assert smaller.load(tmp_path / "replay.npz", sequences(1)) == 4
    markers, priority = held_by_age(smaller)
    assert markers.tolist() == [2.0, 3.0, 4.0, 5.0]
    np.testing.assert_array_equal(priority, [3.0, 4.0, 5.0, 6.0])
    batch = smaller.get(2000, timeout=1.0)
    assert batch is not None and set(batch.obs[:, 0, 0].tolist()) == {2.0, 3.0, 4.0, 5.0}


def test_a_sequence_overwritten_while_the_replay_is_written_is_left_out(tmp_path, monkeypatch):
    from learner.agents.r2d2 import replay as replay_module

    store = replay(max_frames=5 * 4)
    store.put(sequences(5))
    write = replay_module._write_member
    calls = []

    def put_during_the_write(archive, name, array):
        if not calls:  # serving goes on while the ring is written: ids 5, 6 take slots 0, 1
            store.put(sequences(2, first_id=5))
        calls.append(name)
        write(archive, name, array)

    monkeypatch.setattr(replay_module, "_write_member", put_during_the_write)
    store.save(tmp_path / "replay.npz")
    resumed = replay(max_frames=5 * 4)
    assert resumed.load(tmp_path / "replay.npz", sequences(1)) == 3
    assert held_by_age(resumed)[0].tolist() == [2.0, 3.0, 4.0]


def test_a_replay_of_other_shapes_is_refused_with_its_reason(tmp_path) -> None:
    from learner.agents.base import SavedStoreError

    store = replay()
    store.put(sequences(3, rows=4))
    store.save(tmp_path / "replay.npz")
    shapes = r"obs is float32\[4, 1\], this run's is float32\[6, 1\]"
    with pytest.raises(SavedStoreError, match=shapes):
        replay().load(tmp_path / "replay.npz", sequences(1, rows=6))
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(SavedStoreError, match="unreadable replay"):
        replay().load(tmp_path / "bad.npz", sequences(1, rows=4))


def damaged_replay(path, case: str) -> None:
    """Rewrite the replay file at ``path`` with one kind of damage (or a crafted lie)."""
    with np.load(path) as saved:
        members = {name: saved[name] for name in saved.files}
    meta = json.loads(members["meta"].tobytes())
    if case == "short ring":
        members["ring.obs"] = members["ring.obs"][:-1]
    elif case == "short priorities":
        members["priority"] = members["priority"][:-1]
    elif case == "nan priority":
        members["priority"][1] = np.nan
    elif case == "negative priority":
        members["priority"][1] = -2.0
    elif case == "zero priorities":
        members["priority"][:] = 0.0
    elif case == "negative count":
        meta["counters"]["inserted_sequences"] = -5
    elif case == "counter as text":
        meta["counters"]["sampled_sequences"] = "12"
    elif case == "unknown counter":
        meta["counters"]["evicted"] = 3
    elif case == "missing counters":
        del meta["counters"]
    elif case == "meta a list":
        meta = [meta]
    elif case == "max priority text":
        meta["max_priority"] = "high"
    elif case == "nan max priority":
        meta["max_priority"] = float("nan")
    elif case == "id past the count":
        members["ids"][0] = 10_000
    elif case == "repeated id":
        members["ids"][1] = members["ids"][0]
    elif case == "float ids":
        members["ids"] = members["ids"].astype(np.float64)
    elif case == "missing key":
        del members["priority"]
    elif case == "truncated file":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        return
    members["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    path.unlink()
    np.savez(path, **members)


DAMAGE = [
    "short ring", "short priorities", "nan priority", "negative priority", "zero priorities",
    "negative count", "counter as text", "unknown counter", "missing counters", "meta a list",
    "max priority text", "nan max priority", "id past the count", "repeated id", "float ids",
    "missing key", "truncated file",
]  # fmt: skip


@pytest.mark.parametrize("case", DAMAGE)
def test_a_damaged_replay_file_is_unreadable_and_leaves_the_replay_empty_and_sound(
    tmp_path, case
) -> None:
    """A crafted or damaged file crashed the resume (IndexError, TypeError, ValueError
    from lengths and counters) or loaded a NaN priority that made the sum tree NaN."""
    from learner.agents.base import SavedStoreError

    store = replay()
    store.put(sequences(5))
    store.feedback(np.arange(5), np.arange(1.0, 6.0))
    path = tmp_path / "replay.npz"
    store.save(path)
    resumed = replay()
    assert resumed.load(path, sequences(1)) == 5  # the file as written loads
    damaged_replay(path, case)
    fresh = replay()
    with pytest.raises(SavedStoreError, match=r"unreadable replay|not a seedrl replay"):
        fresh.load(path, sequences(1))
    assert len(fresh) == 0 and fresh.counters == ReplayCounters()
    fresh.put(sequences(3))  # the run refills it as a fresh one would
    batch = fresh.get(4, timeout=1.0)
    assert batch is not None and np.isfinite(fresh._tree.total)  # type: ignore[union-attr]
    assert np.isfinite(batch.sample_weight).all()


def test_a_resumed_learner_with_a_damaged_replay_starts_from_an_empty_one(tmp_path, caplog):
    from support import random_unrolls, small_learner

    from learner.parts import build_learner, save_checkpoint

    settings = dict(agent="r2d2", burn_in=1, sequence_overlap=0, hidden_sizes=(8,))
    learner = small_learner(tmp_path, 3, 2, **settings)
    learner.queue.put(random_unrolls(6, 4, seed=1))
    save_checkpoint(learner)
    damaged_replay(learner.config.replay_path, "nan priority")
    resumed = build_learner(dataclasses.replace(learner.config, resume=True))
    assert len(resumed.queue) == 0
    assert "unreadable replay" in caplog.text and "starting with an empty replay" in caplog.text


# ------------------------------------------------------------------ on the trainer hosts


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_replay_trains_on_a_host_and_gets_its_priorities_back(tmp_path, mode) -> None:
    """The replay lives in the learner process; a thread or a child process samples from
    it, trains, and the new priorities come back to it."""
    from support import random_unrolls, small_learner, wait_until

    from learner.run import choose_host

    learner = small_learner(
        tmp_path, 4, 3, agent="r2d2", burn_in=2, sequence_overlap=1, replay_min_frames=0,
        replay_ratio=0.0, trainer=mode, lstm=True, lstm_size=8, hidden_sizes=(8,),
    )  # fmt: skip
    assert learner.builder.unroll_length == 6 and learner.builder.overlap == 1
    store = learner.queue
    assert isinstance(store, PrioritizedReplay)
    unrolls = random_unrolls(5, 6, seed=2)
    unrolls.core_state = tuple(np.zeros((5, 8), np.float32) for _ in range(2))
    store.put(unrolls)
    host = choose_host(learner)
    host.start()
    try:
        wait_until(lambda: learner.stats.learner_steps >= 3, 120.0, interval=0.05)
        wait_until(lambda: (store._priority_C[:5] != 1.0).any(), 30.0, interval=0.05)
    finally:
        host.stop()
    record = store.metrics()
    assert record["replay_sequences"] == 5 and record["replay_frames"] == 5 * 7
    state = host.training_state()
    assert state is not None and "r2d2_target" in state.agent_state


def test_the_schedules_clock_counts_a_replayed_frame_once(tmp_path) -> None:
    """A frame budget's linear rate must run over the frames the actors sent: at replay
    ratio 8 a batch of 3 sequences x 4 trained rows (12 frames) holds 12 / 8 = 1.5 new
    ones, so 10 steps are 15 frames on the clock, where V-trace's 10 steps of 12 fresh
    frames each, trained twice (updates per batch 2), are 60."""
    from support import small_learner

    from learner.parts import make_trainer

    r2d2 = small_learner(tmp_path / "r2d2", 4, 3, agent="r2d2", replay_ratio=8.0,
                         burn_in=1, sequence_overlap=1, hidden_sizes=(8,))  # fmt: skip
    assert make_trainer(r2d2).clock(10).frames == pytest.approx(15.0)
    vtrace = small_learner(tmp_path / "vtrace", 4, 3, updates_per_batch=2, hidden_sizes=(8,))
    assert make_trainer(vtrace).clock(10).frames == pytest.approx(60.0)


def test_a_resumed_learner_gets_back_the_target_network_from_its_checkpoint(tmp_path) -> None:
    from support import small_learner

    from learner.parts import build_learner, save_checkpoint

    settings = dict(agent="r2d2", burn_in=1, sequence_overlap=0, hidden_sizes=(8,))
    learner = small_learner(tmp_path, 3, 2, **settings)
    agent = learner.agent
    assert isinstance(agent, R2D2Agent)
    target = agent.target_network(learner.state, 0)
    with torch.no_grad():
        for p in target.parameters():
            p.mul_(-3.0)  # a target unlike the online weights
    learner.state.extras[TARGET_KEY].step = 7
    save_checkpoint(learner)

    resumed = build_learner(dataclasses.replace(learner.config, resume=True))
    saved = resumed.agent.state_dict(resumed.state)
    assert saved["r2d2_target_step"] == 7
    for name, value in target.state_dict().items():
        torch.testing.assert_close(saved["r2d2_target"][name], value)


def test_a_resumed_learner_samples_from_the_replay_its_checkpoint_kept(tmp_path) -> None:
    from support import random_unrolls, small_learner

    from learner.parts import build_learner, save_checkpoint

    settings = dict(agent="r2d2", burn_in=1, sequence_overlap=0, hidden_sizes=(8,))
    learner = small_learner(tmp_path, 3, 2, **settings)
    store = learner.queue
    store.put(random_unrolls(6, 4, seed=1))
    store.feedback(np.arange(6), np.arange(1.0, 7.0))
    save_checkpoint(learner)
    assert learner.config.replay_path.is_file()

    resumed = build_learner(dataclasses.replace(learner.config, resume=True))
    assert len(resumed.queue) == 6
    np.testing.assert_array_equal(resumed.queue._priority_C[:6], np.arange(1.0, 7.0))
    np.testing.assert_array_equal(resumed.queue._ring.obs[:6], store._ring.obs[:6])

    # A periodic checkpoint between replay writes leaves the last replay as it was.
    store.put(random_unrolls(2, 4, seed=2))
    save_checkpoint(learner, replay=False)
    assert len(build_learner(dataclasses.replace(learner.config, resume=True)).queue) == 6

    # Off: nothing written, and a resumed run starts from an empty replay.
    off = dataclasses.replace(learner.config, replay_checkpoint=False, resume=True)
    learner.config.replay_path.unlink()
    save_checkpoint(dataclasses.replace(learner, config=off))
    assert not off.replay_path.exists()
    assert len(build_learner(off).queue) == 0


def test_periodic_checkpoints_write_the_replay_once_per_its_interval() -> None:
    from learner.checkpointing import ReplayCadence

    cadence = ReplayCadence(600.0, start=100.0)
    assert [cadence.due(t) for t in (160.0, 699.0, 700.0)] == [False, False, True]
    cadence.written(760.0)  # the write is due from its own time, not the interval's grid
    assert [cadence.due(t) for t in (820.0, 1359.0, 1360.0)] == [False, False, True]
    every = ReplayCadence(0.0, start=100.0)
    assert every.due(100.0) and every.due(160.0)
