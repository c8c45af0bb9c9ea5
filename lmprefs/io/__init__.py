"""Files that survive a kill: the one atomic text writer and fault injection for the crash tests (`atomic`),
versioned directories published behind a symlink with a verified manifest (`publish`), JSON and JSONL rows
(`jsonl`), a run directory's lock (`locks`) and the run's config.json (`config_file`). No torch."""
