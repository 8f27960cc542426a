#!/usr/bin/env bash
# The wheel a user installs: build it, install it into a fresh virtual environment
# outside the checkout, run a short job from there, and check that it installs one
# import namespace (codedgd) and no top-level `services` or `client` package.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

python3 -m pip wheel -q --no-deps --wheel-dir "$work/dist" "$root"
wheel=("$work"/dist/codedgd-*.whl)
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --disable-pip-version-check "${wheel[0]}"

cd "$work"  # nothing of the checkout on sys.path
"$work/venv/bin/codedgd" run -r 3 --no-progress -o "$work/out.json"
"$work/venv/bin/python" - <<'PY'
import importlib.util
import sys

for name in ("services", "client"):
    spec = importlib.util.find_spec(name)
    if spec is not None:
        sys.exit(f"the wheel installs a top-level {name!r} package ({spec.origin}): "
                 "everything must live under codedgd.*")
import codedgd.client.cli, codedgd.services.proto.codedgd_pb2_grpc  # noqa: E401,F401
print("wheel: one namespace (codedgd.*); no top-level services or client")
PY
