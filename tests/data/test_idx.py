"""Fashion-MNIST's IDX files: read from a directory the tests write themselves (gzipped
or not), with every malformed file named; the real files when present (slow)."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from codedgd.services.data import load_dataset
from codedgd.services.data.idx import DEBIAN_PATH, FILES, load_fashion_mnist, read_idx, write_idx
from codedgd.services.errors import ConfigError, DataError


def write_mnist(directory: Path, train: int = 40, test: int = 10, *, gz: bool = True) -> Path:
    """A small MNIST-layout directory: 28x28 images whose pixels encode their label."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    suffix = ".gz" if gz else ""
    for split, n in (("train", train), ("test", test)):
        labels = (np.arange(n) % 10).astype(np.uint8)
        images = rng.integers(0, 50, size=(n, 28, 28), dtype=np.uint8)
        images[:, 0, :] = labels[:, None] * 25  # a row that tells the class
        write_idx(directory / (FILES[f"{split}_images"] + suffix), images)
        write_idx(directory / (FILES[f"{split}_labels"] + suffix), labels)
    return directory


@pytest.mark.parametrize("gz", [True, False])
def test_idx_files_read_as_a_ten_class_dataset(tmp_path: Path, gz: bool) -> None:
    path = write_mnist(tmp_path / "fm", gz=gz)
    ds = load_dataset("fashion-mnist", {"path": str(path)}, seed=0)
    assert ds.task == "multiclass"
    assert ds.X_train.shape == (40, 784) and ds.X_test.shape == (10, 784)
    assert ds.X_train.min() >= 0.0 and ds.X_train.max() <= 1.0
    assert sorted(set(ds.y_train)) == list(range(10))
    # the dataset's own split, in order: image i's first row encodes its label
    assert np.allclose(ds.X_train[:, :28].max(axis=1), ds.y_train * 25 / 255)


def test_rows_take_a_seeded_sample(tmp_path: Path) -> None:
    path = str(write_mnist(tmp_path / "fm"))
    a = load_fashion_mnist(seed=3, path=path, rows=12, test_rows=5)
    b = load_fashion_mnist(seed=3, path=path, rows=12, test_rows=5)
    assert a.X_train.shape == (12, 784) and a.X_test.shape == (5, 784)
    assert np.array_equal(a.X_train, b.X_train)
    with pytest.raises(ConfigError, match="rows must be a whole number"):
        load_fashion_mnist(seed=3, path=path, rows=0)


def test_bad_files_are_named(tmp_path: Path) -> None:
    path = write_mnist(tmp_path / "fm", gz=False)
    images = path / FILES["train_images"]
    raw = images.read_bytes()
    images.write_bytes(raw[:-100])
    with pytest.raises(DataError, match="train-images-idx3-ubyte is cut short"):
        load_fashion_mnist(seed=0, path=str(path))
    images.write_bytes(b"\x00\x00\x0d\x03" + raw[4:])
    with pytest.raises(DataError, match="not an IDX file of unsigned bytes"):
        load_fashion_mnist(seed=0, path=str(path))
    images.write_bytes(raw)
    (path / FILES["test_labels"]).unlink()
    with pytest.raises(DataError, match="dataset-fashion-mnist"):
        load_fashion_mnist(seed=0, path=str(path))
    with pytest.raises(DataError, match="does not exist"):
        load_fashion_mnist(seed=0, path=str(tmp_path / "nowhere"))
    gz = tmp_path / "x.gz"
    gz.write_bytes(gzip.compress(b"\x00\x00\x08\x01\x00\x00\x00\x05abc")[:-3])
    with pytest.raises(DataError, match="corrupt or cut short"):
        read_idx(gz, 1)


def test_labels_and_images_that_do_not_belong_together_are_refused(tmp_path: Path) -> None:
    path = write_mnist(tmp_path / "fm")
    write_idx(path / (FILES["train_labels"] + ".gz"), np.zeros(39, dtype=np.uint8))
    with pytest.raises(DataError, match="40 train images but 39 labels"):
        load_fashion_mnist(seed=0, path=str(path))


@pytest.mark.slow
@pytest.mark.skipif(not DEBIAN_PATH.is_dir(), reason="apt-get install dataset-fashion-mnist")
def test_the_real_files_from_debians_package() -> None:
    ds = load_fashion_mnist(seed=0)
    assert ds.X_train.shape == (60000, 784) and ds.X_test.shape == (10000, 784)
    assert np.bincount(ds.y_train.astype(int)).tolist() == [6000] * 10
