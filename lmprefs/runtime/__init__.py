"""What a run needs from the machine it runs on: device and dtype (`device`), torch.distributed process groups and
collectives (`distributed`), run logs (TensorBoard, metrics.jsonl, trackers, progress bars: `runlog`) and the config
as this machine will run it (`resolve`)."""
