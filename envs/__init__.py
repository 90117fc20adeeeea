"""Environments: the interface, the registry and the built-ins (maze, dataset, reasoning_gym). Importing this stays
light (no PIL): a built-in loads on first use."""
from envs.base import Env, Observation, StepResult
from envs.contract import ContractError, EnvError, check_env, check_observation, check_step_result
from envs.registry import RegistryError, factories, make, register, registered
from envs.seeds import parse_seeds

register("maze", "envs.maze:MazeEnv")
register("dataset", "envs.dataset:DatasetEnv")
register("reasoning_gym", "envs.reasoning_gym:ReasoningGymEnv")  # needs the reasoning-gym extra

__all__ = ["Env", "Observation", "StepResult", "ContractError", "EnvError", "check_env", "check_observation",
           "check_step_result", "RegistryError", "factories", "make", "parse_seeds", "register", "registered"]
