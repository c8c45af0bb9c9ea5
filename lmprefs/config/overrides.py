"""Command-line overrides (`--ppo.lr 2e-5`, `--rewards.kl-target None`), config files, and field help.

Keys are checked against the dataclass tree: an unknown or misspelt key is a ConfigError that suggests the closest
real key, and values are parsed by the field's type. Configs are written as JSON and reload into the same tree.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import re
import textwrap
import types
import typing
from typing import Any, Literal

from lmprefs.config import Config
from lmprefs.errors import UserError


class ConfigError(UserError):
    pass


@functools.cache
def _hints(cls) -> dict[str, Any]:
    """The field types of a config class (get_type_hints evaluates every annotation string: slow, and asked for each
    field of each class whenever a command reads its flags)."""
    return typing.get_type_hints(cls)


def all_keys(cls=Config, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> type for every leaf field ("ppo.lr": float, ...)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        t = _hints(cls)[f.name]
        if dataclasses.is_dataclass(t):
            out |= all_keys(t, f"{prefix}{f.name}.")
        else:
            out[prefix + f.name] = t
    return out


def parse_value(text: str, t: Any, key: str) -> Any:
    """Parse `text` as type `t` (int, float, bool, str, X | None, Literal[...], tuple[str or int, ...])."""
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin in (typing.Union, types.UnionType):
        if text in ("None", "none", "null") and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return parse_value(text, inner, key)
    if origin is Literal:
        if text not in args:
            raise ConfigError(f"--{key.replace('_', '-')} {text!r}: choose one of {', '.join(map(str, args))}")
        return text
    if origin is tuple:  # comma-separated; "" is the empty tuple
        items = split_items(text, f"--{key.replace('_', '-')}")
        return tuple(parse_value(s, int, key) for s in items) if args[0] is int else tuple(items)
    if t is bool:
        low = text.lower()
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"--{key.replace('_', '-')} {text!r}: expected true or false")
    if t in (int, float):
        try:  # an int as written (float() rounds past 2**53), else one in float notation: 1e6
            v = float(text) if t is float else _int(text)
        except (ValueError, OverflowError):
            v = None
        if v is None:
            raise ConfigError(f"--{key.replace('_', '-')} {text!r}: expected {t.__name__}")
        return v
    return _unescape(text, key) if "\\" in text else text


def split_items(text: str, flag: str) -> list[str]:
    """The items of a comma-separated value (`--arms ppo,rloo`, `--lora.targets c_attn,c_proj`), stripped; "" has
    none. An empty item (`1,,2`, a trailing comma) or one given twice is a ConfigError naming `flag` and the value:
    dropped or merged without a word, it ran another list than the one typed."""
    if not text.strip():
        return []
    items = [s.strip() for s in text.split(",")]
    if "" in items:
        raise ConfigError(f"{flag} {text!r}: item {items.index('') + 1} is empty; separate the items with single "
                          "commas")  # fmt: skip
    twice = next((x for i, x in enumerate(items) if x in items[:i]), None)
    if twice is not None:
        raise ConfigError(f"{flag} {text!r}: {twice} is given twice")
    return items


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return int(float(text)) if float(text).is_integer() else None


# Python's backslash escapes; a backslash before anything else is kept as typed
_ESCAPE = re.compile(r"\\(N(\{[A-Za-z0-9 -]*\})?|x[0-9a-fA-F]{0,2}|u[0-9a-fA-F]{0,4}|U[0-9a-fA-F]{0,8}|[0-7]{1,3}"
                     r"|[\\'\"abfnrtv\n]|$)")


def _unescape(text: str, key: str) -> str:
    """`text` with its escapes (\\n, \\t, \\x41, \\u00e9, \\N{...}) decoded one by one: decoding the whole text as
    unicode_escape bytes would read its UTF-8 as Latin-1 ('Résumé' became 'RÃ©sumÃ©'). A broken escape is a
    ConfigError naming the value, not a UnicodeDecodeError."""

    def one(m: re.Match) -> str:
        try:
            return m.group(0).encode("ascii").decode("unicode_escape")
        except UnicodeDecodeError as e:
            raise ConfigError(f"--{key.replace('_', '-')} {text!r}: {m.group(0)!r} is not a valid escape "
                              f"({e.reason}); write a backslash as \\\\") from None  # fmt: skip

    return _ESCAPE.sub(one, text)


def _set(obj, path: list[str], value: Any):
    if len(path) == 1:
        return dataclasses.replace(obj, **{path[0]: value})
    return dataclasses.replace(obj, **{path[0]: _set(getattr(obj, path[0]), path[1:], value)})


def apply_overrides(cfg: Config, pairs: list[tuple[str, str]], origin: str = "command line") -> Config:
    """cfg with each (dotted key, text value) applied; ConfigError names an unknown key and suggests one. The result
    is validated once, with every override in place, so their order does not matter (`--ppo.batch-size 64
    --ppo.total-episodes 512` was refused: 64 episodes over the preset's total of 32)."""
    keys = all_keys()
    values = {}
    for raw_key, text in pairs:
        key = raw_key.replace("-", "_")
        if key not in keys:
            near = difflib.get_close_matches(key, list(keys), n=1, cutoff=0.5)
            hint = f"; did you mean --{near[0].replace('_', '-')}?" if near else "; see --help for the keys"
            raise ConfigError(f"unknown config key --{raw_key} (from the {origin}){hint}")
        values[key] = parse_value(text, keys[key], key)
    if not values:
        return cfg
    sections: dict[str, dict[str, Any]] = {}
    for key, v in values.items():
        sec, name = key.split(".")
        sections.setdefault(sec, {})[name] = v
    try:  # sections do not validate; Config does, once
        return dataclasses.replace(cfg, **{sec: dataclasses.replace(getattr(cfg, sec), **kv)
                                           for sec, kv in sections.items()})  # fmt: skip
    except ValueError as e:  # Config.__post_init__ validation
        if isinstance(e, UserError):
            raise
        given = " ".join(f"--{k.replace('_', '-')} {t}" for k, t in pairs)
        raise ConfigError(f"{given}: {e}" if len(pairs) == 1 else f"{e} (from the {origin})") from None


def set_value(cfg: Config, raw_key: str, value: Any, origin: str = "Python API") -> Config:
    """cfg with one dotted key set to a Python value; the new Config validates it (types and ranges)."""
    key = raw_key.replace("-", "_")
    try:
        return _set(cfg, key.split("."), value)
    except ValueError as e:
        if isinstance(e, UserError):
            raise
        raise ConfigError(f"{raw_key}={value!r} (from the {origin}): {e}") from None


def split_overrides(argv: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """Separate dotted `--a.b value` / `--a.b=value` overrides from the command's own arguments."""
    rest, pairs, i = [], [], 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--") and "." in a.split("=", 1)[0]:
            if "=" in a:
                k, v = a[2:].split("=", 1)
                i += 1
            else:
                if i + 1 >= len(argv):
                    raise ConfigError(f"{a} needs a value")
                k, v = a[2:], argv[i + 1]
                i += 2
            pairs.append((k, v))
        else:
            rest.append(a)
            i += 1
    return rest, pairs


# ---------------------------------------------------------------------------------------------------------------
# Files


def to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def from_dict(d: dict, cls=Config, origin: str = "config", prefix: str = "") -> Any:
    """Rebuild a config from its dict; unknown keys are rejected (a saved config must mean what it says)."""
    if not isinstance(d, dict):
        raise ConfigError(f"{origin}: {prefix.rstrip('.') or 'config'} must be an object, not {type(d).__name__}")
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for k, v in d.items():
        if k not in names:
            near = difflib.get_close_matches(k, names, n=1)
            hint = f"; did you mean {prefix}{near[0]}?" if near else ""
            raise ConfigError(f"{origin}: unknown key {prefix}{k}{hint}")
        t = hints[k]
        if dataclasses.is_dataclass(t):
            kwargs[k] = from_dict(v, t, origin, f"{prefix}{k}.")
        elif typing.get_origin(t) is tuple:  # a JSON list; tuple("c_attn") would be its letters
            if not isinstance(v, list | tuple):
                raise ConfigError(f"{origin}: {prefix}{k}={v!r} must be a list")
            kwargs[k] = tuple(v)
        else:
            kwargs[k] = v
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{origin}: {e}") from None


# ---------------------------------------------------------------------------------------------------------------
# Help text from the field docstrings


def field_docs(cls) -> dict[str, str]:
    """{field: docstring} read from the class source (a string literal right after each field)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    cls_def = tree.body[0]
    assert isinstance(cls_def, ast.ClassDef)
    body, out = cls_def.body, {}
    for a, b in zip(body, body[1:], strict=False):
        if (isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name) and isinstance(b, ast.Expr)
                and isinstance(b.value, ast.Constant)):  # fmt: skip
            out[a.target.id] = " ".join(str(b.value.value).split())
    return out


def config_help(cfg: Config, source: str = "the preset", section: str | None = None) -> str:
    """Every config key (or one section's) with its value in cfg and its docstring."""
    lines = [f"config overrides (--section.key VALUE; the values shown are those of {source}):"]
    for f in dataclasses.fields(Config):
        if section is not None and f.name != section:
            continue
        sub = getattr(cfg, f.name)
        docs = field_docs(type(sub))
        for g in dataclasses.fields(sub):
            key = f"--{f.name}.{g.name}".replace("_", "-")
            lines.append(f"  {key} {getattr(sub, g.name)!r}\n      {docs.get(g.name, '')}")
    return "\n".join(lines)


def config_keys(command: str, source: str) -> str:
    """The config keys by section, names only, with where to read their values and meanings: a command's --help
    stays a screen or two where every key with its docstring ran to 200-260 lines."""
    lines = ["config overrides: --section.key VALUE (e.g. --ppo.lr 2e-5), any of these keys by section:"]
    defaults = Config()
    for f in dataclasses.fields(Config):
        names = [g.name.replace("_", "-") for g in dataclasses.fields(getattr(defaults, f.name))]
        lines += textwrap.wrap(", ".join(names), 116, initial_indent=f"  {f.name.replace('_', '-'):13s}",
                               subsequent_indent=" " * 15, break_on_hyphens=False)  # fmt: skip
    lines += [f"each key's value ({source}) and meaning: lmprefs {command} ... --help-config [SECTION];",
              "the whole config as JSON: lmprefs config PRESET"]
    return "\n".join(lines)
