"""Files that are whole or absent: written to a temporary file beside the target,
flushed to disk (fsync), then renamed over it, so a reader never sees half a file and
a process killed mid-write leaves the previous version (or nothing) in place.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

# The process's umask, read once: a file made by mkstemp is 0600, the one it replaces
# would have been 0666 & ~umask, as open() makes it.
_UMASK = os.umask(0o022)
os.umask(_UMASK)


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w") -> Iterator[IO[Any]]:
    """Open ``path`` for writing (``"w"``: text, ``"wb"``: bytes); it appears, whole, when
    the ``with`` block ends without an exception (and is left untouched if one is raised).

    The directory entry is synced too, so the rename survives a power cut.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)
        kwargs: dict[str, Any] = {"newline": "", "encoding": "utf-8"} if mode == "w" else {}
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _sync_directory(target.parent)


def _sync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - not every platform opens directories
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)
