"""A worker taking its place in a job: the Assignment, its partitions' rows, the build.

The coordinator sends an ``Assignment`` (the job document, this worker's partitions and
encoding coefficients), then the rows of those partitions as ``PartitionData`` chunks
(or nothing, when the worker loads a real dataset from its own ``--data-dir``), then
``AssignmentEnd``. The worker then builds what its rounds need, off the event loop: the
model's per-partition gradient blocks with the coefficients (a
:class:`~codedgd.services.compute.gradient.Computer`) and the job's straggler model. Bad
data refuses the assignment (the AssignmentAck carries the error); it never fails a round.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp

from codedgd.services.compute.gradient import Computer, PartitionRows
from codedgd.services.errors import DataError, WireError
from codedgd.services.job import JobConfig
from codedgd.services.proto import codedgd_pb2 as pb
from codedgd.services.stragglers.base import StragglerModel
from codedgd.services.wire import Assembler, to_array


class PartitionIntake:
    """The PartitionData chunks of one assignment, assembled into arrays per (partition, key)."""

    def __init__(self) -> None:
        self._pieces: dict[tuple[int, str], Assembler] = {}
        self.arrays: dict[tuple[int, str], np.ndarray] = {}

    def add(self, data: pb.PartitionData, raw: memoryview | None) -> None:
        """One chunk (``raw``: its bytes, when kept out of the message). WireError if bad."""
        key = (data.partition, data.chunk.key)
        asm = self._pieces.setdefault(key, Assembler(data.chunk.key))
        array = asm.add(data.chunk, raw)
        if array is not None:
            self.arrays[key] = array
            del self._pieces[key]


def build(
    assignment: pb.Assignment,
    config: JobConfig,
    arrays: dict[tuple[int, str], np.ndarray],
    data_dir: Path | None,
) -> tuple[Computer, StragglerModel]:
    """What this worker's rounds need: its Computer and the job's straggler model (blocking)."""
    from codedgd.services.models import create_model
    from codedgd.services.stragglers import create_straggler_model

    a = assignment
    model = create_model(config.model.name, config.model.options)
    if a.inline_data:
        parts = [partition_from_arrays(arrays, int(p)) for p in a.partitions]
    else:
        parts = partitions_from_disk(
            config, [int(p) for p in a.partitions], a.n_partitions, dict(a.options), data_dir
        )
    coefficients = to_array(a.coefficients).astype(np.float64)
    straggler = create_straggler_model(
        config.stragglers.name,
        config.stragglers.options,
        seed=config.seed,
        n_workers=int(a.n_workers),
    )
    computer = Computer(
        model,
        parts,
        coefficients,
        dict(a.options),
        batch_size=config.batch_size,
        seed=config.seed,
    )
    return computer, straggler


def partition_from_arrays(arrays: dict[tuple[int, str], np.ndarray], p: int) -> PartitionRows:
    """Partition ``p``'s rows from the arrays the coordinator sent (dense X, or CSR parts)."""
    if (p, "y") not in arrays:
        raise WireError(f"partition {p} was assigned but its data never arrived")
    y = np.asarray(arrays[(p, "y")], dtype=np.float64)
    if (p, "X") in arrays:
        X: np.ndarray | sp.csr_matrix = np.asarray(arrays[(p, "X")], dtype=np.float64)
    else:
        try:
            shape = tuple(int(v) for v in arrays[(p, "X.shape")])
            X = sp.csr_matrix(
                (arrays[(p, "X.data")], arrays[(p, "X.indices")], arrays[(p, "X.indptr")]),
                shape=shape,
            )
            X.check_format(full_check=False)
        except (KeyError, ValueError) as exc:
            raise WireError(f"partition {p}: malformed sparse matrix ({exc})") from None
    if X.shape[0] != y.shape[0]:
        raise WireError(f"partition {p}: {X.shape[0]} rows but {y.shape[0]} labels")
    return PartitionRows(p, X, y)


def partitions_from_disk(
    config: JobConfig,
    partitions: list[int],
    k: int,
    options: dict[str, str],
    data_dir: Path | None,
) -> list[PartitionRows]:
    """The partitions' rows from the worker's own copy of a real dataset, fingerprint-checked."""
    from codedgd.services.data import load_dataset
    from codedgd.services.data.dataset import (
        FINGERPRINT_PREFIX,
        fingerprint,
        partition_rows,
        take_rows,
    )

    if data_dir is None:
        raise WireError("the job loads data on workers but this worker has no --data-dir")
    ds = load_dataset(config.data.name, config.data.options, seed=config.seed, data_dir=data_dir)
    blocks = partition_rows(ds.n_train, k, config.seed)
    parts = [
        PartitionRows(p, take_rows(ds.X_train, blocks[p]), ds.y_train[blocks[p]])
        for p in partitions
    ]
    for part in parts:
        expected = options.get(f"{FINGERPRINT_PREFIX}{part.index}")
        if expected is not None and fingerprint(part.X, part.y) != expected:
            raise DataError(
                f"partition {part.index} of {config.data.name!r} read from "
                f"{data_dir} differs from the coordinator's copy: give the "
                "worker the same dataset files, or start it without --data-dir so the "
                "coordinator sends the rows"
            )
    return parts
