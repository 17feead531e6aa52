"""The peer seedrl's SAC is measured beside: a single-process SAC loop at CleanRL's
``sac_continuous_action`` settings, where one env is stepped by the training loop itself
and every step after the replay's first ``learning_starts`` transitions is followed by a
gradient update. Its rate is what one process without central inference trains at here.

Runs in seedrl's own interpreter as ``python -m benchmarks.peers.sac_loop_driver sac
--env HalfCheetah-v5 ...``. It is written here from CleanRL's documented algorithm and
hyperparameters, not from its code: the ``cleanrl`` package on PyPI predates gymnasium's
API. It imports torch, gymnasium and the peers' measuring rules only, nothing of seedrl's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.peers.measure import (
    ReturnWindow,
    emit_result,
    say,
    task_driver_parser,
    update_rates,
)


@dataclass(frozen=True)
class LoopSettings:
    """CleanRL ``sac_continuous_action``'s defaults."""

    buffer_size: int = 1_000_000
    gamma: float = 0.99
    tau: float = 0.005
    batch_size: int = 256
    learning_starts: int = 5_000
    policy_lr: float = 3e-4
    q_lr: float = 1e-3
    policy_frequency: int = 2
    """The actor and the temperature take this many steps on every this-many-th update."""
    hidden: int = 256
    log_std_min: float = -5.0
    log_std_max: float = 2.0


def _build(obs_dim: int, act_dim: int, low: np.ndarray, high: np.ndarray, s: LoopSettings):
    """The actor, twin critics with their targets, and the learned temperature."""
    import torch
    from torch import nn

    def mlp(inputs: int, outputs: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Linear(inputs, s.hidden), nn.ReLU(),
            nn.Linear(s.hidden, s.hidden), nn.ReLU(),
            nn.Linear(s.hidden, outputs),
        )  # fmt: skip

    class Actor(nn.Module):
        scale: torch.Tensor
        bias: torch.Tensor

        def __init__(self) -> None:
            super().__init__()
            self.body = mlp(obs_dim, 2 * act_dim)
            self.register_buffer("scale", torch.as_tensor((high - low) / 2, dtype=torch.float32))
            self.register_buffer("bias", torch.as_tensor((high + low) / 2, dtype=torch.float32))

        def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            """A squashed-Gaussian sample scaled to the bounds, and its log-probability."""
            mean, raw = self.body(obs).chunk(2, dim=-1)
            span = s.log_std_max - s.log_std_min
            log_std = s.log_std_min + 0.5 * span * (torch.tanh(raw) + 1)
            std = log_std.exp()
            u = mean + std * torch.randn_like(mean)
            y = torch.tanh(u)
            normal = -0.5 * ((u - mean) / std) ** 2 - log_std - 0.5 * math.log(2 * math.pi)
            log_prob = normal - torch.log(self.scale * (1 - y.pow(2)) + 1e-6)
            return y * self.scale + self.bias, log_prob.sum(-1)

    critics = nn.ModuleList([mlp(obs_dim + act_dim, 1) for _ in range(2)])
    targets = nn.ModuleList([mlp(obs_dim + act_dim, 1) for _ in range(2)])
    targets.load_state_dict(critics.state_dict())
    return Actor(), critics, targets


class SACLoop:
    """One env's transitions in a numpy replay and SAC's updates on uniform batches."""

    def __init__(
        self, obs_dim: int, low: np.ndarray, high: np.ndarray, s: LoopSettings, device: str
    ) -> None:
        import torch

        act_dim = len(low)
        self.s, self.device = s, torch.device(device)
        actor, critics, targets = _build(obs_dim, act_dim, low, high, s)
        self.actor, self.critics, self.targets = (
            m.to(self.device) for m in (actor, critics, targets)
        )
        self.log_alpha = torch.zeros(1, requires_grad=True, device=self.device)
        self.target_entropy = -float(act_dim)
        self.q_opt = torch.optim.Adam(self.critics.parameters(), lr=s.q_lr)
        self.pi_opt = torch.optim.Adam(self.actor.parameters(), lr=s.policy_lr)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=s.q_lr)
        size = s.buffer_size
        self.obs = np.zeros((size, obs_dim), np.float32)
        self.next_obs = np.zeros((size, obs_dim), np.float32)
        self.actions = np.zeros((size, act_dim), np.float32)
        self.rewards = np.zeros(size, np.float32)
        self.terminal = np.zeros(size, np.float32)
        self.stored = 0
        self.updates = 0
        self.rng = np.random.default_rng(0)

    def store(self, obs: Any, next_obs: Any, action: Any, reward: float, terminal: bool) -> None:
        i = self.stored % self.s.buffer_size
        self.obs[i], self.next_obs[i], self.actions[i] = obs, next_obs, action
        self.rewards[i], self.terminal[i] = reward, terminal
        self.stored += 1

    def act(self, obs: Any) -> np.ndarray:
        import torch

        with torch.no_grad():
            x = torch.as_tensor(obs, dtype=torch.float32, device=self.device).unsqueeze(0)
            return self.actor(x)[0][0].cpu().numpy()

    def update(self) -> None:
        """One critic step on a uniform batch; the actor and temperature on their cadence."""
        import torch
        import torch.nn.functional as F

        idx = self.rng.integers(0, min(self.stored, self.s.buffer_size), self.s.batch_size)
        to = lambda a: torch.as_tensor(a[idx], device=self.device)  # noqa: E731
        obs, nxt, act, rew, term = (to(a) for a in (self.obs, self.next_obs, self.actions,
                                                     self.rewards, self.terminal))  # fmt: skip
        alpha = self.log_alpha.exp().detach()
        with torch.no_grad():
            next_act, next_logp = self.actor(nxt)
            pair = torch.cat([nxt, next_act], -1)
            soft = torch.min(*(q(pair).squeeze(-1) for q in self.targets)) - alpha * next_logp
            target = rew + (1 - term) * self.s.gamma * soft
        pair = torch.cat([obs, act], -1)
        q_loss = sum(F.mse_loss(q(pair).squeeze(-1), target) for q in self.critics)
        self.q_opt.zero_grad()
        q_loss.backward()  # type: ignore[union-attr]
        self.q_opt.step()
        if self.updates % self.s.policy_frequency == 0:
            for _ in range(self.s.policy_frequency):
                new_act, logp = self.actor(obs)
                pair = torch.cat([obs, new_act], -1)
                q_min = torch.min(*(q(pair).squeeze(-1) for q in self.critics))
                pi_loss = (self.log_alpha.exp().detach() * logp - q_min).mean()
                self.pi_opt.zero_grad()
                pi_loss.backward()
                self.pi_opt.step()
                alpha_loss = (-self.log_alpha.exp() * (logp.detach() + self.target_entropy)).mean()
                self.alpha_opt.zero_grad()
                alpha_loss.backward()
                self.alpha_opt.step()
        with torch.no_grad():
            for online, target_net in zip(self.critics, self.targets, strict=True):
                for p, t in zip(online.parameters(), target_net.parameters(), strict=True):
                    t.mul_(1 - self.s.tau).add_(p, alpha=self.s.tau)
        self.updates += 1


SAMPLE_EVERY_S = 1.0
REPORT_EVERY_S = 5.0


def run(
    env_id: str, settings: LoopSettings, launched_at: float, wall_cap_s: float,
    warmup_s: float, measure_s: float, seed: int, device: str,
) -> dict[str, Any]:  # fmt: skip
    """Train until ``warmup_s + measure_s`` after the first update (or the wall cap) and
    say how fast it stepped and updated over the window after the warm-up."""
    import gymnasium as gym
    import torch

    torch.manual_seed(seed)
    env = gym.make(env_id)
    space, obs_shape = env.action_space, env.observation_space.shape
    if not isinstance(space, gym.spaces.Box) or obs_shape is None:
        raise SystemExit(f"{env_id}: the SAC loop needs Box actions and observations")
    loop = SACLoop(int(np.prod(obs_shape)), space.low, space.high,
                   settings, device)  # fmt: skip
    space.seed(seed)
    obs, _ = env.reset(seed=seed)
    window, episode_return = ReturnWindow(float("inf")), 0.0
    steps, first_update, samples = 0, None, []
    next_sample = next_report = time.monotonic()
    while True:
        now = time.monotonic()
        if now - launched_at >= wall_cap_s:
            stopped = "wall cap"
            break
        if first_update is not None and now - first_update >= warmup_s + measure_s:
            stopped = "measured"
            break
        action = space.sample() if steps < settings.learning_starts else loop.act(obs)
        next_obs, reward, terminated, truncated, _ = env.step(action)
        loop.store(obs, next_obs, action, float(reward), bool(terminated))
        episode_return += float(reward)
        steps += 1
        obs = next_obs
        if terminated or truncated:
            window.add([episode_return])
            episode_return = 0.0
            obs, _ = env.reset()
        if steps > settings.learning_starts:
            if first_update is None:
                first_update = time.monotonic()
            loop.update()
        if first_update is not None and now >= next_sample:
            samples.append((now, float(steps), float(loop.updates)))
            next_sample = now + SAMPLE_EVERY_S
        if now >= next_report:
            say(f"sac loop: {steps:,} env steps, {loop.updates:,} updates, "
                f"{now - launched_at:.0f} s")  # fmt: skip
            next_report = now + REPORT_EVERY_S
    env.close()
    if first_update is not None:  # the window ends where the loop stopped
        samples.append((time.monotonic(), float(steps), float(loop.updates)))
    return {
        "frames": steps,
        "updates": loop.updates,
        "episodes": window.episodes,
        "return_mean100": window.mean,
        "startup_s": (first_update - launched_at) if first_update else None,
        "wall_s": time.monotonic() - launched_at,
        **update_rates(samples, warmup_s),
        "transitions_per_update": settings.batch_size,
        "stopped_by": stopped,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = task_driver_parser(
        "python -m benchmarks.peers.sac_loop_driver", "--logdir", frame_cap=0, tasks=("sac",)
    )
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--learning-starts", type=int, default=LoopSettings.learning_starts)
    parser.add_argument("--device", default="auto", help="auto: cuda when present, else cpu")
    args = parser.parse_args(argv)
    import torch

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    settings = LoopSettings(learning_starts=args.learning_starts)
    out = run(args.env, settings, args.launched_at, args.wall_cap_s, args.warmup_s,
              args.measure_s, args.seed, device)  # fmt: skip
    out["summary"] = f"1 env in the training loop, CleanRL's settings, {device}"
    out["settings"] = {"env": args.env, "device": device, **vars(settings)}
    emit_result(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
