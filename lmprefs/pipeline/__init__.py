"""The steps a command runs, built from the layers below: a task's model and queries (`task`), labeling
(`labeling`), reward-model training from a label store (`reward_model`), rewards for PPO (`rewards`), a policy run
with resume (`policy`) and the online loop that relabels during PPO (`online`)."""
