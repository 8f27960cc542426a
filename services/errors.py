"""Errors a user can cause. Each message names the problem and the fix."""

from __future__ import annotations


class CodedGDError(Exception):
    """Base class of every error codedgd reports to a user (never a traceback)."""


class ConfigError(CodedGDError, ValueError):
    """A job description, option or parameter is invalid."""


class PlanError(ConfigError):
    """A policy cannot build a plan for the requested n, s, r, ... ."""


class DataError(CodedGDError):
    """A dataset is missing, corrupt, or does not match what was asked."""


class WireError(CodedGDError):
    """A message on the wire has the wrong shape, dtype, round or size."""


class NotInJob(WireError):
    """A peer pushed into a job this worker is not (or no longer) in: not the sender's
    data at fault (the peer server answers FAILED_PRECONDITION, not INVALID_ARGUMENT)."""


class NonFiniteError(WireError):
    """A tensor holds NaN or inf where numbers belong: the sender is at fault."""


class DecodeError(CodedGDError):
    """A policy could not decode (infeasible set of arrivals, residual too large)."""


class WorkerFault(DecodeError):
    """An arrival the policy cannot use through its sender's fault: no gradient where the
    policy needs one (a ``skipped`` result under a policy whose workers never skip, or a
    lag-wk worker skipping before its first upload), or a payload of the wrong length.

    The coordinator throws that worker out and replaces it like a lost one; the job
    goes on (a real DecodeError, a bug or an undecodable round, fails it).
    """


class JobFailed(CodedGDError):
    """A job stopped before its last round (worker lost, cancelled, error)."""


class Diverged(JobFailed):
    """The descent made the training loss worse, or not a number: the job diverged."""
