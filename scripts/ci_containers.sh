#!/usr/bin/env bash
# The container suite on a fresh Debian (bookworm) machine, as root, without a Docker engine:
# installs podman, runc, debootstrap, Debian's prometheus, iproute2 and podman-compose, then
# runs `python -m pytest -m containers` (images built with podman from docker/Dockerfile,
# docker-compose.yml run by podman-compose, the EC2 layout in network namespaces).
#
#   scripts/ci_containers.sh            # .ci/run calls it under a time budget
#
# Base images cannot be pulled from a registry on these machines: the suite builds one with
# debootstrap the first time (about 1-2 min) and podman keeps it for later runs.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/ci_containers.sh: run as root (podman networks and network namespaces)" >&2
    exit 2
fi

echo "== container suite: install"
missing=()
# iptables: netavark (podman's network backend) calls it for every container on a network;
# without it every `podman run` fails with "netavark: No such file or directory".
for tool in podman runc debootstrap prometheus ip tc openssl iptables catatonit; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ "${#missing[@]}" -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends \
        podman runc debootstrap prometheus iproute2 openssl ca-certificates \
        netavark aardvark-dns iptables catatonit
fi
# tests/containers/test_k8s.py renders deploy/k8s with kubectl's kustomize (1.21 or newer:
# Debian's kubernetes-client is 1.20, too old for kustomize components); it comes with the
# machine image here (Google Cloud SDK), from no registry this script may use.
command -v kubectl >/dev/null || echo "scripts/ci_containers.sh: kubectl (>= 1.21) is missing:" \
    "tests/containers/test_k8s.py will fail; install it from your cluster tooling" >&2
python3 -m pip show -q podman-compose >/dev/null 2>&1 || python3 -m pip install -q podman-compose
python3 -m pip install -q -e ".[dev]"

# runc and no default ulimits: crun fails here ("cgroups in hybrid mode not supported")
# and setting RLIMIT_NOFILE/NPROC is refused (see ../shared/CONTAINERS.md).
if [ -z "${CONTAINERS_CONF:-}" ]; then
    export CONTAINERS_CONF=/etc/containers/codedgd-ci.conf
    mkdir -p /etc/containers
    cat > "$CONTAINERS_CONF" <<'CONF'
[containers]
default_ulimits = []
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
CONF
fi

echo "== container suite: tests"
export CODEDGD_CONTAINERS_REQUIRED=1   # a missing tool fails the suite instead of skipping
exec python3 -m pytest -m containers -q -p no:cacheprovider "$@"
