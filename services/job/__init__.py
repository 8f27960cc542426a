"""A job: its description (:mod:`.config`), its preparation before round 0
(:mod:`.prepare`), the descent it drives (:mod:`.descent`) and the errors a round can end
with (:mod:`.failures`).

This package sits below both the coordinator and the simulator: each prepares a job,
steps and evaluates it the same way, and differs only in where the rounds' messages come
from (real workers over gRPC, or a virtual clock).
"""

from codedgd.services.job.config import Component, JobConfig

__all__ = ["Component", "JobConfig"]
