"""End-to-end recipes over the pipeline: the quickstart (`quickstart`), the paper's experiments (`experiment`), the
writing-prompts demo (`writing_prompts`), sampling from a run (`sample`) and scoring texts with a reward model
(`score`)."""
