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
    p.add_argument("--run-dir", default=None, help="with labels.select bald or spread: where each round's ensemble "
                   "and rounds.jsonl go (default runs/label-PRESET-TIME; give the same one to resume)")
    help_with_config(p, argv, name, pairs)
    a = p.parse_args(argv)
    from lmprefs.labels.store import check_store_path
    from lmprefs.pipeline.labeling import collect_labels, open_store
    from lmprefs.pipeline.task import setup_task

    if a.n <= 0:
        raise UserError(f"--n {a.n}: must be positive")
    from lmprefs.runtime import distributed as dist

    cfg = resolve_config(a.preset, pairs, a.config)
    labeler = a.labeler or cfg.labels.labeler
    # rank 0 alone reads and writes the store: another rank checking it could see the file rank 0 is creating,
    # empty for a moment, and refuse it as an empty file
    db = check_store_path(a.db, must_exist=False) if dist.is_main() else Path(a.db)
    if labeler != "none":
        from lmprefs.labels.labelers import score_fn

        score_fn(labeler)  # the judge's assets are there before the store is created
    directed = cfg.labels.select != "random"
    if directed:
        from lmprefs.cli.common import run_dir_for
        from lmprefs.pipeline.label_rounds import check_first_round

        check_first_round(db, cfg, labeler, a.db)
        run_dir = run_dir_for(a.run_dir, cfg, "label", a.preset)
    task = setup_task(cfg)
    # created only now (a bad value above leaves no file behind), and by rank 0, which writes every rank's questions
    if directed and dist.world() > 1:
        raise UserError(f"labels.select={cfg.labels.select}: directed selection runs in one process, not "
                        f"{dist.world()}; start it without a launcher")  # fmt: skip
    store = open_store(a.db) if dist.is_main() else None
    if directed:
        from lmprefs.pipeline.label_rounds import label_in_rounds

        seed = cfg.run.seed if a.seed is None else a.seed
        rows = label_in_rounds(task, store, a.n, labeler=labeler, seed=seed, run_dir=run_dir)
        if dist.is_main():
            assert store is not None  # rank 0 opened it
            print(f"{sum(r['questions'] for r in rows)} questions in {len(rows)} rounds ({cfg.labels.select}, "
                  f"{run_dir / 'rounds.jsonl'}); {a.db} now: {store.table_counts()}")  # fmt: skip
        return 0
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


def cmd_rank_queue(argv: list[str]) -> int:
    p = command_parser("rank-queue")
    p.add_argument("--db", default="labels.sqlite", help="label store whose pending items to rank (must exist)")
    p.add_argument("--run-dir", required=True,
                   help="a train-reward run whose reward model is an ensemble (train_reward.ensemble >= 2): its "
                   "config.json frames the texts as its training did")  # fmt: skip
    p.add_argument("--select", default=None, choices=["bald", "spread"],
                   help="acquisition (default the run's labels.select, bald when that is random)")
    p.add_argument("--device", default=None, help="device to score on (default the run's run.device)")
    a = p.parse_args(argv)
    from lmprefs.config.overrides import set_value
    from lmprefs.io.config_file import load_config
    from lmprefs.labels.store import LabelStore, check_store_path
    from lmprefs.models.ensemble import is_ensemble_dir

    run = Path(a.run_dir)
    model_dir = run / "reward_model"
    if not (run / "config.json").is_file():
        raise UserError(f"--run-dir {run}: holds no run (no config.json); give a train-reward run directory")
    if not is_ensemble_dir(model_dir):
        what = "one reward model" if model_dir.is_dir() else "no reward model"
        raise UserError(f"--run-dir {run}: holds {what}, not an ensemble; train one with `lmprefs train-reward "
                        "--train-reward.ensemble K` (K >= 2)")  # fmt: skip
    db = check_store_path(a.db, must_exist=True)
    cfg = load_config(run / "config.json")
    select = a.select or (cfg.labels.select if cfg.labels.select != "random" else "bald")
    cfg = set_value(cfg, "labels.select", select, "--select")
    if a.device:
        cfg = set_value(cfg, "run.device", a.device, "--device")
    from lmprefs.models.ensemble import load_reward_ensemble
    from lmprefs.pipeline.selection import Chooser, ensemble_scores, rank_queue
    from lmprefs.pipeline.task import setup_task

    t = setup_task(cfg)
    ens = load_reward_ensemble(model_dir, t.device).eval()
    chooser = Chooser(cfg.labels, ensemble_scores(ens, t.ctx), f"{select} of the {len(ens)}-member ensemble "
                      f"{model_dir}")  # fmt: skip
    with LabelStore(db) as store:
        out = rank_queue(store, chooser, t.tok, cfg.task)
    if not out["items"]:
        print(f"{a.db}: no pending {cfg.labels.type} items to rank")
        return 0
    print(f"ranked {out['items']} pending {cfg.labels.type} items in {a.db} by {select} (largest "
          f"{out['max']:.4f}, median {out['median']:.4f}); the web app serves them largest first")  # fmt: skip
    return 0
