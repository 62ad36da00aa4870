"""The checked-in generated gRPC code equals what ``make protos`` would produce now."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support.paths import ROOT

GENERATED = ROOT / "protos" / "dpfl" / "v1"


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    fresh = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    checked_in = {
        p.name: p.read_bytes()
        for p in GENERATED.iterdir()
        if p.name.endswith(("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi"))
    }
    assert sorted(fresh) == sorted(checked_in), "generated file set differs: run `make protos`"
    stale = [name for name in fresh if fresh[name] != checked_in[name]]
    assert stale == [], f"stale generated code {stale}: run `make protos` and commit"


def test_every_round_message_carries_a_header() -> None:
    from dpfl.protos import pb

    for wrapper in (pb.CoordinatorMessage, pb.AgentMessage):
        for field in wrapper.DESCRIPTOR.oneofs_by_name["body"].fields:
            msg = field.message_type
            if msg.name in {"Hello", "Ping"}:
                continue
            assert "header" in msg.fields_by_name, f"{msg.name} lacks a RoundHeader"
            assert msg.fields_by_name["header"].message_type.name == "RoundHeader"
