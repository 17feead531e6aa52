"""R2D2's loss pinned against a slow reference written from the paper (Kapturowski et al.
2019), one sequence and one frame at a time: which action's Q value is trained, which
transitions count, the n-step window, the double-Q argmax, value rescaling, what the
burn-in pass leaves in the recurrent state, importance weights and the priorities.

The reference steps the network one frame per call (the loss unrolls whole sequences), keeps
its own recurrent state, and sums in float64, so it shares no arithmetic with the code under
test beyond the network itself."""

from __future__ import annotations

import math

import numpy as np
import torch

from learner.agents.base import SAMPLE_PRIORITY
from learner.agents.r2d2.agent import TARGET_KEY, R2D2Agent
from learner.common.schedules import StepClock
from seedrl.config import LearnerConfig
from seedrl.proto import seedrl_pb2 as pb

BURN_IN, LENGTH, N_STEP, GAMMA, ETA, EPS = 3, 6, 3, 0.9, 0.9, 1e-3
ROWS, BATCH, ACTIONS = BURN_IN + LENGTH + 1, 3, 3


def h(x: float) -> float:
    return math.copysign(math.sqrt(abs(x) + 1.0) - 1.0, x) + EPS * x


def h_inverse(y: float) -> float:
    """Solves h(x) = y by bisection, not by the closed form the code uses."""
    low, high = -1e6, 1e6
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if h(mid) < y else (low, mid)
    return (low + high) / 2


def setup():
    config = LearnerConfig(
        agent="r2d2", lstm=True, lstm_size=5, hidden_sizes=(8,), burn_in=BURN_IN,
        unroll_length=LENGTH, sequence_overlap=1, n_step=N_STEP, discount=GAMMA,
        priority_eta=ETA, value_rescale_eps=EPS, target_update_interval=100,
    )  # fmt: skip
    agent = R2D2Agent(config, pb.SpaceSpec(kind="discrete", n=ACTIONS), torch.device("cpu"))
    torch.manual_seed(0)
    model = agent.build_model(pb.SpaceSpec(kind="box", shape=[2], dtype="float32"), "mlp")
    state = agent.state_for(model)
    agent.target_network(state, 0)  # the target is this copy until step 100
    with (
        torch.no_grad()
    ):  # the online net moves on: double Q now picks with one, values with the other
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))

    rng = np.random.default_rng(7)
    obs = rng.normal(size=(ROWS, BATCH, 2)).astype(np.float32)
    reward = rng.normal(size=(ROWS, BATCH)).astype(np.float32)
    terminated = np.zeros((ROWS, BATCH), bool)
    truncated = np.zeros((ROWS, BATCH), bool)
    first = np.zeros((ROWS, BATCH), bool)
    terminated[BURN_IN + 2, 0] = (
        True  # an end inside the trained rows: its transition to the reset is masked
    )
    truncated[BURN_IN + 4, 1] = True  # a truncation: bootstraps from its final observation
    terminated[1, 2] = True  # an end inside the burn-in
    for t, b in zip(*np.nonzero(terminated | truncated), strict=True):
        if t + 1 < ROWS:
            first[t + 1, b] = True
    batch = {
        "obs": torch.from_numpy(obs),
        "first": torch.from_numpy(first),
        "reward": torch.from_numpy(reward),
        "terminated": torch.from_numpy(terminated),
        "truncated": torch.from_numpy(truncated),
        "action": torch.from_numpy(rng.integers(0, ACTIONS, size=(ROWS, BATCH))),
        "sample_weight": torch.tensor([1.0, 0.25, 0.6]),
    }
    core = tuple(torch.from_numpy(rng.normal(size=(BATCH, 5)).astype(np.float32)) for _ in range(2))
    return agent, state, batch, core


def q_per_frame(net, batch, core, b: int) -> list[np.ndarray]:
    """Q values of every row of sequence ``b``, stepping ``net`` one frame per call from the
    stored start state (burn-in rows included: the state they leave is what counts)."""
    state = tuple(s[b : b + 1] for s in core)
    out = []
    with torch.no_grad():
        for t in range(ROWS):
            q, state = net.act(
                batch["obs"][t : t + 1, b : b + 1], batch["first"][t : t + 1, b : b + 1], state
            )
            out.append(q[0, 0].double().numpy())
    return out


def n_step_target(online, target, batch, t: int, b: int) -> float:
    """h(r_{t+1} + ... + gamma^(k-1) r_{t+k} + gamma^k h^-1(Q_target(s_{t+k}, argmax Q_online)))
    for the window that stops at an end, the n-th step or the last row; none past a
    termination."""
    reward = batch["reward"].double().numpy()
    term, trunc = batch["terminated"].numpy(), batch["truncated"].numpy()
    total = 0.0
    for k in range(1, N_STEP + 1):
        row = t + k
        total += GAMMA ** (k - 1) * reward[row, b]
        if term[row, b]:
            return h(total)
        if trunc[row, b] or k == N_STEP or row == ROWS - 1:
            greedy = int(np.argmax(online[row]))
            return h(total + GAMMA**k * h_inverse(target[row][greedy]))
    raise AssertionError("the window always stops")


def counted(batch) -> list[tuple[int, int]]:
    """(row, sequence) of every trained transition: after the burn-in, not from a final
    observation to its reset."""
    done = (batch["terminated"] | batch["truncated"]).numpy()
    return [(t, b) for b in range(BATCH) for t in range(BURN_IN, ROWS - 1) if not done[t, b]]


def reference(agent, state, batch, core) -> tuple[float, list[float], dict]:
    """(loss, per-sequence priorities, TD error per counted transition)."""
    model = state.model
    action = batch["action"].numpy()
    weights = batch["sample_weight"].double().numpy()
    online = [q_per_frame(model, batch, core, b) for b in range(BATCH)]
    target = [q_per_frame(state.extras[TARGET_KEY].network, batch, core, b) for b in range(BATCH)]
    tds = {}
    for t, b in counted(batch):
        tds[t, b] = n_step_target(online[b], target[b], batch, t, b) - online[b][t][action[t, b]]
    loss = sum(weights[b] * 0.5 * td * td for (_, b), td in tds.items()) / len(tds)
    priorities = []
    for b in range(BATCH):
        errors = [abs(td) for (_, s), td in tds.items() if s == b]
        priorities.append(ETA * max(errors) + (1 - ETA) * sum(errors) / len(errors))
    return loss, priorities, tds


def test_r2d2_loss_and_priorities_match_a_frame_by_frame_reference() -> None:
    agent, state, batch, core = setup()
    total, terms = agent.loss(state, batch, core, StepClock(1, 0.0))
    expected, priorities, _ = reference(agent, state, batch, core)
    assert math.isclose(float(total.detach()), expected, rel_tol=1e-4), (float(total), expected)
    np.testing.assert_allclose(terms[SAMPLE_PRIORITY].numpy(), priorities, rtol=1e-4)


def test_r2d2_loss_gradient_is_the_td_error_on_the_taken_action_only() -> None:
    """d loss / d Q(s_t, a) is -w_b td / count on the action taken at row t of a counted
    transition and 0 on every other Q value, read off the online network's output."""
    agent, state, batch, core = setup()
    model = state.model
    captured: list[torch.Tensor] = []
    original = model.act

    def act(obs, first, state):
        q, state = original(obs, first, state)
        if q.requires_grad:  # the trained pass, not the burn-in
            q.retain_grad()
            captured.append(q)
        return q, state

    model.act = act  # type: ignore[method-assign]
    total, _ = agent.loss(state, batch, core, StepClock(1, 0.0))
    total.backward()
    model.act = original  # type: ignore[method-assign]
    (q,) = captured
    _, _, tds = reference(agent, state, batch, core)
    action, weights = batch["action"].numpy(), batch["sample_weight"].double().numpy()
    expected = np.zeros(q.shape)
    for (t, b), td in tds.items():
        expected[t - BURN_IN, b, action[t, b]] = -weights[b] * td / len(tds)
    assert q.grad is not None
    np.testing.assert_allclose(q.grad.double().numpy(), expected, rtol=1e-4, atol=1e-7)
