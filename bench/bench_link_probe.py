"""How well ``codedgd tune --probe-links`` measures a link: against tc-shaped links.

bench_shaped's hosts (a coordinator and 12 workers, each in a network namespace of its own,
every NIC shaped by a tbf qdisc at ``--rate`` in both directions), then ``codedgd tune
--probe JOB.toml --probe-links`` run in the coordinator's namespace as a user runs it (a
probe job of two workers, uncoded; the two link probes of one worker), and the link it
fits against the shaped rate. ``none`` runs the namespaces unshaped (veth pairs only: what
the machine's own network stack and codedgd's gRPC and Python cost).

Needs root (ip netns, tc). Nothing leaves the namespaces it makes; they are deleted at
the end (also on Ctrl-C).

    sudo python -m bench.bench_link_probe                       # none 1gbit 200mbit 50mbit
    sudo python -m bench.bench_link_probe --rate 100mbit --repeats 3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_shaped import (
    COORDINATOR_IP,
    ROOT,
    build,
    parse_rate,
    run,
    start,
    teardown,
)

JOB = """
[job]
workers = 2
rounds = 50
seed = 1
[data]
name = "synthetic"
rows = 400
dim = 20
[policy]
name = "uncoded"
"""


def _unshape(namespaces: list[str]) -> None:
    """Remove every tbf qdisc bench_shaped's build added (the ``none`` rate)."""
    for ns in namespaces:
        devices = run("ip", "-n", ns, "-o", "link", "show").splitlines()
        for line in devices:
            dev = line.split(":")[1].strip().split("@")[0]
            if dev != "lo":
                run("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root",
                    check=False)  # fmt: skip


def probe(prefix: str, rate: str, work: Path) -> dict[str, float]:
    """The link ``tune --probe-links`` fits on hosts shaped at ``rate`` (none: unshaped)."""
    hosts = build(prefix, "1gbit" if rate == "none" else rate)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        if rate == "none":
            _unshape(hosts.namespaces)
        procs = start(hosts, work)
        time.sleep(8)  # every worker connected
        (work / "job.toml").write_text(JOB)
        done = subprocess.run(
            [
                "ip", "netns", "exec", hosts.coordinator, sys.executable, "-m",
                "codedgd.client.cli", "tune", "--probe", str(work / "job.toml"),
                "--probe-rounds", "10", "--probe-output", str(work / "probe.json"),
                "--probe-links", "--coordinator", f"{COORDINATOR_IP}:50051",
                "--policy", "uncoded", "--repeats", "1", "--json", "--no-progress",
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=600,
        )  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"tune at {rate}: {done.stderr.strip()[-2000:]}")
        link: dict[str, float] = json.loads(done.stdout)["link"]
        return link
    finally:
        for p in procs:
            p.kill()
            p.wait()
        teardown(hosts)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rate", nargs="+", default=["none", "1gbit", "200mbit", "50mbit"])
    p.add_argument("--repeats", type=int, default=2, help="probes per rate (default 2)")
    a = p.parse_args()
    for rate in a.rate:
        if rate != "none":
            parse_rate(rate)  # (a typo named before the namespaces are made)
    started = time.time()
    print(
        "| shaped rate | rate (MB/s) | fitted bandwidth (MB/s) | fitted / rate | latency a hop "
        "(ms) | burst (kB, how) | round trips: 16 kB (ms) | 1 MB (ms) | 4 MB (ms) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for rate in a.rate:
        for _ in range(a.repeats):
            with tempfile.TemporaryDirectory() as tmp:
                link = probe("cgdlp", rate, Path(tmp))
            bandwidth = link["bandwidth_bytes_per_second"]
            shown = "inf" if bandwidth is None else f"{bandwidth / 1e6:.1f}"
            middle = link.get("medium_seconds")
            medium = "-" if middle is None else f"{middle * 1e3:.2f}"
            if rate == "none":
                expected, ratio = "-", "-"
            else:
                expected = f"{parse_rate(rate) / 1e6:.1f}"
                ratio = "-" if bandwidth is None else f"{bandwidth / parse_rate(rate):.2f}"
            print(
                f"| {rate} | {expected} | {shown} | {ratio} | "
                f"{link['latency_seconds'] * 1e3:.2f} | "
                f"{link['burst_bytes'] / 1e3:.0f} ({link.get('burst', '-')}) | "
                f"{link['small_seconds'] * 1e3:.2f} | {medium} | "
                f"{link['large_seconds'] * 1e3:.2f} |",
                flush=True,
            )
    print(f"\n({time.time() - started:.0f} s; bench_link_probe.py, {time.strftime('%F')})")


if __name__ == "__main__":
    main()
