"""Reading an exported program's StableHLO text (`jax.export.Exported.mlir_module()`): the
tensor shapes it holds, and where each op sits — inside which loops and manual-sharding
(shard_map) regions, following calls through the module's private functions.

The text is MLIR's generic printing as jax 0.10.2 writes it: one op per line, a region opened
by a line ending in `{` (`cond {`, `} do {`, `({`, `}, {`) and closed by a line starting with
`}`; attribute dictionaries (`{...}` on one line) and strings are balanced within their line.
shard_map lowers to `sdy.manual_computation` (Shardy, jax's default partitioner), whose body
has the per-device shapes.
"""

import collections
import dataclasses
import re

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_TENSOR = re.compile(r"tensor<((?:\d+x)*)([a-z]\w*)>")
_FUNC = re.compile(r"func\.func (?:public |private )?@([\w$.-]+)")
_CALL = re.compile(r"\bcall @([\w$.-]+)\(")
_CUSTOM_CALL = re.compile(r"stablehlo\.custom_call @([\w$.-]+)\(")
_OP_NAME = re.compile(r'^\s*(?:%[^=]* = )?"?([a-z_]+\.[\w.]+)')  # `%4:2 = "stablehlo.case"(`
_REGION_OPS = {"stablehlo.while": "while", "sdy.manual_computation": "manual",
               "stablehlo.case": "case", "stablehlo.if": "case"}


def tensor_shapes(text: str) -> collections.Counter:
    """How often each tensor type (shape tuple, element type) is written in the module."""
    return collections.Counter((tuple(int(d) for d in dims.split("x") if d), dtype)
                               for dims, dtype in _TENSOR.findall(text))


@dataclasses.dataclass
class Op:
    """One op of interest: the function it is written in, the regions around it there, and its
    operand types (shapes, element types)."""

    name: str  # "while", "manual", "case", "call @f", "custom_call @target"
    function: str
    regions: tuple[str, ...]  # the enclosing region ops in `function`, outermost first
    operands: list[tuple[tuple[int, ...], str]]  # custom calls' only


class Program:
    """The ops of a StableHLO module with every context ('while' / 'manual' / 'case' regions,
    outermost first) in which `main` reaches them."""

    def __init__(self, text: str):
        self.ops: list[Op] = []
        function, stack, last_at_indent = None, [], {}
        for line in text.splitlines():
            bare = _STRING.sub('""', line)
            code = bare.lstrip()
            indent = len(bare) - len(code)
            name = _OP_NAME.match(line)
            kind = _REGION_OPS.get(name.group(1)) if name else None
            if code.startswith("func.func"):
                function, stack = _FUNC.search(code).group(1), [None]  # its body's region
                continue
            if function is None:
                continue
            regions = tuple(k for k in stack if k)
            if kind:
                self.ops.append(Op(kind, function, regions, []))
            if match := _CUSTOM_CALL.search(code):
                self.ops.append(Op("custom_call @" + match.group(1), function, regions,
                                   _operands(bare)))
            elif match := _CALL.search(code):
                self.ops.append(Op("call @" + match.group(1), function, regions, []))
            if not code.startswith("}") and not code.startswith("cond {"):
                last_at_indent[indent] = kind  # the op a `cond {` / `} do {` line belongs to
            opened = code.count("{") - code.count("}")
            if opened > 0:  # this line's op (or, for `cond {`, the one above it) owns a region
                owner = kind if not code.startswith(("}", "cond {")) else last_at_indent.get(indent)
                stack.extend([owner] * opened)
            elif opened < 0:
                del stack[opened:]
            if not stack:
                function = None  # the function's closing brace
        self.contexts = self._contexts()

    def _contexts(self) -> dict[str, set[tuple[str, ...]]]:
        """function -> every tuple of regions around its calls, from `main` down (the call
        graph of a jax module has no cycles)."""
        calls = collections.defaultdict(list)  # callee -> [(caller, regions at the call)]
        for op in self.ops:
            if op.name.startswith("call @"):
                calls[op.name[len("call @"):]].append((op.function, op.regions))
        memo = {"main": {()}}

        def of(function):
            if function not in memo:
                memo[function] = {outer + regions for caller, regions in calls[function]
                                  for outer in of(caller)}
            return memo[function]

        for function in {op.function for op in self.ops}:
            of(function)
        return memo

    def where(self, op: Op) -> set[tuple[str, ...]]:
        """Every context in which `main` reaches `op` (empty if it never does)."""
        return {outer + op.regions for outer in self.contexts.get(op.function, set())}

    def custom_calls(self, target: str) -> list[Op]:
        return [op for op in self.ops if op.name == "custom_call @" + target]

    def loop_depth(self) -> int:
        """How deeply `stablehlo.while` loops nest, across calls (0: no loop)."""
        return max((context.count("while") + 1 for op in self.ops if op.name == "while"
                    for context in self.where(op)), default=0)


def _operands(line: str) -> list[tuple[tuple[int, ...], str]]:
    """The operand types of an op from its trailing `: (operand types) -> results`."""
    signature = line.rpartition(" : (")[2].partition(") -> ")[0]
    return [(tuple(int(d) for d in dims.split("x") if d), dtype)
            for dims, dtype in _TENSOR.findall(signature)]


def misplaced_kernels(program: Program, target: str, per_device: set[tuple[int, ...]],
                      head_dim: int) -> list[str]:
    """What is wrong with where the `target` custom calls (a Pallas kernel) sit: a call `main`
    reaches outside an `sdy.manual_computation` (shard_map), or q / k / v operands (rank 4,
    last axis `head_dim`) not of a `per_device` shape. Empty when every call is per shard."""
    calls = program.custom_calls(target)
    if not calls:
        return [f"no {target} call in the program"]
    problems = []
    for call in calls:
        contexts = program.where(call)
        outside = sorted(c for c in contexts if "manual" not in c)
        if outside or not contexts:
            problems.append(f"{target} in @{call.function} outside shard_map "
                            f"(reached within {outside or 'nothing: never called'})")
        qkv = sorted({shape for shape, _ in call.operands
                      if len(shape) == 4 and shape[-1] == head_dim})
        if not qkv or not set(qkv) <= per_device:
            problems.append(f"{target} in @{call.function}: q/k/v operands {qkv} not per device "
                            f"{sorted(per_device)}")
    return problems
