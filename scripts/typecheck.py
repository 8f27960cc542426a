"""Type-check the codedgd namespace with mypy (strict, as configured in pyproject.toml).

The folders services/ and client/ install as ``codedgd.services`` and ``codedgd.client``
(setuptools package-dir mapping). An editable install reaches them through an import
hook that mypy does not follow, so this script lays out the namespace mypy expects:
build/typecheck/codedgd/{services,client} are symbolic links to the real folders. mypy
then names every module by its import name, and the paths it reports are mapped back
to the real files (services/..., client/...).

    python scripts/typecheck.py            # what CI runs
    python scripts/typecheck.py -- --no-incremental   # extra mypy flags after --
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "typecheck"
PACKAGES = ("services", "client")


def lay_out() -> Path:
    """build/typecheck/codedgd/<package> → the real folder (made or refreshed)."""
    namespace = TREE / "codedgd"
    namespace.mkdir(parents=True, exist_ok=True)
    for name in PACKAGES:
        link = namespace / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(ROOT / name, target_is_directory=True)
    return TREE


def main(argv: list[str]) -> int:
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    tree = lay_out()
    env = {**os.environ, "MYPYPATH": str(tree)}
    command = [sys.executable, "-m", "mypy", *extra]
    for name in PACKAGES:
        command += ["-p", f"codedgd.{name}"]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    prefix = str((tree / "codedgd").relative_to(ROOT)) + os.sep
    for stream, text in ((sys.stdout, proc.stdout), (sys.stderr, proc.stderr)):
        stream.write(text.replace(prefix, ""))
    return proc.returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
