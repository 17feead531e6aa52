"""Models and the learner's recurrent bookkeeping: inference and training must agree.

The strongest check of the LSTM path: frames go through the real ``InferenceEngine``
(which keeps each slot's core state in the trajectory builder), and the unrolls that
come out are re-run the way the trainer runs them, from the stored start state. With
unchanged weights, the policy parameters and values training computes must equal the
ones inference produced for the same frames, across episode boundaries, unroll
boundaries and slots that join late.
"""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
import torch
from support import engine_for
from torch import nn

from learner.agents import cpu_kernels, models
from learner.agents.models import (
    ActorCritic,
    ImpalaResNet,
    ModelSpec,
    NatureCNN,
    ResidualBlock,
    UnsupportedSetup,
    action_head,
    actor_critic,
    build_model,
    choose_torso,
)
from learner.serving.batcher import PendingRequest
from learner.serving.inference import Connection, FramePayload, StepCounter
from learner.state.stats import LearnerStats
from learner.state.trajectories import TrajectoryBuilder, UnrollQueue, Unrolls
from learner.training.trainer import to_time_major
from seedrl.proto import seedrl_pb2 as pb

T = 6


def box_spec(shape: tuple[int, ...], dtype: str = "float32") -> pb.SpaceSpec:
    return pb.SpaceSpec(kind="box", shape=list(shape), dtype=dtype)


def make_engine(model: ActorCritic, head, obs_shape, obs_dtype, lstm_size: int):
    builder = TrajectoryBuilder(
        unroll_length=T,
        obs_shape=obs_shape,
        obs_dtype=obs_dtype,
        action_shape=head.action_shape,
        action_dtype=str(head.action_dtype).removeprefix("torch."),
        param_size=head.param_size,
        core_state_sizes=(lstm_size, lstm_size) if lstm_size else (),
    )
    queue = UnrollQueue(10_000)
    engine = engine_for(
        model, head, torch.device("cpu"), builder, queue, LearnerStats(), threading.Lock(),
        StepCounter(),
    )  # fmt: skip
    return engine, builder, queue


async def drive(engine, builder, streams: int, k: int, steps: int, obs_fn, rng, late: int = 0):
    """``steps`` batches of ``streams`` actors x ``k`` envs with random episode ends.

    Stream 0 joins ``late`` batches after the others, so slots start at different offsets.
    """
    conns = [Connection(f"a{i}", f"r{i}", "peer", k, builder.allocate(k)) for i in range(streams)]
    loop = asyncio.get_running_loop()
    for step in range(steps):
        batch = []
        for i, conn in enumerate(conns):
            if i == 0 and step < late:
                continue
            done_K = rng.random(k) < 0.15
            term_K = done_K & (rng.random(k) < 0.5)
            payload = FramePayload(
                conn,
                np.ascontiguousarray(obs_fn(rng, k), builder.obs_dtype).tobytes(),
                rng.normal(size=k).astype(np.float32).tobytes(),
                term_K.tobytes(),
                (done_K & ~term_K).tobytes(),
            )
            batch.append(PendingRequest(payload, k, loop.create_future()))
        await engine.process(batch)
        for request in batch:
            assert request.future.done()


def replay(model: ActorCritic, unrolls: Unrolls) -> tuple[torch.Tensor, torch.Tensor]:
    """What the trainer computes for these unrolls: params ``[T+1, N, P]``."""
    batch = to_time_major(unrolls, torch.device("cpu"))
    core = tuple(torch.from_numpy(s) for s in unrolls.core_state)
    with torch.no_grad():
        params, _, _ = model(batch["obs"], batch["first"], core)
    return params, batch["behaviour_params"]


@pytest.mark.parametrize(
    ("obs_shape", "obs_dtype", "torso", "action"),
    [
        ((4,), "float32", "mlp", "discrete"),
        ((3,), "float32", "mlp", "box"),
        ((4, 10, 10), "bool", "cnn", "discrete"),
        ((4, 10, 10), "bool", "resnet", "discrete"),
    ],
)
def test_lstm_training_replays_the_params_inference_produced(obs_shape, obs_dtype, torso, action):
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    if action == "discrete":
        head = action_head(pb.SpaceSpec(kind="discrete", n=3))
    else:
        head = action_head(box_spec((2,)))
    model = build_model(box_spec(obs_shape, obs_dtype), head, torso, (16,), lstm_size=8)
    assert model.core is not None
    engine, builder, queue = make_engine(model, head, obs_shape, obs_dtype, lstm_size=8)

    def obs_fn(rng, k):
        if obs_dtype == "bool":
            return rng.random((k, *obs_shape)) < 0.3
        return rng.normal(size=(k, *obs_shape)).astype(obs_dtype)

    asyncio.run(drive(engine, builder, streams=3, k=2, steps=5 * T + 3, obs_fn=obs_fn, rng=rng,
                      late=2))  # fmt: skip
    unrolls = queue.get(len(queue), timeout=1)
    assert unrolls is not None and len(unrolls) >= 12
    assert unrolls.first[:, 1:].any(), "episode boundaries inside unrolls must be covered"
    assert np.abs(unrolls.core_state[0]).sum() > 0, "later unrolls start from a live state"
    params, behaviour = replay(model, unrolls)
    torch.testing.assert_close(params, behaviour, rtol=1e-5, atol=1e-5)


def test_wrong_start_state_is_detected():
    """The replay check has teeth: zeroing the stored start states breaks the agreement."""
    torch.manual_seed(0)
    rng = np.random.default_rng(1)
    head = action_head(pb.SpaceSpec(kind="discrete", n=3))
    model = build_model(box_spec((4,)), head, "mlp", (16,), lstm_size=8)
    engine, builder, queue = make_engine(model, head, (4,), "float32", lstm_size=8)
    asyncio.run(drive(engine, builder, 2, 2, 4 * T, lambda r, k: r.normal(size=(k, 4)).astype(
        np.float32), rng))  # fmt: skip
    unrolls = queue.get(len(queue), timeout=1)
    assert unrolls is not None
    unrolls.core_state = tuple(np.zeros_like(s) for s in unrolls.core_state)
    params, behaviour = replay(model, unrolls)
    assert not torch.allclose(params, behaviour, atol=1e-4)


def test_feed_forward_replay_matches_too():
    torch.manual_seed(0)
    rng = np.random.default_rng(2)
    head = action_head(pb.SpaceSpec(kind="discrete", n=2))
    model = build_model(box_spec((4,)), head, "mlp", (16,))
    engine, builder, queue = make_engine(model, head, (4,), "float32", lstm_size=0)
    asyncio.run(drive(engine, builder, 2, 3, 3 * T, lambda r, k: r.normal(size=(k, 4)).astype(
        np.float32), rng))  # fmt: skip
    unrolls = queue.get(len(queue), timeout=1)
    assert unrolls is not None and unrolls.core_state == ()
    params, behaviour = replay(model, unrolls)
    torch.testing.assert_close(params, behaviour, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("shape", "dtype", "layout"),
    [
        ((4, 84, 84), "uint8", (4, 84, 84)),  # Atari frame stack, channels first
        ((84, 84), "uint8", (1, 84, 84)),
        ((10, 10, 4), "bool", (4, 10, 10)),  # raw MinAtar Breakout, channels last
        ((210, 160, 3), "uint8", (3, 210, 160)),  # raw Atari RGB
    ],
)
def test_cnn_image_layouts(shape, dtype, layout):
    spec = box_spec(shape, dtype)
    assert choose_torso(spec, "auto") == "cnn"
    head = action_head(pb.SpaceSpec(kind="discrete", n=4))
    model = build_model(spec, head, "auto")
    assert model._image_layout(shape) == layout
    obs = torch.zeros((2, 3, *shape), dtype=getattr(torch, dtype))
    params, values, _ = model(obs, torch.zeros(2, 3, dtype=torch.bool))
    assert params.shape == (2, 3, 4) and values.shape == (2, 3)


def test_model_spec_rebuilds_identical_network():
    """Checkpoints store the ModelSpec; rebuilding from it must load the same weights."""
    head = action_head(box_spec((1,)))
    model = build_model(box_spec((3,)), head, "mlp", (32, 32), lstm_size=0)
    clone = ActorCritic(ModelSpec(**codec_roundtrip(model.spec)))
    clone.load_state_dict(model.state_dict())
    x = torch.randn(1, 5, 3)
    first = torch.zeros(1, 5, dtype=torch.bool)
    torch.testing.assert_close(model(x, first)[0], clone(x, first)[0])


def codec_roundtrip(spec: ModelSpec) -> dict:
    """ModelSpec -> JSON-like dict (as checkpoints store it) -> constructor kwargs."""
    import json

    from seedrl.config import to_json_dict

    data = json.loads(json.dumps(to_json_dict(spec)))
    data["obs_shape"] = tuple(data["obs_shape"])
    data["hidden_sizes"] = tuple(data["hidden_sizes"])
    return data


@pytest.mark.parametrize(
    ("obs_shape", "torso", "action", "lstm_size"),
    [
        ((4,), "mlp", "discrete", 0),  # separate value MLP: act() skips it
        ((3,), "mlp", "box", 0),  # Gaussian: params carry the learned log-std
        ((4,), "mlp", "discrete", 8),
        ((4, 10, 10), "cnn", "discrete", 0),
        ((4, 10, 10), "resnet", "discrete", 0),
    ],
)
def test_act_gives_the_policy_params_and_core_state_of_forward(obs_shape, torso, action, lstm_size):
    """Inference calls ``act`` (no value head); training calls ``forward``: they must agree."""
    torch.manual_seed(0)
    spec = pb.SpaceSpec(kind="discrete", n=3) if action == "discrete" else box_spec((2,))
    head = action_head(spec)
    model = build_model(box_spec(obs_shape), head, torso, (16,), lstm_size=lstm_size)
    obs, first = torch.randn(2, 5, *obs_shape), torch.zeros(2, 5, dtype=torch.bool)
    core = model.initial_state(5)
    with torch.no_grad():
        params, values, core_after = model(obs, first, core)
        act_params, act_core_after = model.act(obs, first, core)
    assert values.shape == (2, 5)
    torch.testing.assert_close(act_params, params)
    for a, b in zip(act_core_after, core_after, strict=True):
        torch.testing.assert_close(a, b)


# ---------------------------------------------------------------------- Tanh


@pytest.mark.parametrize("numpy_faster", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_tanh_matches_torch_tanh_in_value_and_gradient(monkeypatch, numpy_faster, dtype):
    """Whichever kernel the speed check picks, the layer is tanh: values and gradients."""
    monkeypatch.setattr(cpu_kernels, "numpy_tanh_is_faster", lambda: numpy_faster)
    monkeypatch.setattr(cpu_kernels, "NUMPY_TANH_MIN_ELEMENTS", 0)
    x = torch.randn(37, 11, dtype=dtype) * 3
    x.requires_grad_(True)
    reference = x.detach().clone().requires_grad_(True)
    upstream = torch.randn(37, 11, dtype=dtype)

    y = cpu_kernels.Tanh()(x)
    (y * upstream).sum().backward()
    (torch.tanh(reference) * upstream).sum().backward()

    tol = 1e-6 if dtype == torch.float32 else 1e-12
    assert y.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(y, torch.tanh(reference), atol=tol, rtol=tol)
    torch.testing.assert_close(x.grad, reference.grad, atol=tol, rtol=tol)


def test_tanh_takes_numpy_only_for_large_cpu_tensors(monkeypatch):
    """Below NUMPY_TANH_MIN_ELEMENTS the autograd function's overhead outweighs the kernel."""
    monkeypatch.setattr(cpu_kernels, "numpy_tanh_is_faster", lambda: True)
    calls = []
    real_apply = cpu_kernels._NumpyTanh.apply
    monkeypatch.setattr(cpu_kernels._NumpyTanh, "apply", lambda x: calls.append(x) or real_apply(x))
    layer = cpu_kernels.Tanh()
    layer(torch.randn(cpu_kernels.NUMPY_TANH_MIN_ELEMENTS - 1))
    assert calls == []
    layer(torch.randn(cpu_kernels.NUMPY_TANH_MIN_ELEMENTS))
    assert len(calls) == 1


def test_numpy_tanh_passes_gradcheck_on_strided_input(monkeypatch):
    monkeypatch.setattr(cpu_kernels, "numpy_tanh_is_faster", lambda: True)
    monkeypatch.setattr(cpu_kernels, "NUMPY_TANH_MIN_ELEMENTS", 0)
    x = torch.randn(6, 8, dtype=torch.float64).t().requires_grad_(True)  # non-contiguous
    assert not x.is_contiguous()
    assert torch.autograd.gradcheck(cpu_kernels.Tanh(), (x,))


def test_numpy_tanh_speed_check_is_cached_bool():
    first = cpu_kernels.numpy_tanh_is_faster()
    assert isinstance(first, bool)
    assert cpu_kernels.numpy_tanh_is_faster() is first


def test_mlp_and_a_plain_nn_mlp_load_each_others_checkpoints():
    """Our Tanh has no parameters and our Linear has nn.Linear's: state dicts of plain
    nn.Linear/nn.Tanh MLPs load into ours, and ours into them."""
    x = torch.randn(5, 4)
    for direction in ("into ours", "into theirs"):
        ours, _ = models.mlp(4, (8, 8))
        theirs = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.Tanh()
        )
        source, target = (theirs, ours) if direction == "into ours" else (ours, theirs)
        target.load_state_dict(source.state_dict())
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("input_grad", [False, True])
def test_tanh_mlp_trains_as_its_layers_do(monkeypatch, input_grad):
    """The one-node numpy pass gives the layer-by-layer outputs and every gradient."""
    calls: list[torch.Tensor] = []
    real_apply = cpu_kernels._NumpyTanhMLP.apply
    monkeypatch.setattr(
        cpu_kernels._NumpyTanhMLP, "apply", lambda x, *p: calls.append(x) or real_apply(x, *p)
    )
    torch.manual_seed(0)
    ours, _ = models.mlp(4, (16, 8))
    plain = torch.nn.Sequential(
        torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8), torch.nn.Tanh()
    )
    plain.load_state_dict(ours.state_dict())
    x = torch.randn(50, 4)
    grad_out = torch.randn(50, 8)
    results = []
    for net in (ours, plain):
        xi = x.clone().requires_grad_(input_grad)
        y = net(xi)
        y.backward(grad_out)
        grads = [p.grad.clone() for p in net.parameters()]
        results.append((y.detach(), grads, xi.grad))
    assert len(calls) == 1  # ours took the fused pass, once
    (y_ours, g_ours, x_ours), (y_plain, g_plain, x_plain) = results
    torch.testing.assert_close(y_ours, y_plain, atol=1e-6, rtol=1e-5)
    for a, b in zip(g_ours, g_plain, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    if input_grad:
        torch.testing.assert_close(x_ours, x_plain, atol=1e-5, rtol=1e-5)
    else:
        assert x_ours is None and x_plain is None
    with torch.no_grad():  # inference runs the layers one by one
        torch.testing.assert_close(ours(x), y_plain, atol=1e-6, rtol=1e-5)
    assert len(calls) == 1


# ---------------------------------------------------------------------- Linear


def _path_calls(monkeypatch) -> list[torch.Tensor]:
    calls: list[torch.Tensor] = []
    real_apply = cpu_kernels._WideLinear.apply

    def counting_apply(x, weight, bias):
        calls.append(x)
        return real_apply(x, weight, bias)

    monkeypatch.setattr(cpu_kernels._WideLinear, "apply", counting_apply)
    return calls


@pytest.mark.parametrize("bias", [True, False])
def test_wide_linear_matches_nn_linear_in_value_and_every_gradient(monkeypatch, bias):
    """A layer with fewer inputs than outputs takes its own backward: same numbers."""
    calls = _path_calls(monkeypatch)
    ours = cpu_kernels.Linear(4, 16, bias=bias).double()
    theirs = torch.nn.Linear(4, 16, bias=bias).double()
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(50, 4, dtype=torch.float64, requires_grad=True)
    x_theirs = x.detach().clone().requires_grad_(True)
    upstream = torch.randn(50, 16, dtype=torch.float64)

    (ours(x) * upstream).sum().backward()
    (theirs(x_theirs) * upstream).sum().backward()

    assert len(calls) == 1
    torch.testing.assert_close(x.grad, x_theirs.grad)
    for mine, reference in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert mine.grad is not None and mine.grad.is_contiguous()
        torch.testing.assert_close(mine.grad, reference.grad)
    assert torch.autograd.gradcheck(
        lambda x, w: cpu_kernels._WideLinear.apply(x, w, None), (x, ours.weight)
    )


def test_wide_linear_skips_the_input_gradient_of_observations(monkeypatch):
    """Observations need no gradient: the backward does not compute one."""
    calls = _path_calls(monkeypatch)
    layer = cpu_kernels.Linear(3, 8)
    layer(torch.randn(10, 3)).sum().backward()
    assert len(calls) == 1
    assert layer.weight.grad is not None and layer.bias.grad is not None


def test_linear_keeps_nn_linear_path_where_the_layout_does_not_matter(monkeypatch):
    """Narrow layers, no-grad passes (inference) and batched 3-d inputs: nn.Linear's own."""
    calls = _path_calls(monkeypatch)
    cpu_kernels.Linear(16, 4)(torch.randn(10, 16))
    with torch.no_grad():
        cpu_kernels.Linear(4, 16)(torch.randn(10, 4))
    cpu_kernels.Linear(4, 16)(torch.randn(2, 10, 4))
    frozen = cpu_kernels.Linear(4, 16)
    frozen.requires_grad_(False)
    frozen(torch.randn(10, 4))
    assert calls == []


# ---------------------------------------------------------------------- log_softmax_last


@pytest.mark.parametrize(
    "shape",
    [
        (20, 128, 2),
        (cpu_kernels.ACTION_MAJOR_MIN_ROWS, 6),
        (3, 5),
        (300, cpu_kernels.ACTION_MAJOR_MAX_ACTIONS),
    ],
)
def test_log_softmax_last_equals_torch_in_value_and_gradient(shape):
    """Action-major (large batches, few actions) or direct, it is log_softmax over -1."""
    logits = (torch.randn(*shape, dtype=torch.float64) * 5).requires_grad_(True)
    reference = logits.detach().clone().requires_grad_(True)
    upstream = torch.randn(*shape, dtype=torch.float64)

    ours = cpu_kernels.log_softmax_last(logits)
    (ours * upstream).sum().backward()
    (torch.log_softmax(reference, -1) * upstream).sum().backward()

    assert ours.shape == logits.shape
    torch.testing.assert_close(ours, torch.log_softmax(reference, -1))
    torch.testing.assert_close(logits.grad, reference.grad)


def test_categorical_head_on_a_training_batch_of_strided_logits():
    """Time-major views of batch-major logits (what the trainer passes) give the same
    log-probabilities and entropies as the plain formulas."""
    head = models.CategoricalHead(3)
    logits = torch.randn(128, 21, 3).transpose(0, 1)[:20]
    actions = torch.randint(0, 3, (20, 128))
    plain = torch.log_softmax(logits, -1)
    torch.testing.assert_close(
        head.log_prob(logits, actions), plain.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    )
    torch.testing.assert_close(head.entropy(logits), -(plain.exp() * plain).sum(-1))


# ------------------------------------------------ distributions and the recurrent reset


def test_gaussian_head_log_prob_and_entropy_are_torch_normals():
    """Including log-stds outside the model's bounds: the head itself is an exact Normal."""
    torch.manual_seed(0)
    head = models.GaussianHead((2,))
    mean = torch.randn(6, 2)
    log_std = torch.tensor([[-6.0, -1.0], [0.0, 0.5], [2.5, 3.0], [-4.9, 1.9], [0.3, -0.3], [1, 2]])
    actions = torch.randn(6, 2) * 3
    params = torch.cat([mean, log_std], dim=-1)
    normal = torch.distributions.Normal(mean, log_std.exp())
    torch.testing.assert_close(head.log_prob(params, actions), normal.log_prob(actions).sum(-1))
    torch.testing.assert_close(head.entropy(params), normal.entropy().sum(-1))


def test_gaussian_head_samples_have_the_mean_and_std_of_the_params():
    torch.manual_seed(0)
    head = models.GaussianHead((2,))
    n = 40_000
    params = torch.tensor([0.7, -1.5, np.log(0.5), np.log(2.0)], dtype=torch.float32).repeat(n, 1)
    samples = head.sample(params)
    assert samples.shape == (n, 2)
    torch.testing.assert_close(samples.mean(0), torch.tensor([0.7, -1.5]), atol=0.03, rtol=0)
    torch.testing.assert_close(samples.std(0), torch.tensor([0.5, 2.0]), atol=0, rtol=0.02)
    torch.testing.assert_close(head.greedy(params[:1]), torch.tensor([[0.7, -1.5]]))


def _sigmoid(x: torch.Tensor) -> torch.Tensor:
    return 1.0 / (1.0 + torch.exp(-x))


def hand_lstm_params(model: ActorCritic, obs_TO, first_T, h, c) -> torch.Tensor:
    """The LSTM policy written out from its equations (not ``nn.LSTMCell``, not the
    model's masking): the state is zeroed exactly where an episode starts."""
    core = model.core
    assert core is not None
    w_ih, w_hh, b = core.weight_ih, core.weight_hh, core.bias_ih + core.bias_hh
    out = []
    for t in range(len(obs_TO)):
        if first_T[t]:
            h, c = torch.zeros_like(h), torch.zeros_like(c)
        x = model.torso(obs_TO[t : t + 1])
        gates = x @ w_ih.T + h @ w_hh.T + b
        i, f, g, o = gates.chunk(4, dim=-1)
        c = _sigmoid(f) * c + _sigmoid(i) * torch.tanh(g)
        h = _sigmoid(o) * torch.tanh(c)
        out.append(model.policy(torch.cat([x, h], dim=-1))[0])
    return torch.stack(out)


def _lstm_model() -> tuple[ActorCritic, models.CategoricalHead]:
    torch.manual_seed(3)
    head = action_head(pb.SpaceSpec(kind="discrete", n=3))
    model = build_model(box_spec((4,)), head, "mlp", (8,), lstm_size=5)
    with torch.no_grad():
        model.policy.weight.normal_()  # far from the near-zero init, so the core shows
    return model, head  # type: ignore[return-value]


def test_lstm_state_resets_exactly_at_episode_starts_in_training():
    """A two-episode unroll from a live start state: rows 0-2 carry it, row 3 starts over."""
    model, _ = _lstm_model()
    obs_TO = torch.randn(7, 4)
    first_T = torch.tensor([False, False, False, True, False, False, False])
    h0, c0 = torch.randn(1, 5), torch.randn(1, 5)
    with torch.no_grad():
        want = hand_lstm_params(model, obs_TO, first_T, h0, c0)
        params, _, _ = model(obs_TO[:, None], first_TB=first_T[:, None], core_state=(h0, c0))
    torch.testing.assert_close(params[:, 0], want, rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # the fixture has teeth: no reset at row 3 gives other params
        carried = hand_lstm_params(model, obs_TO, torch.zeros(7, dtype=torch.bool), h0, c0)
    assert not torch.allclose(carried[3:], want[3:], atol=1e-4)


def test_lstm_state_resets_exactly_at_episode_starts_in_inference():
    """Frames served one at a time: the frame after a done frame starts from a zero state."""
    model, head = _lstm_model()
    engine, builder, queue = make_engine(model, head, (4,), "float32", lstm_size=5)
    rng = np.random.default_rng(5)
    obs_TO = rng.normal(size=(T + 1, 4)).astype(np.float32)
    terminated = np.zeros(T + 1, np.bool_)
    terminated[2] = True  # frame 2 ends the first episode; frame 3 is the reset frame
    conn = Connection("a", "r", "peer", 1, builder.allocate(1))

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        for t in range(T + 1):
            payload = FramePayload(
                conn, obs_TO[t].tobytes(), np.zeros(1, np.float32).tobytes(),
                terminated[t : t + 1].tobytes(), np.zeros(1, np.bool_).tobytes(),
            )  # fmt: skip
            await engine.process([PendingRequest(payload, 1, loop.create_future())])

    asyncio.run(serve())
    unrolls = queue.get(1, timeout=1)
    assert unrolls is not None
    first_T = torch.tensor([True, False, False, True, False, False, False])
    with torch.no_grad():
        want = hand_lstm_params(
            model, torch.from_numpy(obs_TO), first_T, torch.zeros(1, 5), torch.zeros(1, 5)
        )
    assert unrolls.first[0].tolist() == first_T.tolist()
    torch.testing.assert_close(
        torch.from_numpy(unrolls.policy_params[0]), want, rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize(
    ("rows", "shape", "channels_last"),
    [
        (672, (4, 84, 84), True),  # an Atari training batch
        (64, (4, 84, 84), False),  # an Atari inference batch
        (672, (4, 10, 10), False),  # a MinAtar training batch: small grids stay NCHW
    ],
)
def test_conv_input_layout_picks_channels_last_only_for_large_training_frames(
    rows, shape, channels_last
):
    """Channels-last only where it trains faster; elsewhere plain NCHW, even for a permuted
    (channels-last strided) observation, and never a change of values."""
    hwc = torch.randint(0, 255, (rows, shape[1], shape[2], shape[0]), dtype=torch.uint8)
    images = hwc.permute(0, 3, 1, 2)
    laid_out = cpu_kernels.conv_input_layout(images)
    assert torch.equal(laid_out, images)
    assert laid_out.is_contiguous(memory_format=torch.channels_last) == channels_last
    assert laid_out.is_contiguous() != channels_last


def test_cnn_forward_is_the_same_in_either_input_layout(monkeypatch):
    """The layout is a speed choice only: a training batch gives the same outputs and
    gradients whichever layout the conv input takes."""
    torch.manual_seed(0)
    spec_model = build_model(
        box_spec((4, 84, 84), "uint8"), action_head(pb.SpaceSpec(kind="discrete", n=6))
    )
    obs = torch.randint(0, 255, (2, 150, 4, 84, 84), dtype=torch.uint8)
    first = torch.zeros(2, 150)
    results = []
    for layout in (cpu_kernels.conv_input_layout, torch.Tensor.contiguous):
        monkeypatch.setattr(actor_critic, "conv_input_layout", layout)
        spec_model.zero_grad()
        params, values, _ = spec_model(obs, first)
        (params.sum() + values.sum()).backward()
        grads = [p.grad.clone() for p in spec_model.parameters() if p.grad is not None]
        results.append((params.detach(), values.detach(), grads))
    (p1, v1, g1), (p2, v2, g2) = results
    torch.testing.assert_close(p1, p2, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(v1, v2, rtol=1e-4, atol=1e-5)
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


def assert_orthogonal_relu_gain(layers: list[nn.Module]) -> None:
    """Each layer's weight is orthogonal with the ReLU gain, and its bias zero."""
    gain_sq = nn.init.calculate_gain("relu") ** 2
    for layer in layers:
        w = layer.weight.detach().flatten(1)
        small = w if w.shape[0] <= w.shape[1] else w.T
        torch.testing.assert_close(
            small @ small.T, gain_sq * torch.eye(len(small)), atol=1e-4, rtol=0
        )
        assert not layer.bias.any()


def features_of_near_identical_frames(encoder: nn.Module) -> torch.Tensor:
    """A dark background with one small bright object moved around, as on Pong: the
    features ``[8, F]`` an encoder gives those eight frames."""
    frames = torch.full((8, 4, 84, 84), 0.34)
    for i in range(8):
        frames[i, :, 8 * i : 8 * i + 8, 30:38] = 0.9
    with torch.no_grad():
        return encoder(frames)


def test_nature_cnn_starts_orthogonal_so_atari_frames_give_distinct_features():
    """Each layer of the Atari encoder is orthogonal with the ReLU gain and has zero biases;
    under PyTorch's default init its features on near-identical frames were almost equal."""
    torch.manual_seed(0)
    cnn = NatureCNN(4, 84, 84)
    layers = [m for m in cnn.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
    assert len(layers) == 4
    assert_orthogonal_relu_gain(layers)
    # The features must tell the frames apart by far more than float noise.
    spread = features_of_near_identical_frames(cnn).std(0).mean().item()
    assert spread > 0.01, spread  # far above what the default init gives


@pytest.mark.parametrize(
    ("shape", "flat"), [((4, 84, 84), 32 * 11 * 11), ((10, 10, 4), 32 * 2 * 2)]
)
def test_resnet_is_impalas_three_sections_of_pool_and_two_residual_blocks(shape, flat):
    """``--model resnet``: three sections halve the image each (84 -> 42 -> 21 -> 11), with
    16, 32 and 32 channels and two residual blocks apiece, into one 256-unit layer; a
    checkpoint's ModelSpec rebuilds it."""
    torch.manual_seed(0)
    model = build_model(box_spec(shape, "uint8"), action_head(pb.SpaceSpec(kind="discrete", n=6)),
                        "resnet")  # fmt: skip
    assert isinstance(model.torso, ImpalaResNet)
    convs = [m for m in model.torso.conv if isinstance(m, nn.Conv2d)]
    assert [c.out_channels for c in convs] == [16, 32, 32]
    blocks = [m for m in model.torso.modules() if isinstance(m, ResidualBlock)]
    assert len(blocks) == 6
    assert model.torso.fc[0].in_features == flat and model.torso.out_size == 256
    clone = ActorCritic(ModelSpec(**codec_roundtrip(model.spec)))
    clone.load_state_dict(model.state_dict())
    obs = torch.randint(0, 255, (2, 3, *shape), dtype=torch.uint8)
    first = torch.zeros(2, 3, dtype=torch.bool)
    with torch.no_grad():
        params, values, _ = model(obs, first)
        torch.testing.assert_close(clone(obs, first)[0], params)
    assert params.shape == (2, 3, 6) and values.shape == (2, 3)


def test_a_residual_block_adds_its_input_to_what_its_convolutions_make():
    """The skip connection: with the second conv zeroed the block is the identity, and
    otherwise it is the input plus conv1(relu(conv0(relu(x))))."""
    torch.manual_seed(0)
    block = ResidualBlock(8)
    x = torch.randn(2, 8, 5, 5)
    with torch.no_grad():
        expected = x + block.conv1(torch.relu(block.conv0(torch.relu(x))))
        torch.testing.assert_close(block(x), expected)
        block.conv1.weight.zero_()
        block.conv1.bias.zero_()
        torch.testing.assert_close(block(x), x)


def test_resnet_on_a_vector_observation_says_what_it_needs():
    head = action_head(pb.SpaceSpec(kind="discrete", n=2))
    with pytest.raises(ValueError, match="resnet needs a rank-2 or rank-3 observation"):
        build_model(box_spec((4,)), head, "resnet")


def test_resnet_starts_with_identity_blocks_and_distinct_bounded_features():
    """Each residual block starts as the identity (its second conv zeroed), the other layers
    orthogonal with the ReLU gain: features of near-identical frames differ clearly (under
    PyTorch's default init they barely did) and do not grow through the blocks (with the
    ReLU gain on every conv they did)."""
    torch.manual_seed(0)
    net = ImpalaResNet(4, 84, 84)
    blocks = [m for m in net.modules() if isinstance(m, ResidualBlock)]
    for block in blocks:
        assert not block.conv1.weight.any() and not block.conv1.bias.any()
    zeroed = {id(b.conv1) for b in blocks}
    others = [m for m in net.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
    others = [m for m in others if id(m) not in zeroed]
    assert len(others) == 3 + 6 + 1  # section convs, first conv of each block, the layer
    assert_orthogonal_relu_gain(others)
    features = features_of_near_identical_frames(net)
    assert features.std(0).mean().item() > 0.03  # far above the default init's spread
    assert features.mean().item() < 1.0  # far below every conv at the ReLU gain


def test_the_small_grid_cnn_stacks_one_unpadded_layer_per_channel_count():
    """``--cnn-channels 32,32`` on a Connect Four board (6x7, two planes): two 3x3 layers
    leave a 2x3 grid of 32 features; the checkpoint's ModelSpec rebuilds the network."""
    torch.manual_seed(0)
    head = action_head(pb.SpaceSpec(kind="discrete", n=7))
    model = build_model(box_spec((6, 7, 2)), head, "auto", cnn_channels=(32, 32))
    convs = [m for m in model.torso.conv if isinstance(m, nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.padding) for c in convs] == [
        (2, 32, (0, 0)), (32, 32, (0, 0)),
    ]  # fmt: skip
    assert model.torso.fc[0].in_features == 32 * 2 * 3
    clone = ActorCritic(ModelSpec(**codec_roundtrip(model.spec)))
    clone.load_state_dict(model.state_dict())
    obs = torch.randint(0, 2, (2, 3, 6, 7, 2)).float()
    first = torch.zeros(2, 3, dtype=torch.bool)
    with torch.no_grad():
        torch.testing.assert_close(clone(obs, first)[0], model(obs, first)[0])


def test_two_layers_see_a_five_by_five_window():
    """What makes the second layer worth having on a board: the feature at the corner sees
    the cells up to four away from it, so a line of four fits in one filter's view."""
    encoder = models.SmallCNN(1, 6, 7, channels=(4, 4))
    board = torch.rand(1, 1, 6, 7)
    with torch.no_grad():
        for conv in encoder.conv:  # positive weights: no ReLU can hide a change
            if isinstance(conv, nn.Conv2d):
                conv.weight.abs_()
                conv.bias.zero_()
        corner = encoder.conv(board).reshape(4, 2, 3)[:, 0, 0]
        seen, unseen = board.clone(), board.clone()
        seen[0, 0, 4, 4] += 1.0
        unseen[0, 0, 5, 0] += 1.0
        unseen[0, 0, 0, 5] += 1.0
        assert not torch.equal(encoder.conv(seen).reshape(4, 2, 3)[:, 0, 0], corner)
        assert torch.equal(encoder.conv(unseen).reshape(4, 2, 3)[:, 0, 0], corner)


def test_a_grid_too_small_for_its_layers_is_refused():
    head = action_head(pb.SpaceSpec(kind="discrete", n=7))
    with pytest.raises(UnsupportedSetup, match="--cnn-channels 8,8,8: 3 unpadded 3x3 layers"):
        build_model(box_spec((6, 7, 2)), head, "auto", cnn_channels=(8, 8, 8))


def test_log_std_init_starts_every_action_dimension_at_that_noise_and_needs_a_gaussian():
    """--log-std-init: the sampled actions of a fresh model have std exp(x) on each action
    dimension; an action space without a Gaussian refuses the flag at start-up."""
    from learner.agents.vtrace.agent import VTraceAgent
    from seedrl.config import LearnerConfig

    config = LearnerConfig(log_std_init=-1.5)
    action = box_spec((3,))  # unbounded: the samples are not clipped
    agent = VTraceAgent(config, action, torch.device("cpu"))
    model = agent.build_model(box_spec((4,)), "mlp")
    torch.manual_seed(0)
    params, _, _ = model(torch.zeros(1, 20_000, 4), torch.zeros(1, 20_000, dtype=torch.bool))
    samples = agent.head.sample(params[0])
    torch.testing.assert_close(samples.std(0), torch.full((3,), np.exp(-1.5)), rtol=0.03, atol=0)
    discrete = VTraceAgent(config, pb.SpaceSpec(kind="discrete", n=3), torch.device("cpu"))
    with pytest.raises(UnsupportedSetup, match="--log-std-init sets a Gaussian policy's noise"):
        discrete.build_model(box_spec((4,)), "mlp")
