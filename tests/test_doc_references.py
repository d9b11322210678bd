"""Every document a docstring or comment cites is in this repository, and so is every section it names.

Users read the code without the team's brief beside it: a citation of a page that is
not shipped (``DESIGN.md``, ``TORCH.md``) or of a section that was renamed sends them
nowhere. Checked: ``docs/...md`` and ``benchmarks/...md`` paths, the bare names of the
team's working notes, and the ``(docs/page.md, "Section")`` form, whose section must be a
heading of that page. File names that are outputs (``--report R.md``) are not citations.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("autoshard", "costmodel", "solver", "hw_profiles", "benchmarks", "examples")
NOT_SHIPPED = re.compile(r"\b(DESIGN|TORCH|PEERS|STYLE|DEVELOPERS)\.md\b")
PATH = re.compile(r"(?<![\w/.-])((?:docs|benchmarks)/[\w./-]+?\.md)(?:#[\w-]+)?")
SECTION = re.compile(r"((?:docs|benchmarks)/[\w./-]+?\.md),\s*\"([^\"]+)\"")


def _sources() -> list[Path]:
    return sorted(p for package in SOURCES for p in (ROOT / package).rglob("*.py"))


def _headings(page: Path) -> list[str]:
    return [line.lstrip("#").strip() for line in page.read_text().splitlines() if line.startswith("#")]


def citations(text: str) -> tuple[list[str], list[str], list[tuple[str, str]]]:
    """(pages not shipped, cited paths, cited (path, section) pairs) in ``text``."""
    return (NOT_SHIPPED.findall(text), PATH.findall(text), SECTION.findall(text))


def broken_citations(path: Path) -> list[str]:
    """One message per citation in ``path`` that does not resolve."""
    text = path.read_text()
    where = path.relative_to(ROOT)
    missing, paths, sections = citations(text)
    found = [f"{where}: cites {name}.md, which is not in this repository" for name in missing]
    found += [f"{where}: cites {p}, which does not exist" for p in paths if not (ROOT / p).is_file()]
    for page, section in sections:
        if (ROOT / page).is_file() and not any(section.lower() in h.lower() for h in _headings(ROOT / page)):
            found.append(f"{where}: cites section {section!r} of {page}, which has no such heading")
    return found


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_document_and_section_exists(path):
    assert broken_citations(path) == []


def test_the_check_catches_a_missing_page_and_section(tmp_path, monkeypatch):
    text = ('"""See DESIGN.md and docs/no_such_page.md; also (docs/design.md, "No such section"),\n'
            'but (docs/design.md, "Devices") and docs/formats.md#plan are fine; --report R.md is an output."""\n')
    fake = ROOT / "autoshard" / "_citation_probe.py"
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: text if self == fake else _read(self))
    found = broken_citations(fake)
    assert len(found) == 3
    assert "DESIGN.md" in found[0] and "no_such_page.md" in found[1] and "No such section" in found[2]


_read = Path.read_text
