"""Loaders of the real datasets (see the data directory's README for provenance).

Each loader checks the file's format (gzip, header, column count, numeric cells)
and raises :class:`DataError` naming the file, the problem and the fix. Every
split is seeded; one-hot dictionaries are built over all rows, as in the
published gradient-coding experiments.
"""

from __future__ import annotations

import csv
import gzip
import itertools
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from codedgd.services.data.dataset import Dataset, split
from codedgd.services.errors import DataError

AMAZON_FILE = Path("amazon_employee_access") / "train.csv.gz"
COVTYPE_FILE = Path("covtype_ramp_subset") / "test.csv.gz"
KC_HOUSE_FILE = Path("kc_house") / "kc_house_data.csv.gz"

AMAZON_HEADER = [
    "ACTION",
    "RESOURCE",
    "MGR_ID",
    "ROLE_ROLLUP_1",
    "ROLE_ROLLUP_2",
    "ROLE_DEPTNAME",
    "ROLE_TITLE",
    "ROLE_FAMILY_DESC",
    "ROLE_FAMILY",
    "ROLE_CODE",
]
# Pairs of the 9 id columns (0-based) left out of the interaction features.
AMAZON_EXCLUDED_PAIRS = frozenset({(5, 7), (2, 3)})


def _fix(path: Path) -> str:
    return (
        f"re-copy {path.name} from the original dataset, or point CODEDGD_DATA_DIR / "
        "--data-dir at a directory with an intact copy"
    )


def _read_csv(
    data_dir: Path, rel: Path, expected_header: Sequence[str] | None, n_columns: int
) -> tuple[list[str], list[list[str]]]:
    path = data_dir / rel
    if not path.is_file():
        raise DataError(
            f"{path} not found: the data directory must contain {rel} "
            "(set --data-dir or CODEDGD_DATA_DIR)"
        )
    try:
        with gzip.open(path, "rt", newline="") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            rows = list(reader)
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, csv.Error) as exc:
        raise DataError(f"{path} is corrupt or truncated ({exc}): {_fix(path)}") from None
    if header is None:
        raise DataError(f"{path} is empty: {_fix(path)}")
    if expected_header is not None and header != list(expected_header):
        raise DataError(f"{path} has an unexpected header {header[:4]}...: {_fix(path)}")
    if len(header) != n_columns:
        raise DataError(f"{path} has {len(header)} columns, expected {n_columns}: {_fix(path)}")
    for i, row in enumerate(rows):
        if len(row) != n_columns:
            raise DataError(
                f"{path} line {i + 2} has {len(row)} cells, expected {n_columns}: {_fix(path)}"
            )
    if not rows:
        raise DataError(f"{path} has no data rows: {_fix(path)}")
    return header, rows


def _numeric(rows: list[list[str]], path: Path, dtype: type = float) -> np.ndarray:
    try:
        return np.array(rows, dtype=np.float64 if dtype is float else np.int64)
    except ValueError as exc:
        raise DataError(f"{path} has a non-numeric cell ({exc}): {_fix(path)}") from None


def _one_hot(columns: Sequence[np.ndarray], bias: bool = True) -> sp.csr_matrix:
    """One-hot of integer-coded columns (distinct values over all rows), plus a bias column."""
    n = columns[0].shape[0]
    codes = []
    offset = 0
    for col in columns:
        _, inverse = np.unique(col, return_inverse=True)
        codes.append(inverse.astype(np.int64) + offset)
        offset += int(inverse.max()) + 1
    if bias:
        codes.append(np.full(n, offset, dtype=np.int64))
        offset += 1
    indices = np.stack(codes, axis=1).reshape(-1)
    indptr = np.arange(0, n * len(codes) + 1, len(codes), dtype=np.int64)
    data = np.ones(indices.shape[0], dtype=np.float64)
    return sp.csr_matrix((data, indices, indptr), shape=(n, offset))


def load_amazon(data_dir: Path, *, seed: int, test_fraction: float = 0.2) -> Dataset:
    """Amazon Employee Access: logistic regression features of Tandon et al. / ErasureHead.

    One-hot of the 9 id columns, of the 34 pairwise interactions of those columns
    (all 36 pairs except (5, 7) and (2, 3), 0-based among the 9), and a bias:
    exactly 241,915 dimensions, 44 non-zeros per row. Label: ACTION ∈ {0, 1}.
    """
    _, rows = _read_csv(data_dir, AMAZON_FILE, AMAZON_HEADER, 10)
    table = _numeric(rows, data_dir / AMAZON_FILE, int)
    y = table[:, 0].astype(np.float64)
    if not np.isin(y, (0.0, 1.0)).all():
        raise DataError(
            f"{data_dir / AMAZON_FILE}: ACTION must be 0 or 1: {_fix(data_dir / AMAZON_FILE)}"
        )
    ids = table[:, 1:]
    scale = int(ids.max()) + 1
    pairs = [
        (i, j)
        for i, j in itertools.combinations(range(9), 2)
        if (i, j) not in AMAZON_EXCLUDED_PAIRS
    ]
    columns = [ids[:, i] for i in range(9)] + [ids[:, i] * scale + ids[:, j] for i, j in pairs]
    return split(
        _one_hot(columns),
        y,
        name="amazon",
        task="classification",
        seed=seed,
        test_fraction=test_fraction,
    )


def load_covtype(data_dir: Path, *, seed: int, test_fraction: float = 0.2) -> Dataset:
    """Covertype subset, classes 1 (Spruce/Fir, label 0) vs 2 (Lodgepole Pine, label 1).

    Features: the 54 given columns (10 min-max scaled numeric, 44 binary) plus a
    bias column, dense: 79,222 rows.
    """
    path = data_dir / COVTYPE_FILE
    header, rows = _read_csv(data_dir, COVTYPE_FILE, None, 55)
    if header[0] != "Elevation" or header[-1] != "Cover_Type":
        raise DataError(f"{path} has an unexpected header: {_fix(path)}")
    table = _numeric(rows, path)
    keep = np.isin(table[:, -1], (1.0, 2.0))
    table = table[keep]
    y = (table[:, -1] == 2.0).astype(np.float64)
    X = np.hstack([table[:, :-1], np.ones((table.shape[0], 1))])
    return split(
        np.ascontiguousarray(X),
        y,
        name="covtype",
        task="classification",
        seed=seed,
        test_fraction=test_fraction,
    )


def load_kc_house(data_dir: Path, *, seed: int, test_fraction: float = 0.2) -> Dataset:
    """King County house sales: least squares on price × 1e-6.

    One-hot of every column from ``bedrooms`` onward (distinct values over all
    rows) plus a bias: 27,654 dimensions, sparse.
    """
    path = data_dir / KC_HOUSE_FILE
    header, rows = _read_csv(data_dir, KC_HOUSE_FILE, None, 21)
    if "price" not in header or "bedrooms" not in header:
        raise DataError(f"{path} lacks the price/bedrooms columns: {_fix(path)}")
    start = header.index("bedrooms")
    values = _numeric([row[header.index("price") :] for row in rows], path)
    price_col = 0
    first = start - header.index("price")
    y = values[:, price_col] * 1e-6
    columns = [values[:, j] for j in range(first, values.shape[1])]
    return split(
        _one_hot(columns),
        y,
        name="kc-house",
        task="regression",
        seed=seed,
        test_fraction=test_fraction,
    )
