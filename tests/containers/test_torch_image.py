"""The torch image variant: docker/Dockerfile built with ``--build-arg EXTRAS=torch``
trains a network (`codedgd run -m mlp`, worker processes inside the container) on IDX files
mounted into it and writes a state_dict the host's PyTorch loads.

Sandbox-only: PyTorch's CPU index (the Dockerfile's default TORCH_PIP_OPTIONS) is not
reachable here, so the build takes the CPU wheel this machine keeps in /opt/wheels through
the same build arguments a user with a wheel mirror would give.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require_torch
from tests.containers.support import (
    APP_IMAGE,
    ROOT,
    build,
    build_suite_images,
    ensure_base_images,
    from_image,
    missing,
    podman,
    require_tools,
)
from tests.data.test_idx import write_mnist

pytestmark = pytest.mark.containers

TORCH_IMAGE = "localhost/codedgd:torch-containers-test"
WHEELS = Path("/opt/wheels")


def test_the_torch_image_trains_an_mlp_and_writes_a_state_dict(tmp_path: Path) -> None:
    torch: Any = require_torch()
    require_tools("podman", "runc")
    wheels = sorted(WHEELS.glob("torch-*+cpu-cp311-*.whl"))
    if not wheels:
        missing(f"no PyTorch CPU wheel for Python 3.11 in {WHEELS}")
    version = wheels[-1].name.split("-")[1]  # e.g. 2.13.0+cpu
    dockerfile = ROOT / "docker" / "Dockerfile"
    ensure_base_images([from_image(dockerfile)])
    build(
        TORCH_IMAGE, dockerfile, ROOT,
        "--build-arg", "EXTRAS=torch",
        "--build-arg", "TORCH_PIP_OPTIONS=--find-links /wheels",
        "--build-arg", f"TORCH_REQUIREMENT=torch=={version}",
        "-v", f"{WHEELS}:/wheels:ro",
    )  # fmt: skip
    data = write_mnist(tmp_path / "fm", train=120, test=30)
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)  # the image runs as an unprivileged user
    podman(
        "run", "--rm", "--network", "none",
        "-v", f"{data}:/data:ro", "-v", f"{out}:/out",
        TORCH_IMAGE,
        "run", "-n", "2", "-r", "3", "-d", "fashion-mnist", "--data-opt", "path=/data",
        "-m", "mlp", "--model-opt", "hidden=8", "--lr", "0.1", "--batch-size", "16",
        "-o", "/out/mlp.json", "--no-progress",
    )  # fmt: skip
    state = torch.load(out / "mlp.model.pt", weights_only=True)
    assert {k: tuple(v.shape) for k, v in state.items()} == {
        "0.weight": (8, 784),
        "0.bias": (8,),
        "2.weight": (10, 8),
        "2.bias": (10,),
    }
    # The image without the extra refuses a network, naming the build argument.
    build_suite_images()
    plain = podman(
        "run", "--rm", "--network", "none", "-v", f"{data}:/data:ro", APP_IMAGE,
        "run", "-n", "2", "-r", "1", "-d", "fashion-mnist", "--data-opt", "path=/data",
        "-m", "mlp", "--lr", "0.1", "--no-progress",
        check=False,
    )  # fmt: skip
    assert plain.returncode == 2 and "EXTRAS=torch" in plain.stderr, plain.stderr
