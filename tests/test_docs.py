"""The docs name only what exists: every repository path and every codedgd module or
attribute that README.md, docs/ and deploy/ mention resolves in this checkout."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted(
    [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "deploy").rglob("*.md")]
)
TOPS = ("services", "client", "tests", "bench", "docs", "docker", "deploy", "scripts", "protos")
# A repository path: starts with a top-level folder; stops at a character paths here never hold.
PATH = re.compile(r"(?<![\w./-])(?:\.ci/run|(?:" + "|".join(TOPS) + r")/[\w./-]*)")
MODULE = re.compile(r"(?<![\w.])codedgd\.(?:services|client)(?:\.\w+)+")


def _mentions(pattern: re.Pattern[str], text: str) -> set[str]:
    text = re.sub(r"https?://\S+", "", text)  # a URL's path is not ours
    return {m.group(0).rstrip(".,:;)") for m in pattern.finditer(text)}


def _resolves(dotted: str) -> bool:
    """A module, or a module's attribute (a class, a function, a method of a class)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 1, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_a_doc_names_exists(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    missing = sorted(p for p in _mentions(PATH, text) if "*" not in p and not (ROOT / p).exists())
    assert not missing, f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_a_doc_names_imports(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    stale = sorted(m for m in _mentions(MODULE, text) if not _resolves(m))
    assert not stale, f"{doc.relative_to(ROOT)} names modules or names that do not exist: {stale}"
