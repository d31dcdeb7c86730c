"""Built-in tools: ``calculator`` (safe arithmetic, evaluated from the syntax tree, never ``eval``) and ``python``
(runs a program in the reward sandbox, ``plugins/reward/sandbox.py``)."""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlforge.agent import Tool, ToolError
from rlforge.errors import ConfigError
from rlforge.hookspecs import hookimpl

LOG10_2 = math.log10(2)
ALLOWED = "use numbers, + - * / // % ** and parentheses"


@dataclass
class CalculatorConfig:
    """The ``calculator`` tool (``rollout.agent.calculator``)."""

    max_length: int = 200  # longest expression, in characters
    max_exponent: int = 64  # largest |exponent| of **
    max_digits: int = 100  # integers (results and intermediate values) with more digits are refused


_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_REFUSED = {ast.Name: "names", ast.Attribute: "attributes", ast.Call: "function calls",
            ast.Subscript: "subscripts", ast.Lambda: "lambdas"}


class Calculator(Tool):
    """Evaluate an arithmetic expression: + - * / // % ** and parentheses over integers and decimals."""

    name = "calculator"
    description = "Evaluate an arithmetic expression: + - * / // % ** and parentheses over integers and decimals."
    parameters = {"type": "object", "required": ["expression"],
                  "properties": {"expression": {"type": "string", "description": "for example (3 + 4) * 2"}}}

    def execute(self, arguments: dict[str, Any], state: Any) -> str:
        expression = arguments.get("expression")
        if not isinstance(expression, str):
            raise ToolError(f"calculator: the argument 'expression' must be a string, got {expression!r:.80}")
        return format_number(evaluate(expression, self.options or CalculatorConfig()))


def evaluate(expression: str, limits: Any) -> int | float:
    """The value of ``expression`` (numbers, + - * / // % **, unary minus, parentheses); ``ToolError`` for anything
    else, for division by zero, and for results over the limits (``CalculatorConfig``)."""
    if len(expression) > limits.max_length:
        raise ToolError(f"calculator: the expression is {len(expression)} characters, over {limits.max_length}")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ToolError(f"calculator: not an arithmetic expression: {expression!r:.80}") from None
    return _Evaluator(limits).value(tree.body)


class _Evaluator:
    def __init__(self, limits: Any) -> None:
        self.limits = limits

    def value(self, node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return self.checked(node.value)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return self.checked(_UNARY[type(node.op)](self.value(node.operand)))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = self.value(node.left), self.value(node.right)
            if isinstance(node.op, ast.Pow):
                self.check_power(left, right)
            try:
                return self.checked(_BINARY[type(node.op)](left, right))
            except ZeroDivisionError:
                raise ToolError("calculator: division by zero") from None
            except OverflowError:
                raise ToolError("calculator: the result is too large") from None
        if type(node) in _REFUSED:
            raise ToolError(f"calculator: {_REFUSED[type(node)]} are not allowed; {ALLOWED}")
        if isinstance(node, (ast.BinOp, ast.UnaryOp)):
            raise ToolError(f"calculator: the operator {type(node.op).__name__} is not allowed; {ALLOWED}")
        what = f"the constant {node.value!r:.40}" if isinstance(node, ast.Constant) else type(node).__name__
        raise ToolError(f"calculator: {what} is not allowed; {ALLOWED}")

    def check_power(self, base: int | float, exponent: int | float) -> None:
        if abs(exponent) > self.limits.max_exponent:
            raise ToolError(f"calculator: exponents are limited to {self.limits.max_exponent}, got {exponent}")
        if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
            digits = (abs(base).bit_length() - 1) * exponent * LOG10_2
            if digits > self.limits.max_digits:
                raise ToolError(f"calculator: the result would have more than {self.limits.max_digits} digits")

    def checked(self, x: Any) -> int | float:
        if isinstance(x, complex):
            raise ToolError("calculator: the result is not a real number")
        if isinstance(x, float) and not math.isfinite(x):
            raise ToolError("calculator: the result is too large")
        if isinstance(x, int) and abs(x).bit_length() * LOG10_2 > self.limits.max_digits + 1:
            raise ToolError(f"calculator: the result has more than {self.limits.max_digits} digits")
        return x


def format_number(x: int | float) -> str:
    """Integers exactly; floats with 12 significant digits (``8/2`` -> ``4``, ``0.1+0.2`` -> ``0.3``)."""
    return str(x) if isinstance(x, int) else f"{x:.12g}"


@dataclass
class PythonToolConfig:
    """The ``python`` tool (``rollout.agent.python``): limits of the sandboxed program."""

    timeout_s: float = 5.0  # wall-clock limit of the program (below rollout.agent.tool_timeout_s)
    memory_mb: int = 512  # address-space limit of the program
    max_output_kib: int = 16  # stdout and stderr are each cut to this size before the token limit applies


class PythonTool(Tool):
    """Run a Python program in the sandbox and return what it printed (and the error, if it failed)."""

    name = "python"
    description = "Run a Python program and return what it prints to stdout (and the error if it fails)."
    parameters = {"type": "object", "required": ["code"],
                  "properties": {"code": {"type": "string", "description": "a complete Python program"}}}

    @staticmethod
    def validate_config(config: Any, registry: Any) -> None:
        own, outer = config.rollout.agent.python.timeout_s, config.rollout.agent.tool_timeout_s
        if not 0 < own < outer:
            raise ConfigError(f"'rollout.agent.python.timeout_s' ({own}) must be > 0 and below "
                              f"'rollout.agent.tool_timeout_s' ({outer}), so the program is stopped before the call.")

    def execute(self, arguments: dict[str, Any], state: Any) -> str:
        from rlforge.plugins.reward.sandbox import run_sandboxed

        code = arguments.get("code")
        if not isinstance(code, str):
            raise ToolError(f"python: the argument 'code' must be a string, got {code!r:.80}")
        o = self.options
        result = run_sandboxed(code, "", timeout_s=o.timeout_s, memory_mb=o.memory_mb,
                               max_output_kib=o.max_output_kib)
        if result.timed_out:
            return f"{result.stdout}\n[stopped: the program ran longer than {o.timeout_s:g} s]".lstrip()
        if result.exit_code != 0:
            return f"{result.stdout}{result.stderr}\n[exit code {result.exit_code}]".lstrip()
        return result.stdout or "(the program printed nothing)"


@hookimpl
def rlforge_register(registry):
    registry.tool.register("calculator", Calculator, config=CalculatorConfig)
    registry.tool.register("python", PythonTool, config=PythonToolConfig)
