"""The tool task as an agent written against the OpenAI chat API, the way agents are written for any
OpenAI-compatible server: nothing in it knows about training. `python -m examples.tools.run --agent openai`
registers it as the run's env (envs.base.AgentEnv); the rollout points `client` at its own engine.
"""
from __future__ import annotations

from examples.tools.task import answer_of, question

# The `look` tool's OpenAI function schema, written by hand as for any OpenAI-compatible server (the same as
# the one envs.tools derives from LookEnv.look, so the prompts of both forms agree).
TOOLS = [{"type": "function", "function": {
    "name": "look", "description": "Look at the object the question asks about and say its color.",
    "parameters": {"type": "object", "properties": {}}}}]


def task(seed: int) -> dict:
    text, color = question(seed)
    return {"question": text, "color": color}


def look_agent(client, task: dict, max_calls: int = 2) -> float:
    """Ask the question; answer each tool call; the reward is 1 for the right color."""
    messages = [{"role": "user", "content": task["question"]}]
    for _ in range(max_calls + 1):
        reply = client.chat.completions.create(model="grpo", messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        if not message.tool_calls:
            return float(answer_of(message.content or "") == task["color"])
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            result = task["color"] if call.function.name == "look" else f"error: no tool {call.function.name!r}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return 0.0
