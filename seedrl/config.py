"""Run configuration: frozen dataclasses, one attribute docstring per field.

The dataclasses are the single source of truth: the command line is generated from them
(:mod:`seedrl.cli`), presets and config files fill them (:mod:`seedrl.presets`), and the
resolved config is saved as JSON in the learner's log directory.

The learner's config comes in sections: its own fields, grouped by ``# comments``, and
the chosen agent's knobs, an :class:`AgentOptions` subclass the agent's package declares.
This package may not import the learner, so the learner names its agents to it
(:func:`set_agent_catalog`, on ``import learner``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

T = TypeVar("T")

AUTH_TOKEN_ENV = "SEEDRL_AUTH_TOKEN"
SECRET_FIELDS = frozenset({"auth_token"})
"""Fields never written down or sent anywhere: left out of ``config.json``, checkpoints,
``repr`` and a W&B run, and never put on a command line another process builds (other
users see those in ``ps``)."""
REPEATABLE = "repeatable"
"""Field metadata key: the flag may be given several times, each adding to the tuple."""
OPTIONS = "options"
"""Field metadata key: the field holds a section of knobs, not a value of its own (no flag)."""
INFERENCE_BACKENDS = ("auto", "torch", "numpy")
TRAINER_MODES = ("auto", "process", "thread", "device")
PRECISIONS = ("auto", "fp32", "bf16")


SERVING_AUTO = "auto"
"""--serving-processes that the learner resolves from its host (learner/serving/auto.py)."""


def serving_count(value: object) -> int | None:
    """--serving-processes as a number of frontends, None for auto; ValueError for
    anything else. A number (a config file's, the Python API's) counts as its text."""
    if value == SERVING_AUTO:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():  # no sign, no space
        return int(value)
    raise ValueError(
        f"--serving-processes must be {SERVING_AUTO} or a whole number >= 0, got {value!r}"
    )


LR_SCHEDULES = ("auto", "constant", "linear", "inverse_sqrt")
LOG_STD_RANGE = (-5.0, 2.0)
"""Where a Gaussian policy's log-std is kept (the learner projects it back after each step)."""
WANDB_MODES = ("online", "offline")
OPPONENT_SAMPLING = ("latest", "uniform", "pfsp")
"""How self-play picks an episode's opponent from the pool of past selves."""
PBT_BOUNDS: dict[str, tuple[float, float]] = {
    "learning_rate": (1e-5, 3e-2),
    "entropy_cost": (1e-5, 0.1),
    "baseline_cost": (0.05, 2.0),
    "max_grad_norm": (0.05, 100.0),
}
"""The hyperparameters population-based training may perturb, each kept within its
(low, high): the ones an update reads afresh at every step (the trainer's rate and clip,
the loss's coefficients), so a member's new value takes effect at its next step."""


def flag_name(field: str) -> str:
    """The command-line flag of a config field (``lambda_`` -> ``--lambda``)."""
    return "--" + field.rstrip("_").replace("_", "-")


def require_choice(config: Any, name: str, choices: Sequence[str]) -> None:
    """ValueError unless ``config.<name>`` is one of ``choices`` ("x must be a, b or c")."""
    value = getattr(config, name)
    if value not in choices:
        allowed = f"{', '.join(choices[:-1])} or {choices[-1]}"
        raise ValueError(f"{flag_name(name)} must be {allowed}, got {value!r}")


def require_range(
    config: Any,
    names: Sequence[str],
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> None:
    """ValueError naming the flag unless each ``config.<name>`` lies in the range (None
    passes: optional fields are off). A wrong value must stop the run before anything
    starts, not train on, e.g., every reward clipped to -1."""
    for name in names:
        value = getattr(config, name)
        if value is None:
            continue
        values = value if isinstance(value, tuple) else (value,)
        for v in values:
            too_low = low is not None and (v <= low if low_open else v < low)
            too_high = high is not None and (v >= high if high_open else v > high)
            if too_low or too_high or v != v:  # v != v: NaN
                if low is not None and high is not None:
                    bound = (
                        f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
                    )
                elif low is not None:
                    bound = f"{'>' if low_open else '>='} {low:g}"
                else:
                    bound = f"{'<' if high_open else '<='} {high:g}"
                raise ValueError(f"{flag_name(name)} must be {bound}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class AgentOptions:
    """One agent's own knobs: a section its package declares (``learner/agents/NAME/
    config.py``) as a frozen dataclass subclass with a docstring under each field, and
    registers with the agent (``learner/agents/registry.py``). Its flags, its ``--help``
    group, its config-file keys and its table in docs/configuration.md all come from it,
    so a new agent edits nothing here. The class attributes say what the agent can do,
    for the checks that differ between agents; the learner asks them, never a name."""

    replay: ClassVar[bool] = False
    """The agent trains on samples of a replay it keeps, not on the bounded queue of
    unrolls (so --max-queue-unrolls does not bound its batches)."""
    continuous_actions: ClassVar[bool] = True
    """The agent acts in Box (continuous) action spaces."""

    def check(self, config: LearnerConfig) -> None:
        """ValueError naming the flag when a knob is out of range or does not fit the rest
        of ``config`` (:func:`require_range`, :func:`require_choice`); nothing by default."""

    @property
    def effective_max_update_kl(self) -> float | None:
        """The bound on how far one optimizer step may move the policy; None: no bound
        (an agent without a policy to bound)."""
        return None


AgentCatalog = Callable[[], Mapping[str, type[AgentOptions]]]
"""What names the registered agents: ``--agent`` name -> the agent's options class."""
_catalogs: list[AgentCatalog] = []


def set_agent_catalog(catalog: AgentCatalog) -> None:
    """Name the registered agents: the learner passes its registry, which this package may
    not import. Asked on each use, so an agent a test adds to the registry is known."""
    _catalogs[:] = [catalog]


def agent_sections() -> Mapping[str, type[AgentOptions]]:
    """``--agent`` name -> its options class, as the registry says now."""
    if not _catalogs:
        raise RuntimeError(
            "no agents are registered: import learner (learner/agents/registry.py names them)"
            " before building a LearnerConfig"
        )
    return _catalogs[0]()


def knob_names(options: type[AgentOptions]) -> frozenset[str]:
    """The knobs (field names) of an agent's options class."""
    return frozenset(f.name for f in dataclasses.fields(options))


def knob_owners(name: str) -> list[str]:
    """The agents whose options have a knob called ``name`` (none: no agent's knob)."""
    return [agent for agent, cls in agent_sections().items() if name in knob_names(cls)]


def misplaced_knob(name: str, agent: str) -> str | None:
    """The one line refusing another agent's knob ``name`` for ``--agent agent``; None when
    no agent has such a knob."""
    owners = knob_owners(name)
    if not owners:
        return None
    return f"{flag_name(name)} is a knob of --agent {' and '.join(owners)}, not of --agent {agent}"


def agent_options_class(agent: str) -> type[AgentOptions]:
    """The options class of the registered ``agent``; ValueError naming --agent otherwise."""
    sections = agent_sections()
    if agent not in sections:
        names = list(sections)
        allowed = f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]
        raise ValueError(f"--agent must be {allowed}, got {agent!r}")
    return sections[agent]


def options_field(cls: type) -> dataclasses.Field[Any] | None:
    """The field of a config dataclass that holds the agent's options (None: it has none)."""
    return next((f for f in dataclasses.fields(cls) if f.metadata.get(OPTIONS)), None)


def chosen_agent(values: Mapping[str, Any]) -> str:
    """The ``--agent`` that field values name (the default when they name none)."""
    return str(values.get("agent", LearnerConfig.agent))


def config_hints(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """The names ``cls`` takes, each with its type: the fields and, for a config with a
    section of agent knobs, the knobs of the agent ``values`` choose (when registered)."""
    hints = typing.get_type_hints(cls)
    section = options_field(cls)
    if section is not None:
        del hints[section.name]
        options = agent_sections().get(chosen_agent(values))
        if options is not None:
            knobs = typing.get_type_hints(options)
            hints.update({name: knobs[name] for name in knob_names(options)})
    return hints


def knob_type(name: str) -> Any:
    """The type of the knob ``name`` of whichever registered agent has one (None: none)."""
    for options in agent_sections().values():
        if name in knob_names(options):
            return typing.get_type_hints(options)[name]
    return None


def is_knob_default(name: str, value: Any) -> bool:
    """Whether ``value`` is the default of knob ``name`` in every agent that has it: an old
    flat ``config.json`` lists every agent's knobs at their defaults."""
    defaults = [
        _default(f)
        for options in agent_sections().values()
        for f in dataclasses.fields(options)
        if f.name == name
    ]
    value = tuple(value) if isinstance(value, list) else value
    return bool(defaults) and all(d == value for d in defaults)


def _agent_options(agent: str, given: AgentOptions | None, knobs: dict[str, Any]) -> AgentOptions:
    """``agent``'s options: ``given`` (when it is that agent's, as ``dataclasses.replace``
    passes it along) with ``knobs`` set on it."""
    cls = agent_options_class(agent)
    own = knob_names(cls)
    for name in knobs:
        if name not in own:
            message = misplaced_knob(name, agent)
            if message is None:
                raise TypeError(f"LearnerConfig got an unexpected keyword argument {name!r}")
            raise ValueError(message)
    base = given if type(given) is cls else cls()
    return dataclasses.replace(base, **knobs) if knobs else base


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if callable(f.default_factory):
        return f.default_factory()
    raise TypeError(f"LearnerConfig needs {f.name}")


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
    """Everything the learner process needs; saved as ``config.json`` with each run.

    Its fields come in sections (the ``# comments`` below: ``--help`` groups and
    docs/configuration.md's tables follow them); the chosen agent's own knobs are one more
    section, an :class:`AgentOptions` the agent's package declares, kept in
    ``agent_options`` and read as if they were fields (``config.epsilon``)."""

    # run
    env: str = "CartPole-v1"
    """gymnasium id (e.g. CartPole-v1) or a ``module:callable`` env factory."""
    env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments for the env constructor, as a JSON object."""
    self_play: bool = False
    """Two-player games (a multi-agent env of two agents, e.g. PettingZoo's Connect Four):
    the learning policy plays one agent, chosen at random each episode, and a frozen
    snapshot of itself from the opponent pool plays the other (--snapshot-every,
    --pool-size, --opponent-sampling); only the learning policy's frames are trained on.
    Off: every agent of a multi-agent env is played, and trained, by the one policy."""
    policy_mapping: tuple[str, ...] = ()
    """A multi-agent env's agent groups with networks of their own: ``agent_id=policy,...``
    (the ids the env names its agents by). Each named policy is served, and trained by its
    own trainer, on its own agents' frames only; ``*=policy`` names the policy of the
    agents not listed, which without it play for the first policy named. Empty: one policy
    plays every agent (docs/multiagent.md)."""
    bind: str = "127.0.0.1"
    """Address to listen on; 0.0.0.0 (or [::]) to accept actors from other hosts, which
    needs --auth-token (or $SEEDRL_AUTH_TOKEN), TLS client certificates or --insecure."""
    port: int = 8686
    """gRPC port (0 picks a free one and prints it); under torchrun, rank r serves port + r."""
    advertise_host: str = ""
    """Host actors dial for this learner (GetInfo rank_addresses); default: --bind, and
    for a wildcard bind the host the actor already used to reach rank 0."""
    local_socket: bool = True
    """Also listen on a unix socket in a private temp dir (without TLS) and offer it to
    actors on this host: a unix socket costs less CPU per message than loopback TCP. A
    unix --bind needs none: serving frontends listen beside its path, with its TLS."""
    logdir: str = "runs/latest"
    """Where metrics.jsonl, TensorBoard events, config.json and checkpoints go."""
    device: str = "auto"
    """torch device: auto (CUDA when present, else CPU), cpu, cuda, cuda:1, ..."""
    seed: int = 0
    """Seed for torch and the learner's action sampling."""
    torch_threads: int = 1
    """Intra-op threads of torch and of numpy's BLAS (inference and training share them);
    0 keeps the libraries' own choice."""

    # model
    agent: str = "vtrace"
    """The learning algorithm, one of learner/agents/registry.py's: vtrace (IMPALA's
    V-trace actor-critic), r2d2 (recurrent replay distributed DQN with Ape-X prioritized
    replay and per-slot epsilon-greedy; discrete actions; its presets turn --lstm on) or
    sac (soft actor-critic on a replay; bounded Box actions; feed-forward). An
    agent is its network head, action choice, what it keeps to train on and its loss
    (learner/agents/); its own knobs are a section of their own, listed by ``--agent NAME
    --help``."""
    model: str = "auto"
    """Torso: auto (cnn for image observations, else mlp; for dict/tuple observations one
    encoder per leaf: cnn for images, mlp for vectors, an embedding for small discrete
    leaves, concatenated), mlp, cnn (Nature CNN; a small one for small grids) or resnet
    (IMPALA's deep encoder: larger and slower, for a GPU)."""
    action_mask: str = "action_mask"
    """The leaf of a dict observation whose non-zero entries mark the allowed actions of a
    Discrete or MultiDiscrete action space (one entry per action, all choices of a
    MultiDiscrete side by side); masked actions get probability 0 in inference and in the
    loss. Empty: never mask."""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """MLP hidden layer widths."""
    cnn_channels: tuple[int, ...] = (16,)
    """Channels of the small-grid CNN's unpadded 3x3 conv layers, one entry per layer, for
    images under 36 pixels a side (MinAtar's, a board game's; larger frames get the Nature
    CNN). Each layer trims a cell from every side of the grid and widens what one feature
    sees: two layers see 5x5 windows."""
    lstm: bool = False
    """Add an LSTM core; its per-(actor, env) state lives on the learner."""
    lstm_size: int = 128
    """LSTM hidden size when --lstm is on."""

    # training
    unroll_length: int = 20
    """T: transitions per unroll; consecutive unrolls of a slot share one frame."""
    batch_size: int = 64
    """Unrolls per learner step. A small model's step is mostly per-op overhead, so a
    larger batch costs less CPU per frame and leaves more to the actors."""
    updates_per_batch: int | None = None
    """Optimizer steps on each batch (K): every step recomputes the loss with the current
    weights and V-trace corrects for the policy having moved since acting, so a batch
    teaches more before it is dropped, at K times the training compute per frame. Unset:
    the agent's own, 1 but for V-trace on a MultiDiscrete action, which takes 4 under PPO's
    clip (--policy-clip; docs/learning.md, suite structured)."""
    learning_rate: float = 4e-3
    """Adam learning rate. This high only with the bound on each step (--max-update-kl): at
    this rate without it a policy that had just solved its task was often thrown off within
    a few dozen updates, since Adam takes full-sized steps on the gradients left once every
    episode ends alike (docs/stability.md); the presets set their own."""
    adam_eps: float = 1e-5
    """Adam epsilon."""
    discount: float = 0.99
    """Discount factor gamma."""
    entropy_cost: float = 0.001
    """Weight of the entropy bonus. Once every episode of a solved task ends alike the
    advantages vanish and only this bonus moves the policy, towards acting at random, to
    the edge of failing (docs/stability.md): hence small by default."""
    final_entropy_cost: float | None = None
    """Entropy bonus at --total-frames frames trained on: when set, the weight moves linearly
    from --entropy-cost to this over the run, so a bonus large enough to explore early
    does not hold back the policy late (Pong: docs/learning.md); unset keeps it constant."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip of each optimizer (losses are per-frame means, so PPO-sized
    clips fit); an agent may leave its optimizers unclipped (--agent sac does)."""
    lr_schedule: str = "auto"
    """Learning rate over the run: constant; linear (from --learning-rate down to 0 at
    --total-frames frames trained on, a replayed frame counted once, as IMPALA and
    TorchBeast anneal it); or inverse_sqrt (--learning-rate for --lr-hold-frames frames
    trained on, then falling as the inverse square root of the frames, with no end in
    view). auto is linear for a run planned to
    --total-frames without --target-return, else inverse_sqrt: at a constant rate, Adam
    keeps moving a solved policy by full-sized steps on gradients that are mostly noise
    until it loses what it learned (docs/stability.md)."""
    lr_hold_frames: int = 1_000_000
    """Trained frames an inverse_sqrt --lr-schedule keeps --learning-rate for; after F
    frames the rate is --learning-rate x sqrt(this / F) (half at 4x, a quarter at 16x)."""
    lr_decay_start: float = 0.0
    """Share of --total-frames a linear --lr-schedule holds --learning-rate before it starts
    to fall (still to 0 at --total-frames), so the rate stays up through the climb and
    anneals only at the end (Pong: docs/learning.md); 0 falls from the start."""
    reward_scale: float = 1.0
    """Multiply training rewards by this (before clipping); episode returns stay raw."""
    reward_clip: float | None = None
    """Clip training rewards to [-x, x] (Atari uses 1); episode returns stay raw."""
    normalize_observations: bool = False
    """Normalize observations by the running mean and variance of every frame the learner
    serves (kept on the learner, saved in checkpoints, applied by evaluate); each unroll
    keeps the normalized frames it was acted on, so training sees what inference saw. A
    dict/tuple observation: each float vector leaf by its own statistics, the others as
    they are."""
    normalize_returns: bool = True
    """Divide training rewards (after scale and clip) by a running std of the discounted
    return, clipped to [-10, 10], as PPO's VecNormalize does: a new env's reward scale is
    unknown, and on raw rewards the defaults lost a solved policy or never learned on some
    seeds. Presets of known reward scale turn it off."""
    train: bool = True
    """Train the policy (off: inference only, for benchmarks; ``python -m learner serve``
    serves a checkpoint's policy so)."""
    greedy: bool = False
    """Serve each row's most likely action (a Gaussian's mean) instead of a sample, as
    ``evaluate`` plays by default; only without training (--no-train, ``python -m learner
    serve --greedy``): V-trace and the replay learn from sampled behaviour."""
    trainer: str = "auto"
    """Where the learner step runs: process (a child process with its own GIL; weights
    reach inference through shared memory), thread (beside the event loop, on the model
    inference uses), device (a thread on its own CUDA stream with a second copy of the
    weights on the device for inference, refreshed by one device-to-device copy: no host
    round trip), or auto (device on CUDA, process on the CPU; thread for torchrun ranks,
    whose process group lives in the learner)."""
    precision: str = "fp32"
    """Arithmetic of the forward pass and loss: fp32, bf16 (autocast; the weights and the
    optimizer stay fp32), or auto (bf16 on CUDA, fp32 elsewhere). fp32 by default: on a GPU
    the shipped networks are too small for bf16 to pay for its casts; a CPU with native bf16
    instructions (AVX-512 BF16, AMX) trains the CNNs faster in bf16, the MLP slower."""

    # league (self-play: read only for two-player games; docs/self-play.md)
    snapshot_every: int = 1000
    """Learner steps between frozen snapshots of the learning policy in the opponent pool."""
    pool_size: int = 20
    """Snapshots kept in the opponent pool (the oldest evicted; the newest always kept);
    each is a CPU copy of the model's weights."""
    opponent_sampling: str = "pfsp"
    """How an episode's opponent is picked from the pool: latest (the newest snapshot),
    uniform, or pfsp (AlphaStar's prioritized fictitious self-play: the snapshots the
    learner loses to most are played most)."""
    pfsp_exponent: float = 2.0
    """p in pfsp's weight (1 - P[learner beats the snapshot])^p; larger focuses harder on
    the snapshots that still beat the learner (0: uniform)."""
    fixed_opponents: tuple[str, ...] = ()
    """Scripted opponents that stay in the pool for good beside the snapshots: random,
    heuristic (Connect Four: win if it can, block if it must) or module:callable (a
    function from the agent's observation dict to an action); drawn by the same rule as
    the snapshots and rated with them."""
    fixed_opponent_share: float | None = None
    """The chance that an episode's opponent is one of the fixed opponents (picked among
    them by the same rule), the rest going to the snapshots; unset, fixed opponents and
    snapshots are drawn together by one rule. A floor keeps the scripted player whose
    tactic the learner still misses in its games once the snapshots outnumber it."""

    # population (population-based training; docs/pbt.md)
    population: int = 1
    """Members trained side by side in this learner (population-based training): each its
    own network, optimizer, trainer and hyperparameters, served in the same batched
    forward passes grouped by member, the env slots shared out evenly among them. 1: one
    policy, no population."""
    pbt_interval: int = 100_000
    """Frames of a member's own between its exploit/explore checks: when its recent return
    ranks in the bottom --pbt-fraction, it copies a top member (weights, optimizer state,
    normalisers) and perturbs the copy's hyperparameters."""
    pbt_fraction: float = 0.25
    """Truncation selection: the share of the population at the bottom that copies a
    member of the same share at the top (at least one member each)."""
    pbt_params: tuple[str, ...] = ("learning_rate", "entropy_cost")
    """Hyperparameters an exploit perturbs and the members start spread over: any of
    learning_rate, entropy_cost, baseline_cost, max_grad_norm (each within its bounds,
    docs/pbt.md)."""
    pbt_resample: float = 0.25
    """Chance that a perturbed hyperparameter is drawn afresh within its bounds
    (log-uniform) rather than multiplied by 0.8 or 1.2."""
    pbt_start: tuple[str, ...] = ()
    """Members' starting values, ``param=v0:v1:...`` (one value per member) for each param
    listed; a --pbt-params param not listed starts at its flag's value in member 0 and
    perturbed once in each other member."""

    # serving
    inference_batch_size: int = 64
    """Run a forward pass once this many frames are pending ..."""
    inference_timeout_ms: float = 12.0
    """... or this long after the first pending frame arrived, whichever is first.
    Longer: bigger batches, so less learner CPU per frame, when many CPU-starved actors
    trickle in; shorter: less wait behind a silent actor when few streams are open."""
    inference_quorum: float = 0.9
    """... or once this share of the open streams has a frame pending (rounded up: with
    up to 9 streams, all of them). Below 1, a few slow or silent actors among many do not
    hold every batch to the timeout."""
    inference_backend: str = "auto"
    """Inference's forward pass: auto (numpy for a feed-forward MLP on the CPU, which skips
    torch's per-op dispatch, which dominates a small batch; torch
    otherwise), torch, or numpy (an error for models it cannot run). See learner.agents.policy."""
    max_queue_unrolls: int = 256
    """Finished unrolls waiting for the trainer; when full, inference waits (back-pressure)."""
    time_phases: bool = False
    """Time the serving phases on the event loop (decode, batch assembly, forward,
    trajectory write, trainer hand-off, reply) and write their running totals to
    metrics.jsonl as ``phase_s/<phase>``, to see where the learner's CPU per frame goes
    (``python -m benchmarks.loadgen``). Off by default: every boundary reads the clock."""
    frame_once: bool = True
    """For envs whose observations stack frames (Atari): actors send only the newest
    frame, the learner keeps each slot's stack and stores single frames. Off: whole
    stacks travel and are stored (what envs that stack their own way always do)."""
    uvloop: bool = True
    """Serve on uvloop's event loop (libuv, in Cython) rather than asyncio's own: with one
    env per message most serving work is loop machinery, which uvloop runs cheaper. Off,
    or where uvloop is not installed: asyncio's loop."""
    serving_processes: str = SERVING_AUTO
    """Frontend processes that serve the actors' gRPC streams (one port, SO_REUSEPORT),
    handing frames to this process through a shared-memory slot table so the process
    that owns the model pays no per-message work (docs/serving-tier.md). 0: one process
    serves and runs the model. auto: from the host's usable cores, none below 4 (there
    the extra hop costs more than the spread gives), else a frontend per two cores beyond
    two, at most 8; and none for a run the frontends cannot serve (a unix --bind path
    too long for their sockets beside it), which an explicit number refuses, or whose
    slot table and rings would not fit the free /dev/shm."""
    max_actors: int = 1024
    """Actor streams served at once, those still awaiting their Hello included; more get
    RESOURCE_EXHAUSTED and retry."""
    max_envs: int = 16384
    """Envs (trajectory slots) across all admitted streams; bounds the learner's memory
    (each slot holds T+1 observations), so one Hello cannot claim gigabytes."""
    actor_envs_per_actor: int = 0
    """K the learner advises its actors in GetInfo: an actor given no --envs-per-actor of
    its own steps K envs per stream (presets set the K they were measured with). 0: no
    advice; actors step 1."""
    max_message_bytes: int = 16 * 1024 * 1024
    """Largest gRPC message accepted, in bytes."""
    max_connections: int = 2048
    """TCP connections served at once (the actors of one process share one); more are
    closed as they arrive. Held under half the learner's open-file limit, so a flood of
    connections always leaves descriptors for checkpoints, logs and metrics."""
    handshake_timeout_s: float = 10.0
    """A connection that has not begun HTTP/2 (and TLS, when on) this many seconds after it
    was accepted is closed: a socket that sends nothing holds a descriptor no longer."""
    connection_idle_timeout_s: float = 60.0
    """A connection with no call open for this many seconds is closed (GOAWAY; a client
    reconnects when it next calls), so one that never starts a stream is let go (0: never)."""
    max_envs_per_peer: int = 0
    """Envs one peer (an IP address; every unix-socket actor counts as one peer) may hold
    across its streams, so one client cannot take every env slot; more get
    RESOURCE_EXHAUSTED. 0: half of --max-envs (set it to --max-envs for one actor host
    that needs every slot)."""
    hello_timeout_s: float = 30.0
    """An Act stream must send its Hello within this many seconds, or it ends with
    DEADLINE_EXCEEDED: a connection that never says who it is holds no server resources
    for long (0: wait for ever)."""
    stream_idle_timeout_s: float = 120.0
    """An admitted stream whose actor sends no frame for this many seconds after its last
    reply ends with DEADLINE_EXCEEDED, freeing its place and its K env slots (a live but
    stuck actor; a dead host is dropped sooner by the keepalive). Time the stream waits
    for the learner does not count. Raise it for envs whose step or reset takes longer
    (0: never)."""
    auth_token: str | None = dataclasses.field(default=None, repr=False)
    """Shared token every call must carry (default: --auth-token-file, else
    $SEEDRL_AUTH_TOKEN); None disables it. On the command line every user of this host
    sees it in the process list: prefer the file or the variable. Never written down."""
    auth_token_file: str | None = None
    """File holding the shared token (as Kubernetes and compose mount secrets); its
    surrounding whitespace is ignored."""
    tls_cert: str | None = None
    """PEM server certificate; with --tls-key turns TLS on."""
    tls_key: str | None = None
    """PEM server private key."""
    tls_client_ca: str | None = None
    """PEM CA that client certificates must chain to (mutual TLS); optional."""
    insecure: bool = False
    """Serve a non-loopback --bind with neither a token nor client certificates: anyone who
    reaches the port can take actor places and read the env spec (trusted networks only)."""

    # checkpointing, stopping and logging
    total_frames: int = 0
    """Stop after this many env frames (0: no limit)."""
    target_return: float | None = None
    """Stop once the mean return of the last 100 episodes reaches this."""
    max_seconds: float = 0.0
    """Stop after this much wall time (0: no limit)."""
    checkpoint_interval_s: float = 60.0
    """Seconds between checkpoints (one is also written at the end and on SIGTERM/SIGINT)."""
    checkpoint_history_frames: int = 0
    """Also keep the first checkpoint past each multiple of this many frames, as
    logdir/checkpoints/frames-N.pt (0: only the latest), to evaluate or resume a run's
    earlier policies, e.g. from before a collapse."""
    best_checkpoint_interval_s: float = 10.0
    """Keep logdir/checkpoint-best.pt, the checkpoint of the best mean return of the last
    100 episodes so far (in self-play with --fixed-opponents: of the best score against
    them), rewritten at most this often while it climbs: a run left on past its best ends
    with that policy at hand (0: keep no best checkpoint)."""
    replay_checkpoint: bool = True
    """An agent with a replay (R2D2): write the replay beside each checkpoint
    (logdir/replay.npz, about the bytes the replay holds, up to --replay-bytes) and take it
    back on --resume, so a resumed run trains on at once; off for a replay too large to
    write at every checkpoint (a resumed run then refills it to --replay-min-frames)."""
    replay_checkpoint_interval_s: float = 600.0
    """An agent with a replay, with --replay-checkpoint: write the replay with a periodic
    checkpoint at most this often (0: with every one); an Atari replay is GiBs, too much
    for the disk and cores to take every --checkpoint-interval-s. The final checkpoint
    always writes it; a killed run resumes on the replay of its last write."""
    resume: bool = False
    """Continue from logdir/checkpoint.pt when it exists."""
    standby: str = ""
    """Run as the standby of the learner serving at this HOST:PORT: serve nothing, watch its
    health, and once it has answered and then stopped for --standby-grace-s, take over:
    resume from the newest checkpoint in --logdir (the primary's, on a shared disk) and
    serve on --port. A learner whose logdir names another live leader also waits as its
    standby. Empty: serve at once."""
    standby_grace_s: float = 5.0
    """How long the primary must fail its health checks before the standby takes over; a
    primary restarting in place (SIGKILL and --resume) within it keeps its place."""
    standby_tls_ca: str | None = None
    """PEM CA of the primary's certificate, when the primary serves TLS (for --standby)."""
    log_interval_s: float = 2.0
    """Seconds between metrics.jsonl lines and progress updates."""
    progress: str = "auto"
    """Live progress: auto (bar on a terminal, plain lines otherwise), bar, plain, off."""
    tensorboard: bool = True
    """Write TensorBoard event files into logdir."""
    metrics_port: int = 0
    """Serve Prometheus /metrics on this port (on --metrics-bind's address); 0: off."""
    metrics_bind: str = "127.0.0.1"
    """Address the /metrics endpoint listens on. It has no authentication (a token or TLS
    protects the gRPC port only), so a non-loopback address also needs --metrics-insecure."""
    metrics_insecure: bool = False
    """Let --metrics-bind be a non-loopback address: anyone who reaches the port reads the
    run's metrics (keep it on a network you trust, e.g. behind a NetworkPolicy)."""
    log_episodes: bool = True
    """Append one JSON line per finished episode (frames, elapsed_s, return, length) to
    logdir/episodes.jsonl, as SB3's Monitor does, so the plotted learning curve starts at
    the first episode; off for envs whose episodes end so often that the file grows fast."""
    record_dataset: str = ""
    """Write the training stream's finished episodes to a Minari dataset in this directory,
    whose last part (NAME-vN) is the dataset id (``pip install -e '.[dataset]'``); empty: off."""
    record_every: int = 1
    """With --record-dataset: keep one finished episode in this many."""
    wandb: bool = False
    """Also log to Weights & Biases (``pip install -e '.[wandb]'``): the resolved config
    without secrets, and every metric as a curve over frames."""
    wandb_project: str = "seedrl"
    """W&B project of the run (with --wandb)."""
    wandb_entity: str | None = None
    """W&B team or user the run belongs to (default: the logged-in user's)."""
    wandb_mode: str = "online"
    """online (sync to the W&B server as the run goes) or offline (write the run under
    logdir/wandb with no network; upload it later with ``wandb sync``)."""

    agent_options: AgentOptions | None = dataclasses.field(default=None, metadata={OPTIONS: True})
    """The chosen agent's own knobs: the :class:`AgentOptions` its package declares, made
    from the knobs given by name beside the fields (``LearnerConfig(agent="r2d2",
    epsilon=0.3)``, ``dataclasses.replace(config, epsilon=0.3)``)."""

    def __init__(self, **values: Any) -> None:
        """The fields by name, as a dataclass takes them, and the chosen agent's knobs by
        name, which go into ``agent_options``: a knob of another agent is a ValueError
        naming its flag and its agent."""
        for f in dataclasses.fields(self):
            object.__setattr__(
                self, f.name, values.pop(f.name) if f.name in values else _default(f)
            )
        options = _agent_options(self.agent, self.agent_options, values)
        object.__setattr__(self, "agent_options", options)
        self.__post_init__()

    def __post_init__(self) -> None:
        for check in SECTION_CHECKS:
            check(self)
        if self.agent_options is not None:
            self.agent_options.check(self)

    def __getattr__(self, name: str) -> Any:
        """A knob of the chosen agent, read as if it were a field (``config.burn_in``)."""
        options = self.__dict__.get("agent_options")
        if name.startswith("_"):  # pickle and copy probe dunders before __dict__ is filled
            raise AttributeError(name)
        if options is not None and name in knob_names(type(options)):
            return getattr(options, name)
        owners = [a for a, cls in agent_sections().items() if name in knob_names(cls)]
        if owners:
            raise AttributeError(
                f"{name} is a knob of --agent {' and '.join(owners)}; this config's --agent "
                f"is {self.__dict__.get('agent')}"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def with_changes(self, **changes: Any) -> LearnerConfig:
        """``dataclasses.replace(self, **changes)``, knobs of the agent included, in a form
        type checkers take (they know only the fields, not an agent's knobs)."""
        return dataclasses.replace(self, **changes)

    @property
    def serving_frontends(self) -> int | None:
        """--serving-processes as a number; None while it reads auto (the learner
        resolves that from its host before it serves: learner/serving/auto.py)."""
        return serving_count(self.serving_processes)

    @property
    def offers_local_socket(self) -> bool:
        """Whether the learner listens on a same-host unix socket of its own and offers it
        (--local-socket, never beside TLS: the socket is plaintext)."""
        return self.local_socket and not self.tls_cert

    @property
    def effective_lr_schedule(self) -> str:
        """``lr_schedule`` with ``auto`` resolved: linear when a frame budget is the plan,
        else inverse_sqrt (a run of unknown length)."""
        if self.lr_schedule != "auto":
            return self.lr_schedule
        return "linear" if self.total_frames and self.target_return is None else "inverse_sqrt"

    @property
    def effective_max_update_kl(self) -> float | None:
        """The bound on how far one optimizer step may move the agent's policy (the
        agent's options resolve it); None when nothing bounds the step."""
        return None if self.agent_options is None else self.agent_options.effective_max_update_kl

    @property
    def envs_per_peer(self) -> int:
        """``max_envs_per_peer`` with 0 resolved: half of --max-envs (at least one env)."""
        return self.max_envs_per_peer or max(1, self.max_envs // 2)

    @property
    def checkpoint_path(self) -> Path:
        return Path(self.logdir) / "checkpoint.pt"

    @property
    def replay_path(self) -> Path:
        """The replay saved with checkpoint.pt (--replay-checkpoint)."""
        return Path(self.logdir) / "replay.npz"

    @property
    def best_checkpoint_path(self) -> Path:
        """The checkpoint of the best mean-100 return so far (--best-checkpoint-interval-s)."""
        return Path(self.logdir) / "checkpoint-best.pt"

    def history_checkpoint_path(self, frames: int) -> Path | None:
        """Where the checkpoint at ``frames`` is kept for good: the multiple of
        --checkpoint-history-frames it is the first past; None when history is off."""
        every = self.checkpoint_history_frames
        if not every:
            return None
        return Path(self.logdir) / "checkpoints" / f"frames-{frames // every * every}.pt"


def _check_run(config: LearnerConfig) -> None:
    require_range(config, ("port",), low=0, high=65535)
    require_range(config, ("seed", "torch_threads"), low=0)


DEFAULT_POLICY = "*"
"""The agent id in --policy-mapping that stands for every agent not listed."""


def policy_pairs(config: LearnerConfig) -> list[tuple[str, str]]:
    """--policy-mapping as (agent id, policy) pairs, in the order given."""
    return [tuple(item.split("=", 1)) for item in config.policy_mapping]  # type: ignore[misc]


def _check_policies(config: LearnerConfig) -> None:
    if not config.policy_mapping:
        return
    seen: set[str] = set()
    for item in config.policy_mapping:
        agent, _, policy = item.partition("=")
        if not agent or not policy or "=" in policy:
            raise ValueError(f"--policy-mapping takes agent_id=policy items, got {item!r}")
        if agent in seen:
            raise ValueError(f"--policy-mapping names agent {agent!r} twice")
        seen.add(agent)
    if config.self_play:
        raise ValueError(
            "--policy-mapping and --self-play: several trained policies do not play a league"
        )


def pbt_start_values(config: LearnerConfig) -> dict[str, tuple[float, ...]]:
    """--pbt-start as param -> one starting value per member."""
    starts: dict[str, tuple[float, ...]] = {}
    for item in config.pbt_start:
        name, _, values = item.partition("=")
        starts[name] = tuple(float(v) for v in values.split(":"))
    return starts


def _check_population(config: LearnerConfig) -> None:
    require_range(config, ("population", "pbt_interval"), low=1)
    require_range(config, ("pbt_fraction",), low=0, high=0.5, low_open=True)
    require_range(config, ("pbt_resample",), low=0, high=1)
    unknown = [name for name in config.pbt_params if name not in PBT_BOUNDS]
    if unknown:
        raise ValueError(
            f"--pbt-params: {unknown[0]!r} is not one population-based training perturbs; "
            f"choose among {', '.join(PBT_BOUNDS)}"
        )
    try:
        starts = pbt_start_values(config)
    except ValueError:
        raise ValueError(
            f"--pbt-start takes param=v0:v1:... items of numbers, got {config.pbt_start}"
        ) from None
    for name, values in starts.items():
        if name not in config.pbt_params:
            raise ValueError(f"--pbt-start sets {name!r}, which --pbt-params does not list")
        if len(values) != config.population:
            raise ValueError(
                f"--pbt-start gives {name!r} {len(values)} values for a --population of "
                f"{config.population}"
            )
        low, high = PBT_BOUNDS[name]
        if not all(low <= v <= high for v in values):
            raise ValueError(f"--pbt-start: {name!r} values must lie in [{low:g}, {high:g}]")
    if config.population == 1:
        return
    refused = (
        ("--policy-mapping", bool(config.policy_mapping)),
        ("--self-play", config.self_play),
        (f"--trainer {config.trainer}", config.trainer not in ("auto", "thread")),
    )
    for flag, given in refused:
        if given:
            raise ValueError(
                f"--population trains its members in threads of the learner process: drop {flag}"
            )


def _check_model(config: LearnerConfig) -> None:
    require_range(config, ("lstm_size", "hidden_sizes", "cnn_channels"), low=1)
    if not config.hidden_sizes:
        raise ValueError("--hidden-sizes needs at least one layer width")
    if not config.cnn_channels:
        raise ValueError("--cnn-channels needs at least one layer")
    require_choice(config, "model", ("auto", "mlp", "cnn", "resnet"))


def _check_training(config: LearnerConfig) -> None:
    require_range(config, ("unroll_length", "batch_size", "updates_per_batch"), low=1)
    require_range(config, ("entropy_cost", "final_entropy_cost"), low=0)
    require_range(
        config, ("learning_rate", "adam_eps", "max_grad_norm", "reward_scale", "reward_clip"),
        low=0, low_open=True,
    )  # fmt: skip
    require_range(config, ("discount",), low=0, high=1)
    if config.greedy and config.train:
        raise ValueError("--greedy serves a policy without training it: add --no-train")
    require_choice(config, "trainer", TRAINER_MODES)
    require_choice(config, "precision", PRECISIONS)
    require_choice(config, "lr_schedule", LR_SCHEDULES)
    if config.lr_schedule == "linear" and not config.total_frames:
        raise ValueError("--lr-schedule linear needs --total-frames (it decays to 0 there)")
    require_range(config, ("lr_decay_start",), low=0, high=1, high_open=True)
    if config.lr_decay_start and config.effective_lr_schedule != "linear":
        raise ValueError(
            "--lr-decay-start shapes a linear schedule; this run's is "
            f"{config.effective_lr_schedule}"
        )
    require_range(config, ("lr_hold_frames",), low=1)
    if config.final_entropy_cost is not None and not config.total_frames:
        raise ValueError("--final-entropy-cost needs --total-frames (it is reached there)")


def _check_league(config: LearnerConfig) -> None:
    require_range(config, ("snapshot_every", "pool_size"), low=1)
    require_range(config, ("pfsp_exponent",), low=0)
    require_range(config, ("fixed_opponent_share",), low=0, high=1)
    require_choice(config, "opponent_sampling", OPPONENT_SAMPLING)
    if config.fixed_opponent_share is not None and not config.fixed_opponents:
        raise ValueError("--fixed-opponent-share needs --fixed-opponents")


def _check_serving(config: LearnerConfig) -> None:
    require_range(
        config,
        ("inference_batch_size", "max_queue_unrolls", "max_actors", "max_envs",
         "max_message_bytes", "max_connections"),
        low=1,
    )  # fmt: skip
    require_range(
        config,
        ("inference_timeout_ms", "hello_timeout_s", "stream_idle_timeout_s",
         "connection_idle_timeout_s", "max_envs_per_peer", "actor_envs_per_actor"),
        low=0,
    )  # fmt: skip
    count = serving_count(config.serving_processes)
    if count is not None:  # one spelling, so config.json and the refusals read "2"
        object.__setattr__(config, "serving_processes", str(count))
    require_range(config, ("handshake_timeout_s",), low=0, low_open=True)
    require_range(config, ("inference_quorum",), low=0, high=1, low_open=True)
    require_choice(config, "inference_backend", INFERENCE_BACKENDS)
    if (config.tls_cert is None) != (config.tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    _require_one_token_source(config)
    if config.tls_client_ca is not None and config.tls_cert is None:
        raise ValueError("--tls-client-ca needs --tls-cert and --tls-key (it is a TLS option)")
    replay = config.agent_options is not None and config.agent_options.replay
    if not replay and config.max_queue_unrolls < config.batch_size:  # a replay feeds no queue
        raise ValueError(
            f"--max-queue-unrolls ({config.max_queue_unrolls}) must be >= --batch-size "
            f"({config.batch_size}) or the trainer could never fill a batch"
        )


def _check_checkpointing(config: LearnerConfig) -> None:
    require_range(config, ("record_every",), low=1)
    require_range(config, ("metrics_port",), low=0, high=65535)
    require_range(
        config,
        ("total_frames", "max_seconds", "checkpoint_history_frames",
         "best_checkpoint_interval_s", "replay_checkpoint_interval_s"),
        low=0,
    )  # fmt: skip
    require_range(
        config, ("checkpoint_interval_s", "log_interval_s", "standby_grace_s"),
        low=0, low_open=True,
    )  # fmt: skip
    require_choice(config, "progress", ("auto", "bar", "plain", "off"))
    require_choice(config, "wandb_mode", WANDB_MODES)


SECTION_CHECKS: tuple[Callable[[LearnerConfig], None], ...] = (
    _check_run, _check_policies, _check_population, _check_model, _check_training,
    _check_league, _check_serving, _check_checkpointing,
)  # fmt: skip
"""The learner's checks, one per section; the agent's own run after them."""


@dataclasses.dataclass(frozen=True)
class ActorConfig:
    """One actor launcher: N actors, each stepping K envs over one stream, in a few processes."""

    learner: str = "127.0.0.1:8686"
    """Learner address HOST:PORT (or unix:PATH); with several learner ranks, rank 0's
    address (the rest come from GetInfo) or a comma-separated list (actor i -> entry i mod n)."""
    fallback_learner: str = ""
    """Standby learners to fail over to (comma-separated HOST:PORT): when the learner in use
    is gone (unreachable after the reconnect backoff), the actor tries the next address in
    turn, wrapping around. Not part of --learner, whose list names ranks that all train at once."""
    num_actors: int = 1
    """N: actors to run, each with its own stream and K envs (see --actors-per-process)."""
    actors_per_process: int = 0
    """How many actors share one process, each on its own thread (their streams wait in
    gRPC with the GIL released). 0: auto, one per process up to PROCESSES_PER_CPU (4)
    processes per CPU the launcher may use, and the rest spread over those (threads share
    one set of pages in the CPU caches, processes each bring their own)."""
    envs_per_actor: int = 0
    """K: environments each actor steps and sends in one message. 0: the K the learner
    advises in GetInfo (its preset's, ``--actor-envs-per-actor``), else 1."""
    env_groups: int = 1
    """G: split the K envs into G groups, each on its own stream, so one group steps its
    envs while the others wait for actions (Sample Factory's double buffering); K % G == 0."""
    seed: int = 0
    """Base env seed; actor i seeds its envs from seed + i * K."""
    actor_id: str = ""
    """Name prefix for actor ids (default: hostname-pid)."""
    first_index: int = 0
    """Index of the first actor (seeds, ids, learner rank), for several launchers on one
    learner; -1 picks a random one, for identical replicas (compose --scale, Kubernetes)."""
    auth_token: str | None = dataclasses.field(default=None, repr=False)
    """Shared token (default: --auth-token-file, else $SEEDRL_AUTH_TOKEN); visible in the
    process list when given here."""
    auth_token_file: str | None = None
    """File holding the shared token; its surrounding whitespace is ignored."""
    allow_env_module: tuple[str, ...] = dataclasses.field(default=(), metadata={REPEATABLE: True})
    """Modules whose ``module:callable`` envs this host builds when the learner names one
    (a module allows its submodules too), or exact env ids; repeatable. A learner's env id
    is code to run here: without this, only registered gymnasium ids are built."""
    tls_ca: str | None = None
    """PEM CA to verify the learner's certificate; turns TLS on."""
    tls_server_name: str | None = None
    """Override the TLS server name checked against the certificate."""
    tls_cert: str | None = None
    """PEM client certificate, for a learner that demands one (--tls-client-ca)."""
    tls_key: str | None = None
    """PEM private key of --tls-cert."""
    local_socket: bool = True
    """Use the unix socket a learner on this host offers (when --learner is a loopback
    address or a unix socket: a serving frontend's own), falling back to the address
    dialled if it cannot connect."""
    max_backoff_s: float = 30.0
    """Cap of the exponential reconnect backoff (with jitter)."""
    exit_on_shutdown: bool = False
    """Exit when the learner stops for a restart, instead of waiting to reconnect."""
    max_frames: int = 0
    """Stop each actor after this many frames (0: until the learner finishes)."""
    stats_dir: str = ""
    """Directory for the actors' round-trip records: each process appends one JSON line
    per stream (frames, round-trip p50/p99/mean ms, RSS) to ``actor-<pid>.jsonl`` there
    when the stream ends (empty: none). The round trips are timed always."""
    nice: int = 0
    """Add this to the actor processes' niceness (0-19): with many more actors than cores on
    the learner's host, the learner then keeps the CPU share it needs to serve them."""
    sched_batch: bool = True
    """Run actor processes in Linux's SCHED_BATCH class (no wakeup preemption): many
    actors on one host switch less and leave the learner its slices."""
    pin_cpus: str = "off"
    """Pin each actor process the launcher starts to one CPU, round robin over the CPUs
    the launcher may use: on, off, or auto (on when the number of processes is a multiple
    of those CPUs, so every CPU gets as many; off for a lone replica on a bigger host).
    For hosts that run only actors: a pinned actor never migrates into cold caches. Off
    by default: on a small shared host it saved nothing dependable."""
    cpu: int = -1
    """The CPU the actor processes run on (-1: any); the launcher sets it per process from
    --pin-cpus."""
    restart: bool = True
    """Restart what crashes: the launcher its actor processes, a process its actor threads."""
    start_method: str = "fork" if hasattr(os, "fork") else "exec"
    """How the launcher starts actor processes: fork (from the launcher once it has
    imported what an actor runs, so every actor shares those memory pages and the CPU
    caches hold one copy: faster round trips and less memory per actor) or exec (a fresh
    ``python -m actors actor`` each)."""

    def __post_init__(self) -> None:
        require_choice(self, "start_method", START_METHODS)
        if self.start_method == "fork" and not hasattr(os, "fork"):
            raise ValueError("--start-method fork needs os.fork (not on this platform)")
        require_range(self, ("num_actors",), low=1)
        require_range(self, ("actors_per_process", "seed", "max_frames", "envs_per_actor"), low=0)
        require_range(self, ("first_index",), low=-1)
        require_range(self, ("max_backoff_s",), low=0, low_open=True)
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        if self.tls_cert is not None and self.tls_ca is None:
            raise ValueError("--tls-cert needs --tls-ca (the CA that signed the learner's cert)")
        _require_one_token_source(self)
        require_choice(self, "pin_cpus", PIN_CPUS_MODES)
        if self.cpu < -1:
            raise ValueError(f"--cpu must be a CPU number or -1 (any), got {self.cpu}")
        require_range(self, ("nice",), low=0, high=19)
        if self.env_groups > 1 and not self.envs_per_actor:
            # The groups split K before any learner is asked what K it advises.
            raise ValueError("--env-groups needs --envs-per-actor (the K it splits)")
        if self.env_groups < 1 or self.envs_per_actor % self.env_groups:
            raise ValueError(
                f"--env-groups must be >= 1 and divide --envs-per-actor "
                f"({self.envs_per_actor}), got {self.env_groups}"
            )


PIN_CPUS_MODES = ("auto", "on", "off")
"""The values of ``--pin-cpus`` (see :func:`actor_cpus`)."""
START_METHODS = ("fork", "exec")
"""The values of ``--start-method``."""


def _require_one_token_source(config: Any) -> None:
    if config.auth_token and config.auth_token_file:
        raise ValueError("--auth-token and --auth-token-file: give one of them")


def to_json_dict(config: Any) -> dict[str, Any]:
    """A JSON-friendly dict of a config (tuples become lists), :data:`SECRET_FIELDS` left
    out: this is what goes into ``config.json`` and checkpoints. A section of knobs (the
    agent's options) is written flat beside the fields, as the knobs are given."""
    data = dataclasses.asdict(config)
    for f in dataclasses.fields(config):
        if f.metadata.get(OPTIONS):
            data.update(data.pop(f.name) or {})
    data = {k: v for k, v in data.items() if k not in SECRET_FIELDS}
    return json.loads(json.dumps(data))
