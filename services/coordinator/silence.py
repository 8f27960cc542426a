"""Silent peers: whom to blame when a ring's or a tree's round stops moving.

A worker of a ring or tree that waits for a peer's data longer than the round's deadline
reports that peer silent (``PeerFailure.silent``) and keeps waiting. A peer that is
itself waiting for another is silent too (a ring stalls all the way round; a tree's
parent stalls with its child), so the reports form a who-waits-for-whom graph, and only
its roots are to blame: a worker reported silent that sent no silent report of its own.
In a cycle (a ring whose every member waits on the next, the hung one included) there
is no root. The link that failed is where data stopped first: a ring's stall spreads
downstream one message per hop, so the wait with the fewest messages received from its
peer (PeerFailure.received) names it, and among equals the wait that began first. When
the waits began cannot decide alone: a hop takes milliseconds, and each report's start
is estimated across a loaded machine's scheduling and the report's own transit.

The deadline is derived from measured round times, not guessed: ``factor`` times the
longest of the job's recent rounds, at least ``minimum`` seconds, at most the job's
``round_timeout`` (and that until a few rounds have been timed). The coordinator
resolves a round's reports 1.5 deadlines after θ_t went out, when workers' waits (which
begin after θ_t arrives) have had time to expire and be reported, and again every half
deadline while the round is stuck. A worker found at a root that is alive and working
on the round (its heartbeat says so) is blamed only at the next resolution: its own wait
may have begun later than its peers' (its compute ran slower on a loaded machine), and
blaming it before that wait is reported released a healthy worker.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

COORDINATOR = -1
RECENT_ROUNDS = 20  # the rounds the deadline is derived from
TIMED_ROUNDS = 3  # rounds timed before the deadline is derived (round_timeout before)
RESOLVE_AFTER = 1.5  # deadlines after θ_t went out, the round's reports are resolved


@dataclass(frozen=True)
class Stall:
    """One wait past the deadline: ``reporter`` (a worker, or COORDINATOR) waits for
    data from ``peers`` since ``since`` (the coordinator's clock)."""

    reporter: int
    peers: frozenset[int]
    since: float
    what: str  # what was waited for, for the reason given to the blamed
    received: int = 0  # messages of the round had from ``peers`` before the wait


def peer_deadline(
    recent: Iterable[float], factor: float, minimum: float, round_timeout: float
) -> float:
    """The round's deadline from the job's ``recent`` round seconds (the last ones)."""
    timed = list(recent)[-RECENT_ROUNDS:]
    if len(timed) < TIMED_ROUNDS:
        return round_timeout
    longest = max(timed)
    return min(round_timeout, max(minimum, factor * longest))


def silent_roots(stalls: Iterable[Stall], now: float) -> dict[int, str]:
    """The workers to blame for a stalled round, each with the reason to give.

    A worker is blamed when some wait is for it and it reported no wait of its own;
    with none such (a cycle of waits), the peers of the wait with the fewest messages
    received, among equals the one that began first. The reason
    names the link: a peer's wait, when one is for the blamed, before the coordinator's.
    """
    # Peers' waits first (each names a link), the coordinator's own last; earliest first.
    stalls = sorted(stalls, key=lambda s: (s.reporter == COORDINATOR, s.since, s.reporter))
    reporters = {s.reporter for s in stalls}
    blamed: dict[int, Stall] = {}
    for stall in stalls:
        for peer in sorted(stall.peers):
            if peer not in reporters and peer not in blamed:
                blamed[peer] = stall
    if not blamed:
        waits = [s for s in stalls if s.reporter != COORDINATOR]
        first = min(waits, key=lambda s: (s.received, s.since, s.reporter), default=None)
        if first is not None:
            blamed = {peer: first for peer in sorted(first.peers)}
    return {peer: _reason(stall, now) for peer, stall in blamed.items()}


def _reason(stall: Stall, now: float) -> str:
    who = "the coordinator" if stall.reporter == COORDINATOR else f"worker {stall.reporter}"
    return f"silent: {who} waited {now - stall.since:.1f} s for its {stall.what}"
