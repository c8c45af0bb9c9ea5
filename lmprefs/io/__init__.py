"""Files that survive a kill: the one atomic text writer, fault injection for the crash tests and writes the disk
refuses (`atomic`), versioned directories published behind a symlink with a verified manifest (`publish`), JSON and
JSONL rows (`jsonl`), a run directory's lock (`locks`), the run's config.json (`config_file`), and a user's input
files checked in one line (`inputs`). No torch."""
