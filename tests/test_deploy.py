"""The EC2 files agree with each other: user-data writes the env files deploy/ec2 gives."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

EC2 = Path(__file__).resolve().parent.parent / "deploy" / "ec2"


def _settings(text: str) -> list[str]:
    return [
        line.strip()
        for line in text.splitlines()
        if re.match(r"\s*CODEDGD_[A-Z_]+=", line) and not line.strip().startswith("#")
    ]


@pytest.mark.parametrize("role", ["worker", "coordinator"])
def test_user_data_writes_the_env_file_of_deploy_ec2(role: str) -> None:
    env = _settings((EC2 / f"{role}.env").read_text())
    user_data = _settings((EC2 / "user-data" / f"{role}.yaml").read_text())
    assert env and env == user_data


def test_the_peer_port_is_open_between_workers_and_published() -> None:
    groups = (EC2 / "security-groups.yaml").read_text()
    rule = groups[groups.index("WorkerPeersFromWorkers:") :]
    assert (
        "FromPort: 50052" in rule and 'SourceSecurityGroupId: {"Fn::GetAtt": [WorkerGroup' in rule
    )
    assert "-p 50052:50052" in (EC2 / "user-data" / "worker.yaml").read_text()
    assert "CODEDGD_PEER_LISTEN=0.0.0.0:50052" in _settings((EC2 / "worker.env").read_text())
