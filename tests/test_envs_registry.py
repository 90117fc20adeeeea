import subprocess
import sys

import pytest

import envs
from envs import Env, Observation, RegistryError, StepResult, registry


class Countdown(Env):
    """A user's text-only environment: say the number one less than the one shown."""

    def __init__(self, start: int = 3):
        self.start = start

    def reset(self, seed):
        self.n = self.start + seed
        return Observation(text=str(self.n))

    def step(self, action_text):
        ok = action_text.strip() == str(self.n - 1)
        self.n -= 1
        return StepResult(Observation(text=str(self.n)), float(ok), self.n == 0 or not ok, {"success": ok})


@pytest.fixture(autouse=True)
def private_registry(monkeypatch):
    monkeypatch.setattr(registry, "_factories", dict(registry._factories))


def test_a_user_env_is_one_class_and_one_register_call():
    envs.register("countdown", Countdown)
    env = envs.make("countdown", start=1)
    obs = env.reset(seed=1)
    assert obs.text == "2" and obs.images == []
    result = env.step("1")
    assert (result.observation.text, result.reward, result.done, result.info) == ("1", 1.0, False, {"success": True})
    assert env.keep_images is True  # the interface's default for envs that do not say


def test_maze_is_built_in_and_takes_its_options():
    env = envs.make("maze", size=7, cell_px=16)
    assert type(env).__name__ == "MazeEnv" and (env.size, env.cell_px) == (7, 16)
    assert env.reset(0).images[0].size == (112, 112)
    assert "maze" in envs.registered()


def test_unknown_name_lists_known_names_and_how_to_register():
    with pytest.raises(RegistryError) as e:
        envs.make("mazee")
    message = str(e.value)
    assert "'mazee'" in message and "'maze'" in message and "Did you mean 'maze'" in message
    assert "envs.register('mazee'" in message


def test_unknown_option_lists_accepted_options():
    with pytest.raises(RegistryError) as e:
        envs.make("maze", sise=7)
    message = str(e.value)
    assert "'sise'" in message
    for option in ("size", "cell_px", "max_turns", "format_reward", "keep_images"):
        assert repr(option) in message


def test_factory_taking_any_options_gets_them_all():
    envs.register("anything", lambda **options: Countdown(start=options["n"]))
    assert envs.make("anything", n=5, ignored=True).reset(0).text == "5"


def test_an_option_called_name_reaches_the_env():
    envs.register("named", lambda **options: Countdown(start=len(options["name"])), overwrite=True)
    assert envs.make("named", name="abc").reset(0).text == "3"


def test_registering_a_name_twice_needs_overwrite():
    envs.register("countdown", Countdown)
    envs.register("countdown", Countdown)  # the same factory again is harmless (a re-run script)
    with pytest.raises(RegistryError, match="overwrite=True"):
        envs.register("countdown", lambda: Countdown())
    envs.register("countdown", lambda: Countdown(start=9), overwrite=True)
    assert envs.make("countdown").start == 9


def test_bad_registrations_are_refused():
    with pytest.raises(RegistryError, match="callable"):
        envs.register("x", 42)
    with pytest.raises(RegistryError, match="module:Class"):
        envs.register("x", "envs.maze.MazeEnv")
    envs.register("missing", "envs.nowhere:Nothing")
    with pytest.raises(RegistryError, match="cannot load"):
        envs.make("missing")


def test_importing_envs_stays_light():
    code = "import sys, envs; print(sorted({'PIL', 'numpy', 'torch'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_factories_hands_over_only_the_names_asked_for():
    envs.register("other", lambda **options: Countdown(start=1), overwrite=True)
    assert set(envs.factories(["maze", "not-registered"])) == {"maze"}
    assert {"maze", "other"} <= set(envs.factories())
