"""The committed generated code must match what grpcio-tools makes from protos/ today."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GENERATED = ("seedrl_pb2.py", "seedrl_pb2_grpc.py", "seedrl_pb2.pyi")


def test_generated_code_is_fresh(tmp_path):
    subprocess.run(
        [
            sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT / 'protos'}",
            f"--python_out={tmp_path}", f"--grpc_python_out={tmp_path}", f"--pyi_out={tmp_path}",
            str(ROOT / "protos/seedrl/proto/seedrl.proto"),
        ],
        check=True,
    )  # fmt: skip
    for name in GENERATED:
        fresh = (tmp_path / "seedrl/proto" / name).read_text()
        committed = (ROOT / "seedrl/proto" / name).read_text()
        assert fresh == committed, f"seedrl/proto/{name} is stale: run `make proto` and commit"


def test_package_is_versioned():
    from seedrl.proto import seedrl_pb2

    assert seedrl_pb2.DESCRIPTOR.package == "seedrl.v1"
    assert "Learner" in seedrl_pb2.DESCRIPTOR.services_by_name
