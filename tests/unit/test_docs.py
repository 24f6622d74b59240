"""The README fits on a screen and every link in it and in the reference pages leads somewhere (issue 49);
docs/ is the product and lab/ the notebook (issue 48).

The README is the first page a user reads: what it is, the two Quick start commands, one speed table,
how to bring one's own model, then links. Everything else lives in docs/, so a link or an anchor that
no longer resolves would hide it. docs/ holds what a user reads; the dated lab notebook and raw results
live in lab/, and docs/benchmarks.md shows current numbers only, so it stays short and links to the
notebook once, for history.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
LAB = ROOT / "lab"
# the pages a README link leads to, and the ones they link among themselves
PAGES = [README, *(DOCS / f"{n}.md" for n in ("usage", "server", "models", "drafters", "cpu", "exactness",
                                               "development", "gpu", "policy", "llama_cpp", "scale-out", "bench",
                                               "benchmarks"))]
BENCHMARKS_MAX_LINES = 400
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"```.*?```", re.S)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _FENCE.sub("", page.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"#{1,6} (.*)", line)
        if m:
            s = slug(m.group(1))
            out.add(s if s not in seen else f"{s}-{seen[s]}")
            seen[s] = seen.get(s, 0) + 1
    return out


def links(page: Path) -> list[str]:
    return _LINK.findall(_FENCE.sub("", page.read_text(encoding="utf-8")))


def test_readme_fits_on_a_screen() -> None:
    size = len(README.read_bytes())
    assert size <= 10 * 1024, f"README.md is {size} bytes; move detail into a page under docs/ and link it"


def test_quick_start_is_exactly_make_run_and_make_test() -> None:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    commands = [line.split("#")[0].strip() for block in blocks for line in block.splitlines() if line.strip()]
    assert commands == ["make run", "make test"]


def test_readme_has_one_speed_table_naming_its_machine() -> None:
    section = README.read_text(encoding="utf-8").split("## Speed", 1)[1].split("\n## ", 1)[0]
    tables = re.findall(r"(?m)^\|---", section)
    assert len(tables) == 1 and "AVX-512" in section and "llama.cpp" in section and "docs/benchmarks.md" in section


def local_targets(page: Path) -> list[tuple[str, Path, str]]:
    """(link, resolved file, anchor) for each link on the page that is not a URL."""
    out = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked offline
        path, _, anchor = target.partition("#")
        out.append((target, (page.parent / path).resolve() if path else page, anchor))
    return out


@pytest.mark.parametrize("page", [*PAGES, LAB / "README.md", LAB / "notes.md"], ids=lambda p: p.name)
def test_every_link_and_anchor_resolves(page: Path) -> None:
    broken = []
    for target, dest, anchor in local_targets(page):
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with that anchor in {dest.name}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def links_into(docs: Path, lab: Path) -> list[str]:
    """Every link from a page under docs/ to something under lab/, as 'page -> link'."""
    lab = lab.resolve()
    return [f"{page.relative_to(docs)} -> {target}" for page in sorted(docs.rglob("*.md"))
            for target, dest, _ in local_targets(page) if dest == lab or lab in dest.parents]


def test_docs_link_to_the_lab_only_once_from_benchmarks_for_history() -> None:
    assert links_into(DOCS, LAB) == ["benchmarks.md -> ../lab/notes.md"]


def test_the_lab_link_check_catches_a_reference_page_citing_the_notebook(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "lab" / "results").mkdir(parents=True)
    (tmp_path / "docs" / "cpu.md").write_text("# CPU\n\n[raw](../lab/results/) [ok](cpu.md#cpu) [web](https://x.org)\n")
    assert links_into(tmp_path / "docs", tmp_path / "lab") == ["cpu.md -> ../lab/results/"]


def test_benchmarks_page_shows_current_numbers_only() -> None:
    lines = (DOCS / "benchmarks.md").read_text(encoding="utf-8").count("\n")
    assert lines <= BENCHMARKS_MAX_LINES, (f"docs/benchmarks.md is {lines} lines: keep the latest figures per "
                                           "measurement and leave history to lab/notes.md")


def test_docs_holds_reference_pages_and_images_only() -> None:
    assert not (DOCS / "results").exists(), "raw results belong in lab/results/"
    stray = [str(p.relative_to(DOCS)) for p in DOCS.rglob("*")
             if p.is_file() and p.suffix != ".md" and p.parent != DOCS / "img"]
    assert not stray, f"not reference pages or their images (move them to lab/): {stray}"


def test_the_checker_catches_a_broken_anchor(tmp_path: Path) -> None:
    page = tmp_path / "a.md"
    page.write_text("# Speed on a CPU: the kernels, γ\n\n[ok](#speed-on-a-cpu-the-kernels-γ) [bad](#nope)\n")
    assert links(page) == ["#speed-on-a-cpu-the-kernels-γ", "#nope"]
    assert anchors(page) == {"speed-on-a-cpu-the-kernels-γ"}


def test_readme_links_every_reference_page() -> None:
    linked = {Path(t.partition("#")[0]).name for t in links(README)}
    assert {p.name for p in PAGES[1:]} <= linked
