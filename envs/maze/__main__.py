"""`python -m envs.maze --stats --seeds 0-63 --json`, `python -m envs.maze --render 0 --out maze0.png`."""
from envs.maze.env import main

main()
