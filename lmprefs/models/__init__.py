"""Models over a Hugging Face causal LM: loading (`loading`), the trunk and its frozen prefix (`trunk`), the policy
with its value head (`policy`), the reward model (`reward_model`), LoRA (`lora`), the sampler (`sampling`), their
saved directories (`artifacts`) and DDP/FSDP wrappers (`parallel`)."""
