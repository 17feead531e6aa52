"""The docs' GPU section is rendered from a GPU check's JSONs: rows, ratios and markers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks import results_table
from benchmarks.gpu_table import (
    BEGIN,
    END,
    LOADGEN_BEGIN,
    LOADGEN_END,
    derived_lines,
    render,
    render_loadgen,
    step_rows,
    train_rows,
)

ROOT = Path(__file__).resolve().parent.parent


def _run(trainer: str, device: str, precision: str, fps: float, **extra: object) -> dict:
    return {
        "preset": "atari", "device": device, "trainer": trainer, "actors": "4x8",
        "listening": f"seedrl learner listening on 127.0.0.1:1 (env ALE/Pong-v5, device "
        f"{device}, trainer {trainer}, {precision})",
        "rc": 0, "fps": fps, "learner_steps_per_s": fps / 100, "measured_s": 10.0,
        "trainer_wait_share": 0.5, "inference_batch_mean": 31.5, "episode_return_mean": -20.5,
        "gpu": {"util_mean": 12.4, "util_max": 40.0} if device == "cuda" else
        {"util_mean": 0.0, "util_max": 0.0},
        **extra,
    }  # fmt: skip


def _summary() -> dict:
    return {
        "started": "2030-01-02T03:04:05Z",
        "finished": "2030-01-02T03:09:05Z",
        "info": {
            "python": "3.12.0",
            "cpus": 8,
            "nvidia_smi": "Test GPU, 1000 MiB, 1.2.3",
            "gpu": "Test GPU",
            "torch": "9.9.9",
            "cuda": "99.0",
        },
        "tests": {"rc": 1, "summary": "1 failed, 5 passed"},
        "train": {
            # the requested trainer is auto: the row shows the one the learner resolved
            "atari-device-cuda": {**_run("device", "cuda", "bf16", 4000.0), "trainer": "auto"},
            "atari-process-cuda": _run("process", "cuda", "bf16", 3000.0),
            "atari-process-cpu": _run("process", "cpu", "fp32", 1000.0, error="exited"),
            "atari-resnet-device-cuda": _run("device", "cuda", "fp32", 2000.0, model="resnet"),
            "cartpole-device-cuda": {"skipped": "budget"},
        },
        "timings": {"rc": 124, "rows": []},
    }


def _timings() -> list[dict]:
    return [
        {"preset": "atari", "device": "cuda", "precision": "fp32", "params": 1234567,
         "batch": "32x21", "forward_b64_ms": 2.0, "forward_b256_ms": 3.0,
         "train_step_thread_ms": 8.0, "train_step_device_ms": 9.5,
         "handoff_device_ms": 0.05, "handoff_host_ms": 2.0},
        {"preset": "atari", "device": "cpu", "precision": "fp32", "params": 1234567,
         "batch": "32x21", "forward_b64_ms": 4.0, "forward_b256_ms": 12.0,
         "train_step_thread_ms": 80.0},
        {"preset": "atari", "model": "resnet", "device": "cuda", "precision": "fp32",
         "params": 1000, "batch": "32x21", "forward_b64_ms": 3.0, "forward_b256_ms": 6.0,
         "train_step_thread_ms": 16.0},
        {"preset": "atari", "model": "resnet", "device": "cpu", "precision": "fp32",
         "params": 1000, "batch": "32x21", "forward_b64_ms": 30.0, "forward_b256_ms": 120.0,
         "train_step_thread_ms": 800.0},
        {"preset": "atari", "device": "cuda", "precision": "bf16", "params": 1234567,
         "batch": "32x21", "forward_b64_ms": 2.5, "forward_b256_ms": 3.5,
         "train_step_thread_ms": 9.0},
        {"preset": "atari", "device": "cpu", "precision": "bf16", "params": 1234567,
         "batch": "32x21", "forward_b64_ms": 2.5, "forward_b256_ms": 7.0,
         "train_step_thread_ms": 40.0},
    ]  # fmt: skip


def test_training_rows_read_the_resolved_settings_and_the_speed_up_over_cpu() -> None:
    device, process, cpu, resnet, skipped = train_rows(_summary())
    assert device[:6] == ["ALE/Pong-v5", "CNN", "4x8", "device", "cuda", "bf16"]
    assert device[6:12] == ["4,000", "4.00×", "40.0", "12% / 40%", "50%", "31.5"]
    assert process[6:8] == ["3,000", "3.00×"]
    assert cpu[5:8] == ["fp32", "1,000", "1.00×"] and cpu[9] == "—"  # no GPU util on CPU
    assert cpu[-2:] == ["-20.5", "exited"]
    # a model the preset does not ship is named, and its speed-up is over the preset's CPU row
    assert resnet[:2] == ["ALE/Pong-v5", "ResNet"] and resnet[6:8] == ["2,000", "2.00×"]
    assert skipped[0] == "cartpole-device-cuda" and skipped[6] == "—"
    assert skipped[-1] == "skipped: budget"


def test_step_rows_and_the_ratios_read_off_them() -> None:
    gpu, cpu, resnet_gpu, _, _, cpu_bf16 = step_rows(_timings())
    assert gpu == ["Atari CNN", "cuda", "fp32", "1,234,567", "32x21", "2.00", "3.00",
                   "8.00", "9.50", "0.050", "2.00"]  # fmt: skip
    assert cpu[5:] == ["4.00", "12.00", "80.00", "—", "—", "—"]
    assert resnet_gpu[:3] == ["Atari ResNet", "cuda", "fp32"]
    assert cpu_bf16[1:3] == ["cpu", "bf16"]
    lines = derived_lines(_summary(), _timings())
    # the ResNet's device-resident row is not compared with the CNN's process row
    assert lines[0] == (
        "- ALE/Pong-v5 on CUDA, device-resident over process trainer: "
        "1.33× frames/s, 1.33× learner steps/s."
    )
    assert lines[1].startswith("- Atari CNN: ")
    # each GPU precision against the CPU's default (fp32), not the CPU's bf16 row
    assert "fp32 0.5× / 0.25×, bf16 0.62× / 0.29×" in lines[1] and "fp32 40×" in lines[1]
    assert lines[1].endswith("CPU training step in bf16 over fp32 0.5×.")
    assert lines[2].startswith("- Atari ResNet: ") and "fp32 0.1× / 0.05×" in lines[2]
    assert len(lines) == 3


def test_the_block_names_the_card_the_tests_and_the_steps_that_ran_out() -> None:
    block = render(_summary(), _timings(), [])
    assert "on an **Test GPU** (1000 MiB, driver 1.2.3), 8 CPUs" in block
    assert "torch 9.9.9 (CUDA 99.0)" in block
    assert "CUDA tests (`pytest -k cuda`): 1 failed, 5 passed (exit 1)" in block
    assert "`timings` step exited 124 (its time ran out)" in block


def test_command_rewrites_only_the_gpu_block(tmp_path: Path) -> None:
    summary, timings = tmp_path / "summary.json", tmp_path / "timings.jsonl"
    summary.write_text(json.dumps(_summary()))
    timings.write_text("".join(json.dumps(t) + "\n" for t in _timings()))
    cpu_block = f"{results_table.BEGIN}\nthe CPU table\n{results_table.END}\n"
    page = tmp_path / "performance.md"
    page.write_text(f"# Perf\n{cpu_block}\n{BEGIN}\nold\n{END}\nafter\n")
    subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_table", str(summary), "--timings", str(timings),
         "--update", str(page)],
        cwd=ROOT, check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    new = render(_summary(), _timings(), [])
    assert page.read_text() == f"# Perf\n{cpu_block}\n{BEGIN}\n{new}{END}\nafter\n"


def test_the_performance_page_has_the_gpu_markers_once() -> None:
    text = (ROOT / "docs" / "performance.md").read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1 and text.index(BEGIN) < text.index(END)


def _loadgen_summary(served: float, trained: float, busy: float) -> dict:
    def row(mode: str, fps: float, trained_fps: float, util: float) -> dict:
        return {
            "mode": mode, "fps_answered": fps, "trained_fps": trained_fps,
            "learner_steps_per_s": trained_fps / 640, "learner_cpu_us_per_frame": 40.0,
            "learner_loop_thread_us_per_frame": 30.0, "learner_other_threads_us_per_frame": 10.0,
            "trainer_cpu_us_per_frame": 5.0, "generator_cpu_us_per_frame": 20.0,
            "inference_batch_mean": 60.0, "rtt_p50_ms": 0.9, "rtt_p99_ms": 3.5,
            "gpu": {"util_mean": util, "util_max": 90.0},
        }  # fmt: skip

    return {
        **_summary(),
        "loadgen": {
            "cartpole": {"env": "CartPole-v1", "preset": None, "model": "mlp", "streams": 1024,
                         "envs": 1, "device": "cuda", "skipped": "budget"},
            "atari-cnn": {
                "env": "ALE/Pong-v5", "preset": "atari", "model": "cnn", "streams": 64,
                "envs": 1, "device": "cuda", "rc": 0,
                "rows": [row("inference", served, 0.0, 20.0), row("system", 50_000, trained, busy)],
            },
        },
    }  # fmt: skip


def test_the_gpu_load_generator_block_has_its_rows_and_says_the_aim_met_or_missed() -> None:
    summary = _loadgen_summary(served=120_000, trained=24_000, busy=35.0)
    text = render_loadgen(summary)
    assert "| CartPole-v1, 1024 × 1 | MLP | cuda | — |" in text and "skipped: budget" in text
    assert (
        "| ALE/Pong-v5, 64 × 1 | CNN | cuda | system | 50,000 | 24,000 | 37.5 | 35% / 90% "
        "| 40.0 | 30.0 / 10.0 | 5.0 | 20.0 | 60.0 | 0.900 / 3.50 |  |"
    ) in text
    assert "(aim ≥ 100,000): **120,000** frames/s: met" in text
    assert "(aim ≥ 30,000): **24,000** frames/s: missed by 6,000 (80% of it)" in text
    assert "(aim over 50 %): **35 %**: missed" in text


def test_a_load_generator_summary_rewrites_only_its_own_block(tmp_path: Path) -> None:
    summary = {k: v for k, v in _loadgen_summary(1.0, 2.0, 3.0).items() if k != "train"}
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary))
    page = tmp_path / "performance.md"
    page.write_text(f"{BEGIN}\nthe H200 check\n{END}\n{LOADGEN_BEGIN}\n{LOADGEN_END}\n")
    subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_table", str(path), "--update", str(page)],
        cwd=ROOT, check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    new = render_loadgen(summary)
    assert page.read_text() == (
        f"{BEGIN}\nthe H200 check\n{END}\n{LOADGEN_BEGIN}\n{new}{LOADGEN_END}\n"
    )
