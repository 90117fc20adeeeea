"""The driver: the training loop (`Trainer`), the rollout and train actor pools, faults, the run lock, eval."""
