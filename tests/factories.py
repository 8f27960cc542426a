"""Test data many tests build: a round record with every field a plain default."""

from __future__ import annotations

import math
from typing import Any

from codedgd.services.records import RoundRecord


def round_record(t: int = 0, **fields: Any) -> RoundRecord:
    """Round ``t`` of a run whose every round took a second and used nobody in
    particular; ``fields`` set the rest (any RoundRecord field)."""
    values: dict[str, Any] = {
        "round": t,
        "wall_seconds": float(t + 1),
        "round_seconds": 1.0,
        "wait_seconds": 1.0,
        "decode_seconds": 0.0,
        "compute_seconds_max": 0.0,
        "loss": 1.0,
        "metric": math.nan,
        "metric_name": "",
        "workers_used": (),
        "exact": True,
        "decode_residual": 0.0,
        "bytes_up": 0,
        "bytes_down": 0,
        "uploads": 0,
        "computations": 0,
        "cancelled": 0,
        "late_dropped": 0,
    }
    values.update(fields)
    return RoundRecord(**values)
