"""benchmarks/dormant.py: which ReLU units of a checkpoint never fire on visited states."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.dormant import dormant_report, main
from learner.parts import build_learner, save_checkpoint
from seedrl.config import LearnerConfig


def test_a_unit_is_dormant_only_if_it_never_fired_anywhere():
    fired = torch.zeros(3, 4, 5, dtype=torch.bool)  # 3 states, 4 channels, 5 positions
    fired[2, 0, 4] = True  # channel 0: once, at one position of one state
    fired[:, 1, :] = True  # channel 1: always
    [row] = dormant_report({"conv": fired})
    assert row == {"layer": "conv", "units": 4, "never_fired": 2, "active_share": 0.2667}


def _checkpoint(tmp_path, silence_conv: bool):
    config = LearnerConfig(
        env="MinAtar/Breakout-v1", logdir=str(tmp_path), tensorboard=False, progress="off"
    )
    learner = build_learner(config)
    if silence_conv:  # every conv channel's output is negative whatever the input
        conv = learner.model.torso.conv[0]
        with torch.no_grad():
            conv.weight.zero_()
            conv.bias.fill_(-1.0)
    save_checkpoint(learner)
    return config.checkpoint_path


@pytest.mark.parametrize("silence_conv", [False, True])
def test_a_silenced_conv_layer_reports_every_channel_dormant(tmp_path, capsys, silence_conv):
    path = _checkpoint(tmp_path, silence_conv)
    assert main(["--checkpoint", str(path), "--steps", "40"]) == 0
    rows = {r["layer"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    conv = rows["torso.conv.1"]
    assert conv["units"] == 16 and set(rows) == {"torso.conv.1", "torso.fc.1"}
    if silence_conv:
        assert conv["never_fired"] == 16 and conv["active_share"] == 0.0
    else:
        assert conv["never_fired"] < 16 and conv["active_share"] > 0.0


def test_a_bad_checkpoint_exits_2_with_one_line(tmp_path, capsys):
    bad = tmp_path / "checkpoint.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(SystemExit) as exit_info:
        main(["--checkpoint", str(bad)])
    assert exit_info.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
