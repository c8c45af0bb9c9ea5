"""Training: the PPO math (`ppo`), the TF1-style Adam (`optim`), and the reward-model and policy training loops."""
