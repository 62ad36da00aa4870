"""Every reference in the repository's text points inside the repository, to something that exists.

A reader of the repository must be able to follow every citation: no text names a document that
is not here, every repository path a text mentions exists, a ``docs/*.md#anchor`` names a heading
of that document (GitHub's slug), and a ``tests/...py::name`` names a function or class defined in
that file. Paths a ``.gitignore`` declares local (operator secrets, test artifacts) may be
absent.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.paths import ROOT

#: Folders whose text is scanned, and the repository-root files scanned besides them.
SCANNED_DIRS = (
    "accounting",
    "benchmarks",
    "cli",
    "client",
    "deploy",
    "docs",
    "examples",
    "learning",
    "mechanisms",
    "protos",
    "scripts",
    "secagg",
    "server",
    "tests",
    ".ci",
)
SCANNED_ROOT_FILES = ("Makefile", "README.md", "pyproject.toml", ".dockerignore", ".gitignore")
TEXT_SUFFIXES = {
    ".py",
    ".pyi",
    ".md",
    ".yaml",
    ".yml",
    ".toml",
    ".proto",
    ".sh",
    ".js",
    ".html",
    ".css",
    ".mako",
    ".cfg",
    ".ini",
    ".txt",
    ".json",
}
TEXT_NAMES = {"Makefile", "Dockerfile", "run"}
SKIPPED_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", "artifacts"}

#: Documents that live outside the repository. The names are assembled here so that this file
#: does not cite them itself.
OUTSIDE_DOCUMENTS = ("ALGORITHMS", "SECAGG", "DESIGN", "STYLE")
OUTSIDE = re.compile(r"\b(?:" + "|".join(OUTSIDE_DOCUMENTS) + r")\.md\b")

#: A repository-relative path: a top-level folder, then path characters, optionally an anchor
#: (``#slug``) or a pytest node (``::name``). Not preceded by a path character, so the tail of an
#: absolute path or of a URL never matches.
TOP_LEVEL = sorted({*SCANNED_DIRS} - {".ci"})
PATH_REF = re.compile(
    r"(?<![\w./\-~$])"
    r"(?P<path>(?:" + "|".join(TOP_LEVEL) + r")/[\w./\-]*[\w/])"
    r"(?:#(?P<anchor>[\w\-]+)|(?P<node>(?:::\w+)+))?"
)


def _text_files() -> Iterator[Path]:
    for name in SCANNED_ROOT_FILES:
        if (ROOT / name).is_file():
            yield ROOT / name
    for folder in SCANNED_DIRS:
        base = ROOT / folder
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            if SKIPPED_DIRS & set(path.relative_to(ROOT).parts) or not path.is_file():
                continue
            if path.suffix in TEXT_SUFFIXES or path.name in TEXT_NAMES or "Dockerfile" in path.name:
                yield path


FILES = list(_text_files())


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors_of(markdown: str) -> set[str]:
    """Every heading anchor of a Markdown text (fenced code skipped, duplicates numbered)."""
    seen: dict[str, int] = {}
    anchors: set[str] = set()
    fenced = False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        match = None if fenced else re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match is None:
            continue
        slug = github_slug(match.group(1))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _gitignore_patterns() -> list[tuple[Path, str]]:
    patterns = []
    for ignore in (ROOT / ".gitignore", *(ROOT / d / ".gitignore" for d in SCANNED_DIRS)):
        if ignore.is_file():
            for line in _read(ignore).splitlines():
                line = line.strip()
                if line and not line.startswith(("#", "!")):
                    patterns.append((ignore.parent, line.strip("/")))
    return patterns


def declared_local(path: str) -> bool:
    """True for a path a ``.gitignore`` declares local (operator secrets, test artifacts)."""
    target = ROOT / path
    for base, pattern in _gitignore_patterns():
        if not target.is_relative_to(base):
            continue
        parts = target.relative_to(base).parts
        if "/" in pattern:
            depth = pattern.count("/") + 1
            if len(parts) >= depth and fnmatch.fnmatch("/".join(parts[:depth]), pattern):
                return True
        elif any(fnmatch.fnmatch(part, pattern) for part in parts):
            return True
    return False


def broken_references(text: str) -> list[str]:
    """The problems of one text's references to repository paths (empty when all resolve)."""
    problems = []
    for match in PATH_REF.finditer(text):
        raw = match.group("path")
        path = raw.rstrip("./")
        target = ROOT / path
        if not target.exists():
            if declared_local(path):
                continue
            problems.append(f"{raw}: no such file or folder")
            continue
        anchor, node = match.group("anchor"), match.group("node")
        if anchor is not None:
            if target.suffix != ".md":
                problems.append(f"{raw}#{anchor}: an anchor into a file that is not Markdown")
            elif anchor not in anchors_of(_read(target)):
                problems.append(f"{raw}#{anchor}: no heading of {path} has this anchor")
        if node is not None and target.suffix == ".py":
            source = _read(target)
            for name in node.strip(":").split("::"):
                if not re.search(rf"^\s*(?:async\s+def|def|class)\s+{name}\b", source, re.M):
                    problems.append(f"{raw}{node}: {name} is not defined in {path}")
    return problems


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_the_scan_covers_code_docs_and_deployment() -> None:
    scanned = {_rel(p) for p in FILES}
    for expected in (
        "Makefile",
        "pyproject.toml",
        "docs/secagg.md",
        "protos/dpfl/v1/agent.proto",
        "deploy/docker/agent.Dockerfile",
        "deploy/compose.yaml",
        "examples/dp-helmet.yaml",
        "secagg/shamir.py",
        "tests/unit/test_doc_references.py",
    ):
        assert expected in scanned


def test_no_text_cites_a_document_outside_the_repository() -> None:
    offenders = [
        f"{_rel(path)}:{number}: {line.strip()}"
        for path in FILES
        for number, line in enumerate(_read(path).splitlines(), start=1)
        if OUTSIDE.search(line)
    ]
    assert not offenders, "cites a document outside the repository:\n" + "\n".join(offenders)


def test_every_repository_path_a_text_mentions_exists() -> None:
    this_file = Path(__file__).resolve()  # its examples of broken references are deliberate
    offenders = [
        f"{_rel(path)}: {problem}"
        for path in FILES
        if path.resolve() != this_file
        for problem in broken_references(_read(path))
    ]
    assert not offenders, "references that do not resolve:\n" + "\n".join(offenders)


# -- the checker itself ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        ("Stage 3: masked input", "stage-3-masked-input"),
        ("(c) DP-FedSGD with several local steps", "c-dp-fedsgd-with-several-local-steps"),
        ("DP-FedSGD: agents above `max_local_size`", "dp-fedsgd-agents-above-max_local_size"),
        ("Rule 1: never under-count", "rule-1-never-under-count"),
        ("A round over the wire", "a-round-over-the-wire"),
    ],
)
def test_github_slug(heading: str, slug: str) -> None:
    assert github_slug(heading) == slug


def test_anchors_skip_code_and_number_duplicates() -> None:
    text = "# Title\n\n## Part\n\n```bash\n# not a heading\n```\n\n## Part\n"
    assert anchors_of(text) == {"title", "part", "part-1"}


@pytest.mark.parametrize(
    "text",
    [
        "see docs/no-such-page.md",
        "see docs/secagg.md#no-such-heading",
        "in learning/algorithms/no_such_module.py",
        "(tests/unit/test_doc_references.py::test_that_does_not_exist)",
        "an anchor into code: secagg/shamir.py#top",
    ],
)
def test_a_broken_reference_is_reported(text: str) -> None:
    assert broken_references(text)


@pytest.mark.parametrize(
    "text",
    [
        "docs/secagg.md#stage-3-masked-input",
        "(docs/architecture.md#rule-1-never-under-count).",
        "learning/algorithms/base.py and learning/algorithms/",
        "tests/unit/test_doc_references.py::test_github_slug",
        "https://example.org/docs/no-such-page.md and /srv/docs/nothing.md",
        "the operator's deploy/.env and tests/artifacts/report.json",
    ],
)
def test_a_good_reference_passes(text: str) -> None:
    assert broken_references(text) == []


def test_an_outside_document_is_recognised() -> None:
    name = "SEC" + "AGG"
    assert OUTSIDE.search(f"as {name}.md §2 says")
    assert not OUTSIDE.search("docs/secagg.md#parameters")
