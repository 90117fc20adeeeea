"""Environments: the interface, the registry and the built-in maze. Importing this stays light (no PIL)."""
from envs.base import Env, Observation, StepResult
from envs.contract import ContractError, EnvError, check_env, check_observation, check_step_result
from envs.registry import RegistryError, factories, make, register, registered
from envs.seeds import parse_seeds

register("maze", "envs.maze:MazeEnv")
register("dataset", "envs.dataset:DatasetEnv")

__all__ = ["Env", "Observation", "StepResult", "ContractError", "EnvError", "check_env", "check_observation",
           "check_step_result", "RegistryError", "factories", "make", "parse_seeds", "register", "registered"]
