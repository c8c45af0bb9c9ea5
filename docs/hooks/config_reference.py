"""MkDocs hook: the configuration reference, generated at build time from the config dataclasses.

Field docstrings are the only documentation of a hyperparameter (`lmprefs <cmd> --help` prints them too), so the
site renders them rather than keeping a second copy that would drift. configuration.md holds two markers that are
replaced here: the presets (as `lmprefs presets` lists them, with what each changes from the defaults) and one
table per config section. A leaf field without a docstring fails the build, naming it.
"""

from __future__ import annotations

import dataclasses
import html
import operator
import re
import sys
import types
import typing
from pathlib import Path
from typing import Literal

from mkdocs.exceptions import PluginError

PRESETS_MARKER = "<!-- generated: presets -->"
REFERENCE_MARKER = "<!-- generated: config-reference -->"
PAGE = "configuration.md"


def on_config(config):
    # Document the checkout being built, not whichever lmprefs happens to be installed.
    root = str(Path(config.config_file_path).resolve().parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    return config


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    for marker in (PRESETS_MARKER, REFERENCE_MARKER):
        if marker not in markdown:
            raise PluginError(f"{PAGE}: the marker {marker!r} is missing; the generated tables go there")
    from lmprefs import config as lc  # the public names; the module's layout may change

    return markdown.replace(PRESETS_MARKER, presets_markdown(lc)).replace(REFERENCE_MARKER, reference_markdown(lc))


def sections(lc) -> list[tuple[str, type]]:
    """(name, dataclass) of every section of Config; the CLI's keys are `section.key`, so every top-level field
    must be one."""
    hints = typing.get_type_hints(lc.Config)
    out = []
    for f in dataclasses.fields(lc.Config):
        if not dataclasses.is_dataclass(hints[f.name]):
            raise PluginError(f"Config.{f.name} is not a section (a dataclass); the reference lists sections only")
        out.append((f.name, hints[f.name]))
    return out


def leaves(cls, prefix: str) -> list[tuple[str, type, str, object, object]]:
    """(dotted key, declaring dataclass, field name, type, default) of every leaf field, recursing into nested
    dataclasses."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        if dataclasses.is_dataclass(t):
            out += leaves(t, f"{prefix}{f.name}.")
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            out.append((prefix + f.name, cls, f.name, t, default))
    return out


def type_name(t) -> str:
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join("None" if a is type(None) else type_name(a) for a in args)
    if origin is tuple:
        return "tuple[" + ", ".join("..." if a is Ellipsis else type_name(a) for a in args) + "]"
    return getattr(t, "__name__", str(t))


def cell(text: str) -> str:
    """Markdown table cell. Outside code spans, HTML-escaped (a docstring's runs/<command> is not a tag) and pipes
    escaped (they would split the cell); inside them the table parser already leaves pipes alone."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(p if p.startswith("`") else html.escape(p, quote=False).replace("|", "\\|") for p in parts)


def reference_markdown(lc) -> str:
    # the parser `lmprefs <cmd> --help` uses: one reading of the source
    from lmprefs.config.overrides import field_docs

    missing, blocks = [], []
    for name, cls in sections(lc):
        rows = ["| key | type | default | what it does |", "|---|---|---|---|"]
        for key, owner, fname, t, default in leaves(cls, f"{name}."):
            doc = field_docs(owner).get(fname)
            if not doc:
                missing.append(key)
                continue
            rows.append(f"| `{key}` | {cell(type_name(t))} | {cell(f'`{default!r}`')} | {cell(doc)} |")
        intro = cell(" ".join((cls.__doc__ or "").split()))
        blocks.append(f"### `{name}`\n\n{intro}\n\n" + "\n".join(rows))
    if missing:
        raise PluginError("config fields without a docstring (a string literal right after the field): "
                          + ", ".join(missing))  # fmt: skip
    return "\n\n".join(blocks)


def presets_markdown(lc) -> str:
    defaults = {key: default for name, cls in sections(lc) for key, *_, default in leaves(cls, f"{name}.")}
    out = []
    for name, (desc, cfg) in lc.PRESETS.items():
        values = {key: operator.attrgetter(key)(cfg) for key in defaults}
        changed = [f"`{key}={v!r}`" for key, v in values.items() if v != defaults[key]]
        out.append(f"`{name}`\n:   {cell(desc)}\n\n    Changes from the defaults: "
                   + (cell(", ".join(changed)) if changed else "none") + ".")  # fmt: skip
    return "\n\n".join(out)
