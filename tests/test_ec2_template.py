"""Every CloudFormation template under deploy/ec2 passes cfn-lint with no error and no
warning, and its roles grant the SSM parameters the user-data reads and writes, no more.
cfn-lint ships the resource schemas of every region, so this runs offline; it checks the
template, not AWS (nothing here is deployed)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from cfnlint.api import ManualArgs, lint_file

EC2 = Path(__file__).resolve().parent.parent / "deploy" / "ec2"
# Regions the README's cost table and commands use, and two more: a resource type or
# property missing in one of them is an error.
REGIONS = ["us-east-1", "eu-west-1", "ap-southeast-2"]
TEMPLATES = sorted(
    p
    for p in EC2.rglob("*")
    if p.suffix in {".yaml", ".yml", ".json"} and "AWSTemplateFormatVersion" in p.read_text()
)


def _problems(template: Path) -> list[str]:
    """cfn-lint's errors (E...) and warnings (W...); informational matches are let pass."""
    matches = lint_file(template, config=ManualArgs(regions=REGIONS))
    return [
        f"{m.rule.id} line {m.linenumber}: {m.message}"
        for m in matches
        if m.rule.id.startswith(("E", "W"))
    ]


def test_deploy_ec2_has_its_cloudformation_templates() -> None:
    assert {EC2 / "security-groups.yaml", EC2 / "worker-group.yaml"} <= set(TEMPLATES)


def test_the_worker_group_launches_workers_with_the_worker_user_data() -> None:
    """worker-group.yaml embeds user-data/worker.yaml: the two must not drift apart."""
    template = yaml.safe_load((EC2 / "worker-group.yaml").read_text())
    data = template["Resources"]["WorkerLaunchTemplate"]["Properties"]["LaunchTemplateData"]
    assert data["UserData"]["Fn::Base64"] == _user_data("worker"), (
        "copy deploy/ec2/user-data/worker.yaml into worker-group.yaml's UserData"
    )


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: str(p.relative_to(EC2)))
def test_the_template_passes_cfn_lint(template: Path) -> None:
    problems = _problems(template)
    assert not problems, f"cfn-lint on {template.relative_to(EC2)}:\n" + "\n".join(problems)


def test_cfn_lint_would_catch_a_broken_template(tmp_path: Path) -> None:
    """Not a vacuous pass: a wrong property type and a misspelled resource type are found."""
    text = (EC2 / "security-groups.yaml").read_text()
    broken = text.replace("FromPort: 50052", 'FromPort: "fifty"').replace(
        "Type: AWS::IAM::InstanceProfile", "Type: AWS::IAM::InstanceProfil"
    )
    assert broken != text
    (tmp_path / "broken.yaml").write_text(broken)
    ids = {p.split()[0] for p in _problems(tmp_path / "broken.yaml")}
    assert {"E3012", "E3006"} <= ids


def _parameters(role: str, action: str) -> set[str]:
    """The names under ${SecretsPrefix} that a role's inline policies allow ``action`` on."""
    template = yaml.safe_load((EC2 / "security-groups.yaml").read_text())
    names: set[str] = set()
    for policy in template["Resources"][role]["Properties"]["Policies"]:
        if "Fn::If" in policy:  # a policy with a condition: the one given when it holds
            policy = policy["Fn::If"][1]
        for statement in policy["PolicyDocument"]["Statement"]:
            resources: Any = statement["Resource"]
            if action not in statement["Action"]:
                continue
            for resource in resources if isinstance(resources, list) else [resources]:
                arn = resource["Fn::Sub"] if isinstance(resource, dict) else resource
                if "parameter${SecretsPrefix}/" in arn:
                    names.add(arn.split("parameter${SecretsPrefix}/")[1])
    return names


def _user_data(role: str) -> str:
    return (EC2 / "user-data" / f"{role}.yaml").read_text()


def _fetched(role: str) -> set[str]:
    """The secrets codedgd-start fetches: its `for name in ...; do` list."""
    (names,) = re.findall(r"for name in ([\w. ]+); do", _user_data(role))
    return set(names.split())


def test_each_role_may_read_the_parameters_its_user_data_fetches() -> None:
    coordinator = _parameters("CoordinatorRole", "ssm:GetParameter")
    worker = _parameters("WorkerRole", "ssm:GetParameter")
    assert _fetched("coordinator") <= coordinator
    assert _fetched("worker") | {"coordinator-address"} <= worker
    assert "$SECRETS_PREFIX/coordinator-address" in _user_data("worker")
    # The operators' token and the coordinator's key stay off worker instances.
    assert not worker & {"operator.token", "coordinator.key", "operator.key"}


def test_only_the_coordinator_writes_and_only_its_address() -> None:
    assert _parameters("CoordinatorRole", "ssm:PutParameter") == {"coordinator-address"}
    assert _parameters("WorkerRole", "ssm:PutParameter") == set()
    assert '--name "$SECRETS_PREFIX/coordinator-address"' in _user_data("coordinator")


@pytest.mark.parametrize(
    "name", ["user-data/coordinator.yaml", "user-data/worker.yaml", "worker.env"]
)
def test_no_private_ip_is_written_into_the_files(name: str) -> None:
    """The coordinator is found through SSM, each instance's own IP through IMDS."""
    private = re.compile(r"\b(?:10|172\.(?:1[6-9]|2\d|3[01])|192\.168)(?:\.\d{1,3}){3}\b")
    text = (EC2 / name).read_text()
    assert not private.findall(text), f"{name} hard-codes {private.findall(text)}"
