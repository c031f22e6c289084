"""Every document the repository cites is in the repository, or named with its public address.

A reader of a clone must be able to follow each reference: a ``*.md`` path in code,
docs, README or scripts resolves to a file here (relative to the citing file or to the
repository root), or the citing file gives that document's public URL. Paths into a
directory outside the repository are refused outright.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from harness import ROOT

# Not part of the repository: tool output, venvs, build trees, VCS data.
_SKIPPED_DIRS = {"build", "install", "log", "demo-output", "__pycache__", "node_modules"}
_URL = re.compile(r"https?://[^\s)>\]\"'`]+")
# A path ending in .md, optionally with an anchor: docs/protocol.md, ../x/y.md, README.md#z
_DOC_PATH = re.compile(r"(?<![\w/.-])((?:\.{1,2}/)*[\w.-]+(?:/[\w.-]+)*\.md)\b")
# Documents the code writes rather than cites: bench/run_all.py's output (bench/results/ by default).
_WRITTEN = {"report.md", "codec.md"}
_OUTSIDE = re.compile(r"(?:^|[\s\"'`(])(?:\.\./)+shared\b|/work/shared\b")


def repository_text_files() -> list[tuple[Path, str]]:
    """The repository's text files and their text (not this one: it spells out what it forbids)."""
    files = []
    for directory, subdirs, names in os.walk(ROOT):
        subdirs[:] = [d for d in subdirs if d not in _SKIPPED_DIRS and (not d.startswith(".") or d == ".ci")]
        for name in names:
            path = Path(directory, name)
            if path == Path(__file__).resolve() or path.suffix in {".png", ".jpg", ".pyc"}:
                continue
            try:
                files.append((path, path.read_text()))
            except UnicodeDecodeError:
                continue
    return files


def unresolved_references(path: Path, text: str) -> list[str]:
    """The ``*.md`` paths ``text`` cites that neither exist here nor come with their public URL."""
    urls = _URL.findall(text)
    public = {url.split("#")[0].rstrip(".,;:").rsplit("/", 1)[-1] for url in urls}
    bare = _URL.sub(" ", text)
    missing = []
    for cited in sorted(set(_DOC_PATH.findall(bare))):
        if (path.parent / cited).is_file() or (ROOT / cited).is_file() or Path(cited).name in _WRITTEN:
            continue
        if Path(cited).name in public and "/" not in cited:
            continue  # e.g. SPEC.md, named beside https://github.com/PlugRL/plugrl-protocol/blob/main/SPEC.md
        missing.append(cited)
    return missing


FILES = repository_text_files()


def test_the_scan_sees_the_code_docs_and_scripts():
    names = {p.relative_to(ROOT).as_posix() for p, _ in FILES}
    assert {"README.md", "docs/protocol.md", "docs/design.md", "plugrl_ros/protocol/codec.py", ".ci/run"} <= names


def test_every_cited_document_is_in_the_repository_or_has_its_public_address():
    problems = [f"{p.relative_to(ROOT)}: {ref}" for p, text in FILES for ref in unresolved_references(p, text)]
    assert not problems, "cited documents that a reader of this repository cannot open:\n" + "\n".join(problems)


def test_no_file_points_outside_the_repository():
    problems = [str(p.relative_to(ROOT)) for p, text in FILES if _OUTSIDE.search(text)]
    assert not problems, f"paths outside the repository in: {problems}"


@pytest.mark.parametrize(
    ("text", "outside"),
    [("see ../shared/NOTES.md", True), ("/work/shared/x", True), ("shared/ memory", False), ("a ../shared_x", False)],
)
def test_the_outside_check_itself(text, outside):
    assert bool(_OUTSIDE.search(text)) is outside


def test_the_readme_links_the_protocol_and_design_docs():
    readme = (ROOT / "README.md").read_text()
    assert "docs/protocol.md" in readme and "docs/design.md" in readme


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("see PROTOCOL.md, Closing", ["PROTOCOL.md"]),
        ("see docs/protocol.md", []),
        ("[design](design.md)", ["design.md"]),  # from the root, docs/design.md is not design.md
        ("SPEC.md section 9", ["SPEC.md"]),
        ("SPEC.md (https://github.com/PlugRL/plugrl-protocol/blob/main/SPEC.md#9-x)", []),
        ("bench/README.md and README.md#performance", []),
        ("docs/missing.md", ["docs/missing.md"]),
    ],
)
def test_the_reference_check_itself(text, expected):
    assert unresolved_references(ROOT / "README.md", text) == expected
