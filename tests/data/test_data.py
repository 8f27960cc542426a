"""Datasets: the synthetic default, the real loaders' dimensions, and clear errors."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from codedgd.services.data import (
    check_dataset_options,
    load_dataset,
    partition_rows,
    resolve_data_dir,
)
from codedgd.services.errors import ConfigError, DataError


def test_synthetic_is_deterministic_and_learnable() -> None:
    a = load_dataset("synthetic", {"rows": 500, "dim": 7}, seed=3)
    b = load_dataset("synthetic", {"rows": 500, "dim": 7}, seed=3)
    c = load_dataset("synthetic", {"rows": 500, "dim": 7}, seed=4)
    assert np.array_equal(a.X_train, b.X_train) and np.array_equal(a.y_train, b.y_train)
    assert not np.array_equal(a.X_train, c.X_train)
    assert a.X_train.shape == (400, 7) and a.X_test.shape == (100, 7)
    assert set(np.unique(a.y_train)) == {0.0, 1.0}


def test_synthetic_sparse_and_regression() -> None:
    d = load_dataset(
        "synthetic", {"rows": 300, "dim": 1000, "density": 0.01, "task": "regression"}, seed=0
    )
    assert sp.issparse(d.X_train) and d.task == "regression"
    assert 0.005 < d.X_train.nnz / (240 * 1000) < 0.02


def test_partitions_cover_every_row_once() -> None:
    blocks = partition_rows(103, 10, seed=1)
    assert sorted(np.concatenate(blocks).tolist()) == list(range(103))
    assert {len(b) for b in blocks} == {10, 11}
    assert all(
        np.array_equal(x, y) for x, y in zip(blocks, partition_rows(103, 10, seed=1), strict=True)
    )


@pytest.mark.parametrize(
    "name,options,message",
    [
        ("mnist", {}, "unknown dataset 'mnist'"),
        ("amazonn", {}, "Did you mean amazon"),
        ("synthetic", {"cols": 3}, "no option"),
        ("synthetic", {"density": 2.0}, "density"),
    ],
)
def test_bad_dataset_requests(name: str, options: dict[str, object], message: str) -> None:
    with pytest.raises((ConfigError, DataError), match=message):
        load_dataset(name, options, seed=0)


def test_missing_data_dir_names_the_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CODEDGD_DATA_DIR", raising=False)
    with pytest.raises(DataError, match="--data-dir DIR or set CODEDGD_DATA_DIR"):
        resolve_data_dir(None)
    with pytest.raises(DataError, match="does not exist"):
        resolve_data_dir(tmp_path / "nope")
    with pytest.raises(ConfigError, match="CODEDGD_DATA_DIR"):
        check_dataset_options("amazon", {})


def test_real_datasets_shapes(data_dir: Path) -> None:
    amazon = load_dataset("amazon", {}, seed=0, data_dir=data_dir)
    assert amazon.dim == 241_915
    assert amazon.n_train == 26_215 and amazon.X_test.shape[0] == 32_769 - 26_215
    assert sp.issparse(amazon.X_train)
    assert set(np.diff(amazon.X_train.indptr)) == {44}
    cov = load_dataset("covtype", {}, seed=0, data_dir=data_dir)
    assert cov.n_train + cov.X_test.shape[0] == 79_222 and cov.dim == 55
    kc = load_dataset("kc-house", {}, seed=0, data_dir=data_dir)
    assert kc.dim == 27_654 and kc.n_train + kc.X_test.shape[0] == 21_613
    assert abs((kc.y_train.sum() + kc.y_test.sum()) / 21_613 - 0.54008814) < 1e-6


def _write(root: Path, rel: str, content: bytes) -> None:
    target = root / rel
    target.parent.mkdir(parents=True)
    target.write_bytes(content)


def test_corrupt_files_get_clear_errors(data_dir: Path, tmp_path: Path) -> None:
    original = (data_dir / "amazon_employee_access" / "train.csv.gz").read_bytes()
    cases = {
        "truncated": original[: len(original) // 2],
        "not gzip": b"ACTION,RESOURCE\n1,2\n",
        "bad header": gzip.compress(b"A,B,C,D,E,F,G,H,I,J\n1,2,3,4,5,6,7,8,9,10\n"),
        "bad cell": gzip.compress(
            gzip.decompress(original)[:300].rsplit(b"\n", 1)[0] + b"\n1,x,3,4,5,6,7,8,9,10\n"
        ),
    }
    for label, content in cases.items():
        d = tmp_path / label.replace(" ", "_")
        _write(d, "amazon_employee_access/train.csv.gz", content)
        with pytest.raises(DataError, match=r"re-copy train\.csv\.gz") as info:
            load_dataset("amazon", {}, seed=0, data_dir=d)
        assert "train.csv.gz" in str(info.value), label
