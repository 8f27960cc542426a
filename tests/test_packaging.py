"""What `pip install codedgd` installs: one import namespace, every package in it."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _setuptools() -> dict[str, object]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return dict(tomllib.load(f)["tool"]["setuptools"])


def test_every_package_is_packaged_under_the_codedgd_namespace() -> None:
    """Every folder with Python modules under services/ and client/ is a package that
    pyproject.toml lists as codedgd.<folder path>: an unlisted one would be missing from
    the wheel (an editable install would still find it, so only a wheel shows it)."""
    listed = set(_setuptools()["packages"])  # type: ignore[arg-type]
    found = set()
    for top in ("services", "client"):
        for d in [ROOT / top, *(ROOT / top).rglob("*")]:
            if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py")):
                assert (d / "__init__.py").exists(), f"{d} lacks __init__.py: it would not install"
                found.add("codedgd." + ".".join(d.relative_to(ROOT).parts))
    assert found == listed, (
        f"pyproject.toml [tool.setuptools] packages: missing {sorted(found - listed)}, "
        f"stale {sorted(listed - found)}"
    )


def test_the_client_namespace_offers_the_public_api_lazily() -> None:
    """`from codedgd.client import Client, JobConfig, ...` works for every advertised name,
    and importing the package alone loads neither gRPC nor numpy (the CLI starts fast)."""
    import subprocess
    import sys

    probe = (
        "import sys, codedgd.client as c\n"
        "heavy = sorted(m for m in ('grpc', 'numpy', 'scipy') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
        "for name in c.__all__:\n"
        "    getattr(c, name)\n"
        "print(len(c.__all__))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) >= 10


def test_the_client_exports_are_listed_once() -> None:
    import codedgd.client as c

    assert sorted(c.__all__) == sorted(c._EXPORTS)
