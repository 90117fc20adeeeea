"""What runs inside a train rank: the model's forward, LoRA, FSDP, the update step and checkpoints."""
