"""A calculator task for a real model: products too large to do in one's head, and a `calculate` tool that
can do them.

Each seed is one question, "What is 347 * 28? Use the calculate tool." (a three-digit number times a
two-digit one), whose answer the model cannot recall; the tool evaluates whole-number arithmetic safely (an
`ast` walk over integer literals, + - *, parentheses and unary minus; anything else is an error the model
reads). The final answer, a reply without a tool call, scores 1 when its last integer is the product.

The prompt is a system message and two worked exchanges before the question (`PROMPT`), chosen by measuring
SmolLM2-135M-Instruct (examples/tools/README.md): asked plainly, or told to use the tool in the system
prompt, it never opened a `<tool_call>`; with the two exchanges it does in a fifth of its sampled replies.

    python -m examples.tools.run --model smollm2-135m-instruct
"""
from __future__ import annotations

import ast
import operator
import random
import re

from envs.base import Env, Observation, StepResult

# Past this size a literal or a partial result is refused: a short expression like 9**9**9 is out anyway
# (no **), but a long chain of products could still grow a number without bound.
MAX_ABS = 10**15
MAX_CHARS = 200

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def evaluate(expression: str) -> int:
    """The value of a whole-number expression with + - *, parentheses and unary minus; ValueError otherwise."""
    if len(expression) > MAX_CHARS:
        raise ValueError(f"the expression is longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an arithmetic expression ({e.msg}); write e.g. 347 * 28") from None
    return _value(tree.body)


def _value(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _value(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _checked(_OPS[type(node.op)](_value(node.left), _value(node.right)))
    if isinstance(node, ast.BinOp):
        raise ValueError(f"the operator {type(node.op).__name__} is not supported: use + - * only")
    raise ValueError(f"{ast.unparse(node)!r} is not supported: use whole numbers, + - * and parentheses only")


def _checked(v: int) -> int:
    if abs(v) > MAX_ABS:
        raise ValueError(f"a number past {MAX_ABS:.0e} in absolute value")
    return v


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression with whole numbers, + - * and parentheses.

    Args:
        expression: the expression, e.g. "347 * 28"
    """
    return str(evaluate(expression))


SYSTEM = ("You are a helpful assistant with a calculator. You cannot multiply large numbers yourself: call the "
          "calculate tool first, then answer with the number it returns.")
DEMOS = ((123, 45), (608, 37))  # the worked exchanges' products; no seed asks them


def ask(a: int, b: int) -> str:
    return f"What is {a} * {b}? Use the calculate tool."


def _demo(i: int, a: int, b: int) -> list[dict]:
    call = {"id": f"demo{i}", "type": "function",
            "function": {"name": "calculate", "arguments": {"expression": f"{a} * {b}"}}}
    return [{"role": "user", "content": ask(a, b)},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"demo{i}", "name": "calculate", "content": str(a * b)},
            {"role": "assistant", "content": f"{a} * {b} = {a * b}"}]


PROMPT = [{"role": "system", "content": SYSTEM}] + [m for i, (a, b) in enumerate(DEMOS) for m in _demo(i, a, b)]


def question(seed: int) -> tuple[str, int]:
    """The task of `seed`: the question's text and its answer."""
    rng = random.Random(seed)
    while True:
        a, b = rng.randint(100, 999), rng.randint(10, 99)
        if (a, b) not in DEMOS:
            return ask(a, b), a * b


def final_integer(text: str) -> int | None:
    """The last integer of a reply (thousands commas dropped), or None."""
    found = re.findall(r"-?\d+", text.replace(",", ""))
    return int(found[-1]) if found else None


class CalcEnv(Env):
    keep_images = False
    blocking = False  # the tool and the scoring only compute
    tools = (calculate,)

    def reset(self, seed: int) -> Observation:
        text, self.answer = question(seed)
        return Observation(text, messages=PROMPT + [{"role": "user", "content": text}])

    def task_key(self, seed: int) -> str:
        return question(seed)[0]

    def step(self, action_text: str) -> StepResult:
        got = final_integer(action_text)
        ok = got == self.answer
        return StepResult(Observation("Episode over."), float(ok), True, {"success": ok, "parse_error": got is None})
