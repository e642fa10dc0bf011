"""Links work where they are read: the README on the package index, the docs on their site.

The package index renders README.md on its own, away from the repository, so a relative
link there (``docs/guarantees.md``) leads nowhere: every link of the README is absolute.
A link to the documentation site must name a page ``make docs`` builds from ``docs/``; a
link into the repository must name a file or folder that exists. The project's metadata
(``[project.urls]``) points to the same two places.

The docs' getting-started pages take the README's quick starts in with ``{include}``;
each page must lead the reader on, never back to itself (the README's quick starts once
ended with "More in the docs' *Getting started with LangChain*", which the page of that
name then showed to its own reader).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

#: Where ``make docs``' pages are published, and where the repository lives.
DOCS_SITE = "https://demote.readthedocs.io/en/latest/"
REPOSITORY = "https://github.com/demote-dev/demote"

_INLINE = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)")  # [text](target), ![alt](target)
_REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)
_HTML = re.compile(r"""\b(?:href|src)\s*=\s*["']([^"']+)["']""", re.IGNORECASE)
_CODE = re.compile(r"^ *(`{3,}|~{3,}).*?^ *\1", re.MULTILINE | re.DOTALL)  # fenced blocks


def links(markdown: str) -> list[str]:
    """Every link target of ``markdown`` (inline, reference, HTML), outside code blocks."""
    text = _CODE.sub("", markdown)
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code: `[x](y)` there is no link
    found = _INLINE.findall(text) + _REFERENCE.findall(text) + _HTML.findall(text)
    return [target for target in found if target]


def docs_page(url: str) -> Path:
    """The ``docs/`` source of a page of the documentation site."""
    path = url.removeprefix(DOCS_SITE).split("#", 1)[0]
    if path == "" or path.endswith("/"):
        path += "index.html"
    assert path.endswith(".html"), f"{url}: not a page of the site (a .html page or a folder)"
    return DOCS / (path.removesuffix(".html") + ".md")


def repository_path(url: str) -> Path:
    """The file or folder of the repository that ``url`` shows (``blob/main/...``)."""
    match = re.fullmatch(rf"{re.escape(REPOSITORY)}/(?:blob|tree)/main/([^#?]+)(?:#.*)?", url)
    assert match, f"{url}: a repository link must be {REPOSITORY}/blob/main/<path>"
    return ROOT / match[1]


def test_links_finds_every_kind_of_link() -> None:
    markdown = (
        "See [a](docs/a.md), ![b](img/b.png) and <a href='c.html'>c</a>.\n"
        "[d]: ./d.md\n`[not](a-link.md)`\n```python\nx = '[not](a-link.md)'\n```\n"
    )
    assert links(markdown) == ["docs/a.md", "img/b.png", "./d.md", "c.html"]


def test_readme_links_are_absolute() -> None:
    found = links(README.read_text())
    assert found, "no links found in README.md"
    relative = [t for t in found if not re.match(r"(https://|mailto:)", t)]
    assert relative == [], (
        f"relative links in README.md break where the package index renders it: {relative}; "
        f"link to the docs site ({DOCS_SITE}...) or the repository ({REPOSITORY}/blob/main/...)"
    )


def test_readme_docs_links_name_pages_that_exist() -> None:
    to_docs = [t for t in links(README.read_text()) if t.startswith(DOCS_SITE)]
    assert len(to_docs) >= 10, to_docs  # the README points readers to the docs throughout
    missing = sorted({t for t in to_docs if not docs_page(t).is_file()})
    assert missing == [], f"README links to docs pages that docs/ does not have: {missing}"


MARKDOWN = [README, *sorted(p for p in DOCS.rglob("*.md") if DOCS / "_build" not in p.parents)]


@pytest.mark.parametrize("page", MARKDOWN, ids=[p.relative_to(ROOT).as_posix() for p in MARKDOWN])
def test_links_to_the_docs_site_and_repository_name_what_exists(page: Path) -> None:
    # One spelling of each (not the stable version, http, a /blob/master/ path), so that the
    # checks above see every such link; a repository link names a file that exists.
    for target in links(page.read_text()):
        if "demote.readthedocs.io" in target:
            assert target.startswith(DOCS_SITE) and docs_page(target).is_file(), target
        if "github.com/demote-dev/demote" in target:
            assert target == REPOSITORY or repository_path(target).exists(), target


@pytest.mark.parametrize(
    ("url", "page"),
    [
        (DOCS_SITE, DOCS / "index.md"),
        (DOCS_SITE + "deployment.html", DOCS / "deployment.md"),
        (DOCS_SITE + "getting-started/langchain.html#next", DOCS / "getting-started/langchain.md"),
        (DOCS_SITE + "api/", DOCS / "api/index.md"),
    ],
)
def test_docs_page_maps_site_urls_to_sources(url: str, page: Path) -> None:
    assert docs_page(url) == page


def test_a_missing_page_is_reported() -> None:
    assert not docs_page(DOCS_SITE + "getting-started/no-such-page.html").exists()


def _expanded(page: Path) -> str:
    """The page's text with the README regions it includes put in place."""
    text = page.read_text()

    def include(match: re.Match[str]) -> str:
        included = (page.parent / match["path"]).resolve().read_text()
        start = re.search(r":start-after:\s*(.+)", match["options"])
        end = re.search(r":end-before:\s*(.+)", match["options"])
        if start:
            included = included.split(start[1].strip(), 1)[1]
        if end:
            included = included.split(end[1].strip(), 1)[0]
        return included

    pattern = r"```\{include\}\s+(?P<path>\S+)\n(?P<options>(?::[^\n]*\n)*)```"
    return re.sub(pattern, include, text)


GETTING_STARTED = sorted((DOCS / "getting-started").glob("*.md"))


@pytest.mark.parametrize("page", GETTING_STARTED, ids=[p.stem for p in GETTING_STARTED])
def test_getting_started_pages_lead_on_not_back_to_themselves(page: Path) -> None:
    text = _expanded(page)
    title = text.splitlines()[0].removeprefix("# ")
    assert title.startswith("Getting started"), page
    assert text.count(title) == 1, f"{page.name} names itself ({title!r}) to its own reader"
    own = {page.stem, f"../getting-started/{page.stem}", page.name}
    targets = re.findall(r"\{doc\}`(?:[^<`]*<)?([^>`]+)>?`", text) + [
        docs_page(t).relative_to(page.parent).with_suffix("").as_posix()
        for t in links(text)
        if t.startswith(DOCS_SITE) and docs_page(t).parent == page.parent
    ]
    assert not own & set(targets), f"{page.name} links to itself"
    assert "## Next" in text, f"{page.name} does not say where the reader goes next"


def test_the_front_page_leads_with_agents_and_reaches_a_durable_agent_in_one_click() -> None:
    text = (DOCS / "index.md").read_text()
    table = text[text.index("| you have |") :].split("\n\n", 1)[0]
    rows = [line for line in table.splitlines()[2:] if line.startswith("|")]
    assert "create_agent" in rows[0] and "DemotingMiddleware" in rows[0], rows[0]
    chain = next(row for row in rows if "RunnableWithMessageHistory" in row)
    assert rows.index(chain) > 0 and "deprecated" in chain, chain
    install = re.search(r"pip install '([^']+)'", text)
    assert install and install[1] == "demote[agents]", install
    assert "{doc}`getting-started/durable-agents`" in text
    durable = (DOCS / "getting-started" / "durable-agents.md").read_text()
    for name in ("create_agent", "SqliteSaver", "SQLiteStateStore", "SQLiteArchive", ".erase("):
        assert name in durable, name
    deployment = (DOCS / "deployment.md").read_text()
    for name in ("create_agent", "PostgresSaver", "PostgresStateStore", "PostgresArchive"):
        assert name in deployment, name


def test_project_urls_point_to_the_repository_and_the_docs() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    urls = project["urls"]
    assert set(urls) >= {"Homepage", "Documentation", "Repository", "Issues"}, urls
    assert urls["Repository"] == REPOSITORY
    assert urls["Issues"] == f"{REPOSITORY}/issues"
    assert DOCS_SITE.startswith(urls["Documentation"].rstrip("/") + "/")
    changelogs = [p.name for p in ROOT.iterdir() if p.stem.upper() in {"CHANGELOG", "CHANGES"}]
    assert ("Changelog" in urls) == bool(changelogs), (urls, changelogs)


def test_installed_metadata_carries_the_project_urls() -> None:
    from importlib.metadata import metadata

    entries = metadata("demote").get_all("Project-URL") or []
    named = dict(entry.split(", ", 1) for entry in entries)
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    assert {k.lower(): v for k, v in named.items()} == {k.lower(): v for k, v in urls.items()}
