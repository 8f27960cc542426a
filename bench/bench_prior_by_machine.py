"""auto's prior by machine against by place, on real worker processes that reconnect in
another order.

A pool of n = 8 named workers (``codedgd worker --name m<k>``) of which ``--slow``
machines wait ``--extra-delay`` seconds more every round (the worker's own test
instrument: the delay follows the machine to whichever place it holds, where a
straggler model's follows the place). Steps, all through the CLI a user runs:

1. The machines connect in order m0..m7 to one ``codedgd coordinator``; a source job of
   uncoded, with no straggler model (the delays are the machines' own), runs on them.
2. ``codedgd tune`` on its result file writes auto's start (``--write-auto``): its
   prior (each place's slowness) and ``prior_names`` (the machine of each entry).
3. The pool reconnects in reverse order, so each slow machine holds another place, and
   every variant runs to the same target (interleaved, ``--repeats`` times each):
   ``by machine`` (auto as written: the entries follow the names), ``by place`` (the
   same without ``prior_names``: the entries stay at the places they were measured at,
   now other machines'), ``no prior`` (neither), and uncoded. The target is the loss
   uncoded reaches in ``--rounds`` rounds on the reconnected pool.

Reported: each variant's median time to the target, its ratio to ``by machine``, and
per run auto's switches and how many of its decisions refitted the delays (the
coordinator's ``-vv`` log: a decision over rounds that timed no worker, as lazy rounds
that ask no group, keeps the rule without a refit).
Wall-clock times on this shared 2-core machine: run it alone.

    python -m bench.bench_prior_by_machine
    python -m bench.bench_prior_by_machine --lr 0.1 --rounds 600 --repeats 5
    python -m bench.bench_prior_by_machine --lr 0.1 --rounds 600 --repeats 5 --param lazy=none
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

N = 8
# bench_tune_real's job: a few hundred rounds of a few ms each.
JOB = [
    "-n", str(N), "--seed", "3", "--data-opt", "rows=40000", "--data-opt", "dim=50",
    "--no-progress",
]  # fmt: skip
CLI = [sys.executable, "-m", "codedgd.client.cli"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Pool:
    """One coordinator process and the named worker processes connected to it."""

    def __init__(self, where: Path) -> None:
        self.address = f"127.0.0.1:{_free_port()}"
        self.where = where
        self.log = (where / "coordinator.log").open("w")
        # -vv: auto's every decision, with its reason, is in the log (decisions()).
        self.coordinator = subprocess.Popen(
            [*CLI, "coordinator", "--listen", self.address, "-vv"],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.workers: list[subprocess.Popen[bytes]] = []
        self._wait_for(0)

    def cli(self, *args: str, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [*CLI, *args], capture_output=True, text=True, timeout=1800, cwd=self.where
        )
        if done.returncode not in ok:
            raise SystemExit(f"codedgd {' '.join(args)}:\n{done.stderr}")
        return done

    def decisions(self, since: int) -> tuple[int, int, int]:
        """auto's decisions logged after byte ``since`` of the coordinator's log: (all,
        those that refitted the delays, the log's end)."""
        self.log.flush()
        text = Path(self.log.name).read_bytes()
        lines = text[since:].decode(errors="replace").splitlines()
        made = [line for line in lines if "the look-ahead from round" in line]
        refitted = [line for line in made if ": no refit" not in line]
        return len(made), len(refitted), len(text)

    def connected(self) -> list[str]:
        done = subprocess.run(
            [*CLI, "status", "--json", "--coordinator", self.address],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 0:
            return []
        workers: list[str] = json.loads(done.stdout).get("workers", [])
        return workers

    def _wait_for(self, count: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.coordinator.poll() is not None:
                raise SystemExit(f"the coordinator exited: see {self.log.name}")
            if len(self.connected()) == count and (count or self._serving()):
                return
            time.sleep(0.2)
        raise SystemExit(f"{count} workers did not connect within {timeout:g} s")

    def _serving(self) -> bool:
        return (
            subprocess.run(
                [*CLI, "health", "--coordinator", self.address], capture_output=True
            ).returncode
            == 0
        )

    def connect(self, order: list[int], slow: set[int], extra: float) -> None:
        """Machines m<k> for k in ``order``, each connected before the next starts (places
        go in the order workers connect); those of ``slow`` wait ``extra`` s a round."""
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
        for i, k in enumerate(order):
            flags = ["--extra-delay", str(extra)] if k in slow else []
            self.workers.append(
                subprocess.Popen(
                    [*CLI, "worker", "--coordinator", self.address, "--name", f"m{k}", *flags],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            self._wait_for(i + 1)

    def disconnect(self) -> None:
        for w in self.workers:
            w.terminate()
        for w in self.workers:
            w.wait(timeout=60)
        self.workers = []
        self._wait_for(0)

    def close(self) -> None:
        for w in self.workers:
            w.kill()
        self.coordinator.terminate()
        self.coordinator.wait(timeout=60)
        self.log.close()


def time_to(path: Path, target: float) -> tuple[float, list[str]]:
    """A run's time to ``target`` (inf: missed) and auto's switches (round: note)."""
    rounds = json.loads(path.read_text())["rounds"]
    hit = next((r for r in rounds if r["loss"] is not None and r["loss"] <= target), None)
    notes = [
        f"{r['round']}: {r['note']}" for r in rounds if (r.get("note") or "").startswith("auto:")
    ]
    return (float(hit["wall_seconds"]) if hit else math.inf), notes


def variant(written: dict[str, Any], drop: tuple[str, ...], given: list[str]) -> list[str]:
    """The flags of auto as tune wrote it, with the options ``drop`` left out and the
    options ``given`` (KEY=VALUE) set."""
    policy = dict(written["policy"])
    policy.update(item.split("=", 1) for item in given)
    kept = [f"--param={k}={v}" for k, v in policy.items() if k != "name" and k not in drop]
    return ["--policy", str(policy["name"]), *kept]


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_prior_by_machine",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--slow", type=int, nargs="+", default=[1, 4], help="the slow machines")
    p.add_argument("--extra-delay", type=float, default=0.02, help="their seconds more a round")
    p.add_argument("--source-rounds", type=int, default=60)
    p.add_argument("--rounds", type=int, default=150, help="uncoded's rounds: the target")
    p.add_argument("--lr", default="0.5", help="the job's step size (smaller: longer jobs)")
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of every auto variant, over tune's (e.g. lazy=none: eager rules only)",
    )
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    slow = set(a.slow)
    job = [*JOB, "--lr", a.lr]
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        pool = Pool(where)
        try:
            pool.connect(list(range(N)), slow, a.extra_delay)
            pool.cli(
                "submit", "--coordinator", pool.address, *job, "-r", str(a.source_rounds),
                "-o", "source.json",
            )  # fmt: skip
            tuned = pool.cli("tune", "source.json", "--write-auto", "auto.toml", ok=(0, 1))
            print(tuned.stdout.strip().splitlines()[-1], file=sys.stderr)
            written = tomllib.loads((where / "auto.toml").read_text())
            options = written["policy"]
            print(
                f"auto as tune wrote it: {options.get('name')} r={options.get('r')}; "
                f"prior {options.get('prior')}; prior_names {options.get('prior_names')}",
                file=sys.stderr,
            )
            if "prior_names" not in options:
                raise SystemExit("tune wrote no prior_names: nothing to compare")
            pool.disconnect()
            order = list(reversed(range(N)))
            pool.connect(order, slow, a.extra_delay)
            pool.cli(
                "submit", "--coordinator", pool.address, *job, "-r", str(a.rounds),
                "-o", "uncoded-target.json",
            )  # fmt: skip
            rounds = json.loads((where / "uncoded-target.json").read_text())["rounds"]
            target = float(rounds[-1]["loss"])
            flags = {
                "by machine": variant(written, (), a.param),
                "by place": variant(written, ("prior_names",), a.param),
                "no prior": variant(written, ("prior", "prior_names"), a.param),
                "uncoded": ["--policy", "uncoded"],
            }
            times: dict[str, list[float]] = {label: [] for label in flags}
            switches: dict[str, list[int]] = {label: [] for label in flags}
            made: dict[str, list[tuple[int, int]]] = {label: [] for label in flags}
            for i in range(a.repeats):
                for label, policy in flags.items():
                    out = f"{label.replace(' ', '-')}.{i}.json"
                    _, _, mark = pool.decisions(0)
                    pool.cli(
                        "submit", "--coordinator", pool.address, *policy, *job,
                        "-r", str(2 * a.rounds), "--target-loss", repr(target), "-o", out,
                    )  # fmt: skip
                    seconds, notes = time_to(where / out, target)
                    decided, refitted, _ = pool.decisions(mark)
                    made[label].append((decided, refitted))
                    times[label].append(seconds)
                    switches[label].append(len(notes))
                    print(
                        f"  {label}: {seconds:.3f} s, {len(notes)} switches, {refitted} of "
                        f"{decided} decisions refitted",
                        file=sys.stderr,
                        flush=True,
                    )
                    for note in notes:  # (each switch: the round, the rule, the gain)
                        print(f"    round {note[:150]}", file=sys.stderr)
        finally:
            pool.close()
    medians = {label: statistics.median(t) for label, t in times.items()}
    base = medians["by machine"]
    print(
        f"n = {N}, machines {sorted(slow)} {a.extra_delay:g} s slower a round, reconnected "
        f"in reverse order; target loss {target:.6g} (uncoded's in {a.rounds} rounds); "
        f"medians of {a.repeats} runs"
    )
    print(f"auto's options over tune's: {' '.join(a.param) or 'none'}")
    print(
        "| variant | time to target (s) | range (s) | / by machine | switches | "
        "decisions refitted |"
    )
    print("|---|---:|---:|---:|---|---|")
    for label, m in medians.items():
        shown = ", ".join(map(str, switches[label])) if label != "uncoded" else ""
        refits = ", ".join(f"{r}/{d}" for d, r in made[label]) if label != "uncoded" else ""
        span = f"{min(times[label]):.3f}-{max(times[label]):.3f}"
        print(f"| {label} | {m:.3f} | {span} | {m / base:.2f} | {shown} | {refits} |")
    print(f"({time.time() - started:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
