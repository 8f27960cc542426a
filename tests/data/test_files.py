"""The `file` dataset: a user's LIBSVM, CSV and .npz files (or directories of shards),
dense and sparse, and errors that name the file, line and column of a malformed one."""

from __future__ import annotations

import gzip
import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from codedgd.services.data import (
    check_dataset_options,
    dataset_task,
    is_generated,
    load_dataset,
)
from codedgd.services.data.dataset import Dataset
from codedgd.services.errors import ConfigError, DataError
from tests.conftest import CoordinatorProcess, WorkerProcesses

ROOT = Path(__file__).resolve().parents[2]


def _rows(n: int = 60, d: int = 5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = np.round(rng.normal(size=(n, d)), 4)
    X[rng.random((n, d)) < 0.4] = 0.0
    y = (X[:, 0] + 0.1 * rng.normal(size=n) > 0).astype(np.float64)
    return X, y


def _svmlight(X: np.ndarray, y: np.ndarray, labels: tuple[str, str] = ("-1", "+1")) -> str:
    lines = ["# written by the test: LABEL INDEX:VALUE ..., 1-based"]
    for xi, yi in zip(X, y, strict=True):
        cells = " ".join(f"{j + 1}:{v:g}" for j, v in enumerate(xi) if v != 0)
        lines.append(f"{labels[int(yi)]} {cells}")
    return "\n".join(lines) + "\n"


def _all_rows(ds: Dataset) -> tuple[np.ndarray, np.ndarray]:
    X = sp.vstack([sp.csr_matrix(ds.X_train), sp.csr_matrix(ds.X_test)]).toarray()
    y = np.concatenate([ds.y_train, ds.y_test])
    order = np.lexsort(np.column_stack([X, y]).T)
    return X[order], y[order]


def _same_rows(ds: Dataset, X: np.ndarray, y: np.ndarray) -> bool:
    got_X, got_y = _all_rows(ds)
    order = np.lexsort(np.column_stack([X, y]).T)
    return np.allclose(got_X, X[order]) and np.array_equal(got_y, y[order])


def test_libsvm_file_is_sparse_with_labels_mapped_to_0_1(tmp_path: Path) -> None:
    X, y = _rows()
    (tmp_path / "train.svm").write_text(_svmlight(X, y))
    ds = load_dataset("file", {"path": str(tmp_path / "train.svm")}, seed=1)
    assert sp.issparse(ds.X_train) and ds.dim == 5
    assert ds.n_train == 48 and ds.y_test.size == 12  # test_fraction 0.2
    assert set(np.unique(ds.y_train)) == {0.0, 1.0}  # -1/+1 read as 0/1
    assert _same_rows(ds, X, y)
    assert dataset_task("file", {"path": "x"}) == "classification"
    assert is_generated("file")  # the coordinator sends workers the rows


def test_a_directory_of_gzipped_libsvm_shards_shares_one_feature_count(tmp_path: Path) -> None:
    X, y = _rows(80)
    shards = tmp_path / "shards"
    shards.mkdir()
    X[:40, 4] = 0.0  # the first shard never mentions the last feature
    for i, part in enumerate((slice(0, 40), slice(40, 80))):
        with gzip.open(shards / f"part-{i}.libsvm.gz", "wt") as fh:
            fh.write(_svmlight(X[part], y[part], ("0", "1")))
    (shards / "README.txt").write_text("not data: skipped")
    ds = load_dataset("file", {"path": str(shards), "test_fraction": 0.25}, seed=0)
    assert ds.dim == 5 and ds.n_train + ds.y_test.size == 80
    assert _same_rows(ds, X, y)


def test_csv_with_a_named_label_column_is_dense(tmp_path: Path) -> None:
    X, y = _rows(30, 3)
    lines = ["f0,price,f1,f2"] + [
        f"{a},{t},{b},{c}" for (a, b, c), t in zip(X, y * 7.5, strict=True)
    ]
    (tmp_path / "houses.csv").write_text("\n".join(lines) + "\n")
    options = {"path": str(tmp_path / "houses.csv"), "label": "price", "task": "regression"}
    ds = load_dataset("file", options, seed=0)
    assert isinstance(ds.X_train, np.ndarray) and ds.dim == 3 and ds.task == "regression"
    assert _same_rows(ds, X, y * 7.5)  # regression targets are kept as they are
    tsv = tmp_path / "t.tsv"
    tsv.write_text("label\ta\n0\t1.5\n1\t2.5\n0\t3\n1\t4\n1\t5\n")
    ds = load_dataset("file", {"path": str(tsv), "bias": True}, seed=0)
    assert ds.dim == 2 and np.all(ds.X_train[:, 1] == 1.0)  # a bias column appended


def test_npz_dense_and_csr(tmp_path: Path) -> None:
    X, y = _rows()
    np.savez(tmp_path / "dense.npz", X=X, y=y)
    csr = sp.csr_matrix(X)
    parts = {"X.data": csr.data, "X.indices": csr.indices, "X.indptr": csr.indptr}
    np.savez(tmp_path / "sparse.npz", **parts, **{"X.shape": np.array(csr.shape)}, y=y)
    dense = load_dataset("file", {"path": str(tmp_path / "dense.npz")}, seed=0)
    sparse = load_dataset("file", {"path": str(tmp_path / "sparse.npz")}, seed=0)
    assert isinstance(dense.X_train, np.ndarray) and sp.issparse(sparse.X_train)
    assert _same_rows(dense, X, y) and _same_rows(sparse, X, y)
    assert np.allclose(dense.X_train, sparse.X_train.toarray())  # the same seeded split


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("a.svm", "1 1:0.5 2:1\n0 1:2 x:3\n", r"a\.svm line 2, column 7: 'x:3' is not INDEX:VALUE"),
        ("a.svm", "1 1:0.5\n# note\n0 3:1 2:4\n", r"a\.svm line 3, column 7: index 2 follows 3"),
        ("a.svm", "1 1:0.5\nyes 1:1\n", r"a\.svm line 2, column 1: label 'yes' is not a number"),
        ("a.csv", "a,label\n1,0\n2,1\n3,one\n", r"line 4, column 2 \('label'\): 'one' is not a"),
        ("a.csv", "a,b,label\n1,,0\n", r"a\.csv line 2, column 2 \('b'\): empty cell"),
        ("a.csv", "a,label\n1,0\n2\n", r"a\.csv line 3: 1 cells, but the header has 2 columns"),
        ("a.csv", "a,label\n1,0\nnan,1\n", r"a\.csv line 3, column 1 \('a'\): 'nan' is not"),
        ("a.csv", "a,target\n1,0\n2,1\n", r"no column 'label' \(its columns: a, target\).*label="),
        ("a.csv", "a,label\n1,0\n2,1\n3,2\n", r"two label values, found 3 .*task=regression"),
    ],
)  # fmt: skip
def test_malformed_files_name_line_column_and_fix(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(DataError, match=message):
        load_dataset("file", {"path": str(tmp_path / name)}, seed=0)


def test_malformed_npz_names_what_is_missing(tmp_path: Path) -> None:
    np.savez(tmp_path / "a.npz", X=np.ones((4, 2)))
    with pytest.raises(DataError, match=r"a\.npz has no array 'y'.*X\.indptr"):
        load_dataset("file", {"path": str(tmp_path / "a.npz")}, seed=0)
    parts = {"X.data": np.ones(2), "X.indices": np.array([0, 9]), "X.indptr": np.array([0, 1, 2])}
    np.savez(tmp_path / "b.npz", **parts, **{"X.shape": np.array([2, 3])}, y=np.array([0, 1]))
    with pytest.raises(DataError, match=r"b\.npz: X\.data/X\.indices/X\.indptr/X\.shape do not"):
        load_dataset("file", {"path": str(tmp_path / "b.npz")}, seed=0)
    (tmp_path / "c.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match=r"c\.npz is not a readable \.npz file"):
        load_dataset("file", {"path": str(tmp_path / "c.npz")}, seed=0)


def test_options_are_checked_on_submit_without_reading(tmp_path: Path) -> None:
    (tmp_path / "data.txt").write_text("1 1:1\n")
    with pytest.raises(ConfigError, match="needs path=FILE"):
        check_dataset_options("file", {})
    with pytest.raises(ConfigError, match=r"no option\(s\) lable; its options: bias, delimiter"):
        check_dataset_options("file", {"path": "x.csv", "lable": "y"})
    with pytest.raises(ConfigError, match=r"missing\.csv not found \(looked in"):
        check_dataset_options("file", {"path": str(tmp_path / "missing.csv")})
    with pytest.raises(ConfigError, match=r"format of data\.txt.*format=libsvm\|csv\|npz"):
        check_dataset_options("file", {"path": str(tmp_path / "data.txt")})
    check_dataset_options("file", {"path": str(tmp_path / "data.txt"), "format": "libsvm"})
    with pytest.raises(ConfigError, match="task must be one of classification, regression"):
        check_dataset_options("file", {"path": str(tmp_path / "data.txt"), "task": "ranking"})


def test_relative_paths_are_found_in_the_data_directory(tmp_path: Path) -> None:
    X, y = _rows()
    (tmp_path / "mine.svm").write_text(_svmlight(X, y))
    ds = load_dataset("file", {"path": "mine.svm"}, seed=0, data_dir=tmp_path)
    assert ds.n_train == 48


def test_without_scikit_learn_libsvm_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a.svm").write_text("1 1:1\n0 2:1\n")
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(ConfigError, match=r"pip install 'codedgd\[files\]'"):
        check_dataset_options("file", {"path": str(tmp_path / "a.svm")})
    np.savez(tmp_path / "a.npz", X=np.eye(3), y=np.array([0, 1, 0]))
    assert load_dataset("file", {"path": str(tmp_path / "a.npz")}, seed=0).dim == 3


def test_run_trains_on_a_users_libsvm_file_across_workers(tmp_path: Path) -> None:
    X, y = _rows(200, 6)
    (tmp_path / "train.svm").write_text(_svmlight(X, y))
    out = tmp_path / "run.json"
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "codedgd.client.cli", "run", "--data", "file"),
            *("--data-opt", "path=train.svm", "--data-opt", "bias=true"),
            *("-n", "2", "-r", "3", "-o", str(out), "--no-progress"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    rounds = json.loads(out.read_text())["rounds"]
    assert len(rounds) == 3 and rounds[-1]["loss"] < rounds[0]["loss"]
    assert rounds[-1]["metric_name"] == "auc" and rounds[-1]["metric"] > 0.8

    (tmp_path / "bad.svm").write_text("1 1:1\n0 2:1 1:3\n")
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "codedgd.client.cli", "run", "--data", "file"),
            *("--data-opt", "path=bad.svm", "-n", "2", "-r", "2", "--no-progress"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode != 0
    assert "bad.svm line 2, column 7: index 1 follows 2" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_workers_with_their_own_data_dir_get_a_files_rows_from_the_coordinator(
    tmp_path: Path, worker_processes: WorkerProcesses
) -> None:
    """The coordinator reads the file; workers started with --data-dir (for the real
    datasets) hold no copy of it and still train: the rows come inline."""
    X, y = _rows(120, 4)
    np.savez(tmp_path / "train.npz", X=X, y=y)
    empty = tmp_path / "worker-data"
    empty.mkdir()
    coordinator = CoordinatorProcess()
    out = tmp_path / "run.json"
    try:
        coordinator.start()
        worker_processes.start(coordinator.port, 2, extra=("--data-dir", str(empty)))
        proc = subprocess.run(
            [
                *(sys.executable, "-m", "codedgd.client.cli", "submit"),
                *("--coordinator", coordinator.target, "-n", "2", "-r", "2", "--data", "file"),
                *("--data-opt", f"path={tmp_path / 'train.npz'}", "--watch", "-o", str(out)),
                "--no-progress",
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=300,
        )
    finally:
        if coordinator.proc is not None:
            coordinator.signal(signal.SIGTERM)
    assert proc.returncode == 0, proc.stderr + coordinator.finish()
    assert len(json.loads(out.read_text())["rounds"]) == 2
