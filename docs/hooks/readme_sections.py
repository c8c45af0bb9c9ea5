"""MkDocs hook: sections of README.md shown in a page of the site, so that one text serves both and the page still
reads as plain Markdown (on GitHub, in an editor), where an include line would show as itself.

In README.md a section lies between `<!-- section: NAME -->` and `<!-- end of section: NAME -->` (comments, unseen
when it is read). In a page, the lines from `<!-- README section: NAME -->` to `<!-- end of README section -->`
(a pointer to the README for a reader of the plain file) are replaced here by that section.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.exceptions import PluginError

BLOCK = re.compile(r"^<!-- README section: (?P<name>[\w-]+) -->\n.*?^<!-- end of README section -->$", re.S | re.M)


def readme_section(readme: str, name: str) -> str:
    m = re.search(rf"^<!-- section: {re.escape(name)} -->\n(.*?)^<!-- end of section: {re.escape(name)} -->$",
                  readme, re.S | re.M)  # fmt: skip
    if m is None:
        raise PluginError(f"README.md has no section {name!r} (<!-- section: {name} --> ... <!-- end of section: "
                          f"{name} -->)")  # fmt: skip
    return m.group(1).rstrip("\n")


def include_readme(markdown: str, readme: str) -> str:
    return BLOCK.sub(lambda m: readme_section(readme, m.group("name")), markdown)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if "<!-- README section: " not in markdown:
        return markdown
    readme = (Path(config.config_file_path).resolve().parent / "README.md").read_text()
    return include_readme(markdown, readme)
