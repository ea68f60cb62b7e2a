"""The README is a front page and the docs a site that builds: short, its set-up on the first screen, every
link and anchor of the site whole (``mkdocs build --strict``), the site readable offline in Chromium, and
every command block run by a test or saying why it cannot be."""

import functools
import http.server
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from composing import ROOT

pytestmark = pytest.mark.yours  # reads your task: pytest -m yours (docs/make-it-yours.md)

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
COMMANDS = {"bash", "sh", "shell", "console", "python"}  # a block in one of these is something to run
# Before each command block: the test that runs it (and reads this page), or why none can. A Markdown
# comment (a link reference nothing uses): hidden on GitHub and in the site, and free to sit inside the
# HTML comment of a project without the example's text (generator/rename.py).
NOTE = re.compile(r"\[//\]: # \((?:run by (?P<test>tests/\S+\.py)|not run: (?P<reason>[^()]+))\)")
CHROMIUM = "/usr/bin/chromium"  # Debian's package (.ci/run installs it)


def _blocks(page: Path) -> Iterator[tuple[int, str, str, str]]:
    """(line, language, text, the line before it) of each fenced block of ``page``."""
    text = page.read_text()
    for match in re.finditer(r"(?ms)^```(\w*)[^\n]*\n(.*?)^```", text):
        before = text[: match.start()].rstrip("\n").rpartition("\n")[2]
        yield text[: match.start()].count("\n") + 1, match[1], match[2], before


def _is_command(language: str, text: str) -> bool:
    return language in COMMANDS or (language == "" and text.startswith("$ "))


def test_the_readme_is_a_front_page() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move details into docs/"
    setup = next(i for i, line in enumerate(lines) if line.startswith("pip install uv && uv run"))
    assert setup < 60, f"the set-up commands are on line {setup + 1}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_command_block_is_run_by_a_test_or_says_why_not(page: Path) -> None:
    unnoted, wrong = [], []
    for line, language, text, before in _blocks(page):
        if not _is_command(language, text):
            continue
        note = NOTE.fullmatch(before.strip())
        if note is None:
            unnoted.append(f"{page.name}:{line}")
        elif note["test"]:
            test = ROOT / note["test"]  # this file reads every page; another must name the page it reads
            if not test.is_file() or (test.name != Path(__file__).name and page.name not in test.read_text()):
                wrong.append(f"{page.name}:{line}: {note['test']} does not read {page.name}")
    assert unnoted == [], "put [//]: # (run by tests/<file>.py) or [//]: # (not run: <why>) before these blocks"
    assert wrong == []


def _transcripts() -> list:
    """The ``$ python ...`` lines of the pages' transcripts and the error line each shows; one said to be
    a machine without a GPU's runs only there (``no_gpu``)."""
    found = []
    for page in PAGES:
        for _, language, text, before in _blocks(page):
            if language == "" and text.startswith("$ ") and "run by tests/test_docs.py" in before:
                for command, comment, said in re.findall(r"(?m)^\$ (.+?)(\s+#.*)?\n(Error: .+)$", text):
                    marks = [pytest.mark.no_gpu] if "without a GPU" in comment else []
                    found.append(pytest.param(page.name, command, said, marks=marks, id=f"{page.name}: {command}"))
    return found


@pytest.mark.slow
@pytest.mark.parametrize(("page", "command", "said"), _transcripts())
def test_a_transcript_shows_what_its_command_says(page: str, command: str, said: str) -> None:
    import processes

    assert command.startswith("python "), f"{page}: {command}"
    result = processes.run([sys.executable, *command.split()[1:]], cwd=ROOT, timeout=120)
    assert result.returncode == 1 and result.stderr.strip() == said, result.stderr[-2000:]


def _build(site: Path) -> None:
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    build(load_config(str(ROOT / "mkdocs.yml"), site_dir=str(site), strict=True))


def test_the_site_builds_with_every_link_and_anchor_whole(tmp_path: Path) -> None:
    _build(tmp_path / "site")  # strict: a warning (a link to no page, an anchor no page has) aborts
    built = {path.relative_to(tmp_path / "site").as_posix() for path in (tmp_path / "site").rglob("index.html")}
    docs = ROOT / "docs"
    pages = {
        f"{path.relative_to(docs).with_suffix('')}/index.html" for path in docs.rglob("*.md") if path.stem != "index"
    }
    assert built == pages | {"index.html"}


def _nav_pages() -> list[str]:
    """The site's pages as mkdocs.yml orders them (its nav), as addresses: ``install/``."""

    def walk(items: list) -> Iterator[str]:
        for item in items:
            for value in item.values() if isinstance(item, dict) else [item]:
                yield from walk(value) if isinstance(value, list) else [value]

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    return ["" if page == "index.md" else page.removesuffix(".md") + "/" for page in walk(config["nav"])]


@contextmanager
def _served(folder: Path) -> Iterator[str]:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
def test_every_page_of_the_site_opens_in_chromium_offline_and_without_errors(tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).is_file():
        pytest.skip(f"needs Chromium at {CHROMIUM}: apt-get install chromium (Debian's package)")
    _build(tmp_path / "site")
    hosts: set[str] = set()
    errors: list[str] = []
    titles = {}
    with _served(tmp_path / "site") as url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            tab = browser.new_page()
            tab.on("request", lambda request: hosts.add(urlparse(request.url).hostname or ""))
            tab.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
            tab.on("pageerror", lambda error: errors.append(str(error)))
            for page in _nav_pages():
                response = tab.goto(url + page, wait_until="networkidle")
                assert response is not None and response.status == 200, page
                titles[page] = tab.locator("article h1").first.inner_text()
            tab.goto(url, wait_until="networkidle")
            tab.keyboard.press("/")  # the site's own search, from the built index: a page found by a word
            tab.keyboard.type("torchrun")
            tab.locator(".md-search-result__item").first.wait_for(timeout=15_000)
        finally:
            browser.close()
    assert all(titles.values()) and len(titles) == len(_nav_pages()), titles
    assert errors == []
    assert hosts <= {"127.0.0.1"}, hosts  # no fonts, scripts or analytics from elsewhere
