"""README.md stays a front page: short, its two commands first, and no link into the repository that leads nowhere.
(The docs site itself is checked by `mkdocs build --strict` in CI, which fails on a broken link.)"""

import re
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
COMMANDS = [
    "bash scripts/setup.sh && lmprefs quickstart",
    "bash scripts/setup.sh && python3 -m pytest -q",
]


def test_readme_is_at_most_200_lines():
    n = len(README.read_text().splitlines())
    assert n <= 200, f"README.md has {n} lines; the rest belongs in docs/"


def test_readme_first_code_block_is_the_two_commands():
    first = re.search(r"^```[^\n]*\n(.*?)^```", README.read_text(), re.S | re.M)
    assert first, "README.md has no code block"
    commands = [line.split("#")[0].strip() for line in first.group(1).splitlines() if line.strip()]
    assert commands == COMMANDS


def test_readme_relative_links_point_at_files():
    text = README.read_text()
    targets = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r"^\[[^\]]+\]:\s*(\S+)", text, re.M)
    relative = [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]
    assert relative, "expected README.md to link into docs/"
    missing = [t for t in relative if not (ROOT / unquote(t.split("#")[0])).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_pages_read_as_plain_markdown_show_no_include_lines_and_the_site_includes_the_readme():
    """A docs page opened as a file shows a pointer to the README, never a raw `--8<--` include line; the site's
    hook puts the README's section in its place."""
    import importlib.util

    pages = sorted((ROOT / "docs").rglob("*.md"))
    raw = [f"{p.relative_to(ROOT)}:{i}" for p in pages for i, line in enumerate(p.read_text().splitlines(), 1)
           if line.lstrip().startswith("--8<--")]  # fmt: skip
    assert not raw, f"include lines that read as themselves: {raw}"
    spec = importlib.util.spec_from_file_location("readme_sections", ROOT / "docs" / "hooks" / "readme_sections.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = (ROOT / "docs" / "getting-started.md").read_text()
    built = hook.include_readme(page, README.read_text())
    assert "<!-- README section:" in page and "<!-- README section:" not in built
    assert "| `lmprefs quickstart [--preset P] [--plan]` |" in built and "lmprefs.make_config(" in built
