"""Why a round cannot go on without a lost worker: one text for the cluster and the simulator."""

from __future__ import annotations


def no_replacement_message(t: int, vacant: list[int], replace_timeout: float) -> str:
    """The start of the error of a round whose replacement did not come (real or simulated)."""
    return (
        f"round {t}: no worker took the place of lost worker(s) {vacant} within "
        f"job.replace_timeout={replace_timeout:g} s; "
    )


def infeasible_message(policy: str, t: int, lost: list[str]) -> str:
    """Why round t cannot decode without the lost workers, and the fixes (real or simulated)."""
    return (
        f"policy {policy!r} cannot decode round {t} without the lost worker(s) "
        f"[{', '.join(lost) or 'none'}]. Set job.replace_timeout (--replace-timeout) so a new "
        "worker can take its place, use a policy that tolerates more stragglers (e.g. "
        "ignore-stragglers, frc or cyclic with a larger s), or restart the job with all "
        "workers up."
    )
