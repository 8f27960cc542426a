"""Fashion-MNIST (and any MNIST-layout data) from the standard IDX files.

The four files of the MNIST layout, gzipped or not, in one directory:
``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``
and ``t10k-labels-idx1-ubyte``. On Debian and Ubuntu, ``apt-get install
dataset-fashion-mnist`` puts Fashion-MNIST's under ``/usr/share/datasets/fashion-mnist``
(the default path); anywhere else, give ``--data-opt path=DIR``. Nothing is downloaded.

IDX (LeCun's format): a big-endian header, the magic 0x0000080D-style (two zero bytes, a
type code, the number of dimensions), one 32-bit size per dimension, then the values in
row-major order; images and labels here are unsigned bytes (type code 0x08). Every
problem (a missing file, a wrong magic, a size that does not match the bytes, a file cut
short, image and label counts that differ) is a DataError naming the file.

Rows are the images flattened to 784 features scaled to [0, 1]; labels are the class
indices 0..9, as floats. The dataset's own split is kept (60,000 training and 10,000 test
images); ``rows`` and ``test_rows`` take a seeded sample of either, for quick runs.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np

from codedgd.services.data.dataset import Dataset
from codedgd.services.errors import ConfigError, DataError

DEBIAN_PATH = Path("/usr/share/datasets/fashion-mnist")
FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
UNSIGNED_BYTE = 0x08


def _find(directory: Path, stem: str) -> Path:
    for name in (stem, stem + ".gz"):
        if (directory / name).is_file():
            return directory / name
    raise DataError(
        f"{directory / stem}(.gz) not found: the Fashion-MNIST directory must hold the four "
        f"IDX files ({', '.join(FILES.values())}). On Debian/Ubuntu: apt-get install "
        f"dataset-fashion-mnist (installs them under {DEBIAN_PATH}); or give "
        "--data-opt path=DIR"
    )


def read_idx(path: Path, dims: int) -> np.ndarray:
    """An IDX file of unsigned bytes with ``dims`` dimensions, as a uint8 array."""
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise DataError(f"{path} is corrupt or cut short ({exc}): copy it again") from None
    header = 4 + 4 * dims
    if len(raw) < header:
        raise DataError(f"{path} is cut short: {len(raw)} bytes, not even an IDX header")
    if raw[0] != 0 or raw[1] != 0 or raw[2] != UNSIGNED_BYTE or raw[3] != dims:
        raise DataError(
            f"{path} is not an IDX file of unsigned bytes with {dims} dimension(s) (magic "
            f"{raw[:4].hex()}, expected 000008{dims:02x}): is it the right file?"
        )
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims))
    expected = int(np.prod(shape))
    if len(raw) - header != expected:
        state = "cut short" if len(raw) - header < expected else "longer than its header says"
        raise DataError(
            f"{path} is {state}: its header says {'x'.join(map(str, shape))} = {expected} "
            f"values, it holds {len(raw) - header}"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def _sample(n: int, take: int | None, seed: int, what: str) -> np.ndarray:
    if take is None or take >= n:
        return np.arange(n)
    if isinstance(take, bool) or not isinstance(take, int) or take < 1:
        raise ConfigError(f"fashion-mnist: {what} must be a whole number >= 1, got {take!r}")
    return np.sort(np.random.default_rng(seed).choice(n, size=take, replace=False))


def load_fashion_mnist(
    *,
    seed: int,
    path: str | None = None,
    rows: int | None = None,
    test_rows: int | None = None,
) -> Dataset:
    """The IDX files of ``path`` (default: Debian's) as a 10-class dataset."""
    directory = Path(path).expanduser() if path else DEBIAN_PATH
    if not directory.is_dir():
        raise DataError(
            f"Fashion-MNIST directory {directory} does not exist. On Debian/Ubuntu: apt-get "
            f"install dataset-fashion-mnist (installs the IDX files under {DEBIAN_PATH}); "
            "or give --data-opt path=DIR of the four IDX files"
        )
    parts: dict[str, np.ndarray] = {}
    for key, stem in FILES.items():
        parts[key] = read_idx(_find(directory, stem), 3 if key.endswith("images") else 1)
    for split in ("train", "test"):
        images, labels = parts[f"{split}_images"], parts[f"{split}_labels"]
        if images.shape[0] != labels.shape[0]:
            raise DataError(
                f"{directory}: {images.shape[0]} {split} images but {labels.shape[0]} labels: "
                "the files do not belong together"
            )
        if labels.size and int(labels.max()) > 9:
            raise DataError(f"{directory}: a {split} label is {int(labels.max())}, not 0..9")
    train = _sample(parts["train_images"].shape[0], rows, seed, "rows")
    test = _sample(parts["test_images"].shape[0], test_rows, seed + 1, "test_rows")

    def features(images: np.ndarray) -> np.ndarray:
        flat = images.reshape(images.shape[0], -1)
        return flat.astype(np.float64) / 255.0

    return Dataset(
        name="fashion-mnist",
        task="multiclass",
        X_train=features(parts["train_images"][train]),
        y_train=parts["train_labels"][train].astype(np.float64),
        X_test=features(parts["test_images"][test]),
        y_test=parts["test_labels"][test].astype(np.float64),
    )


def write_idx(path: Path, values: np.ndarray) -> Path:
    """Write ``values`` (uint8) as an IDX file (gzipped when ``path`` ends in .gz): for
    tests and for users who make their own MNIST-layout data."""
    values = np.ascontiguousarray(values, dtype=np.uint8)
    header = bytes([0, 0, UNSIGNED_BYTE, values.ndim])
    header += b"".join(int(n).to_bytes(4, "big") for n in values.shape)
    data = header + values.tobytes()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path
