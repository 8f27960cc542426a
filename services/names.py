"""Worker names: what a name may be, and which machine it stands for from one run to the next.

A worker names itself in its Hello (``--name``; ``host:pid`` by default). The coordinator
appends ``#<session>`` to a name already connected, so the names of one moment are
unique; ``#`` is in no name a worker may give, so the machine behind ``a#7`` is ``a``.

What is known of a machine on one run (auto's prior, from ``codedgd tune``) speaks for
the same machine on the next, whichever place it takes there: :func:`match_machines`
pairs the places of two runs by their holders' names. A name matches itself (its
``#<session>`` dropped); a default name ``host:pid`` (its pid changes with every
process) matches on its host, when that host held one place on each run.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

# What a Hello may carry (see the .proto): names that read as one token in a log line.
MAX_NAME_LENGTH = 64
NAME_PATTERN = re.compile(r"[A-Za-z0-9._:@+-]+")
# A name as the coordinator shows it: a worker's name, "#<session>" when it was taken.
SHOWN_PATTERN = re.compile(r"[A-Za-z0-9._:@+-]+(#[0-9]+)?")


def machine(name: str) -> str:
    """The worker's own name behind a name the coordinator shows (``a#7`` → ``a``)."""
    return name.split("#", 1)[0]


def host(name: str) -> str | None:
    """The host of a default name (``host:pid`` → ``host``); None for any other name."""
    own = machine(name)
    head, sep, pid = own.rpartition(":")
    return head if sep and head and pid.isdigit() else None


def match_machines(before: Sequence[str], now: Sequence[str]) -> list[int | None]:
    """For each name of ``now``, the index in ``before`` of the same machine, or None.

    The same name matches first (``#<session>`` dropped on both sides; "" matches
    nothing); then a default name ``host:pid`` matches the one of ``before`` on the same
    host, when that host is unique among ``before``'s names and among ``now``'s. No
    index of ``before`` is given twice: a name that occurs twice there (two places held
    by one machine, one after the other) matches nothing.
    """
    own = [machine(n) for n in before]
    counts = Counter(n for n in own if n)
    by_name = {n: i for i, n in enumerate(own) if n and counts[n] == 1}
    matched: list[int | None] = [by_name.get(machine(n)) for n in now]
    taken = {i for i in matched if i is not None}
    hosts_before = Counter(h for n in before if (h := host(n)))
    hosts_now = Counter(h for n in now if (h := host(n)))
    by_host = {
        h: i
        for i, n in enumerate(before)
        if i not in taken and (h := host(n)) and hosts_before[h] == 1
    }
    for j, n in enumerate(now):
        h = host(n)
        if matched[j] is None and h is not None and hosts_now[h] == 1 and h in by_host:
            matched[j] = by_host[h]
    return matched
