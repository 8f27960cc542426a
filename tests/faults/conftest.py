"""Hypothesis keeps its files (caches of constants and Unicode data; the fuzz tests keep
no example database) in the system's temporary directory, not in the checkout."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis.configuration import set_hypothesis_home_dir

set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "codedgd-hypothesis")
