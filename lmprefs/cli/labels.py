"""`lmprefs label`, `import-labels`, `export-labels`: simulated labeling and label files in and out of a store."""

from __future__ import annotations

from pathlib import Path

from lmprefs.cli.common import command_parser, help_with_config, preset_parser, seed_arg
from lmprefs.errors import UserError


def cmd_label(argv: list[str]) -> int:
    from lmprefs.config import LABELERS
    from lmprefs.runtime.resolve import resolve_config

    p, argv, pairs, name = preset_parser("label", argv)
    p.add_argument("--db", default="labels.sqlite", help="label store (SQLite file; created if missing)")
    # --questions: torchrun's own parser takes `--n` for an abbreviation of its options and stops the launch
    p.add_argument("--n", "--questions", dest="n", type=int, default=1000,
                   help="questions to sample and label (under torchrun spell it --questions)")
    p.add_argument("--labeler", default=None, choices=list(LABELERS),
                   help="simulated labeler (default labels.labeler); none only queues the questions for people")
    p.add_argument("--seed", type=seed_arg, default=None, help="seed for the queries and samples (default run.seed)")
    help_with_config(p, argv, name, pairs)
    a = p.parse_args(argv)
    from lmprefs.labels.store import check_store_path
    from lmprefs.pipeline.labeling import collect_labels, open_store
    from lmprefs.pipeline.task import setup_task

    if a.n <= 0:
        raise UserError(f"--n {a.n}: must be positive")
    from lmprefs.runtime import distributed as dist

    cfg = resolve_config(a.preset, pairs, a.config)
    check_store_path(a.db, must_exist=False)
    if (a.labeler or cfg.labels.labeler) != "none":
        from lmprefs.labels.labelers import score_fn

        score_fn(a.labeler or cfg.labels.labeler)  # the judge's assets are there before the store is created
    task = setup_task(cfg)
    # created only now (a bad value above leaves no file behind), and by rank 0, which writes every rank's questions
    store = open_store(a.db) if dist.is_main() else None
    out = collect_labels(task, store, a.n, labeler=a.labeler, seed=a.seed)
    if not dist.is_main():
        return 0
    assert store is not None  # rank 0 opened it
    print(f"{out['items']} questions sampled in {out['sample_seconds']:.0f}s; {out['labels_added']} labels by "
          f"{out['labeler']} in {a.db} (store now: {store.table_counts()})")  # fmt: skip
    return 0


def cmd_import_labels(argv: list[str]) -> int:
    p = command_parser("import-labels")
    p.add_argument("file", help="label file: the original's JSON, TRL pairwise JSONL, text comparisons JSONL, "
                   "summarize-from-feedback comparisons JSONL, or per-response scores JSONL; or a save_to_disk "
                   "directory (DIR, or DIR:SPLIT) of rows in one of the JSONL formats")
    p.add_argument("--db", default="labels.sqlite", help="label store to import into (SQLite; created if missing)")
    p.add_argument("--format", default="auto",
                   choices=["auto", "openai", "pairs", "comparisons", "summarize", "scores"],
                   help="file format (auto: by extension and content); summarize: summarize-from-feedback "
                   "comparisons, labeler = worker, split kept; scores: per-response scores, {prompt, response, "
                   "score} JSONL, as scalar_rating labels")  # fmt: skip
    p.add_argument("--labeler", default="import", help="labeler name recorded for the imported labels")
    p.add_argument("--json", action="store_true", help="print the import report as one JSON object")
    a = p.parse_args(argv)
    import dataclasses
    import json

    from lmprefs.data.hf_datasets import is_saved_dataset, split_spec
    from lmprefs.io.inputs import path_kind
    from lmprefs.labels.formats import LabelFileError, import_file
    from lmprefs.labels.store import check_store_path
    from lmprefs.pipeline.labeling import open_store

    kind = path_kind(Path(a.file), "label file", a.file)
    if kind != "file" and not is_saved_dataset(split_spec(a.file)[0]):
        what = {"dir": "is a directory, not a file", "other": "is not a regular file"}.get(kind, "does not exist")
        raise UserError(f"label file {a.file} {what}")
    created = not check_store_path(a.db, must_exist=False).exists()
    try:
        with open_store(a.db) as store:
            r = import_file(store, a.file, format=a.format, labeler=a.labeler)
    except LabelFileError as e:
        if created:  # a rejected file leaves no empty store behind
            for suffix in ("", "-wal", "-shm"):
                Path(a.db + suffix).unlink(missing_ok=True)
        raise UserError(str(e)) from None
    if a.json:
        print(json.dumps(dataclasses.asdict(r) | {"db": a.db}))
    else:
        print(f"imported {r.rows} rows ({r.format}, {', '.join(r.label_types) or 'no labels'}) from {r.path} into "
              f"{a.db}: {r.items_added} new items ({r.items_present} already there), {r.labels_added} new labels "
              f"({r.labels_present} already there)")  # fmt: skip
    return 0


def cmd_export_labels(argv: list[str]) -> int:
    p = command_parser("export-labels")
    p.add_argument("file", help="label file to write (replaced atomically)")
    p.add_argument("--db", default="labels.sqlite", help="label store to read (SQLite; must exist)")
    p.add_argument("--format", default="auto", choices=["auto", "openai", "pairs", "comparisons"],
                   help="auto: .json -> openai (GPT-2 ids, best_of_4), .jsonl -> comparisons (text, every label "
                   "type); pairs: TRL's prompt/chosen/rejected JSONL")  # fmt: skip
    p.add_argument("--label-type", default=None,
                   help="export only this label type (openai: default best_of_4; pairs: every best_of_N)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    a = p.parse_args(argv)
    import json

    from lmprefs.config import label_type_shape
    from lmprefs.labels.formats import LabelFileError, export_file
    from lmprefs.labels.store import LabelStore, check_store_path

    out = Path(a.file)
    if out.is_dir():
        raise UserError(f"export file {out} is a directory; give a file name")
    if not out.parent.is_dir():
        raise UserError(f"export file {out}: folder {out.parent} does not exist")
    fmt = a.format
    if fmt == "auto":
        fmt = {".json": "openai", ".jsonl": "comparisons"}.get(out.suffix)
        if fmt is None:
            raise UserError(f"export file {out}: cannot tell the format from {out.suffix or 'no extension'!r}; "
                            "name it .json or .jsonl, or pass --format")  # fmt: skip
    if a.label_type is not None:
        try:
            label_type_shape(a.label_type)
        except ValueError as e:
            raise UserError(f"--label-type: {e}") from None
    try:
        with LabelStore(check_store_path(a.db, must_exist=True)) as store:
            n = export_file(store, out, format=fmt, label_type=a.label_type)
    except LabelFileError as e:
        raise UserError(str(e)) from None
    except OSError as e:  # a folder that cannot be written (read-only, full, not a real directory)
        raise UserError(f"export file {out}: cannot write it ({e.strerror or e})") from None
    if a.json:
        print(json.dumps({"rows": n, "format": fmt, "path": str(out), "db": a.db}))
    else:
        print(f"exported {n} rows ({fmt}) from {a.db} to {out}")
    return 0
