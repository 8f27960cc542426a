"""The ``file`` dataset: a user's own LIBSVM/svmlight, CSV or NumPy ``.npz`` data.

``path`` names one file or a directory of shards (every file of the format in it, in
name order, stacked). The readers are well-kept ones: scikit-learn's
``load_svmlight_files`` for LIBSVM (the optional extra ``codedgd[files]``), the standard
``csv`` module for CSV and ``numpy.load`` (no pickles) for ``.npz``. A malformed file
raises :class:`DataError` naming the file, the line and column (or the array, row and
column) and the fix. Layouts are documented in docs/data.md.

The coordinator reads the file (relative paths from its working directory, then from
its data directory) and sends each worker its rows: workers need no copy.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import importlib
import os
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import scipy.sparse as sp

from codedgd.services.data.dataset import Dataset, Matrix, split
from codedgd.services.errors import ConfigError, DataError

FORMATS = ("libsvm", "csv", "npz")
TASKS = ("classification", "regression")
# File name endings (after .gz/.bz2 is taken off) that name a format.
EXTENSIONS = {
    ".libsvm": "libsvm",
    ".svm": "libsvm",
    ".svmlight": "libsvm",
    ".csv": "csv",
    ".tsv": "csv",
    ".npz": "npz",
}
INSTALL_HINT = "pip install 'codedgd[files]'"


def load_file(
    *,
    seed: int,
    path: str = "",
    format: str = "",
    label: str | int = "label",
    task: str = "classification",
    delimiter: str = "",
    bias: bool = False,
    test_fraction: float = 0.2,
    data_dir: str | Path | None = None,
) -> Dataset:
    """A user's data file (or directory of shards) as a seeded train/test split.

    ``format``: libsvm, csv or npz (default from the file name); ``label``: the CSV
    column of the labels; ``task``: classification (two classes, mapped to 0/1: the
    smaller value to 0) or regression; ``bias``: append a column of ones.
    """
    opts = check_file_options(
        path=path, format=format, label=label, task=task, delimiter=delimiter, bias=bias,
        test_fraction=test_fraction, data_dir=data_dir,
    )  # fmt: skip
    files, fmt = opts["files"], opts["format"]
    if fmt == "libsvm":
        X, y = _read_libsvm(files)
    elif fmt == "csv":
        X, y = _read_csv_files(files, opts["label"], opts["delimiter"])
    else:
        X, y = _read_npz_files(files)
    where = str(opts["path"])
    check_matrix(X, y, where)
    y = task_labels(y, task, where)
    if bias:
        ones = np.ones((X.shape[0], 1))
        X = (
            sp.csr_matrix(sp.hstack([X, ones], format="csr"))
            if sp.issparse(X)
            else np.hstack([X, ones])
        )
    return split(X, y, name="file", task=task, seed=seed, test_fraction=test_fraction)


def check_file_options(
    *,
    path: Any,
    format: Any = "",
    label: Any = "label",
    task: Any = "classification",
    delimiter: Any = "",
    bias: Any = False,
    test_fraction: Any = 0.2,
    data_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Check the options and find the files (fast: nothing is read). ConfigError on a fault."""
    if not isinstance(path, str) or not path:
        raise ConfigError(
            "dataset 'file' needs path=FILE or path=DIRECTORY: --data-opt path=train.svm "
            '([data] path = "train.svm")'
        )
    if task not in TASKS:
        raise ConfigError(f"dataset 'file': task must be one of {', '.join(TASKS)}, got {task!r}")
    if not isinstance(bias, bool):
        raise ConfigError(f"dataset 'file': bias must be true or false, got {bias!r}")
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, int | float):
        raise ConfigError(f"dataset 'file': test_fraction must be a number, got {test_fraction!r}")
    if not 0 < test_fraction < 1:
        raise ConfigError(f"dataset 'file': test_fraction must be in (0, 1), got {test_fraction!r}")
    if isinstance(label, int) and not isinstance(label, bool):
        label = str(label)  # a column named "1" reads as a number on the command line
    if not isinstance(label, str) or not label:
        raise ConfigError(f"dataset 'file': label must be a column name, got {label!r}")
    if format and format not in FORMATS:
        raise ConfigError(
            f"dataset 'file': format must be one of {', '.join(FORMATS)}, got {format!r}"
        )
    resolved = _resolve(path, data_dir)
    files = _shards(resolved, str(format))
    fmt = str(format) or _format_of(files[0])
    if fmt == "libsvm":
        _sklearn_datasets()  # the optional reader is installed, or say how to install it
    sep = {"": "\t" if files[0].name.endswith((".tsv", ".tsv.gz")) else ",", "tab": "\t"}.get(
        str(delimiter), str(delimiter)
    )
    if len(sep) != 1:
        raise ConfigError(
            f"dataset 'file': delimiter must be one character (or 'tab'), got {delimiter!r}"
        )
    return {"path": resolved, "files": files, "format": fmt, "delimiter": sep, "label": label}


def _resolve(path: str, data_dir: str | Path | None) -> Path:
    """An absolute path as given; a relative one from the working directory, then the
    data directory (--data-dir or $CODEDGD_DATA_DIR) of the process that reads it."""
    given = Path(path).expanduser()
    tried = [given if given.is_absolute() else Path.cwd() / given]
    if not given.is_absolute():
        base = data_dir or os.environ.get("CODEDGD_DATA_DIR")
        if base:
            tried.append(Path(base).expanduser() / given)
    for candidate in tried:
        if candidate.exists():
            return candidate
    raise ConfigError(
        f"dataset 'file': {path} not found (looked in {', '.join(str(p) for p in tried)}); "
        "the coordinator reads the file: give a path that exists where it runs"
    )


def _format_of(file: Path) -> str:
    name = file.name.lower()
    for compressed in (".gz", ".bz2"):
        name = name.removesuffix(compressed)
    fmt = EXTENSIONS.get(Path(name).suffix)
    if fmt is None:
        raise ConfigError(
            f"dataset 'file': cannot tell the format of {file.name} from its name: add "
            f"--data-opt format=libsvm|csv|npz (known endings: {', '.join(EXTENSIONS)})"
        )
    return fmt


def _shards(path: Path, fmt: str) -> list[Path]:
    """The file itself, or a directory's files of the format (name order, hidden skipped)."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise ConfigError(f"dataset 'file': {path} is neither a file nor a directory")
    files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    if fmt:
        files = [p for p in files if _known(p) in (fmt, None)]
    else:
        files = [p for p in files if _known(p) is not None]
        kinds = sorted({str(_known(p)) for p in files})
        if len(kinds) > 1:
            raise ConfigError(
                f"dataset 'file': {path} holds files of several formats ({', '.join(kinds)}): "
                "keep one format per directory, or pick one with --data-opt format=..."
            )
    if not files:
        raise ConfigError(
            f"dataset 'file': directory {path} has no data files (endings: "
            f"{', '.join(EXTENSIONS)}, optionally .gz or .bz2)"
        )
    return files


def _known(file: Path) -> str | None:
    try:
        return _format_of(file)
    except ConfigError:
        return None


# ---------------------------------------------------------------- LIBSVM / svmlight


def _sklearn_datasets() -> Any:
    try:
        return importlib.import_module("sklearn.datasets")
    except ImportError:
        raise ConfigError(
            "reading LIBSVM/svmlight files needs scikit-learn's reader, which is not "
            f"installed: {INSTALL_HINT} (or pip install scikit-learn); CSV and .npz need nothing"
        ) from None


def _read_libsvm(files: Sequence[Path]) -> tuple[Matrix, np.ndarray]:
    """scikit-learn's reader (one feature count over all shards); on a fault, the line."""
    datasets = _sklearn_datasets()
    try:
        parts = datasets.load_svmlight_files([str(f) for f in files], dtype=np.float64)
    except (ValueError, IndexError, OSError, EOFError) as exc:
        for file in files:
            _locate_libsvm_fault(file)  # raises DataError at the first bad line
        raise DataError(
            f"{', '.join(map(str, files))}: not a LIBSVM/svmlight file ({exc}); each line is "
            "'LABEL INDEX:VALUE INDEX:VALUE ...' with increasing indices (docs/data.md)"
        ) from None
    Xs = [sp.csr_matrix(parts[i]) for i in range(0, len(parts), 2)]
    ys = [np.asarray(parts[i], dtype=np.float64) for i in range(1, len(parts), 2)]
    return sp.csr_matrix(sp.vstack(Xs, format="csr")), np.concatenate(ys)


def _open_text(file: Path) -> IO[str]:
    name = file.name.lower()
    if name.endswith(".gz"):
        return gzip.open(file, "rt", newline="", encoding="utf-8")
    if name.endswith(".bz2"):
        return bz2.open(file, "rt", newline="", encoding="utf-8")
    return open(file, newline="", encoding="utf-8")


def _locate_libsvm_fault(file: Path) -> None:
    """Find the first line the reader refused and raise a DataError naming it."""
    fix = "each line is 'LABEL INDEX:VALUE ...' with integer indices in increasing order"
    try:
        with _open_text(file) as fh:
            for number, line in enumerate(fh, start=1):
                content = line.split("#", 1)[0]
                previous = -1
                for column, token in _tokens(content):
                    where = f"{file} line {number}, column {column}"
                    if column == _first_column(content):
                        if not _is_float(token):
                            raise DataError(f"{where}: label {token!r} is not a number: {fix}")
                        continue
                    key, sep, value = token.partition(":")
                    if key == "qid":
                        continue
                    if not sep or not key.isdigit() or not _is_float(value):
                        raise DataError(
                            f"{where}: {token!r} is not INDEX:VALUE (an integer index, a "
                            f"number): {fix}"
                        )
                    if int(key) <= previous:
                        raise DataError(f"{where}: index {key} follows {previous}: {fix}")
                    previous = int(key)
    except (OSError, EOFError, UnicodeDecodeError, zlib.error) as exc:
        raise DataError(f"{file} is unreadable or corrupt ({exc}): re-copy it") from None


def _tokens(content: str) -> Iterator[tuple[int, str]]:
    """(1-based column, token) of each whitespace-separated token."""
    column = 0
    for token in content.split():
        column = content.index(token, column)
        yield column + 1, token
        column += len(token)


def _first_column(content: str) -> int:
    return len(content) - len(content.lstrip()) + 1


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------- CSV


def _read_csv_files(
    files: Sequence[Path], label: str, delimiter: str
) -> tuple[np.ndarray, np.ndarray]:
    header: list[str] | None = None
    Xs, ys = [], []
    for file in files:
        head, X, y = _read_csv(file, label, delimiter)
        if header is not None and head != header:
            raise DataError(
                f"{file}: its header differs from {files[0].name}'s: every shard of a "
                "directory needs the same columns in the same order"
            )
        header = head
        Xs.append(X)
        ys.append(y)
    return np.vstack(Xs), np.concatenate(ys)


def _read_csv(file: Path, label: str, delimiter: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Header line, then numbers; the label column by name. Every fault names line and column."""
    rows: list[list[str]] = []
    lines: list[int] = []
    try:
        with _open_text(file) as fh:
            reader = csv.reader(fh, delimiter=delimiter)
            header = next(reader, None)
            if header is None:
                raise DataError(f"{file} is empty: a CSV file starts with a header line")
            header = [h.strip() for h in header]
            for row in reader:
                if not row:  # a blank line
                    continue
                if len(row) != len(header):
                    raise DataError(
                        f"{file} line {reader.line_num}: {len(row)} cells, but the header "
                        f"has {len(header)} columns: give every row one value per column"
                    )
                rows.append(row)
                lines.append(reader.line_num)
    except (OSError, EOFError, UnicodeDecodeError, csv.Error, zlib.error) as exc:
        raise DataError(f"{file} is unreadable or corrupt ({exc}): re-copy it") from None
    if label not in header:
        raise DataError(
            f"{file} has no column {label!r} (its columns: {', '.join(header[:12])}"
            f"{', ...' if len(header) > 12 else ''}): name the label column with "
            "--data-opt label=COLUMN"
        )
    if not rows:
        raise DataError(f"{file} has a header but no data rows")
    try:
        table = np.array(rows, dtype=np.float64)
    except ValueError:
        table = None
    if table is None or not np.isfinite(table).all():
        _locate_csv_fault(file, header, rows, lines)
        raise AssertionError("unreachable: a bad cell was found above")  # pragma: no cover
    j = header.index(label)
    features = [i for i in range(len(header)) if i != j]
    return header, np.ascontiguousarray(table[:, features]), table[:, j].copy()


def _locate_csv_fault(
    file: Path, header: Sequence[str], rows: Sequence[Sequence[str]], lines: Sequence[int]
) -> None:
    for row, line in zip(rows, lines, strict=True):
        for c, cell in enumerate(row):
            where = f"{file} line {line}, column {c + 1} ({header[c]!r})"
            text = cell.strip()
            if not text:
                raise DataError(f"{where}: empty cell: fill it in or drop the row")
            try:
                value = float(text)
            except ValueError:
                raise DataError(
                    f"{where}: {cell!r} is not a number: every column must be numeric "
                    "(encode categories as numbers or one-hot columns first)"
                ) from None
            if not np.isfinite(value):
                raise DataError(f"{where}: {cell!r} is not a finite number: fill in a value")


# ---------------------------------------------------------------- .npz


def _read_npz_files(files: Sequence[Path]) -> tuple[Matrix, np.ndarray]:
    Xs: list[Matrix] = []
    ys: list[np.ndarray] = []
    for file in files:
        X, y = _read_npz(file)
        if Xs and X.shape[1] != Xs[0].shape[1]:
            raise DataError(
                f"{file}: X has {X.shape[1]} columns but {files[0].name}'s has "
                f"{Xs[0].shape[1]}: every shard needs the same features"
            )
        Xs.append(X)
        ys.append(y)
    if any(sp.issparse(X) for X in Xs):
        return sp.csr_matrix(
            sp.vstack([sp.csr_matrix(X) for X in Xs], format="csr")
        ), np.concatenate(ys)
    return np.vstack(Xs), np.concatenate(ys)


NPZ_LAYOUT = "arrays X and y, or X.data, X.indices, X.indptr, X.shape (CSR) and y"


def _read_npz(file: Path) -> tuple[Matrix, np.ndarray]:
    try:
        with np.load(file, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise DataError(
            f"{file} is not a readable .npz file ({exc}): write it with numpy.savez "
            f"({NPZ_LAYOUT}; no object arrays)"
        ) from None
    if "y" not in arrays:
        raise DataError(f"{file} has no array 'y' (it has {', '.join(arrays) or 'none'}): "
                        f"it needs {NPZ_LAYOUT}")  # fmt: skip
    y = arrays["y"]
    if "X" in arrays:
        X: Matrix = arrays["X"]
        if X.ndim != 2 or not np.issubdtype(X.dtype, np.number):
            raise DataError(
                f"{file}: X must be a 2-D numeric array, got {X.ndim}-D {X.dtype}: save the "
                "feature matrix as rows × columns"
            )
        X = np.ascontiguousarray(X, dtype=np.float64)
    else:
        parts = ("X.data", "X.indices", "X.indptr", "X.shape")
        missing = [p for p in parts if p not in arrays]
        if missing:
            raise DataError(
                f"{file} has neither X nor {', '.join(missing)} (it has "
                f"{', '.join(arrays)}): it needs {NPZ_LAYOUT}"
            )
        try:
            shape = tuple(int(v) for v in arrays["X.shape"])
            X = sp.csr_matrix(
                (
                    np.asarray(arrays["X.data"], dtype=np.float64),
                    arrays["X.indices"],
                    arrays["X.indptr"],
                ),
                shape=shape,
            )
            X.check_format(full_check=True)
        except (ValueError, TypeError) as exc:
            raise DataError(
                f"{file}: X.data/X.indices/X.indptr/X.shape do not form a CSR matrix "
                f"({exc}): save scipy's csr_matrix parts as they are"
            ) from None
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.number):
        raise DataError(f"{file}: y must be a 1-D numeric array, got {y.ndim}-D {y.dtype}")
    return X, np.asarray(y, dtype=np.float64)


# ---------------------------------------------------------------- checks shared with plugins


def check_matrix(X: Any, y: Any, where: str) -> None:
    """X a 2-D float matrix (dense or CSR), y one finite number per row: DataError if not."""
    if not (isinstance(X, np.ndarray) or sp.issparse(X)) or len(X.shape) != 2:
        raise DataError(f"{where}: X must be a 2-D numpy array or scipy sparse matrix")
    if not isinstance(y, np.ndarray) or y.ndim != 1:
        raise DataError(f"{where}: y must be a 1-D numpy array")
    if X.shape[0] != y.shape[0]:
        raise DataError(f"{where}: {X.shape[0]} rows of features but {y.shape[0]} labels")
    if X.shape[0] < 2:
        raise DataError(f"{where}: {X.shape[0]} rows: training needs at least 2")
    values = X.data if sp.issparse(X) else X
    bad = ~np.isfinite(values)
    if bad.any():
        if sp.issparse(X):
            coo = sp.coo_matrix(X)
            i = int(np.flatnonzero(~np.isfinite(coo.data))[0])
            row, col = int(coo.row[i]), int(coo.col[i])
        else:
            row, col = (int(v) for v in np.argwhere(bad)[0])
        raise DataError(
            f"{where}: feature {col} (0-based) of row {row} is {values[bad][0]}: "
            "fill in or drop non-finite values"
        )
    if not np.isfinite(y).all():
        row = int(np.flatnonzero(~np.isfinite(y))[0])
        raise DataError(f"{where}: the label of row {row} (0-based) is {y[row]}: fix it")


def task_labels(y: np.ndarray, task: str, where: str) -> np.ndarray:
    """Classification labels as 0/1 (two classes: the smaller value 0), regression as is."""
    if task == "regression":
        return y.astype(np.float64)
    classes = np.unique(y)
    if classes.size != 2:
        shown = ", ".join(f"{v:g}" for v in classes[:5]) + (", ..." if classes.size > 5 else "")
        raise DataError(
            f"{where}: classification needs two label values, found {classes.size} "
            f"({shown}): for real-valued targets use --data-opt task=regression (and "
            "--model least-squares)"
        )
    labels: np.ndarray = (y == classes[1]).astype(np.float64)
    return labels


__all__ = ["FORMATS", "check_file_options", "check_matrix", "load_file", "split", "task_labels"]
