"""Tests for learner.agents.vtrace.targets against a slow numpy ground truth from the paper."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from learner.agents.vtrace import targets as vtrace


def _ground_truth(
    log_rhos: np.ndarray,
    discounts: np.ndarray,
    rewards: np.ndarray,
    values: np.ndarray,
    bootstrap_value: np.ndarray,
    clip_rho_threshold: float | None,
    clip_pg_rho_threshold: float | None,
    lambda_: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Deliberately slow V-trace straight from eq. 1 of the paper (explicit sums and products).

    v_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) delta_t V
    delta_t V = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t)), V(x_T) = bootstrap_value.
    """
    rhos = np.exp(log_rhos)
    rho_bar = rhos if clip_rho_threshold is None else np.minimum(clip_rho_threshold, rhos)
    pg_rho = rhos if clip_pg_rho_threshold is None else np.minimum(clip_pg_rho_threshold, rhos)
    cs = lambda_ * np.minimum(1.0, rhos)
    n = values.shape[0]

    def value_at(t: int) -> np.ndarray:
        return values[t] if t < n else bootstrap_value

    vs = np.zeros_like(values)
    for s in range(n):
        v_s = values[s].copy()
        for t in range(s, n):
            prod = np.ones_like(values[s])
            for i in range(s, t):
                prod = prod * discounts[i] * cs[i]
            delta_t = rho_bar[t] * (rewards[t] + discounts[t] * value_at(t + 1) - values[t])
            v_s = v_s + prod * delta_t
        vs[s] = v_s

    pg_advantages = np.zeros_like(values)
    for s in range(n):
        v_next = vs[s + 1] if s + 1 < n else bootstrap_value
        pg_advantages[s] = pg_rho[s] * (rewards[s] + discounts[s] * v_next - values[s])
    return vs, pg_advantages


def _random_inputs(
    rng: np.random.Generator, shape: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Random float64 inputs; log_rhos straddle the clip thresholds, discounts contain zeros."""
    log_rhos = rng.normal(0.0, 1.0, size=shape)
    discounts = 0.95 * (rng.uniform(size=shape) > 0.25)
    discounts[1, 0] = 0.0  # Guarantee at least one termination.
    rewards = rng.normal(0.0, 1.0, size=shape)
    values = rng.normal(0.0, 1.0, size=shape)
    bootstrap_value = rng.normal(0.0, 1.0, size=shape[1:])
    return log_rhos, discounts, rewards, values, bootstrap_value


def _run(
    log_rhos: np.ndarray,
    discounts: np.ndarray,
    rewards: np.ndarray,
    values: np.ndarray,
    bootstrap_value: np.ndarray,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    lambda_: float = 1.0,
) -> vtrace.VTraceReturns:
    def t(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64))

    return vtrace.from_importance_weights(
        t(log_rhos),
        t(discounts),
        t(rewards),
        t(values),
        t(bootstrap_value),
        clip_rho_threshold=clip_rho_threshold,
        clip_pg_rho_threshold=clip_pg_rho_threshold,
        lambda_=lambda_,
    )


@pytest.mark.parametrize("clip_rho_threshold", [1.0, 0.5, 2.0, None])
@pytest.mark.parametrize("clip_pg_rho_threshold", [1.0, 0.5, 2.0, None])
@pytest.mark.parametrize("lambda_", [1.0, 0.9, 0.5])
def test_matches_ground_truth(
    clip_rho_threshold: float | None, clip_pg_rho_threshold: float | None, lambda_: float
) -> None:
    rng = np.random.default_rng(0)
    inputs = _random_inputs(rng, (7, 4))
    out = _run(
        *inputs,
        clip_rho_threshold=clip_rho_threshold,
        clip_pg_rho_threshold=clip_pg_rho_threshold,
        lambda_=lambda_,
    )
    vs, pg = _ground_truth(*inputs, clip_rho_threshold, clip_pg_rho_threshold, lambda_)
    np.testing.assert_allclose(out.vs.numpy(), vs, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out.pg_advantages.numpy(), pg, rtol=1e-12, atol=1e-12)


def _random_single_step(
    rng: np.random.Generator, shape: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    return (
        rng.normal(size=shape),
        np.full(shape, 0.9),
        rng.normal(size=shape),
        rng.normal(size=shape),
        rng.normal(size=shape[1:]),
    )


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("shape", [(5, 1), (1, 3), (6, 3, 2), (5, 3, 2, 2)])
def test_shapes_match_ground_truth(seed: int, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(seed)
    inputs = _random_inputs(rng, shape) if shape[0] > 1 else _random_single_step(rng, shape)
    out = _run(*inputs, clip_rho_threshold=1.0, clip_pg_rho_threshold=1.0, lambda_=0.9)
    assert out.vs.shape == shape
    assert out.pg_advantages.shape == shape
    vs, pg = _ground_truth(*inputs, 1.0, 1.0, 0.9)
    np.testing.assert_allclose(out.vs.numpy(), vs, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out.pg_advantages.numpy(), pg, rtol=1e-12, atol=1e-12)


def test_broadcast_trailing_dims() -> None:
    """log_rhos/discounts with a size-1 trailing dim broadcast against values' trailing dim."""
    rng = np.random.default_rng(3)
    log_rhos, discounts, rewards, values, bootstrap_value = _random_inputs(rng, (6, 3, 2))
    log_rhos_1 = log_rhos[..., :1]
    discounts_1 = discounts[..., :1]
    out = _run(log_rhos_1, discounts_1, rewards, values, bootstrap_value)
    vs, pg = _ground_truth(
        np.broadcast_to(log_rhos_1, values.shape),
        np.broadcast_to(discounts_1, values.shape),
        rewards,
        values,
        bootstrap_value,
        1.0,
        1.0,
        1.0,
    )
    assert out.vs.shape == values.shape
    np.testing.assert_allclose(out.vs.numpy(), vs, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out.pg_advantages.numpy(), pg, rtol=1e-12, atol=1e-12)


def test_on_policy_hand_computed() -> None:
    """log_rhos = 0, lambda = 1: vs is the n-step discounted return with bootstrap."""
    # Column 0: no termination. Column 1: episode ends after step 1 (discount 0).
    rewards = np.array([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    discounts = np.array([[0.9, 0.9], [0.9, 0.0], [0.9, 0.9]])
    values = np.array([[0.5, 0.5], [1.0, 1.0], [1.5, 1.5]])
    bootstrap_value = np.array([10.0, 10.0])
    log_rhos = np.zeros_like(rewards)
    out = _run(log_rhos, discounts, rewards, values, bootstrap_value, lambda_=1.0)

    # Column 0: vs_2 = 3 + 0.9 * 10 = 12; vs_1 = 2 + 0.9 * 12 = 12.8; vs_0 = 1 + 0.9 * 12.8.
    # Column 1: vs_2 = 12; vs_1 = 2 + 0 * 12 = 2; vs_0 = 1 + 0.9 * 2 = 2.8.
    expected_vs = np.array([[12.52, 2.8], [12.8, 2.0], [12.0, 12.0]])
    # pg_t = r_t + gamma_t * vs_{t+1} - V_t.
    # Column 0: 1 + 0.9 * 12.8 - 0.5 = 12.02; 2 + 0.9 * 12 - 1 = 11.8; 3 + 9 - 1.5 = 10.5.
    # Column 1: 1 + 0.9 * 2 - 0.5 = 2.3; 2 + 0 - 1 = 1; 10.5.
    expected_pg = np.array([[12.02, 2.3], [11.8, 1.0], [10.5, 10.5]])
    np.testing.assert_allclose(out.vs.numpy(), expected_vs, rtol=1e-12)
    np.testing.assert_allclose(out.pg_advantages.numpy(), expected_pg, rtol=1e-12)


def test_on_policy_equals_discounted_return() -> None:
    rng = np.random.default_rng(7)
    _, discounts, rewards, values, bootstrap_value = _random_inputs(rng, (8, 3))
    out = _run(np.zeros_like(rewards), discounts, rewards, values, bootstrap_value)
    expected = np.zeros_like(rewards)
    ret = bootstrap_value.copy()
    for t in reversed(range(rewards.shape[0])):
        ret = rewards[t] + discounts[t] * ret
        expected[t] = ret
    np.testing.assert_allclose(out.vs.numpy(), expected, rtol=1e-12, atol=1e-12)
    # With rho = 1 everywhere, pg_advantages is the one-step TD error on the targets.
    next_vs = np.concatenate([expected[1:], bootstrap_value[None]])
    np.testing.assert_allclose(
        out.pg_advantages.numpy(),
        rewards + discounts * next_vs - values,
        rtol=1e-12,
        atol=1e-12,
    )


@pytest.mark.parametrize("clip_rho_threshold", [1.0, None])
@pytest.mark.parametrize("lambda_", [1.0, 0.5])
def test_neg_inf_log_rhos_mask_steps(clip_rho_threshold: float | None, lambda_: float) -> None:
    rng = np.random.default_rng(11)
    log_rhos, discounts, rewards, values, bootstrap_value = _random_inputs(rng, (6, 3))
    discounts[:] = 0.9  # No terminations, so any cut in the trace comes from the mask.
    masked = [(2, 0), (5, 1), (0, 2), (3, 2), (4, 2)]
    for t, b in masked:
        log_rhos[t, b] = -math.inf
    out = _run(
        log_rhos,
        discounts,
        rewards,
        values,
        bootstrap_value,
        clip_rho_threshold=clip_rho_threshold,
        lambda_=lambda_,
    )
    vs = out.vs.numpy()
    pg = out.pg_advantages.numpy()
    assert np.all(np.isfinite(vs))
    assert np.all(np.isfinite(pg))

    # rho_t = 0 gives both delta_t = 0 and c_t = 0, so acc_t = 0: vs_t equals V(x_t) exactly,
    # whatever the following step's correction is, and the policy gradient weight is 0.
    for t, b in masked:
        assert vs[t, b] == values[t, b]
        assert pg[t, b] == 0.0

    # The trace is also cut for the step before a masked step: its correction is only its own
    # delta, since c_{t+1} * acc_{t+1} contributes nothing beyond the masked step.
    rho_1 = np.exp(log_rhos[1, 0])
    rho_bar_1 = rho_1 if clip_rho_threshold is None else min(clip_rho_threshold, rho_1)
    delta_1 = rho_bar_1 * (rewards[1, 0] + 0.9 * values[2, 0] - values[1, 0])
    np.testing.assert_allclose(vs[1, 0], values[1, 0] + delta_1, rtol=1e-12)

    ref_vs, ref_pg = _ground_truth(
        log_rhos, discounts, rewards, values, bootstrap_value, clip_rho_threshold, 1.0, lambda_
    )
    np.testing.assert_allclose(vs, ref_vs, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(pg, ref_pg, rtol=1e-12, atol=1e-12)


def test_all_masked_gives_values_and_zero_advantages() -> None:
    rng = np.random.default_rng(5)
    _, discounts, rewards, values, bootstrap_value = _random_inputs(rng, (5, 3))
    log_rhos = np.full_like(values, -math.inf)
    out = _run(log_rhos, discounts, rewards, values, bootstrap_value, clip_rho_threshold=None)
    np.testing.assert_array_equal(out.vs.numpy(), values)
    np.testing.assert_array_equal(out.pg_advantages.numpy(), np.zeros_like(values))


def test_outputs_do_not_require_grad() -> None:
    torch.manual_seed(0)
    shape = (5, 3)
    log_rhos = torch.randn(shape, requires_grad=True)
    discounts = torch.full(shape, 0.9, requires_grad=True)
    rewards = torch.randn(shape, requires_grad=True)
    values = torch.randn(shape, requires_grad=True)
    bootstrap_value = torch.randn(shape[1:], requires_grad=True)
    out = vtrace.from_importance_weights(log_rhos, discounts, rewards, values, bootstrap_value)
    assert not out.vs.requires_grad
    assert not out.pg_advantages.requires_grad
    assert out.vs.grad_fn is None
    assert out.pg_advantages.grad_fn is None


def _good_tensors(shape: tuple[int, ...] = (5, 3)) -> list[torch.Tensor]:
    return [torch.zeros(shape) for _ in range(4)] + [torch.zeros(shape[1:])]


def _call(tensors: list[torch.Tensor]) -> vtrace.VTraceReturns:
    return vtrace.from_importance_weights(
        tensors[0], tensors[1], tensors[2], tensors[3], tensors[4]
    )


def test_namedtuple_dtype_and_inputs_untouched() -> None:
    torch.manual_seed(1)
    shape = (5, 3)
    inputs = [
        torch.randn(shape),
        torch.full(shape, 0.9),
        torch.randn(shape),
        torch.randn(shape),
        torch.randn(shape[1:]),
    ]
    copies = [x.clone() for x in inputs]
    out = _call(inputs)
    vs, pg_advantages = out
    assert isinstance(out, vtrace.VTraceReturns)
    assert vs is out.vs and pg_advantages is out.pg_advantages
    assert vs.dtype == torch.float32 and pg_advantages.dtype == torch.float32
    for original, copy in zip(inputs, copies, strict=True):
        assert torch.equal(original, copy)


@pytest.mark.parametrize(
    ("index", "bad", "match"),
    [
        (4, torch.zeros(5, 3), "bootstrap_value rank"),  # bootstrap has a time dim
        (4, torch.zeros(()), "bootstrap_value rank"),
        (4, torch.zeros(4), "bootstrap_value shape"),  # B disagrees
        (0, torch.zeros(6, 3), r"log_rhos \[T, B\]"),  # T disagrees
        (1, torch.zeros(5, 2), r"discounts \[T, B\]"),  # B disagrees
        (2, torch.zeros(5, 3, 2), "rewards rank"),
        (3, torch.zeros(5), "values must be at least rank 2"),
        (0, torch.zeros(5), "log_rhos rank"),
    ],
)
def test_shape_mismatch_raises(index: int, bad: torch.Tensor, match: str) -> None:
    tensors = _good_tensors()
    tensors[index] = bad
    with pytest.raises(ValueError, match=match):
        _call(tensors)


def test_trailing_dim_mismatch_raises() -> None:
    tensors = _good_tensors((5, 3, 2))
    tensors[2] = torch.zeros(5, 3, 3)
    with pytest.raises(ValueError, match="rewards shape"):
        _call(tensors)


def test_empty_time_raises() -> None:
    with pytest.raises(ValueError, match="at least one time step"):
        _call(_good_tensors((0, 3)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_numpy_path_for_cpu_tensors_matches_the_torch_path(dtype: torch.dtype) -> None:
    """CPU tensors take numpy; every other device takes the torch ops: the same results."""
    rng = np.random.default_rng(7)
    log_rhos, discounts, rewards, values, bootstrap = (
        torch.from_numpy(x).to(dtype) for x in _random_inputs(rng, (20, 8, 3))
    )
    log_rhos[3, 2] = -math.inf  # a masked step
    inputs = (log_rhos, discounts, rewards, values, bootstrap)
    for clip in (1.0, None):
        fast = vtrace.from_importance_weights(*inputs, clip, clip, 0.95)
        slow = vtrace._from_importance_weights_torch(*inputs, clip, clip, 0.95)
        for a, b in zip(fast, slow, strict=True):
            assert a.dtype == b.dtype == dtype
            torch.testing.assert_close(a, b)
