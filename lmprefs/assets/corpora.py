"""The offline corpora: Jane Austen's novels (from Debian's r-cran-janeaustenr, read without R), the 300 ABC news
articles of gensim's test data, and the few KB of Austen shipped in the package."""

from __future__ import annotations

import gzip
import importlib.util
import json
import shutil
import struct
import subprocess
import tempfile
import zlib
from importlib import resources
from pathlib import Path
from typing import Any

from lmprefs.assets.cache import (
    AUSTEN_DEB,
    GENSIM_WHEEL,
    LEE_FILE,
    AssetError,
    _build_dir_atomically,
    _find_download,
    cache_dir,
)
from lmprefs.io.jsonl import read_jsonl


def _r_unserialize(b: bytes):
    """An R object from R's XDR serialization (what janeaustenr's .rdb/.rdx files hold), as Python values."""
    if b[:2] != b"X\n":
        raise ValueError("not an R XDR serialization")
    r = _RReader(b, 2)
    version = r.int32()
    r.int32()  # the writer's R version
    r.int32()  # the oldest R version that can read it
    if version == 3:
        n = r.int32()
        r.pos += n  # native-encoding string
    return r.item()


class _RReader:
    """A reader of the SEXP types janeaustenr's data use: NULL, symbols and references to them, pairlists (tagged
    values), character strings, integer, logical, double, character and list vectors, and their attributes."""

    def __init__(self, b: bytes, pos: int):
        self.b, self.pos = b, pos
        self.refs: list[Any] = []  # the symbols read so far, in order: a reference names one by its number

    def int32(self) -> int:
        v = struct.unpack_from(">i", self.b, self.pos)[0]
        self.pos += 4
        return v

    def item(self):
        flags = self.int32()
        t, has_attr, has_tag = flags & 0xFF, flags & (1 << 9), flags & (1 << 10)
        if t == 254:  # NILVALUE
            return None
        if t == 255:  # REFSXP (a repeated symbol)
            return self.refs[((flags >> 8) or self.int32()) - 1]
        if t == 1:  # SYMSXP
            self.refs.append(("sym", self.item()))
            return self.refs[-1]
        if t == 2:  # pairlist -> [(tag, value)]
            return self._pairlist(has_attr, has_tag)
        if t == 9:  # CHARSXP
            return self._string()
        v = self._vector(t)
        if has_attr:
            attrs = dict(self.item())
            if t == 19 and "names" in attrs:
                return dict(zip(attrs["names"], v, strict=False))  # lengths not enforced here, as before
        return v

    def _pairlist(self, has_attr, has_tag) -> list:
        out = []
        while True:
            if has_attr:
                self.item()
            tag = self.item() if has_tag else None
            out.append((tag[1] if tag else None, self.item()))
            f = self.int32()
            if f & 0xFF == 254:
                return out
            has_attr, has_tag = f & (1 << 9), f & (1 << 10)

    def _string(self) -> str | None:
        n = self.int32()
        if n == -1:
            return None
        s = self.b[self.pos : self.pos + n].decode("utf-8", "replace")
        self.pos += n
        return s

    def _vector(self, t: int) -> list:
        n = self.int32()
        if t in (10, 13):  # logical, integer
            v = list(struct.unpack_from(f">{n}i", self.b, self.pos))
            self.pos += 4 * n
        elif t == 14:  # double
            v = list(struct.unpack_from(f">{n}d", self.b, self.pos))
            self.pos += 8 * n
        elif t in (16, 19):  # STRSXP / VECSXP
            v = [self.item() for _ in range(n)]
        else:
            raise ValueError(f"unsupported R type {t}")
        return v


def _find_austen_deb(work: Path) -> Path:
    return _find_download(
        "LMPREFS_AUSTEN_DEB", f"{AUSTEN_DEB}_*.deb", [cache_dir(), Path.cwd()],
        ["apt-get", "download", AUSTEN_DEB] if shutil.which("apt-get") else None, work,
        f"Jane Austen's novels come from Debian's {AUSTEN_DEB}: run `apt-get update && apt-get download {AUSTEN_DEB}` "
        f"in {cache_dir()} (or set LMPREFS_AUSTEN_DEB to the .deb)",
    )  # fmt: skip


def _build_austen(out: Path) -> None:
    with tempfile.TemporaryDirectory() as work:
        deb = _find_austen_deb(Path(work))
        x = Path(work) / "x"
        if shutil.which("dpkg-deb"):
            subprocess.run(["dpkg-deb", "-x", str(deb), str(x)], check=True)
        else:
            raise AssetError("dpkg-deb is needed to unpack the Austen package (Debian/Ubuntu); install dpkg")
        hits = list(x.glob("usr/lib/R/site-library/janeaustenr/data/Rdata.rdx"))
        if not hits:
            raise AssetError(f"{deb} holds no janeaustenr/data/Rdata.rdx")
        prefix = str(hits[0])[: -len(".rdx")]
        idx = _r_unserialize(gzip.open(prefix + ".rdx").read())
        blob = Path(prefix + ".rdb").read_bytes()
        books = {
            name: _r_unserialize(zlib.decompress(blob[int(off) + 4 : int(off) + int(ln)]))
            for name, (off, ln) in idx["variables"].items()
        }
    with open(out / "passages.jsonl", "w") as f:
        n = 0
        for book in sorted(books):
            text = "\n".join(line or "" for line in books[book])
            for para in text.split("\n\n"):
                words = para.split()
                if len(words) >= 20:  # drops titles, chapter headings and one-line paragraphs
                    f.write(json.dumps({"book": book, "text": " ".join(words).replace("_", "")}) + "\n")
                    n += 1
    (out / "meta.json").write_text(json.dumps({"source": AUSTEN_DEB, "books": sorted(books), "passages": n}))


def austen_dir() -> Path:
    return _build_dir_atomically(cache_dir() / "austen", _build_austen)


def austen_passages() -> list[dict]:
    """Paragraphs of >= 20 words from the six novels: [{"book": ..., "text": ...}] (7,690 of them)."""
    return read_jsonl(austen_dir() / "passages.jsonl")


def _find_gensim_wheel(work: Path) -> Path:
    import sys

    # the wheel is only downloaded and read: installing gensim is not needed (scipy, smart_open, a compiled build)
    return _find_download(
        "LMPREFS_GENSIM_WHEEL", "gensim-*.whl", [cache_dir()],
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", GENSIM_WHEEL, "-d", str(work)], work,
        f"the news articles come from gensim's test data: run `pip download --no-deps {GENSIM_WHEEL} -d "
        f"{cache_dir()}` (or set LMPREFS_GENSIM_WHEEL to the wheel, or pip install gensim)",
    )  # fmt: skip


def _build_lee_news(out: Path) -> None:
    import zipfile

    spec = importlib.util.find_spec("gensim")  # an installed gensim holds the same file (found without importing it)
    locations = spec.submodule_search_locations if spec else None  # None unless gensim is a package
    installed = Path(list(locations)[0]).parent / LEE_FILE if locations else None
    if installed is not None and installed.is_file():
        raw, source = installed.read_bytes(), str(installed)
    else:
        with tempfile.TemporaryDirectory() as work:
            wheel = _find_gensim_wheel(Path(work))
            try:
                with zipfile.ZipFile(wheel) as z:
                    raw = z.read(LEE_FILE)
            except (zipfile.BadZipFile, KeyError) as e:
                raise AssetError(f"{wheel}: not a gensim wheel holding {LEE_FILE} ({e})") from None
            source = f"{wheel.name}:{LEE_FILE}"
    articles = [" ".join(line.split()) for line in raw.decode("utf-8").splitlines() if line.strip()]
    with open(out / "articles.jsonl", "w") as f:
        for i, text in enumerate(articles):
            f.write(json.dumps({"id": i, "text": text}) + "\n")
    (out / "meta.json").write_text(json.dumps({"source": source, "articles": len(articles),
                                               "words": sum(len(a.split()) for a in articles)}))  # fmt: skip


def lee_news_dir() -> Path:
    return _build_dir_atomically(cache_dir() / "lee-news", _build_lee_news)


def lee_news_articles() -> list[str]:
    """The 300 ABC news articles of gensim's `lee_background.cor` (59,890 words; median 162 words an article),
    whitespace normalized, in file order."""
    return [row["text"] for row in read_jsonl(lee_news_dir() / "articles.jsonl")]


def paragraphs(text: str) -> list[str]:
    """The paragraphs of a text (split on blank lines), each on one line."""
    return [" ".join(p.split()) for p in text.split("\n\n") if p.strip()]


def bundled_passages() -> list[str]:
    """A few KB of Austen shipped in the package (the `bundled` query dataset and the tiny model's training text)."""
    return paragraphs(resources.files("lmprefs.assets").joinpath("passages.txt").read_text())
