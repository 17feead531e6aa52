"""Run configuration: frozen dataclasses, one attribute docstring per field.

The dataclasses are the single source of truth: the command line is generated from them
(:mod:`seedrl.cli`), presets and config files fill them (:mod:`seedrl.presets`), and the
resolved config is saved as JSON in the learner's log directory.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

AUTH_TOKEN_ENV = "SEEDRL_AUTH_TOKEN"
SECRET_FIELDS = frozenset({"auth_token"})
"""Fields never written down or sent anywhere: left out of ``config.json``, checkpoints,
``repr`` and a W&B run, and never put on a command line another process builds (other
users see those in ``ps``)."""
REPEATABLE = "repeatable"
"""Field metadata key: the flag may be given several times, each adding to the tuple."""
INFERENCE_BACKENDS = ("auto", "torch", "numpy")
TRAINER_MODES = ("auto", "process", "thread", "device")
AGENTS = ("vtrace", "r2d2")
PRECISIONS = ("auto", "fp32", "bf16")


LR_SCHEDULES = ("auto", "constant", "linear", "inverse_sqrt")
DEFAULT_MAX_UPDATE_KL = 1e-4
"""V-trace's bound on each step when --max-update-kl is unset (docs/stability.md)."""
LOG_STD_RANGE = (-5.0, 2.0)
"""Where a Gaussian policy's log-std is kept (the learner projects it back after each step)."""
WANDB_MODES = ("online", "offline")
OPPONENT_SAMPLING = ("latest", "uniform", "pfsp")
"""How self-play picks an episode's opponent from the pool of past selves."""


def flag_name(field: str) -> str:
    """The command-line flag of a config field (``lambda_`` -> ``--lambda``)."""
    return "--" + field.rstrip("_").replace("_", "-")


def _require_choice(config: Any, name: str, choices: Sequence[str]) -> None:
    """ValueError unless ``config.<name>`` is one of ``choices`` ("x must be a, b or c")."""
    value = getattr(config, name)
    if value not in choices:
        allowed = f"{', '.join(choices[:-1])} or {choices[-1]}"
        raise ValueError(f"{flag_name(name)} must be {allowed}, got {value!r}")


def _require_range(
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
class LearnerConfig:
    """Everything the learner process needs; saved as ``config.json`` with each run."""

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
    actors on this host: a unix socket costs less CPU per message than loopback TCP."""
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
    """The learning algorithm: vtrace (IMPALA's V-trace actor-critic) or r2d2 (recurrent
    replay distributed DQN with Ape-X prioritized replay and per-slot epsilon-greedy;
    discrete actions; its presets turn --lstm on). An agent is its network head, action
    choice, what it keeps to train on and its loss (learner/agents/)."""
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

    # learning
    unroll_length: int = 20
    """T: transitions per unroll; consecutive unrolls of a slot share one frame."""
    batch_size: int = 64
    """Unrolls per learner step. A small model's step is mostly per-op overhead, so a
    larger batch costs less CPU per frame and leaves more to the actors."""
    updates_per_batch: int = 1
    """Optimizer steps on each batch (K): every step recomputes the loss with the current
    weights and V-trace corrects for the policy having moved since acting, so a batch
    teaches more before it is dropped, at K times the training compute per frame."""
    mirror: bool = False
    """Train on every unroll twice, as played and as its left-right mirror image (image
    leaves flipped along their width, the action mask and the Discrete action reversed),
    for games whose rules do not change under the flip, such as Connect Four: twice the
    experience per game at twice the training compute. V-trace only."""
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
    baseline_cost: float = 0.5
    """Weight of the value (baseline) loss."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip (losses are per-frame means, so PPO-sized clips fit)."""
    max_update_kl: float | None = None
    """Bound on how far one optimizer step may move the policy: the mean KL divergence, over
    the batch's actions, from the policy before the step to the one after it. A step that
    goes further is shrunk back along its own direction to the bound. Adam's steps keep
    their size when the gradient turns from tiny to large (a solved policy's first
    failures), and such a step can throw the policy far from what it knew
    (docs/stability.md). Unset: 1e-4 for V-trace, the bound the default --learning-rate
    was measured with; 0 bounds nothing (the presets, each tuned without it); R2D2 has no
    policy to bound."""
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
    lambda_: float = 1.0
    """V-trace lambda (trace cutting)."""
    clip_rho_threshold: float = 1.0
    """V-trace rho-bar."""
    clip_pg_rho_threshold: float = 1.0
    """V-trace rho-bar for the policy-gradient advantage."""
    reward_scale: float = 1.0
    """Multiply training rewards by this (before clipping); episode returns stay raw."""
    log_std_init: float = 0.0
    """Starting log-std of a Gaussian policy (Box actions), on every action dimension: 0
    starts with unit noise; lower starts quieter, for robots whose random flailing ends
    episodes early or costs more in control penalty than staying up earns (Ant)."""
    policy_clip: float | None = None
    """PPO's clipped surrogate for the policy term, as Sample Factory's APPO uses it beside
    V-trace's targets: the advantage r + gamma * v_{s+1} - V(x_s) is weighted by the ratio
    of the learner's policy to the one that acted, and a ratio past [1 - x, 1 + x] in the
    advantage's favour stops pulling. Several updates on one batch (--updates-per-batch)
    then cannot carry the policy far from the one that acted, which V-trace's truncated
    weights alone do not stop. Unset: V-trace's own policy gradient."""
    normalize_advantages: bool = False
    """Scale V-trace policy-gradient advantages to zero mean, unit std per batch (helps
    continuous control; IMPALA itself does not)."""
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

    # r2d2 (read only by --agent r2d2)
    burn_in: int = 40
    """R2D2: rows at the start of each replayed sequence that only unroll the LSTM from
    its stored state (no gradient); --unroll-length transitions follow them."""
    sequence_overlap: int = 40
    """R2D2: rows a slot's consecutive sequences share (besides the bootstrap frame); equal
    to --burn-in, every transition is trained in exactly one sequence."""
    n_step: int = 5
    """R2D2: steps of the n-step double-Q target."""
    target_update_interval: int = 2500
    """R2D2: optimizer steps between copies of the online network into the target one."""
    value_rescale_eps: float = 1e-3
    """R2D2: epsilon of the invertible value rescaling h(x) = sign(x)(sqrt(|x|+1)-1)+eps*x."""
    replay_frames: int = 1_000_000
    """R2D2: replay capacity in stored frames (sequences x rows); the oldest go first."""
    replay_bytes: int = 8 * 1024**3
    """R2D2: replay capacity in bytes of stored sequences (Atari frames stored once)."""
    replay_min_frames: int = 20_000
    """R2D2: stored frames before the first learner step."""
    replay_ratio: float = 1.0
    """R2D2: trained frames (sampled sequences x --unroll-length) per inserted frame; the
    learner waits rather than exceed it (0: no limit)."""
    replay_hold_actors: bool = True
    """R2D2: hold inference, and so the actors, back while the trainer is behind
    --replay-ratio by more than the minimum fill and two batches, so a run trains at the
    asked ratio on a slow learner too; off: actors run free and a slow trainer trains on
    fewer samples per frame."""
    replay_checkpoint: bool = True
    """R2D2: write the replay beside each checkpoint (logdir/replay.npz, about the bytes the
    replay holds, up to --replay-bytes) and take it back on --resume, so a resumed run
    trains on at once; off for a replay too large to write at every checkpoint (a resumed
    run then refills it to --replay-min-frames)."""
    replay_checkpoint_interval_s: float = 600.0
    """R2D2 with --replay-checkpoint: write the replay with a periodic checkpoint at most
    this often (0: with every one); an Atari replay is GiBs, too much for the disk and
    cores to take every --checkpoint-interval-s. The final checkpoint always writes it; a
    killed run resumes on the replay of its last write."""
    priority_exponent: float = 0.9
    """R2D2: alpha, sequences are sampled in proportion to priority ** alpha."""
    importance_exponent: float = 0.6
    """R2D2: beta of the importance weights (N * P(i)) ** -beta, normalised by their max."""
    priority_eta: float = 0.9
    """R2D2: a sequence's priority is eta * max|td| + (1 - eta) * mean|td|."""
    epsilon: float = 0.4
    """R2D2: Ape-X base epsilon; slot i explores with epsilon ** (1 + alpha * i / (N - 1))."""
    epsilon_alpha: float = 7.0
    """R2D2: Ape-X alpha of the per-slot epsilon ladder."""
    epsilon_slots: int = 0
    """R2D2: N, rungs of a fixed epsilon ladder, trajectory slot s on rung s mod N; 0: the
    ladder spans the env slots handed out so far, however many actors connect (a fixed
    ladder longer than the slots leaves its near-greedy rungs unused)."""

    # self-play (read only for two-player games; docs/self-play.md)
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
    serving_processes: int = 0
    """Frontend processes that serve the actors' gRPC streams (one port, SO_REUSEPORT),
    handing frames to this process through a shared-memory slot table so the process
    that owns the model pays no per-message work (docs/serving-tier.md). 0: one process
    serves and runs the model, as before."""
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

    # stopping, checkpoints, logging
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

    def __post_init__(self) -> None:
        _require_range(
            self,
            ("unroll_length", "batch_size", "updates_per_batch", "inference_batch_size",
             "max_queue_unrolls", "max_actors", "max_envs", "max_message_bytes", "lstm_size",
             "max_connections",
             "hidden_sizes", "cnn_channels", "n_step", "target_update_interval", "replay_frames",
             "replay_bytes", "snapshot_every", "pool_size", "record_every"),
            low=1,
        )  # fmt: skip
        _require_range(self, ("port", "metrics_port"), low=0, high=65535)
        _require_range(
            self,
            ("seed", "torch_threads", "total_frames", "max_seconds", "inference_timeout_ms",
             "entropy_cost", "final_entropy_cost", "baseline_cost", "checkpoint_history_frames",
             "hello_timeout_s", "stream_idle_timeout_s", "burn_in", "sequence_overlap",
             "connection_idle_timeout_s", "max_envs_per_peer",
             "replay_min_frames", "replay_ratio", "epsilon_alpha", "value_rescale_eps",
             "importance_exponent", "best_checkpoint_interval_s", "pfsp_exponent",
             "replay_checkpoint_interval_s", "epsilon_slots", "actor_envs_per_actor",
             "serving_processes"),
            low=0,
        )  # fmt: skip
        _require_range(
            self,
            ("learning_rate", "adam_eps", "max_grad_norm", "clip_rho_threshold",
             "clip_pg_rho_threshold", "policy_clip", "reward_scale", "reward_clip",
             "checkpoint_interval_s", "log_interval_s", "standby_grace_s",
             "handshake_timeout_s"),
            low=0,
            low_open=True,
        )  # fmt: skip
        _require_range(
            self, ("discount", "lambda_", "priority_exponent", "priority_eta", "epsilon",
                   "fixed_opponent_share"),
            low=0, high=1,
        )  # fmt: skip
        if self.greedy and self.train:
            raise ValueError("--greedy serves a policy without training it: add --no-train")
        if self.sequence_overlap > self.burn_in + self.unroll_length - 1:
            raise ValueError(
                f"--sequence-overlap ({self.sequence_overlap}) must leave a sequence at least one"
                f" new row (<= --burn-in + --unroll-length - 1)"
            )
        _require_range(self, ("inference_quorum",), low=0, high=1, low_open=True)
        if not self.hidden_sizes:
            raise ValueError("--hidden-sizes needs at least one layer width")
        if not self.cnn_channels:
            raise ValueError("--cnn-channels needs at least one layer")
        _require_choice(self, "inference_backend", INFERENCE_BACKENDS)
        _require_choice(self, "agent", AGENTS)
        _require_choice(self, "model", ("auto", "mlp", "cnn", "resnet"))
        _require_choice(self, "trainer", TRAINER_MODES)
        _require_choice(self, "precision", PRECISIONS)
        _require_choice(self, "progress", ("auto", "bar", "plain", "off"))
        _require_choice(self, "wandb_mode", WANDB_MODES)
        _require_choice(self, "lr_schedule", LR_SCHEDULES)
        _require_choice(self, "opponent_sampling", OPPONENT_SAMPLING)
        if self.fixed_opponent_share is not None and not self.fixed_opponents:
            raise ValueError("--fixed-opponent-share needs --fixed-opponents")
        if self.lr_schedule == "linear" and not self.total_frames:
            raise ValueError("--lr-schedule linear needs --total-frames (it decays to 0 there)")
        _require_range(self, ("lr_decay_start",), low=0, high=1, high_open=True)
        if self.lr_decay_start and self.effective_lr_schedule != "linear":
            raise ValueError(
                "--lr-decay-start shapes a linear schedule; this run's is "
                f"{self.effective_lr_schedule}"
            )
        _require_range(self, ("lr_hold_frames",), low=1)
        if self.mirror and self.agent != "vtrace":
            raise ValueError(f"--mirror trains V-trace unrolls; --agent {self.agent} has none")
        _require_range(self, ("max_update_kl",), low=0)
        if self.max_update_kl and self.agent != "vtrace":
            raise ValueError(
                f"--max-update-kl bounds a policy's change; --agent {self.agent} has no policy"
                " to bound"
            )
        _require_range(self, ("log_std_init",), low=LOG_STD_RANGE[0], high=LOG_STD_RANGE[1])
        if self.policy_clip is not None and self.agent != "vtrace":
            raise ValueError(
                f"--policy-clip bounds a policy's ratio; --agent {self.agent} has no policy"
            )
        if self.final_entropy_cost is not None and not self.total_frames:
            raise ValueError("--final-entropy-cost needs --total-frames (it is reached there)")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        _require_one_token_source(self)
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("--tls-client-ca needs --tls-cert and --tls-key (it is a TLS option)")
        # Only V-trace keeps its unrolls in the bounded queue; R2D2 samples its replay.
        if self.agent == "vtrace" and self.max_queue_unrolls < self.batch_size:
            raise ValueError(
                f"--max-queue-unrolls ({self.max_queue_unrolls}) must be >= --batch-size "
                f"({self.batch_size}) or the trainer could never fill a batch"
            )

    @property
    def effective_lr_schedule(self) -> str:
        """``lr_schedule`` with ``auto`` resolved: linear when a frame budget is the plan,
        else inverse_sqrt (a run of unknown length)."""
        if self.lr_schedule != "auto":
            return self.lr_schedule
        return "linear" if self.total_frames and self.target_return is None else "inverse_sqrt"

    @property
    def effective_max_update_kl(self) -> float | None:
        """``max_update_kl`` with unset resolved (V-trace's default bound) and 0 read as
        no bound: None when nothing bounds the step."""
        if self.max_update_kl is None:
            return DEFAULT_MAX_UPDATE_KL if self.agent == "vtrace" else None
        return self.max_update_kl or None

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
    address), falling back to TCP if it cannot connect."""
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
        _require_choice(self, "start_method", START_METHODS)
        if self.start_method == "fork" and not hasattr(os, "fork"):
            raise ValueError("--start-method fork needs os.fork (not on this platform)")
        _require_range(self, ("num_actors",), low=1)
        _require_range(self, ("actors_per_process", "seed", "max_frames", "envs_per_actor"), low=0)
        _require_range(self, ("first_index",), low=-1)
        _require_range(self, ("max_backoff_s",), low=0, low_open=True)
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        if self.tls_cert is not None and self.tls_ca is None:
            raise ValueError("--tls-cert needs --tls-ca (the CA that signed the learner's cert)")
        _require_one_token_source(self)
        _require_choice(self, "pin_cpus", PIN_CPUS_MODES)
        if self.cpu < -1:
            raise ValueError(f"--cpu must be a CPU number or -1 (any), got {self.cpu}")
        _require_range(self, ("nice",), low=0, high=19)
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
    out: this is what goes into ``config.json`` and checkpoints."""
    data = {k: v for k, v in dataclasses.asdict(config).items() if k not in SECRET_FIELDS}
    return json.loads(json.dumps(data))
