"""Every reference to the specification resolves inside the repository.

A comment or doc that says "spec 2.3", "spec 0, 8, 10 Part A", "spec 2-6" or "docs/spec.md section
12" must name a heading of docs/spec.md; a registry entry's ``spec`` field must be one; and no file
may point at a specification or design note outside the repository (a ``*.md`` path that does not
exist here, such as a sibling checkout's ``spec/estimators.md``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bonkernels import estimators

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "docs" / "spec.md"
SCANNED = ("bonkernels", "csrc", "bench", "examples", "python_tests", "docs", "scripts", "README.md")
SUFFIXES = {".py", ".md", ".h", ".cpp", ".cu", ".cuh", ".txt", ".sh", ".ini", ".toml", ".cfg"}

# "spec 2.3", "Spec 3.4", "spec 0, 8, 10 Part A/D", "spec 2-6", "spec 3.2/3.4"
SPEC_REF = re.compile(r"\b[Ss]pec\s+(\d+(?:\.\d+)?(?:\s*(?:,|/|-|and)\s*\d+(?:\.\d+)?)*)")
# "docs/spec.md section 12", "spec.md, section 2.4", and inside spec.md "section 2.4"
SECTION_REF = re.compile(r"(?:spec\.md,?|[Ss]pec's)\s+[Ss]ections?\s+(\d+(?:\.\d+)?)")
INTERNAL_REF = re.compile(r"\b[Ss]ections?\s+(\d+(?:\.\d+)?(?:\s*(?:,|and)\s*\d+(?:\.\d+)?)*)")
# a path to a markdown file: it must exist in the repository
MD_PATH = re.compile(r"(?<![\w/.-])((?:\.\./|\./)?(?:[\w-]+/)*[\w-]+\.md)\b")


def spec_headings() -> set:
    """The section numbers that docs/spec.md has as headings ("## 2. ..." -> "2", "### 2.3 ..." -> "2.3")."""
    found = set()
    for line in SPEC.read_text().splitlines():
        m = re.match(r"#{2,4}\s+(\d+(?:\.\d+)?)\.?\s", line)
        if m:
            found.add(m.group(1))
    return found


def scanned_files():
    for top in SCANNED:
        path = REPO / top
        if path.is_file():
            yield path
            continue
        for p in sorted(path.rglob("*")):
            if p.is_file() and p.suffix in SUFFIXES and "results" not in p.relative_to(REPO).parts \
                    and p != Path(__file__).resolve():  # this file spells the patterns it looks for
                yield p


def _numbers(group: str):
    return re.findall(r"\d+(?:\.\d+)?", group)


def references(text: str, internal: bool = False):
    """(line number, section) of every spec reference in a text."""
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for m in SPEC_REF.finditer(line):
            out += [(lineno, s) for s in _numbers(m.group(1))]
        for m in SECTION_REF.finditer(line):
            out.append((lineno, m.group(1)))
        if internal:
            for m in INTERNAL_REF.finditer(line):
                out += [(lineno, s) for s in _numbers(m.group(1))]
    return out


def test_spec_has_the_kept_numbering():
    """The section numbers the code has always used (and that this file keeps) are all there."""
    wanted = {"0", "0.1", "1", "1.1", "1.2", "2", "2.1", "2.2", "2.3", "2.4", "3", "3.1", "3.2",
              "3.3", "3.4", "4", "5", "6", "7", "8", "9", "10", "11", "12", "12.1", "12.2", "13",
              "13.1", "13.2", "13.3"}
    assert wanted <= spec_headings()


def test_reference_scanner_finds_references():
    """The scanner is not vacuous, and it flags what it should."""
    assert references("see spec 2.3") == [(1, "2.3")]
    assert [s for _, s in references("spec 0, 8, 10 Part A/D")] == ["0", "8", "10"]
    assert [s for _, s in references("(docs/spec.md section 12)")] == ["12"]
    assert [s for _, s in references("spec 2-6")] == ["2", "6"]
    assert "99" not in spec_headings()
    assert MD_PATH.search("the project's spec (shared/spec/estimators.md)").group(1) == "shared/spec/estimators.md"
    total = sum(len(references(p.read_text(errors="ignore"), p == SPEC)) for p in scanned_files())
    assert total > 100


def test_every_spec_reference_resolves():
    headings = spec_headings()
    bad = []
    for path in scanned_files():
        text = path.read_text(errors="ignore")
        for lineno, section in references(text, internal=path == SPEC):
            if section not in headings:
                bad.append(f"{path.relative_to(REPO)}:{lineno}: spec {section} is not a heading of docs/spec.md")
    assert bad == []


def test_no_reference_points_outside_the_repository():
    bad = []
    for path in scanned_files():
        for lineno, line in enumerate(path.read_text(errors="ignore").splitlines(), 1):
            if re.search(r"\.\./shared|shared/spec|spec/estimators\.md", line):
                bad.append(f"{path.relative_to(REPO)}:{lineno}: {line.strip()}")
                continue
            for m in MD_PATH.finditer(line):
                target = m.group(1)
                here = (path.parent / target) if path.is_file() else None
                if (REPO / target).exists() or (here is not None and here.exists()):
                    continue
                if "/" not in target and list(REPO.glob(f"**/{target}")):
                    continue  # a bare file name of a file that exists in the repository
                bad.append(f"{path.relative_to(REPO)}:{lineno}: {target} is not in the repository")
    assert bad == []


@pytest.mark.parametrize("est", list(estimators.REGISTRY.values()), ids=lambda e: e.name)
def test_registry_spec_field_is_a_heading(est):
    assert est.spec in spec_headings(), f"{est.name}: spec {est.spec!r} is not a heading of docs/spec.md"


def named_tests(text: str):
    """(file, test function) for every test the text names: `python_tests/f.py::test_x`, and
    `::test_y` (or `::test_y[param]`) right after it for the same file."""
    current, out = None, []
    for m in re.finditer(r"`(python_tests/[\w]+\.py)?(?:::(\w+)(?:\[[^\]`]*\])?)?`", text):
        if m.group(1):
            current = m.group(1)
        if m.group(2) and current:
            out.append((current, m.group(2)))
    return out


def test_tests_named_by_the_docs_exist():
    """Every test that docs/spec.md (or adding-an-estimator.md) says covers an estimator exists."""
    named = []
    for doc in (SPEC, REPO / "docs" / "adding-an-estimator.md"):
        named += named_tests(doc.read_text())
    assert len(named) > 40
    missing = []
    for path, name in named:
        source = (REPO / path).read_text() if (REPO / path).exists() else ""
        if not re.search(rf"^def {re.escape(name)}\(", source, re.M):
            missing.append(f"{path}::{name}")
    for doc in (SPEC, REPO / "docs" / "adding-an-estimator.md", REPO / "docs" / "conventions.md"):
        for path in set(re.findall(r"python_tests/\w+\.py", doc.read_text())):
            if not (REPO / path).exists():
                missing.append(f"{doc.name}: {path}")
    assert missing == []
