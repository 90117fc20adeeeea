"""Environments: the interface, the registry and the built-in maze. Importing this stays light (no PIL)."""
from envs.base import Env, Observation, StepResult
from envs.registry import RegistryError, factories, make, register, registered

register("maze", "envs.maze:MazeEnv")

__all__ = ["Env", "Observation", "StepResult", "RegistryError", "factories", "make", "register", "registered"]
