"""``python -m learner evaluate``: run a trained policy from a checkpoint, in process.

A checkpoint carries the env spec (id, kwargs, spaces) and the model spec, so the
network and the env are rebuilt exactly as they were trained, with no other flags.
:class:`Policy` is the same thing for notebooks: ``Policy.load(path).act(obs)``.

Shape suffixes: O observation dims, A action dims, P policy parameters, H core state.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from learner import checkpoint
from seedrl import codec, envs
from seedrl.models import ActionHead, ActorCritic, CoreState, ModelSpec, action_head
from seedrl.proto import seedrl_pb2 as pb


def model_spec_from_dict(data: dict[str, Any]) -> ModelSpec:
    """A ModelSpec from its JSON form in a checkpoint (lists back to tuples)."""
    fields = {f.name for f in dataclasses.fields(ModelSpec)}
    kwargs: dict[str, Any] = {
        k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in fields
    }
    return ModelSpec(**kwargs)


class Policy:
    """A trained policy for one env at a time: keeps its own recurrent state.

    ``act(obs)`` takes one observation (as the env returns it) and returns one action
    (an int for discrete spaces, a clipped float array for Box spaces). Call
    ``reset()`` at the start of every episode.
    """

    def __init__(
        self, model: ActorCritic, head: ActionHead, env_spec: pb.EnvSpec, greedy: bool = True
    ) -> None:
        self.model = model.eval()
        self.head = head
        self.env_spec = env_spec
        self.greedy = greedy
        self._low, self._high = _bounds(env_spec.action_space)
        self._state: CoreState = ()
        self._first = True

    @classmethod
    def load(cls, path: str | Path, greedy: bool = True) -> Policy:
        state = checkpoint.load(path)
        env_spec = pb.EnvSpec.FromString(state["env_spec"])
        head = action_head(env_spec.action_space)
        model = ActorCritic(model_spec_from_dict(state["model_spec"]))
        model.load_state_dict(state["model"])
        return cls(model, head, env_spec, greedy)

    @property
    def env_id(self) -> str:
        return self.env_spec.env_id

    @property
    def env_kwargs(self) -> dict[str, Any]:
        return dict(json.loads(self.env_spec.env_kwargs_json or "{}"))

    def make_env(self, render_mode: str | None = None) -> Any:
        """The env this policy was trained on, built as the actors built it."""
        return envs.make_env(self.env_id, self.env_kwargs, render_mode=render_mode)

    def reset(self) -> None:
        self._state = self.model.initial_state(1)
        self._first = True

    def act(self, obs: Any) -> Any:
        dtype = np.dtype(self.env_spec.observation_space.dtype)
        obs_11O = torch.from_numpy(np.asarray(obs, dtype=dtype)[None, None])
        first_11 = torch.tensor([[self._first]])
        if self._first and not self._state:
            self._state = self.model.initial_state(1)
        with torch.no_grad():
            params_11P, self._state = self.model.act(obs_11O, first_11, self._state)
        self._first = False
        params_P = params_11P[0, 0]
        action = self.head.greedy(params_P) if self.greedy else self.head.sample(params_P)
        if self.head.continuous:
            action_A = action.numpy().astype(np.float32)
            return action_A if self._low is None else np.clip(action_A, self._low, self._high)
        return int(action)


def _bounds(spec: pb.SpaceSpec) -> tuple[np.ndarray | None, np.ndarray | None]:
    if spec.kind != "box" or not spec.low.data:
        return None, None
    return (
        codec.decode_tensor(spec.low, "action low").astype(np.float32),
        codec.decode_tensor(spec.high, "action high").astype(np.float32),
    )


@dataclasses.dataclass
class EvalResult:
    returns: list[float]
    lengths: list[int]
    video: str | None = None

    @property
    def mean(self) -> float:
        return float(np.mean(self.returns))

    @property
    def std(self) -> float:
        return float(np.std(self.returns))


def evaluate(
    policy: Policy,
    episodes: int,
    seed: int = 0,
    max_steps: int = 100_000,
    video: str | Path | None = None,
) -> EvalResult:
    """Run ``episodes`` episodes; record the first one's frames to ``video`` if given."""
    env = policy.make_env(render_mode="rgb_array" if video else None)
    frames: list[np.ndarray] = []
    returns: list[float] = []
    lengths: list[int] = []
    try:
        for episode in range(episodes):
            obs, _ = env.reset(seed=seed + episode)
            policy.reset()
            total, steps = 0.0, 0
            recording = video is not None and episode == 0
            while steps < max_steps:
                if recording:
                    frames.append(np.asarray(env.render()))
                obs, reward, terminated, truncated, _ = env.step(policy.act(obs))
                total += float(reward)
                steps += 1
                if terminated or truncated:
                    break
            returns.append(total)
            lengths.append(steps)
    finally:
        env.close()
    written = None
    if video is not None:
        written = str(write_video(frames, video, fps=_env_fps(env)))
    return EvalResult(returns, lengths, written)


def _env_fps(env: Any) -> int:
    fps = getattr(env, "metadata", {}).get("render_fps")
    return int(fps) if fps else 30


MIN_VIDEO_SIDE = 160
"""Smaller renders (MinAtar's 10x10) are upscaled by whole pixels to at least this."""


def video_frame(frame: Any) -> np.ndarray:
    """An rgb_array render as ``uint8 [H, W, 3]``: floats in [0, 1] scaled, tiny ones upscaled."""
    array = np.asarray(frame)
    if array.dtype.kind == "f":
        array = np.clip(array * 255.0, 0, 255)
    array = array.astype(np.uint8)
    factor = math.ceil(MIN_VIDEO_SIDE / max(1, min(array.shape[:2])))
    if factor > 1:
        array = np.repeat(np.repeat(array, factor, axis=0), factor, axis=1)
    return array


def write_video(frames: list[np.ndarray], path: str | Path, fps: int = 30) -> Path:
    """GIF with Pillow (always there with matplotlib); MP4 needs imageio + imageio-ffmpeg."""
    path = Path(path)
    if not frames or frames[0] is None or np.asarray(frames[0]).ndim != 3:
        raise ValueError("the env rendered no rgb_array frames; cannot write a video")
    path.parent.mkdir(parents=True, exist_ok=True)
    frames = [video_frame(f) for f in frames]
    if path.suffix.lower() == ".gif":
        from PIL import Image

        images = [Image.fromarray(f) for f in frames]
        duration_ms = max(20, round(1000 / fps))
        images[0].save(path, save_all=True, append_images=images[1:], duration=duration_ms, loop=0)
        return path
    try:
        import imageio.v2 as imageio
    except ImportError as exc:
        raise ValueError(f"{path}: MP4 needs imageio and imageio-ffmpeg; use .gif") from exc
    imageio.mimwrite(path, list[Any](frames), fps=fps)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m learner evaluate", description=__doc__)
    parser.add_argument("--checkpoint", required=True, help="a checkpoint.pt (or its logdir)")
    parser.add_argument("--episodes", type=int, default=10)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--greedy", dest="greedy", action="store_true", default=True,
                      help="most likely action / Gaussian mean (default)")  # fmt: skip
    mode.add_argument("--sample", dest="greedy", action="store_false",
                      help="sample actions from the policy")  # fmt: skip
    parser.add_argument("--video", help="write the first episode to this .gif (or .mp4)")
    parser.add_argument("--seed", type=int, default=0, help="env seed of the first episode")
    parser.add_argument("--max-steps", type=int, default=100_000, help="cap per episode")
    args = parser.parse_args(argv)
    path = Path(args.checkpoint)
    if path.is_dir():
        path = path / "checkpoint.pt"
    try:
        policy = Policy.load(path, greedy=args.greedy)
        torch.manual_seed(args.seed)
        result = evaluate(policy, args.episodes, args.seed, args.max_steps, args.video)
    except (checkpoint.CheckpointError, ValueError) as exc:
        parser.exit(2, f"error: {exc}\n")
    std = 0.0 if len(result.returns) < 2 else result.std
    print(
        f"seedrl evaluate: {policy.env_id}, {len(result.returns)} episodes "
        f"({'greedy' if args.greedy else 'sampled'}): mean return {result.mean:.2f} "
        f"+- {std:.2f} (min {min(result.returns):.2f}, max {max(result.returns):.2f}, "
        f"mean length {np.mean(result.lengths):.1f})"
    )
    if result.video:
        print(f"video: {result.video}")
    return 0 if math.isfinite(result.mean) else 1
