"""The expression half of the chat template code generator (ninfer.frontend.chat_codegen).

A jinja2 expression becomes a C++ expression over runtime_cpp/text/jinja/ (`Value`, its
operators, the filters, tests and methods); a condition becomes a C++ bool. `Scope` is the
state both halves share: the lines emitted so far, the constants, filters, tests and
context variables the translation unit declares, and the frames names resolve through;
`Expressions` adds the expressions on top, and chat_codegen's generator the statements.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from jinja2 import nodes

from ninfer.frontend.chat_template import ChatTemplateError

# The names runtime_cpp/text/jinja/ implements (filters.cpp, tests.cpp, methods.cpp; tests
# check they agree).
SUPPORTED_FILTERS = frozenset({
    "abs", "attr", "capitalize", "center", "count", "d", "default", "dictsort", "e", "escape",
    "first", "float", "indent", "int", "items", "join", "last", "length", "list", "lower",
    "map", "max", "min", "reject", "rejectattr", "replace", "reverse", "round", "safe",
    "select", "selectattr", "sort", "string", "sum", "title", "tojson", "trim", "unique",
    "upper", "wordcount"})
SUPPORTED_TESTS = frozenset({
    "!=", "<", "<=", "==", ">", ">=", "boolean", "callable", "defined", "divisibleby", "eq",
    "equalto", "even", "false", "float", "ge", "greaterthan", "gt", "in", "integer",
    "iterable", "le", "lessthan", "lower", "lt", "mapping", "ne", "none", "number", "odd",
    "sameas", "sequence", "string", "true", "undefined", "upper"})
SUPPORTED_METHODS = frozenset({
    "strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith", "replace",
    "upper", "lower", "title", "capitalize", "find", "rfind", "index", "rindex", "count",
    "join", "splitlines", "removeprefix", "removesuffix", "isdigit", "isspace", "isalpha",
    "isalnum", "isupper", "islower", "get", "items", "keys", "values", "copy",
    # list/dict methods that change the container: the sandbox raises SecurityError
    "append", "pop", "update", "extend", "insert", "remove", "clear", "setdefault", "sort",
    "reverse", "popitem"})
_GLOBALS = {"raise_exception", "strftime_now", "namespace", "range", "dict"}
_COMPARE = {"eq": "equal({a}, {b})", "ne": "!equal({a}, {b})", "lt": "lt({a}, {b})",
            "lteq": "le({a}, {b})", "gt": "gt({a}, {b})", "gteq": "ge({a}, {b})",
            "in": "contains({b}, {a})", "notin": "!contains({b}, {a})"}
_BINOPS = {nodes.Add: "add", nodes.Sub: "sub", nodes.Mul: "mul", nodes.Div: "truediv",
           nodes.FloorDiv: "floordiv", nodes.Mod: "mod", nodes.Pow: "power"}


def unsupported(node: nodes.Node, what: str) -> ChatTemplateError:
    return ChatTemplateError(f"chat template line {node.lineno}: {what} is not supported by "
                             "ninfer's template compiler")


def cpp_string(text: str) -> str:
    """A C++ string literal of `text`'s UTF-8 bytes (split so escapes never run on)."""
    out, run = [], []
    for b in text.encode():
        if b in (0x22, 0x5C):
            run.append("\\" + chr(b))
        elif 0x20 <= b < 0x7F and b != 0x3F:  # '?' avoids trigraphs
            run.append(chr(b))
        elif b == 0x0A:
            run.append("\\n")
        else:
            run.append(f"\\{b:03o}")
        if len(run) >= 200:
            out.append('"' + "".join(run) + '"')
            run = []
    out.append('"' + "".join(run) + '"')
    return "\n    ".join(out) if len(out) > 1 else out[0]


def ident(name: str) -> str:
    return re.sub(r"\W", "_", name, flags=re.ASCII)


def test_ident(name: str) -> str:
    return {"!=": "ne_op", "<": "lt_op", "<=": "le_op", "==": "eq_op", ">": "gt_op",
            ">=": "ge_op"}.get(name, ident(name))


@dataclass
class Frame:
    vars: dict[str, str] = field(default_factory=dict)    # name -> C++ Value variable
    macros: dict[str, str] = field(default_factory=dict)  # name -> C++ Macro variable
    loop: str | None = None  # the C++ prefix of the loop this frame iterates, if any
    barrier: bool = False    # a macro body: outer loops are not visible


class Scope:
    """What the generator has emitted and declared, and the frames names resolve through."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.indent = 1
        self.consts: dict[str, str] = {}   # C++ initializer -> constant name
        self.filters: set[str] = set()
        self.tests: set[str] = set()
        self.globals: dict[str, str] = {}  # context name -> C++ variable
        self.frames: list[Frame] = []
        self.counter = 0

    def fresh(self, stem: str) -> str:
        self.counter += 1
        return f"{ident(stem)}_{self.counter}"

    def emit(self, line: str) -> None:
        self.lines.append("  " * self.indent + line)

    def const(self, init: str) -> str:
        if init not in self.consts:
            self.consts[init] = f"k{len(self.consts)}"
        return self.consts[init]

    def resolve(self, name: str) -> str:
        for frame in reversed(self.frames):
            if name in frame.vars:
                return frame.vars[name]
        if name not in self.globals:
            self.globals[name] = f"g_{ident(name)}_{len(self.globals)}"
        return self.globals[name]

    def resolve_macro(self, name: str) -> str | None:
        for frame in reversed(self.frames):
            if name in frame.vars:
                return None
            if name in frame.macros:
                return frame.macros[name]
        return None

    def current_loop(self) -> str | None:
        for frame in reversed(self.frames):
            if "loop" in frame.vars:
                return None
            if frame.loop is not None:
                return frame.loop
            if frame.barrier:
                return None
        return None


class Expressions(Scope):
    """jinja2 expressions as C++ (`expr`: a Value; `cond`: a bool)."""

    def cond(self, node: nodes.Node) -> str:
        """`node` as a C++ bool."""
        if isinstance(node, nodes.And):
            return f"({self.cond(node.left)} && {self.cond(node.right)})"
        if isinstance(node, nodes.Or):
            return f"({self.cond(node.left)} || {self.cond(node.right)})"
        if isinstance(node, nodes.Not):
            return f"!{self.cond(node.node)}"
        if isinstance(node, nodes.Compare):
            return self.compare(node)
        if isinstance(node, nodes.Test):
            return self.test(node)
        if isinstance(node, nodes.Const) and isinstance(node.value, bool):
            return "true" if node.value else "false"
        return f"{self.expr(node)}.truthy()"

    def expr(self, node: nodes.Node) -> str:
        """`node` as a C++ Value expression."""
        method = getattr(self, f"e_{type(node).__name__}", None)
        if method is None:
            raise unsupported(node, f"the expression '{type(node).__name__}'")
        return str(method(node))

    def e_Const(self, node: nodes.Const) -> str:
        v = node.value
        if v is None:
            return "Value::none()"
        if isinstance(v, bool):
            return f"Value({'true' if v else 'false'})"
        if isinstance(v, int):
            if abs(v) >= 2**63:
                raise unsupported(node, "an integer beyond 64 bits")
            return f"Value(int64_t{{{v}}})"
        if isinstance(v, float):
            return f"Value({v.hex()})" if v == v and abs(v) != float("inf") else (
                f"Value(std::numeric_limits<double>::{'quiet_NaN' if v != v else 'infinity'}())")
        if isinstance(v, str):
            return self.const(f"Value(std::string({cpp_string(v)}, {len(v.encode())}))")
        raise unsupported(node, f"a constant of type {type(v).__name__}")

    def e_TemplateData(self, node: nodes.TemplateData) -> str:
        return self.const(f"Value(std::string({cpp_string(node.data)}, "
                          f"{len(node.data.encode())}))")

    def e_Name(self, node: nodes.Name) -> str:
        if node.name == "loop" and self.current_loop() is not None:
            raise unsupported(node, "'loop' used as a value")
        if self.resolve_macro(node.name) is not None:
            raise unsupported(node, f"the macro '{node.name}' used as a value")
        if node.name in _GLOBALS and not any(node.name in f.vars for f in self.frames):
            return f"builtin(context, {cpp_string(node.name)})"
        return self.resolve(node.name)

    def e_Tuple(self, node: nodes.Tuple) -> str:
        return f"Value(List{{{', '.join(self.expr(x) for x in node.items)}}}, true)"

    def e_List(self, node: nodes.List) -> str:
        return f"Value(List{{{', '.join(self.expr(x) for x in node.items)}}})"

    def e_Dict(self, node: nodes.Dict) -> str:
        pairs = ", ".join(f"{{{self.expr(p.key)}, {self.expr(p.value)}}}" for p in node.items)
        return f"dict_literal({{{pairs}}})"

    def e_CondExpr(self, node: nodes.CondExpr) -> str:
        if node.expr2 is None:
            msg = (f"the inline if-expression on line {node.lineno} evaluated to false and no "
                   "else section was defined.")
            other = f"Value::undefined({cpp_string(msg)})"
        else:
            other = self.expr(node.expr2)
        return f"({self.cond(node.test)} ? Value({self.expr(node.expr1)}) : Value({other}))"

    def e_And(self, node: nodes.And) -> str:
        return f"and_({self.expr(node.left)}, [&] {{ return Value({self.expr(node.right)}); }})"

    def e_Or(self, node: nodes.Or) -> str:
        return f"or_({self.expr(node.left)}, [&] {{ return Value({self.expr(node.right)}); }})"

    def e_Not(self, node: nodes.Not) -> str:
        return f"Value({self.cond(node)})"

    def e_Neg(self, node: nodes.Neg) -> str:
        return f"neg({self.expr(node.node)})"

    def e_Pos(self, node: nodes.Pos) -> str:
        return f"pos({self.expr(node.node)})"

    def e_Concat(self, node: nodes.Concat) -> str:
        return f"concat({{{', '.join(self.expr(x) for x in node.nodes)}}})"

    def e_BinExpr(self, node: nodes.BinExpr) -> str:
        fn = _BINOPS.get(type(node))
        if fn is None:
            raise unsupported(node, f"the operator '{node.operator}'")
        return f"{fn}({self.expr(node.left)}, {self.expr(node.right)})"

    e_Add = e_Sub = e_Mul = e_Div = e_FloorDiv = e_Mod = e_Pow = e_BinExpr

    def compare(self, node: nodes.Compare) -> str:
        if len(node.ops) == 1:
            op = node.ops[0]
            return "(" + _COMPARE[op.op].format(a=self.expr(node.expr), b=self.expr(op.expr)) + ")"
        # a < b < c: each operand evaluated once, left to right, stopping at the first false
        parts = [f"Value x0 = {self.expr(node.expr)};"]
        checks = []
        for k, op in enumerate(node.ops, 1):
            parts.append(f"Value x{k} = {self.expr(op.expr)};")
            checks.append(_COMPARE[op.op].format(a=f"x{k - 1}", b=f"x{k}"))
        body = " ".join(f"{p} if (!({c})) return false;" for p, c in zip(parts[1:], checks,
                                                                           strict=True))
        return f"[&]() -> bool {{ {parts[0]} {body} return true; }}()"

    def e_Compare(self, node: nodes.Compare) -> str:
        return f"Value({self.compare(node)})"

    def args(self, args: Sequence[nodes.Node], kwargs: Sequence[nodes.Keyword | nodes.Pair],
             node: nodes.Node) -> str:
        if getattr(node, "dyn_args", None) is not None or getattr(node, "dyn_kwargs", None):
            raise unsupported(node, "*args or **kwargs in a call")
        if not args and not kwargs:
            return "Args{}"
        pos = ", ".join(self.expr(a) for a in args)
        kw = ", ".join(f"{{{cpp_string(str(k.key))}, {self.expr(k.value)}}}" for k in kwargs)
        return f"Args{{List{{{pos}}}, {{{kw}}}}}"

    def apply_filter(self, node: nodes.Filter, value: str) -> str:
        if node.name not in SUPPORTED_FILTERS:
            raise unsupported(node, f"the filter '{node.name}'")
        self.filters.add(node.name)
        return f"F_{ident(node.name)}({value}, {self.args(node.args, node.kwargs, node)})"

    def e_Filter(self, node: nodes.Filter) -> str:
        if node.node is None:
            raise unsupported(node, "a filter without a value")
        return self.apply_filter(node, self.expr(node.node))

    def test(self, node: nodes.Test) -> str:
        if node.name not in SUPPORTED_TESTS:
            raise unsupported(node, f"the test '{node.name}'")
        self.tests.add(node.name)
        return (f"T_{test_ident(node.name)}({self.expr(node.node)}, "
                f"{self.args(node.args, node.kwargs, node)})")

    def e_Test(self, node: nodes.Test) -> str:
        return f"Value({self.test(node)})"

    def loop_attr(self, node: nodes.Getattr) -> str | None:
        """`loop.x` of the innermost loop, as C++; None if `node` is not one."""
        if not (isinstance(node.node, nodes.Name) and node.node.name == "loop"):
            return None
        p = self.current_loop()
        if p is None:
            return None
        i, n, items = f"{p}_i", f"{p}_n", f"(*{p}_items)"
        exprs = {
            "index": f"Value({i} + 1)", "index0": f"Value({i})",
            "revindex": f"Value({n} - {i})", "revindex0": f"Value({n} - {i} - 1)",
            "first": f"Value({i} == 0)", "last": f"Value({i} + 1 == {n})",
            "length": f"Value({n})", "depth": "Value(1)", "depth0": "Value(0)",
            "previtem": f"({i} > 0 ? {items}[{i} - 1] : "
                        f"Value::undefined({cpp_string('there is no previous item')}))",
            "nextitem": f"({i} + 1 < {n} ? {items}[{i} + 1] : "
                        f"Value::undefined({cpp_string('there is no next item')}))",
        }
        if node.attr not in exprs:
            raise unsupported(node, f"'loop.{node.attr}'")
        return exprs[node.attr]

    def e_Getattr(self, node: nodes.Getattr) -> str:
        loop = self.loop_attr(node)
        if loop is not None:
            return loop
        return f"getattr({self.expr(node.node)}, {cpp_string(node.attr)})"

    def e_Getitem(self, node: nodes.Getitem) -> str:
        if isinstance(node.arg, nodes.Slice):
            s = node.arg
            bounds = [self.expr(b) if b is not None else "Value::none()"
                      for b in (s.start, s.stop, s.step)]
            return f"slice({self.expr(node.node)}, {', '.join(bounds)})"
        if (isinstance(node.node, nodes.Name) and node.node.name == "loop"
                and isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str)):
            attr = nodes.Getattr(node.node, node.arg.value, "load", lineno=node.lineno)
            loop = self.loop_attr(attr)
            if loop is not None:
                return loop
        return f"getitem({self.expr(node.node)}, {self.expr(node.arg)})"

    def e_Call(self, node: nodes.Call) -> str:
        callee = node.node
        args = self.args(node.args, node.kwargs, node)
        if isinstance(callee, nodes.Name):
            macro = self.resolve_macro(callee.name)
            if macro is not None:
                return f"call_macro({macro}, {cpp_string(callee.name)}, {args})"
            local = any(callee.name in f.vars for f in self.frames)
            if not local and callee.name in _GLOBALS:
                fn = {"raise_exception": "raise_exception", "strftime_now": "strftime_now",
                      "namespace": "make_namespace", "range": "range", "dict": "make_dict"}
                if callee.name == "raise_exception":
                    return f"(raise_exception({args}), Value())"
                return f"{fn[callee.name]}({args})"
            return f"call_value({self.resolve(callee.name)}, {args})"
        if isinstance(callee, nodes.Getattr):
            if (isinstance(callee.node, nodes.Name) and callee.node.name == "loop"
                    and self.current_loop() is not None):
                if callee.attr != "cycle" or not node.args or node.kwargs:
                    raise unsupported(node, f"'loop.{callee.attr}()'")
                p = self.current_loop()
                return (f"List{{{', '.join(self.expr(a) for a in node.args)}}}"
                        f"[{p}_i % {len(node.args)}]")
            if callee.attr not in SUPPORTED_METHODS:
                raise unsupported(node, f"the method '.{callee.attr}()'")
            return f"call_method({self.expr(callee.node)}, {cpp_string(callee.attr)}, {args})"
        return f"call_value({self.expr(callee)}, {args})"

    def e_MarkSafe(self, node: nodes.MarkSafe) -> str:
        return f"Value({self.expr(node.expr)}.str())"

    e_MarkSafeIfAutoescape = e_MarkSafe

