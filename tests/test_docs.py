"""The repository documents itself: every relative link and every pointer to
a repository file, in the docs, the README and the code's comments and
docstrings, names something that exists; nothing points outside the
repository; the README stays a front door; its example runs."""

from __future__ import annotations

import ast
import io
import itertools
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CODE = sorted(
    p
    for folder in ("scheduler", "cli", "lua", "bench", "tests", ".ci")
    for p in (ROOT / folder).rglob("*")
    if p.is_file()
    and p.suffix in (".py", ".lua", ".proto", "")
    and "__pycache__" not in p.parts
    and not p.name.endswith("_pb2.py")
)

#: a pointer to a repository file: a top-level folder, then a path with a suffix
POINTER = re.compile(
    r"(?<![\w./-])((?:scheduler|lua|cli|tests|bench|docs)/[\w./{},<>*-]*\.(?:py|pyi|lua|md|json|"
    r"png|txt|proto))\b"
)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
#: documents this repository does not have (they lived outside it)
OUTSIDE = re.compile(r"(?<![\w.-])(?:CONTRACT|DESIGN|STYLE)\.md|issue notes|/work/")


def comments(path: Path) -> str:
    """The comments and docstrings of a source file (its prose, not its data)."""
    text = path.read_text(errors="replace")
    if path.suffix == ".py":
        tokens = tokenize.generate_tokens(io.StringIO(text).readline)
        parts = [tok.string for tok in tokens if tok.type == tokenize.COMMENT]
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                parts.append(ast.get_docstring(node) or "")
        return "\n".join(parts)
    if path.suffix == ".lua":
        blocks = re.findall(r"--\[\[.*?\]\]", text, re.S)
        return "\n".join(blocks + re.findall(r"--(?!\[\[).*", text))
    marker = "//" if path.suffix == ".proto" else "#"
    return "\n".join(line.split(marker, 1)[1] for line in text.splitlines() if marker in line)


def _expand(pointer: str) -> list[str]:
    """``bench/results/{ceiling,latency}.json`` -> both paths."""
    m = re.search(r"\{([^{}]*,[^{}]*)\}", pointer)
    if not m:
        return [pointer]
    return list(
        itertools.chain.from_iterable(
            _expand(pointer[: m.start()] + choice + pointer[m.end() :])
            for choice in m.group(1).split(",")
        )
    )


def _exists(pointer: str, where: Path) -> bool:
    if any(c in pointer for c in "<>*{}"):
        return True  # a pattern (lua/<name>-<nkeys>.lua), not a file
    candidates = [ROOT / pointer]
    if pointer.startswith("includes/") or where.is_relative_to(ROOT / "lua"):
        candidates.append(ROOT / "lua" / pointer)
    return any(c.exists() for c in candidates)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", path.read_text(), re.M)}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_relative_link_resolves(doc: Path) -> None:
    links = LINK.findall(doc.read_text())
    for link in links:
        if re.match(r"[a-z]+:", link):
            continue  # an absolute URL
        target, _, anchor = link.partition("#")
        path = (doc.parent / target).resolve() if target else doc
        assert path.exists(), f"{doc.name}: {link} names no file"
        assert path.is_relative_to(ROOT), f"{doc.name}: {link} leaves the repository"
        if anchor:
            assert anchor in anchors(path), f"{doc.name}: {link}: no such heading"


@pytest.mark.parametrize("path", DOCS + CODE, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_pointer_names_a_repository_file(path: Path) -> None:
    text = path.read_text() if path.suffix == ".md" else comments(path)
    missing = [
        p for m in POINTER.finditer(text) for p in _expand(m.group(1)) if not _exists(p, path)
    ]
    assert missing == [], f"{path.relative_to(ROOT)} points at files that do not exist"
    assert not OUTSIDE.findall(text), f"{path.relative_to(ROOT)} points outside the repository"


def test_lua_include_pointers_name_their_files() -> None:
    # "-- @include x" and "includes/x.lua" in the scripts: each an include that exists
    # (or the one the loader writes)
    names = {p.stem for p in (ROOT / "lua" / "includes").glob("*.lua")} | {"constants"}
    for path in (ROOT / "lua").rglob("*.lua"):
        for name in re.findall(r"^-- @include (\w+)", path.read_text(), re.M):
            assert name in names, f"{path.name} includes {name}"


def test_the_readme_is_a_front_door() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 250
    assert '    pip install -e ".[test]" && schedctl simulate\n' in text
    assert "    python -m pytest -q -n auto\n" in text
    for doc in ("design", "contract", "operations", "performance"):
        assert f"(docs/{doc}.md)" in text
    # every schedctl command is listed
    from scheduler.cli.main import main

    for command in main.commands:
        assert f"    schedctl {command}" in text, command


def test_the_readme_example_runs(real_url: str) -> None:
    code = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert code is not None
    source = code.group(1).replace("redis://localhost:6379/0", real_url)
    source += "\nassert placed.node_id == 'n1' and placed.reservation_id\n"
    run = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr


def test_the_design_names_the_four_files_of_a_schedule() -> None:
    text = (ROOT / "docs" / "design.md").read_text()
    section = text[text.index("## One Schedule") : text.index("## The package")]
    files = re.findall(r"^\d\. `([^`]+)`", section, re.M)
    assert files == [
        "scheduler/server/service.py",
        "scheduler/client/aio.py",
        "scheduler/store/calls.py",
        "lua/includes/schedule.lua",
    ]
    assert all((ROOT / f).exists() for f in files)


def test_every_runbook_url_names_a_heading_of_operations() -> None:
    # the alerts' runbook_url (deploy/prometheus/rules.yaml) are anchors of docs/operations.md
    rules = (ROOT / "deploy" / "prometheus" / "rules.yaml").read_text()
    urls = re.findall(r"runbook_url:\s*(\S+)", rules)
    assert urls
    for url in urls:
        target, _, anchor = url.partition("#")
        assert target == "docs/operations.md" and anchor, url
        assert anchor in anchors(ROOT / target), f"{url}: no such heading"
