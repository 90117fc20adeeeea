"""The algorithm: group-relative advantages, the clipped policy loss and their config. Pure tensor functions:
no Ray, no vLLM, no files."""
