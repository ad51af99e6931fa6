"""The README is the user's first page and docs/ holds the rest (issue 33): the README stays short, starts with the
two commands, and every relative link in it and in docs/ reaches a file (and a heading, where it names one).
Reads markdown only: no project imports."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)     # fenced code blocks: neither links nor headings
CODE_SPAN = re.compile(r"(`+)(?!`).+?(?<!`)\1(?!`)", re.S)      # `code`: a [x](y) inside is text, not a link
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)


def prose(text: str) -> str:
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (hyphens, underscores kept), spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)          # a link in a heading anchors by its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")                   # GitHub numbers repeated headings
    return out


def links(path: Path) -> list[str]:
    return LINK.findall(prose(path.read_text(encoding="utf-8")))


def broken_links(path: Path) -> list[str]:
    """Each relative link of `path` whose file is missing, or whose #anchor no heading of that .md file makes."""
    problems = []
    for target in links(path):
        if re.match(r"(?i)^(https?:|mailto:)", target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            problems.append(f"{path.name}: ({target}) -> {dest} does not exist")
        elif anchor and dest.suffix == ".md" and anchor.lower() not in anchors(dest):
            problems.append(f"{path.name}: ({target}) -> no heading of {dest.name} has the anchor #{anchor}")
    return problems


def pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def test_the_readme_is_at_most_200_lines():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move detail into docs/"


def test_the_readme_starts_with_make_sweep_and_make_test():
    head = "\n".join(README.read_text(encoding="utf-8").splitlines()[:15])
    assert "make sweep" in head and "make test" in head


def test_every_relative_link_reaches_its_file_and_heading():
    assert pages(), "docs/ has no pages"
    problems = [p for path in [README, *pages()] for p in broken_links(path)]
    assert not problems, "\n".join(problems)


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in links(README) if t.partition("#")[0]}
    missing = [page.name for page in pages() if page.resolve() not in linked]
    assert not missing, f"docs pages the README does not link: {missing}"


def test_every_docs_page_has_a_title_and_links_back_to_the_readme():
    for page in pages():
        text = page.read_text(encoding="utf-8")
        assert text.startswith("# "), f"{page.name} does not start with a title"
        back = [t for t in links(page) if (page.parent / t.partition("#")[0]).resolve() == README.resolve()]
        assert back, f"{page.name} has no link back to the README"


def test_the_checker_catches_a_missing_file_a_missing_anchor_and_skips_code(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "gate.md").write_text("# The gate\n\n## The criteria: `conf/gate`\n\n## Sequential rounds, 6 Dec\n")
    readme = tmp_path / "README.md"
    readme.write_text("# Title\n\n"
                      "[ok](docs/gate.md) [ok](docs/gate.md#the-criteria-confgate) [ok](docs/gate.md#sequential-rounds-6-dec)\n"
                      "[web](https://example.com/missing) [mail](mailto:a@b.c) [self](#title)\n"
                      "[gone](docs/nope.md) [bad anchor](docs/gate.md#the-verdict) [bad self](#nothing)\n"
                      "`[in code](docs/also-nope.md)`\n\n```\n[in a block](docs/nope-too.md)\n```\n")
    problems = broken_links(readme)
    assert len(problems) == 3, problems
    assert "nope.md" in problems[0] and "does not exist" in problems[0]
    assert "#the-verdict" in problems[1] and "#nothing" in problems[2]


def test_slugs_follow_github():
    assert slug("Promoting, rolling back, status") == "promoting-rolling-back-status"
    assert slug("minilm: `make sweep target=minilm`") == "minilm-make-sweep-targetminilm"
    assert slug("Capacity and cost (`conf/capacity/`)") == "capacity-and-cost-confcapacity"
    assert slug("Your own model") == "your-own-model"
