"""The coordinator's registry of connected workers."""

from __future__ import annotations

from codedgd.services.coordinator.sessions import Sessions


async def test_a_second_worker_with_a_name_in_use_gets_a_distinct_one() -> None:
    sessions = Sessions()
    first = sessions.new("dup", "peer-a", False)
    second = sessions.new("dup", "peer-b", False)
    assert first.name == "dup"
    assert second.name == f"dup#{second.id}"
    sessions.remove(first)
    third = sessions.new("dup", "peer-c", False)  # the name is free again
    assert third.name == "dup"
    assert len({s.name for s in sessions.all()}) == len(sessions) == 2
