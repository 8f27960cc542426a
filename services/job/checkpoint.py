"""A job's checkpoint: everything its rounds need to go on exactly where they stopped.

A checkpoint holds the last round completed and the state of the job's descent after it
(:meth:`codedgd.services.job.descent.Descent.state`): θ and the optimizer's momentum and
schedule position, the divergence yardstick, and the policy's memory across rounds (LAG's
last message per unit, the points they were taken at, its θ history). Everything else a
round uses is rebuilt from the job's config: the data, the plan, the codes (seeded), the
straggler delays (a function of the seed, the round and the worker).

File format (``.npz``, numpy's zip of arrays), written whole or not at all
(:mod:`codedgd.services.files`):

* ``meta``: a 0-d unicode array holding JSON ``{"format": "codedgd.checkpoint.v1",
  "job_id", "round", "state", "arrays", "sha256"}``. ``state`` is the state tree with every
  array replaced by ``{"array": KEY}``; ``arrays`` lists the keys in order; ``sha256`` is
  the SHA-256 of each array's dtype string, shape and little-endian bytes, in that order.
* one entry per array, under its KEY (``a0``, ``a1``, ...).

:func:`read_checkpoint` checks the format, the checksum and every array before it
returns; a file that is cut short, damaged or of another format is a CheckpointError
naming the file and what is wrong with it.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from codedgd.services.errors import CodedGDError
from codedgd.services.files import atomic_open

FORMAT = "codedgd.checkpoint.v1"


class CheckpointError(CodedGDError):
    """A checkpoint file that cannot be used (cut short, damaged, another job's)."""


@dataclass(frozen=True)
class Checkpoint:
    """The job's state after round ``round`` (its rounds resume at ``round + 1``)."""

    job_id: str
    round: int
    state: dict[str, Any]


def write_checkpoint(path: str | Path, checkpoint: Checkpoint) -> Path:
    """Write ``checkpoint`` to ``path`` atomically; the path written."""
    arrays: dict[str, np.ndarray] = {}
    tree = _pack(checkpoint.state, arrays)
    meta = {
        "format": FORMAT,
        "job_id": checkpoint.job_id,
        "round": int(checkpoint.round),
        "state": tree,
        "arrays": list(arrays),
        "sha256": _digest(arrays),
    }
    target = Path(path)
    with atomic_open(target, "wb") as f:
        np.savez(f, meta=np.array(json.dumps(meta, allow_nan=True)), **arrays)  # type: ignore[arg-type]
    return target


def read_checkpoint(path: str | Path) -> Checkpoint:
    """The checkpoint in ``path``, its checksum verified (CheckpointError if it fails)."""
    p = Path(path)
    try:
        with np.load(p, allow_pickle=False) as npz:
            meta = json.loads(str(npz["meta"][()]))
            if not isinstance(meta, dict) or meta.get("format") != FORMAT:
                raise CheckpointError(f"checkpoint {p} is not a {FORMAT} file")
            keys = [str(k) for k in meta["arrays"]]
            arrays = {k: np.array(npz[k]) for k in keys}
    except CheckpointError:
        raise
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {p} does not exist") from None
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as exc:
        raise CheckpointError(
            f"checkpoint {p} is cut short or damaged ({type(exc).__name__}: {exc})"
        ) from None
    if _digest(arrays) != meta.get("sha256"):
        raise CheckpointError(f"checkpoint {p} is damaged: its arrays fail their SHA-256 check")
    try:
        state = _unpack(meta["state"], arrays)
        return Checkpoint(str(meta["job_id"]), int(meta["round"]), state)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {p} is damaged ({exc!r})") from None


def _pack(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    if isinstance(value, np.ndarray):
        key = f"a{len(arrays)}"
        arrays[key] = np.ascontiguousarray(value)
        return {"array": key}
    if isinstance(value, Mapping):
        return {"map": {str(k): _pack(v, arrays) for k, v in value.items()}}
    if isinstance(value, list | tuple):
        return {"list": [_pack(v, arrays) for v in value]}
    if isinstance(value, bool | int | float | str) or value is None:
        return {"value": value}
    if isinstance(value, np.generic):
        return {"value": value.item()}
    raise TypeError(f"a checkpoint cannot hold {type(value).__name__}")


def _unpack(node: Any, arrays: Mapping[str, np.ndarray]) -> Any:
    if not isinstance(node, dict) or len(node) != 1:
        raise ValueError(f"unknown state node {node!r:.80}")
    ((kind, body),) = node.items()
    if kind == "array":
        return arrays[body]
    if kind == "map":
        return {k: _unpack(v, arrays) for k, v in body.items()}
    if kind == "list":
        return [_unpack(v, arrays) for v in body]
    if kind == "value":
        return body
    raise ValueError(f"unknown state node kind {kind!r}")


def _digest(arrays: Mapping[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for key, a in arrays.items():
        little = a.astype(a.dtype.newbyteorder("<"), copy=False)
        h.update(key.encode())
        h.update(little.dtype.str.encode())
        h.update(repr(tuple(a.shape)).encode())
        h.update(np.ascontiguousarray(little).tobytes())
    return h.hexdigest()
