"""The heads of MultiDiscrete (independent categoricals), MultiBinary (Bernoulli) and
masked Discrete/MultiDiscrete actions, against torch.distributions; masks in sampling,
in the loss and in the model."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import Bernoulli, Categorical, Independent, Normal

from learner.agents.models import (
    ActorCritic,
    BernoulliHead,
    MaskedCategoricalHead,
    MultiCategoricalHead,
    ProductHead,
    UnsupportedSetup,
    action_head,
    build_model,
)
from learner.agents.policy import TorchPolicy, inference_policy
from learner.agents.vtrace.loss import VTraceCosts, vtrace_loss
from seedrl import codec

spaces = gym.spaces
NVEC = (3, 1, 4)


def _mask(shape: tuple[int, ...], groups: tuple[int, ...], seed: int) -> torch.Tensor:
    """Random masks ``[..., sum(groups)]`` with at least one allowed action per group."""
    g = torch.Generator().manual_seed(seed)
    parts = []
    for n in groups:
        allowed = torch.rand(*shape, n, generator=g) < 0.5
        first = torch.randint(n, shape, generator=g)
        allowed.scatter_(-1, first.unsqueeze(-1), True)
        parts.append(allowed)
    return torch.cat(parts, -1)


def _reference(logits: torch.Tensor, mask: torch.Tensor | None, groups: tuple[int, ...]):
    """One torch.distributions.Categorical per group (masked logits at -inf)."""
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    return [Categorical(logits=x) for x in logits.split(groups, -1)]


@pytest.mark.parametrize("masked", [False, True])
def test_multi_discrete_log_probs_and_entropy_match_torch_distributions(masked: bool) -> None:
    torch.manual_seed(0)
    head = MultiCategoricalHead(NVEC, (3,), "int64", masked)
    logits = torch.randn(5, 7, sum(NVEC)) * 3
    mask = _mask((5, 7), NVEC, seed=1) if masked else None
    params = logits if mask is None else torch.cat([logits, mask.float()], -1)
    assert params.shape[-1] == head.param_size
    dists = _reference(logits, mask, NVEC)
    actions = torch.stack([d.sample() for d in dists], -1)
    logp, entropy = head.log_prob_and_entropy(params, actions)
    expected = sum(d.log_prob(a) for d, a in zip(dists, actions.unbind(-1), strict=True))
    torch.testing.assert_close(logp, expected)
    torch.testing.assert_close(entropy, sum(d.entropy() for d in dists))
    torch.testing.assert_close(head.log_prob(params, actions), logp)
    torch.testing.assert_close(head.entropy(params), entropy)
    sample = head.sample(params)
    assert sample.shape == (5, 7, 3) and sample.dtype == torch.int64
    for g, n in enumerate(NVEC):
        assert ((sample[..., g] >= 0) & (sample[..., g] < n)).all()


PRODUCT = spaces.Dict(
    {
        "move": spaces.Discrete(5),
        "switches": spaces.MultiBinary((2, 2)),
        "target": spaces.Tuple((spaces.MultiDiscrete([[3, 2], [4, 1]]),)),
    }
)


def test_dict_tuple_actions_are_the_product_of_their_leaves_heads() -> None:
    """Log-probability and entropy are the sums over the leaves' torch.distributions; the
    actions sit side by side as int64 columns that codec splits back into the leaves."""
    torch.manual_seed(0)
    spec = codec.space_to_spec(PRODUCT)
    head = action_head(spec)
    assert isinstance(head, ProductHead)
    assert head.param_size == 5 + 4 + 10 and head.action_shape == (1 + 4 + 4,)
    params = torch.randn(6, 3, head.param_size) * 2
    move, switches, target = params.split([5, 4, 10], -1)
    dists = [
        Categorical(logits=move),
        Independent(Bernoulli(logits=switches), 1),
        *_reference(target, None, (3, 2, 4, 1)),
    ]
    samples = [
        dists[0].sample().unsqueeze(-1),
        dists[1].sample(),
        torch.stack([d.sample() for d in dists[2:]], -1),
    ]
    actions = torch.cat(samples, -1).long()
    logp, entropy = head.log_prob_and_entropy(params, actions)
    expected = dists[0].log_prob(samples[0][..., 0]) + dists[1].log_prob(samples[1])
    expected = expected + sum(
        d.log_prob(a) for d, a in zip(dists[2:], samples[2].unbind(-1), strict=True)
    )
    torch.testing.assert_close(logp, expected)
    torch.testing.assert_close(entropy, sum(d.entropy() for d in dists))
    torch.testing.assert_close(head.entropy(params), entropy)
    assert head.max_entropy == pytest.approx(np.log(5) + 4 * np.log(2) + np.log(3 * 2 * 4))

    drawn = head.sample(params)
    assert drawn.shape == (6, 3, 9) and drawn.dtype == torch.int64
    greedy = head.greedy(params)
    assert (greedy[..., 0] == move.argmax(-1)).all()
    leaves = codec.action_leaves_of(spec, drawn.reshape(18, 9).numpy())
    for value, leaf in zip(leaves, codec.space_leaves(spec, action=True), strict=True):
        assert value.shape == (18, *leaf.shape) and value.dtype == leaf.dtype
    for got, sub in zip(
        leaves, [PRODUCT["move"], PRODUCT["switches"], PRODUCT["target"][0]], strict=True
    ):
        assert all(sub.contains(x) for x in got)


def test_dict_box_actions_are_one_gaussian_over_their_leaves() -> None:
    """A product of diagonal Gaussians is one: its log-probability is the leaves' sum."""
    space = spaces.Tuple((spaces.Box(-1, 1, (2,)), spaces.Box(0, 4, (1, 2))))
    spec = codec.space_to_spec(space)
    head = action_head(spec)
    assert head.continuous and head.action_shape == (4,)
    assert head.low == (-1, -1, 0, 0) and head.high == (1, 1, 4, 4)  # type: ignore[union-attr]
    mean, log_std = torch.randn(5, 4), torch.randn(5, 4) * 0.3
    actions = head.sample(torch.cat([mean, log_std], -1))
    parts = [Independent(Normal(m, s.exp()), 1) for m, s in
             zip(mean.split([2, 2], -1), log_std.split([2, 2], -1), strict=True)]  # fmt: skip
    expected = sum(d.log_prob(a) for d, a in zip(parts, actions.split([2, 2], -1), strict=True))
    logp, entropy = head.log_prob_and_entropy(torch.cat([mean, log_std], -1), actions)
    torch.testing.assert_close(logp, expected)
    torch.testing.assert_close(entropy, sum(d.entropy() for d in parts))


def test_masked_discrete_matches_torch_distributions_and_gives_masked_actions_zero() -> None:
    torch.manual_seed(0)
    head = MaskedCategoricalHead(6)
    logits = torch.randn(4, 9, 6) * 3
    mask = _mask((4, 9), (6,), seed=2)
    params = torch.cat([logits, mask.float()], -1)
    (dist,) = _reference(logits, mask, (6,))
    actions = dist.sample()
    logp, entropy = head.log_prob_and_entropy(params, actions)
    torch.testing.assert_close(logp, dist.log_prob(actions))
    torch.testing.assert_close(entropy, dist.entropy())
    every = torch.arange(6).expand(4, 9, 6)
    probs = head.log_prob(params.unsqueeze(-2).expand(4, 9, 6, 12), every).exp()
    assert (probs[~mask] == 0).all()
    torch.testing.assert_close(probs.sum(-1), torch.ones(4, 9))


def test_bernoulli_log_probs_and_entropy_match_torch_distributions() -> None:
    torch.manual_seed(0)
    head = BernoulliHead((2, 3), "int8")
    logits = torch.randn(5, 4, 6) * 4
    dist = Bernoulli(logits=logits)
    actions = dist.sample().reshape(5, 4, 2, 3).to(torch.int8)
    logp, entropy = head.log_prob_and_entropy(logits, actions)
    torch.testing.assert_close(logp, dist.log_prob(actions.reshape(5, 4, 6).float()).sum(-1))
    torch.testing.assert_close(entropy, dist.entropy().sum(-1))
    sample = head.sample(logits)
    assert sample.shape == (5, 4, 2, 3) and sample.dtype == torch.int8
    assert set(sample.unique().tolist()) <= {0, 1}
    # Far from 0 the sample follows the sign of the logit.
    pair = BernoulliHead((2,), "int8")
    assert (pair.sample(torch.tensor([[50.0, -50.0]] * 100)) == torch.tensor([1, 0])).all()


@pytest.mark.parametrize(
    ("allowed", "masked"),
    [(0.0, 1e30), (0.0, float("inf")), (0.0, float("nan")), (float("-inf"), 0.0), (-1e38, 0.0)],
)
def test_a_masked_action_is_never_sampled_whatever_the_logits(
    allowed: float, masked: float
) -> None:
    torch.manual_seed(0)
    mask = _mask((4096,), (5,), seed=3)
    logits = torch.where(mask, torch.tensor(allowed), torch.tensor(masked))
    params = torch.cat([logits, mask.float()], -1)
    for head in (MaskedCategoricalHead(5), MultiCategoricalHead((5,), (1,), "int64", True)):
        chosen = head.sample(params).reshape(-1)
        assert mask.gather(-1, chosen.unsqueeze(-1)).all()
        assert mask.gather(-1, head.greedy(params).reshape(-1, 1)).all()


def test_the_loss_uses_the_mask_for_behaviour_target_and_entropy() -> None:
    """With the mask in the parameters, V-trace's log-ratios are those of the masked
    distributions, and the entropy is that of the allowed actions only."""
    torch.manual_seed(0)
    t, b, n = 4, 3, 5
    head = MaskedCategoricalHead(n)
    mask = _mask((t + 1, b), (n,), seed=4)
    target_logits = torch.randn(t + 1, b, n)
    behaviour_logits = torch.randn(t + 1, b, n)
    (behaviour,) = _reference(behaviour_logits, mask, (n,))
    (target,) = _reference(target_logits, mask, (n,))
    action = behaviour.sample()
    batch = {
        "action": action,
        "behaviour_params": torch.cat([behaviour_logits, mask.float()], -1),
        "terminated": torch.zeros(t + 1, b, dtype=torch.bool),
        "truncated": torch.zeros(t + 1, b, dtype=torch.bool),
    }
    params = torch.cat([target_logits, mask.float()], -1)
    loss = vtrace_loss(
        head, params, torch.zeros(t + 1, b), batch, torch.ones(t, b),
        VTraceCosts(discount=0.9, baseline_cost=0.5, entropy_cost=0.01),
    )  # fmt: skip
    log_rho = target.log_prob(action)[:t] - behaviour.log_prob(action)[:t]
    torch.testing.assert_close(loss.terms["rho_mean"], log_rho.exp().mean(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loss.terms["entropy"], target.entropy()[:t].mean())
    assert torch.isfinite(loss.total)


MASKED_ENV = spaces.Dict(
    {
        "action_mask": spaces.MultiBinary(7),
        "pos": spaces.Box(-1, 1, (3,), np.float32),
        "direction": spaces.Discrete(4),
        "image": spaces.Box(0, 255, (1, 6, 6), np.uint8),
    }
)


def _packed(space: gym.Space, n: int, seed: int) -> tuple[np.ndarray, list[np.ndarray]]:
    spec = codec.space_to_spec(space)
    space.seed(seed)
    per_env = [codec.flatten_values(spec, space.sample()) for _ in range(n)]
    leaves = codec.space_leaves(spec)
    values = [np.stack([np.asarray(e[i], x.dtype) for e in per_env]) for i, x in enumerate(leaves)]
    return codec.LeafPacking(leaves).pack_values(values), values


def test_auto_model_reads_every_leaf_and_masks_inference_whatever_the_weights() -> None:
    obs_spec = codec.space_to_spec(MASKED_ENV)
    head = action_head(codec.space_to_spec(spaces.MultiDiscrete([3, 4])), masked=True)
    model = build_model(obs_spec, head, "auto", (16,), mask_leaf="action_mask")
    encoders = [encoder for *_, encoder, _ in model.spec.leaf_inputs]
    assert encoders == ["mask", "embed", "cnn", "mlp"]  # keys in order: a, d, i, p
    rows, values = _packed(MASKED_ENV, 64, seed=5)
    mask = values[0].astype(bool)
    mask[:, 0] = True
    mask[:, 3] = True  # every row allows a choice in each group
    rows, values = (
        codec.LeafPacking(codec.space_leaves(obs_spec)).pack_values(
            [mask.astype(np.int8), *values[1:]]
        ),
        values,
    )
    with torch.no_grad():  # weights that favour the masked actions by far
        model.policy.bias.copy_(torch.where(torch.from_numpy(mask[0]), -1e6, 1e6))
    policy = inference_policy(model, head, torch.device("cpu"), "auto", 0)
    assert isinstance(policy, TorchPolicy)
    for _ in range(5):
        action_BA, params_BP, _ = policy(rows, np.zeros(64, bool), ())
        np.testing.assert_array_equal(params_BP[:, 7:], mask.astype(np.float32))
        assert mask[np.arange(64), action_BA[:, 0]].all()
        assert mask[np.arange(64), 3 + action_BA[:, 1]].all()
    _, one_params, _ = policy(rows[:1], np.zeros(1, bool), ())  # leaves at odd offsets
    np.testing.assert_array_equal(one_params[:, 7:], mask[:1].astype(np.float32))
    # Training's forward pass sees the same leaves and the same mask.
    params, values_TB, _ = model(torch.from_numpy(rows)[None], torch.zeros(1, 64, dtype=torch.bool))
    assert params.shape == (1, 64, 14) and values_TB.shape == (1, 64)
    # The value gets a gradient through every encoder.
    values_TB.sum().backward()
    for key, module in model.torso.encoders.items():
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters()), key


def test_unsupported_combinations_are_refused_with_one_line() -> None:
    obs_spec = codec.space_to_spec(MASKED_ENV)
    discrete = codec.space_to_spec(spaces.Discrete(7))
    with pytest.raises(UnsupportedSetup, match="--model mlp reads one observation tensor"):
        build_model(obs_spec, action_head(discrete), "mlp")
    with pytest.raises(UnsupportedSetup, match="has 7 entries but the action space has 5"):
        build_model(
            obs_spec, action_head(codec.space_to_spec(spaces.Discrete(5)), masked=True),
            mask_leaf="action_mask",
        )  # fmt: skip
    with pytest.raises(UnsupportedSetup, match="needs a Discrete or MultiDiscrete"):
        action_head(codec.space_to_spec(spaces.MultiBinary(3)), masked=True)
    mixed = spaces.Dict({"arm": spaces.Box(-1, 1, (2,)), "grip": spaces.Discrete(2)})
    with pytest.raises(UnsupportedSetup) as refused:
        action_head(codec.space_to_spec(mixed))
    assert str(refused.value).startswith(
        "action space Dict(arm: Box(shape=[2], dtype=float32), grip: Discrete(2)) is not "
        "supported: a dict/tuple action space takes either only Box leaves or only"
    )
    with pytest.raises(UnsupportedSetup, match="needs a Discrete or MultiDiscrete"):
        action_head(codec.space_to_spec(spaces.Dict({"a": spaces.Discrete(2)})), masked=True)
    only_mask = codec.space_to_spec(spaces.Dict({"action_mask": spaces.MultiBinary(7)}))
    with pytest.raises(UnsupportedSetup, match="only the action mask"):
        build_model(only_mask, action_head(discrete, masked=True), mask_leaf="action_mask")


def test_models_with_leaves_round_trip_their_spec() -> None:
    """What a checkpoint stores (the spec as JSON) rebuilds the same network."""
    import json

    from learner.tools.trained_policy import model_spec_from_dict
    from seedrl.config import to_json_dict

    obs_spec = codec.space_to_spec(MASKED_ENV)
    head = action_head(codec.space_to_spec(spaces.Discrete(7)), masked=True)
    model = build_model(obs_spec, head, mask_leaf="action_mask")
    spec = model_spec_from_dict(json.loads(json.dumps(to_json_dict(model.spec))))
    assert spec == model.spec
    again = ActorCritic(spec)
    again.load_state_dict(model.state_dict())


def test_sub_action_terms_are_each_heads_entropy_and_policy_gradient() -> None:
    """Per sub-action: the entropy torch.distributions gives, and the RMS over the counted
    transitions of autograd's gradient of -A * log p(a) with respect to that part's logits."""
    from learner.agents.vtrace.loss import sub_action_terms

    torch.manual_seed(3)
    t, b, nvec = 5, 4, (3, 4)
    head = MultiCategoricalHead(nvec, (2,), "int64", masked=False)
    logits = torch.randn(t, b, sum(nvec)) * 2
    reference = _reference(logits, None, nvec)
    action = torch.stack([d.sample() for d in reference], -1)
    adv = torch.randn(t, b)
    weight = (torch.rand(t, b) < 0.7).float()
    terms = sub_action_terms(head, logits, action, adv, weight)
    assert sorted(terms) == ["entropy_head0", "entropy_head1", "pg_signal_head0", "pg_signal_head1"]
    for g, (part, n) in enumerate(zip(logits.split(nvec, -1), nvec, strict=True)):
        part = part.clone().requires_grad_(True)
        policy_term = -(adv * Categorical(logits=part).log_prob(action[..., g])).sum()
        (grad,) = torch.autograd.grad(policy_term, part)  # rows are independent: per row
        counted = weight.bool()
        rms = grad[counted].pow(2).sum(-1).mean().sqrt()
        entropy = Categorical(logits=part.detach()).entropy()[counted].mean()
        assert grad.shape[-1] == n
        torch.testing.assert_close(terms[f"pg_signal_head{g}"], rms)
        torch.testing.assert_close(terms[f"entropy_head{g}"], entropy)


def test_the_loss_reports_sub_action_terms_only_for_several_sub_actions() -> None:
    t, b = 3, 2
    batch = {
        "terminated": torch.zeros(t + 1, b, dtype=torch.bool),
        "truncated": torch.zeros(t + 1, b, dtype=torch.bool),
    }
    costs = VTraceCosts(discount=0.9, baseline_cost=0.5, entropy_cost=0.01)
    for nvec, expected in (((3, 4), 2), ((5,), 0)):
        head = MultiCategoricalHead(nvec, (len(nvec),), "int64", masked=False)
        params = torch.randn(t + 1, b, sum(nvec))
        batch["behaviour_params"] = params.clone()
        batch["action"] = head.sample(params)
        loss = vtrace_loss(head, params, torch.zeros(t + 1, b), batch, torch.ones(t, b), costs)
        assert sum(key.startswith("entropy_head") for key in loss.terms) == expected
        assert sum(key.startswith("pg_signal_head") for key in loss.terms) == expected
