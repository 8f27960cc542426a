"""LAG-WK's upload trigger, on the worker side: upload only when the gradient changed enough.

The coordinator's ``lag-wk`` policy sends a threshold with every round
(:data:`THRESHOLD_PARAM`, in squared payload units; −1 during LAG's first D rounds,
so everyone uploads). The worker computes its message every round and uploads it
only if ``‖payload − last uploaded‖² > threshold``; otherwise it sends a *skipped*
result and the coordinator reuses the last upload. A worker remembers its uploads
only in rounds that carry the parameter, so other policies pay nothing. The real
worker and the simulator both use :class:`LazyUploader`, so they make the same
decisions.

The worker uploads the new message itself rather than the difference δ: both are
ℓ numbers, and the coordinator's copy can then never drift from the worker's.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

THRESHOLD_PARAM = "lag.threshold"
# The PartitionData key of a worker's last upload, handed over with its assignment when a
# job resumes or a newcomer takes a place (partition field 0, not a partition's data).
LAST_UPLOAD_KEY = "lag.last_upload"


class LazyUploader:
    """One worker's memory of its last upload, and the LAG-WK trigger."""

    def __init__(self) -> None:
        self.last: np.ndarray | None = None

    @staticmethod
    def active(params: Mapping[str, float]) -> bool:
        """Does this round use the trigger (and must uploads be remembered)?"""
        return THRESHOLD_PARAM in params

    def should_upload(self, payload: np.ndarray, params: Mapping[str, float]) -> bool:
        """The trigger: upload unless a threshold was sent and the change is within it."""
        threshold = params.get(THRESHOLD_PARAM)
        if threshold is None or self.last is None or self.last.shape != payload.shape:
            return True
        diff = payload - self.last
        return float(diff @ diff) > float(threshold)

    def uploaded(self, payload: np.ndarray) -> None:
        """Remember what was sent (call when the upload really leaves)."""
        self.last = np.array(payload, dtype=np.float64, copy=True)

    def reset(self) -> None:
        self.last = None
