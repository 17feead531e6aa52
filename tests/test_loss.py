"""The learner's loss against a slow reference written from the IMPALA paper.

Every number expected here is computed independently of ``learner.training.trainer``: V-trace
as the double sum of eq. 1, the policy gradient and entropy of a softmax in closed
form. The network is a table (policy logits and value read straight from the
observation, plus one learnable logit vector ``z`` and one learnable value offset
``u``), so each term's gradient has a closed form too.

Hand-built batch, rows ``0..T`` of two unrolls (row t: the frame, the reward and flags
that came with it, the action taken there):

* unroll 0 terminates at row 2; row 3 is the reset frame and carries a reward of 100
  that must not count (the done frame's own "transition" into it is not real);
* unroll 1 is truncated at row 3 with V(final) = 7 and V(reset) = -4 at row 4, so a
  target that bootstraps from the reset frame instead of the final one shows;
* both bootstrap from V(x_T) = 5 and the behaviour logits differ from the target's, so
  the importance weights straddle every threshold.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from learner.agents.base import UPDATE_LOGP
from learner.agents.models import action_head, build_model
from learner.agents.vtrace import targets as vtrace
from learner.agents.vtrace.agent import VTraceAgent
from learner.agents.vtrace.loss import update_kl
from learner.state.trajectories import Unrolls
from learner.training.trainer import Trainer, TrainerParts, to_time_major
from seedrl.config import LearnerConfig
from seedrl.proto import seedrl_pb2 as pb

T, B, A = 5, 2, 3
CPU = torch.device("cpu")


class TableModel(nn.Module):
    """params = obs[..., :A] + z, value = obs[..., A] + u: a network whose outputs are
    chosen by the test, with one policy and one value parameter to differentiate."""

    def __init__(self) -> None:
        super().__init__()
        self.z = nn.Parameter(torch.zeros(A))
        self.u = nn.Parameter(torch.zeros(()))

    def forward(self, obs_TBO, first_TB, core_state=()):
        return obs_TBO[..., :A] + self.z, obs_TBO[..., A] + self.u, core_state

    def bound_log_std_(self) -> None:
        pass


def hand_batch() -> Unrolls:
    rng = np.random.default_rng(7)
    rows = T + 1
    logits = rng.normal(0.0, 1.0, (B, rows, A))
    values = rng.normal(0.0, 2.0, (B, rows))
    values[:, T] = 5.0  # V(x_T), the bootstrap
    values[1, 3], values[1, 4] = 7.0, -4.0  # V(final) of the truncated episode, V(reset)
    reward = rng.normal(0.0, 1.0, (B, rows))
    first = np.zeros((B, rows), bool)
    terminated = np.zeros((B, rows), bool)
    truncated = np.zeros((B, rows), bool)
    terminated[0, 2], first[0, 3], reward[0, 3] = True, True, 100.0
    truncated[1, 3], first[1, 4], reward[1, 4] = True, True, -50.0
    behaviour = logits + rng.normal(0.0, 1.0, logits.shape)
    return Unrolls(
        obs=np.concatenate([logits, values[..., None]], -1).astype(np.float32),
        first=first,
        reward=reward.astype(np.float32),
        terminated=terminated,
        truncated=truncated,
        action=rng.integers(0, A, (B, rows)),
        policy_params=behaviour.astype(np.float32),
        core_state=(),
        acted_step=np.zeros((B, rows), np.int64),
    )


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    return x - x.max() - np.log(np.exp(x - x.max()).sum())


def reference(u: Unrolls, cfg: LearnerConfig) -> dict[str, np.ndarray | float]:
    """V-trace targets, advantages and the loss terms, slowly, from the paper.

    Transition t of an unroll goes from row t to row t+1: action a_t, reward r_{t+1}
    (the outcome of a_t), discount 0 only when row t+1 terminated. A transition that
    starts on a done frame is not real: importance weight 0, no loss weight.
    """
    logits = u.obs[..., :A].astype(np.float64)
    values = u.obs[..., A].astype(np.float64)
    vs = np.zeros((B, T))
    adv = np.zeros((B, T))
    q_minus_v = np.zeros((B, T))  # the advantage without the importance weight
    ratio = np.zeros((B, T))  # pi / mu of the action taken (0 where not valid)
    valid = np.zeros((B, T), bool)
    logpi = np.zeros((B, T))
    ent = np.zeros((B, T))
    for n in range(B):
        r, gamma, rho = np.zeros(T), np.zeros(T), np.zeros(T)
        for t in range(T):
            valid[n, t] = not (u.terminated[n, t] or u.truncated[n, t])
            reward = cfg.reward_scale * float(u.reward[n, t + 1])
            if cfg.reward_clip is not None:
                reward = min(max(reward, -cfg.reward_clip), cfg.reward_clip)
            r[t] = reward
            gamma[t] = 0.0 if u.terminated[n, t + 1] else cfg.discount
            lp = log_softmax(logits[n, t])
            logpi[n, t] = lp[u.action[n, t]]
            ent[n, t] = -(np.exp(lp) * lp).sum()
            mu = log_softmax(u.policy_params[n, t])[u.action[n, t]]
            rho[t] = np.exp(logpi[n, t] - mu) if valid[n, t] else 0.0
        rho_bar = np.minimum(cfg.clip_rho_threshold, rho)
        c = cfg.lambda_ * np.minimum(1.0, rho)
        v = values[n]  # v[T] is V(x_T)
        for s in range(T):
            total = v[s]
            for t in range(s, T):
                prod = 1.0
                for i in range(s, t):
                    prod *= gamma[i] * c[i]
                total += prod * rho_bar[t] * (r[t] + gamma[t] * v[t + 1] - v[t])
            vs[n, s] = total
        for s in range(T):
            v_next = vs[n, s + 1] if s + 1 < T else v[T]
            q_minus_v[n, s] = r[s] + gamma[s] * v_next - v[s]
            adv[n, s] = min(cfg.clip_pg_rho_threshold, rho[s]) * q_minus_v[n, s]
            ratio[n, s] = rho[s]
    count = valid.sum()
    pg = adv.copy() if cfg.policy_clip is None else q_minus_v.copy()
    if cfg.normalize_advantages:
        mean = pg[valid].mean()
        pg = (pg - mean) / (pg[valid].std() + 1e-8)
    if cfg.policy_clip is None:
        policy = -(logpi * pg)[valid].sum() / count
    else:  # PPO's surrogate, one transition at a time
        eps, surrogate = cfg.policy_clip, []
        for n, s in zip(*np.nonzero(valid), strict=True):
            clipped = min(max(ratio[n, s], 1.0 - eps), 1.0 + eps)
            surrogate.append(min(ratio[n, s] * pg[n, s], clipped * pg[n, s]))
        policy = -sum(surrogate) / count
    baseline = 0.5 * np.square(vs - values[:, :T])[valid].sum() / count
    entropy = ent[valid].sum() / count
    total = policy + cfg.baseline_cost * baseline - cfg.entropy_cost * entropy
    return {
        "vs": vs,
        "pg_advantages": adv,
        "advantage": pg,
        "ratio": ratio,
        "valid": valid,
        "loss_policy": policy,
        "loss_baseline": baseline,
        "entropy": entropy,
        "loss_total": total,
    }


def _agent(config: LearnerConfig, num_actions: int) -> VTraceAgent:
    """The V-trace agent for ``num_actions`` discrete actions, on the CPU."""
    return VTraceAgent(config, pb.SpaceSpec(kind="discrete", n=num_actions), CPU)


def table_trainer(**overrides) -> Trainer:
    """A trainer of the table model on raw rewards, the paper's arithmetic."""
    fields = {"normalize_returns": False, **overrides}
    config = LearnerConfig(unroll_length=T, batch_size=B, max_queue_unrolls=B, **fields)
    model = TableModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    agent = _agent(config, A)
    return Trainer(TrainerParts.unshared(config, agent, agent.state_for(model, optimizer), CPU))  # type: ignore[arg-type]


def run_loss(trainer: Trainer, unrolls: Unrolls, monkeypatch) -> tuple[torch.Tensor, dict]:
    """The trainer's total loss and its parts, plus the V-trace outputs it used."""
    seen: dict[str, torch.Tensor] = {}
    real = vtrace.from_importance_weights

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        out = real(*args, **kwargs)
        seen["vs"], seen["pg_advantages"] = out.vs, out.pg_advantages
        return out

    monkeypatch.setattr(vtrace, "from_importance_weights", spy)
    total, parts = trainer.loss(to_time_major(unrolls, CPU), ())
    monkeypatch.undo()
    got = {k: float(v) for k, v in parts.items() if k != UPDATE_LOGP}  # per frame, for the bound
    got["vs"] = seen["vs"].T.double().numpy()  # back to batch-major [B, T]
    got["pg_advantages"] = seen["pg_advantages"].T.double().numpy()
    return total, got


CONFIGS = {
    "defaults": {},
    "thresholds and lambda": {
        "clip_rho_threshold": 0.6, "clip_pg_rho_threshold": 1.7, "lambda_": 0.5, "discount": 0.9
    },
    "reward scale and clip": {"reward_scale": 3.0, "reward_clip": 0.5},
    "normalized advantages": {"normalize_advantages": True},
    "costs": {"entropy_cost": 0.1, "baseline_cost": 0.25},
    "policy clip": {"policy_clip": 0.2, "lambda_": 0.5},
    "policy clip, normalized advantages": {"policy_clip": 0.3, "normalize_advantages": True},
}  # fmt: skip


@pytest.mark.parametrize("overrides", CONFIGS.values(), ids=list(CONFIGS))
def test_loss_and_vtrace_targets_match_the_paper(overrides, monkeypatch):
    """Targets, advantages and every loss term equal the slow reference: rows aligned,
    importance weights, thresholds, lambda, bootstrap, discounts, masking, reward
    scaling and clipping, advantage normalisation over valid steps only."""
    trainer = table_trainer(**overrides)
    unrolls = hand_batch()
    _, got = run_loss(trainer, unrolls, monkeypatch)
    want = reference(unrolls, trainer.config)
    np.testing.assert_allclose(got["vs"], want["vs"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["pg_advantages"], want["pg_advantages"], rtol=1e-5, atol=1e-5)
    for key in ("loss_policy", "loss_baseline", "entropy", "loss_total"):
        assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), key


def test_the_reference_batch_exercises_what_it_claims():
    """Guards the fixture: rhos on both sides of every threshold, a masked transition in
    each unroll, and a truncated target that depends on V(final), not V(reset)."""
    unrolls = hand_batch()
    cfg = LearnerConfig(unroll_length=T, batch_size=B, max_queue_unrolls=B)
    want = reference(unrolls, cfg)
    logits = unrolls.obs[..., :A]
    rhos = [
        np.exp(
            log_softmax(logits[n, t])[unrolls.action[n, t]]
            - log_softmax(unrolls.policy_params[n, t])[unrolls.action[n, t]]
        )
        for n in range(B)
        for t in range(T)
        if want["valid"][n, t]
    ]
    assert min(rhos) < 0.6 and max(rhos) > 1.7
    assert want["valid"].sum(axis=1).tolist() == [T - 1, T - 1]
    moved = dataclasses.replace(unrolls, obs=unrolls.obs.copy())
    moved.obs[1, 3, A] += 1.0  # V(final) of the truncated episode
    assert reference(moved, cfg)["vs"][1, 2] != pytest.approx(want["vs"][1, 2])


def _grads(trainer: Trainer, unrolls: Unrolls, monkeypatch) -> tuple[np.ndarray, float]:
    trainer.model.zero_grad()
    total, _ = run_loss(trainer, unrolls, monkeypatch)
    total.backward()
    model = trainer.model
    return model.z.grad.double().numpy().copy(), float(model.u.grad)  # type: ignore[union-attr]


def test_policy_term_moves_log_pi_along_the_advantage_and_never_reaches_the_value(monkeypatch):
    """Policy term alone: d/dz = -(1/n) sum_t A_t (onehot(a_t) - pi_t); d/du = 0."""
    trainer = table_trainer(baseline_cost=0.0, entropy_cost=0.0)
    unrolls = hand_batch()
    grad_z, grad_u = _grads(trainer, unrolls, monkeypatch)
    want = reference(unrolls, trainer.config)
    expected = np.zeros(A)
    for n in range(B):
        for t in range(T):
            if want["valid"][n, t]:
                pi = np.exp(log_softmax(unrolls.obs[n, t, :A]))
                onehot = np.eye(A)[unrolls.action[n, t]]
                expected -= want["pg_advantages"][n, t] * (onehot - pi)
    expected /= want["valid"].sum()
    np.testing.assert_allclose(grad_z, expected, rtol=1e-5, atol=1e-6)
    assert grad_u == 0.0


@pytest.mark.parametrize("normalize", [False, True])
def test_a_clipped_ratio_stops_pulling_only_in_the_advantages_favour(monkeypatch, normalize):
    """--policy-clip: d/dz = -(1/n) sum_t A_t rho_t (onehot(a_t) - pi_t) over the
    transitions whose ratio has not passed the clip in the direction A_t pushes it (rho
    above 1 + eps with A > 0, below 1 - eps with A < 0): those give no gradient."""
    eps = 0.2
    trainer = table_trainer(
        baseline_cost=0.0, entropy_cost=0.0, policy_clip=eps, normalize_advantages=normalize
    )
    unrolls = hand_batch()
    grad_z, grad_u = _grads(trainer, unrolls, monkeypatch)
    want = reference(unrolls, trainer.config)
    expected, stopped = np.zeros(A), 0
    for n in range(B):
        for t in range(T):
            if not want["valid"][n, t]:
                continue
            rho, adv = want["ratio"][n, t], want["advantage"][n, t]
            if (rho > 1 + eps and adv > 0) or (rho < 1 - eps and adv < 0):
                stopped += 1
                continue
            pi = np.exp(log_softmax(unrolls.obs[n, t, :A]))
            expected -= adv * rho * (np.eye(A)[unrolls.action[n, t]] - pi)
    expected /= want["valid"].sum()
    assert 0 < stopped < want["valid"].sum()  # the batch has both kinds
    np.testing.assert_allclose(grad_z, expected, rtol=1e-5, atol=1e-6)
    assert grad_u == 0.0


def test_baseline_term_moves_v_toward_the_constant_vtrace_target(monkeypatch):
    """Baseline term alone (the difference of two costs): d/du = c_b (1/n) sum_t (V_t - v_t),
    with v_t a constant (no gradient through the targets); d/dz = 0."""
    unrolls = hand_batch()
    with_b = _grads(table_trainer(baseline_cost=0.5, entropy_cost=0.0), unrolls, monkeypatch)
    without = _grads(table_trainer(baseline_cost=0.0, entropy_cost=0.0), unrolls, monkeypatch)
    want = reference(unrolls, LearnerConfig(unroll_length=T, batch_size=B, max_queue_unrolls=B))
    valid = want["valid"]
    v = unrolls.obs[:, :T, A].astype(np.float64)
    expected_u = 0.5 * (v - want["vs"])[valid].sum() / valid.sum()
    assert with_b[1] - without[1] == pytest.approx(expected_u, rel=1e-5)
    np.testing.assert_allclose(with_b[0] - without[0], 0.0, atol=1e-7)


def test_entropy_term_raises_entropy_and_never_reaches_the_value(monkeypatch):
    """Entropy term alone: d/dz = -c_e (1/n) sum_t dH_t/dz, dH/dz_j = -pi_j (log pi_j + H)."""
    unrolls = hand_batch()
    with_e = _grads(table_trainer(baseline_cost=0.0, entropy_cost=0.1), unrolls, monkeypatch)
    without = _grads(table_trainer(baseline_cost=0.0, entropy_cost=0.0), unrolls, monkeypatch)
    valid = reference(unrolls, LearnerConfig(unroll_length=T, batch_size=B, max_queue_unrolls=B))[
        "valid"
    ]
    dh = np.zeros(A)
    for n in range(B):
        for t in range(T):
            if valid[n, t]:
                lp = log_softmax(unrolls.obs[n, t, :A])
                pi = np.exp(lp)
                dh += -pi * (lp + -(pi * lp).sum())
    expected = -0.1 * dh / valid.sum()
    np.testing.assert_allclose(with_e[0] - without[0], expected, rtol=1e-4, atol=1e-7)
    assert with_e[1] - without[1] == 0.0
    assert float(np.dot(expected, dh)) < 0  # a descent step along -grad raises entropy


def test_only_the_baseline_term_reaches_the_real_value_head():
    """On the real model: the policy and entropy terms leave the value MLP and head without
    gradient; the baseline term reaches them (and nothing of the policy's own)."""
    torch.manual_seed(0)
    head = action_head(pb.SpaceSpec(kind="discrete", n=2))
    model = build_model(pb.SpaceSpec(kind="box", shape=[4], dtype="float32"), head, "mlp", (8,))
    from support import random_unrolls

    unrolls = random_unrolls(B, T, seed=4)
    value_params = {id(p) for m in (model.baseline, model.value_torso) for p in m.parameters()}  # type: ignore[union-attr]

    def grads(**costs) -> dict[int, torch.Tensor]:
        config = LearnerConfig(unroll_length=T, batch_size=B, max_queue_unrolls=B, **costs)
        agent = _agent(config, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        trainer = Trainer(
            TrainerParts.unshared(config, agent, agent.state_for(model, optimizer), CPU)
        )
        trainer.grads.zero()
        total, _ = trainer.loss(to_time_major(unrolls, CPU), ())
        total.backward()
        return {id(p): p.grad.clone() for p in model.parameters()}  # type: ignore[union-attr]

    policy_only = grads(baseline_cost=0.0, entropy_cost=0.0)
    entropy_only = {
        k: v - policy_only[k] for k, v in grads(baseline_cost=0.0, entropy_cost=1.0).items()
    }
    baseline_only = {
        k: v - policy_only[k] for k, v in grads(baseline_cost=1.0, entropy_cost=0.0).items()
    }
    for pid in value_params:
        assert not policy_only[pid].any() and not entropy_only[pid].any()
    assert any(baseline_only[pid].abs().sum() > 0 for pid in value_params)
    for pid, g in baseline_only.items():
        if pid not in value_params:
            assert g.abs().max() < 1e-7


@pytest.mark.parametrize("family", ["categorical", "gaussian"])
def test_update_kl_estimates_the_kl_divergence_from_actions_of_the_first_policy(family):
    """The step bound's measure, from log-probabilities of sampled actions alone, against
    the closed-form KL of ``torch.distributions``; a weight of 0 drops a row."""
    gen = torch.Generator().manual_seed(0)
    if family == "categorical":
        before = torch.distributions.Categorical(logits=torch.tensor([0.3, -0.2, 1.1, 0.0]))
        after = torch.distributions.Categorical(logits=torch.tensor([0.5, -0.4, 0.9, 0.2]))
    else:
        before = torch.distributions.Normal(torch.tensor(0.1), torch.tensor(0.8))
        after = torch.distributions.Normal(torch.tensor(0.25), torch.tensor(0.7))
    torch.manual_seed(0)
    actions = before.sample((400, 500))
    before_logp, after_logp = before.log_prob(actions), after.log_prob(actions)
    want = float(torch.distributions.kl_divergence(before, after))
    weight = torch.ones_like(before_logp)
    got = float(update_kl(before_logp, after_logp, weight))
    assert got == pytest.approx(want, rel=0.03)
    # Rows of weight 0 are not counted: junk there changes nothing.
    junk = torch.rand(before_logp.shape, generator=gen) * 50
    padded = float(
        update_kl(
            torch.cat([before_logp, junk]),
            torch.cat([after_logp, -junk]),
            torch.cat([weight, torch.zeros_like(weight)]),
        )
    )
    assert padded == pytest.approx(got, rel=1e-9)
    assert float(update_kl(before_logp, before_logp, weight)) == 0.0
