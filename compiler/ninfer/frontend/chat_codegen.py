"""A chat template's jinja2 AST -> one C++ translation unit over runtime_cpp/text/jinja/.

Every template is compiled ahead of time; the generated function renders a context the way
jinja2 renders the template in transformers' environment (ninfer.frontend.chat_template),
and ninfer.chat_verify checks that on generated conversations after the build.

Scoping follows jinja2's compiler: the template, each loop iteration, each macro call and
each block body (`{% set x %}...`, `{% filter %}`, `{% generation %}`) is a frame; a name
stored in a frame is a C++ local of that frame, initialized from the enclosing frame's value
(so a `set` inside a loop never leaks out, and each iteration starts afresh); a name no frame
stores is a variable of the render context. Macros are C++ lambdas capturing by reference,
which gives jinja2's late binding of the names they read.

Anything not implemented raises ChatTemplateError naming the construct and its line, so a
template either compiles to code that matches jinja2 or fails the compile.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from jinja2 import nodes

from ninfer.frontend.chat_template import ChatTemplate, ChatTemplateError, parse

# The names runtime_cpp/text/jinja/builtins.cpp implements (tests check they agree).
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
_LOOP_ATTRS = {"index", "index0", "revindex", "revindex0", "first", "last", "length",
               "previtem", "nextitem", "depth", "depth0"}
_COMPARE = {"eq": "equal({a}, {b})", "ne": "!equal({a}, {b})", "lt": "lt({a}, {b})",
            "lteq": "le({a}, {b})", "gt": "gt({a}, {b})", "gteq": "ge({a}, {b})",
            "in": "contains({b}, {a})", "notin": "!contains({b}, {a})"}
_BINOPS = {nodes.Add: "add", nodes.Sub: "sub", nodes.Mul: "mul", nodes.Div: "truediv",
           nodes.FloorDiv: "floordiv", nodes.Mod: "mod", nodes.Pow: "power"}


def _unsupported(node: nodes.Node, what: str) -> ChatTemplateError:
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


def _ident(name: str) -> str:
    return re.sub(r"\W", "_", name, flags=re.ASCII)


@dataclass
class _Frame:
    vars: dict[str, str] = field(default_factory=dict)    # name -> C++ Value variable
    macros: dict[str, str] = field(default_factory=dict)  # name -> C++ Macro variable
    loop: str | None = None  # the C++ prefix of the loop this frame iterates, if any
    barrier: bool = False    # a macro body: outer loops are not visible


def _stores(body: Sequence[nodes.Node]) -> Iterator[tuple[str, bool]]:
    """(name, is_macro) for the names stored directly in a frame of `body`."""
    for node in body:
        if isinstance(node, nodes.Assign):
            yield from ((n.name, False) for n in _target_names(node.target))
        elif isinstance(node, nodes.AssignBlock):
            yield from ((n.name, False) for n in _target_names(node.target))
        elif isinstance(node, nodes.Macro):
            yield node.name, True
        elif isinstance(node, nodes.If):
            yield from _stores(node.body)
            for elif_ in node.elif_:
                yield from _stores([elif_])
            yield from _stores(node.else_)


def _target_names(target: nodes.Node) -> list[nodes.Name]:
    if isinstance(target, nodes.Name):
        return [target]
    if isinstance(target, nodes.Tuple):
        return [n for item in target.items for n in _target_names(item)]
    return []  # NSRef: an attribute of a namespace, not a store of a name


class _Generator:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.indent = 1
        self.consts: dict[str, str] = {}   # C++ initializer -> constant name
        self.filters: set[str] = set()
        self.tests: set[str] = set()
        self.globals: dict[str, str] = {}  # context name -> C++ variable
        self.frames: list[_Frame] = []
        self.counter = 0

    # ------------------------------------------------------------------ helpers

    def fresh(self, stem: str) -> str:
        self.counter += 1
        return f"{_ident(stem)}_{self.counter}"

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
            self.globals[name] = f"g_{_ident(name)}_{len(self.globals)}"
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

    def open_frame(self, body: Sequence[nodes.Node], declared: dict[str, str] | None = None,
                   loop: str | None = None, barrier: bool = False) -> _Frame:
        """Push a frame for `body`: `declared` are its locals already emitted (loop targets,
        macro parameters); every other name it stores is declared here, initialized from the
        enclosing frames' value."""
        frame = _Frame(vars=dict(declared or {}), loop=loop, barrier=barrier)
        fresh = []
        for name, is_macro in _stores(body):
            if name in frame.vars or name in frame.macros or name in fresh:
                if is_macro != (name in frame.macros):
                    raise ChatTemplateError(f"chat template: '{name}' is both a macro and a "
                                            "variable in one scope, which ninfer does not support")
                continue
            if is_macro:
                frame.macros[name] = self.fresh("m_" + name)
                self.emit(f"Macro {frame.macros[name]};")
            else:
                fresh.append(name)
        for name in fresh:
            outer = self.resolve(name)  # before the frame is pushed: the enclosing value
            frame.vars[name] = self.fresh("v_" + name)
            self.emit(f"Value {frame.vars[name]} = {outer};")
        self.frames.append(frame)
        return frame

    def block(self, body: Sequence[nodes.Node]) -> None:
        for node in body:
            self.stmt(node)

    # ------------------------------------------------------------------ statements

    def stmt(self, node: nodes.Node) -> None:
        method = getattr(self, f"s_{type(node).__name__}", None)
        if method is None:
            raise _unsupported(node, f"the '{type(node).__name__}' statement")
        method(node)

    def s_Output(self, node: nodes.Output) -> None:
        for child in node.nodes:
            if isinstance(child, nodes.TemplateData):
                if child.data:
                    self.emit(f"out.append({cpp_string(child.data)}, "
                              f"{len(child.data.encode())});")
            else:
                self.emit(f"emit(out, {self.expr(child)});")

    def s_If(self, node: nodes.If) -> None:
        self.emit(f"if ({self.cond(node.test)}) {{")
        self.nested(node.body)
        for elif_ in node.elif_:
            self.emit(f"}} else if ({self.cond(elif_.test)}) {{")
            self.nested(elif_.body)
        if node.else_:
            self.emit("} else {")
            self.nested(node.else_)
        self.emit("}")

    def nested(self, body: Sequence[nodes.Node]) -> None:
        self.indent += 1
        self.block(body)
        self.indent -= 1

    def s_For(self, node: nodes.For) -> None:
        if node.recursive:
            raise _unsupported(node, "a recursive for loop")
        p = self.fresh("loop")
        items, n, i = f"{p}_items", f"{p}_n", f"{p}_i"
        targets = [t.name for t in _target_names(node.target)]
        if not isinstance(node.target, nodes.Name | nodes.Tuple) or (
                isinstance(node.target, nodes.Tuple)
                and not all(isinstance(t, nodes.Name) for t in node.target.items)):
            raise _unsupported(node, "this loop target")
        self.emit("{")
        self.indent += 1
        self.emit(f"std::shared_ptr<const List> {items} = iterate({self.expr(node.iter)});")
        if node.test is not None:
            kept = f"{p}_kept"
            self.emit(f"List {kept};")
            self.emit(f"for (const Value& item : *{items}) {{")
            self.indent += 1
            frame = _Frame(vars={name: self.fresh("v_" + name) for name in targets})
            self.bind_target(node.target, frame.vars, "item")
            self.frames.append(frame)
            self.emit(f"if ({self.cond(node.test)}) {kept}.push_back(item);")
            self.frames.pop()
            self.indent -= 1
            self.emit("}")
            self.emit(f"{items} = std::make_shared<const List>(std::move({kept}));")
        self.emit(f"const size_t {n} = {items}->size();")
        self.emit(f"for (size_t {i} = 0; {i} < {n}; ++{i}) {{")
        self.indent += 1
        bound = {name: self.fresh("v_" + name) for name in targets}
        self.bind_target(node.target, bound, f"(*{items})[{i}]")
        self.open_frame(node.body, declared=bound, loop=p)
        self.block(node.body)
        self.frames.pop()
        self.indent -= 1
        self.emit("}")
        if node.else_:
            self.emit(f"if ({n} == 0) {{")
            self.indent += 1
            self.open_frame(node.else_)
            self.block(node.else_)
            self.frames.pop()
            self.indent -= 1
            self.emit("}")
        self.indent -= 1
        self.emit("}")

    def bind_target(self, target: nodes.Node, names: dict[str, str], value: str) -> None:
        if isinstance(target, nodes.Name):
            self.emit(f"Value {names[target.name]} = {value};")
            return
        items = [t.name for t in _target_names(target)]
        u = self.fresh("unpacked")
        self.emit(f"List {u} = unpack({value}, {len(items)});")
        for k, name in enumerate(items):
            self.emit(f"Value {names[name]} = {u}[{k}];")

    def s_Break(self, node: nodes.Break) -> None:
        self.emit("break;")

    def s_Continue(self, node: nodes.Continue) -> None:
        self.emit("continue;")

    def assign(self, target: nodes.Node, value: str) -> None:
        if isinstance(target, nodes.Name):
            self.emit(f"{self.resolve(target.name)} = {value};")
        elif isinstance(target, nodes.NSRef):
            self.emit(f"set_namespace_attr({self.resolve(target.name)}, "
                      f"{cpp_string(target.attr)}, {value});")
        elif isinstance(target, nodes.Tuple) and all(
                isinstance(t, nodes.Name) for t in target.items):
            u = self.fresh("unpacked")
            self.emit(f"{{ List {u} = unpack({value}, {len(target.items)});")
            for k, t in enumerate(_target_names(target)):
                self.emit(f"  {self.resolve(t.name)} = {u}[{k}];")
            self.emit("}")
        else:
            raise _unsupported(target, "this assignment target")

    def s_Assign(self, node: nodes.Assign) -> None:
        self.assign(node.target, self.expr(node.node))

    def rendered_block(self, body: Sequence[nodes.Node]) -> str:
        """Render `body` in its own frame into a fresh string; returns its variable."""
        buf = self.fresh("block")
        self.emit(f"std::string {buf};")
        self.emit("{")
        self.indent += 1
        self.emit(f"std::string& out = {buf};")
        self.open_frame(body)
        self.block(body)
        self.frames.pop()
        self.indent -= 1
        self.emit("}")
        return buf

    def s_AssignBlock(self, node: nodes.AssignBlock) -> None:
        buf = self.rendered_block(node.body)
        value = f"Value(std::move({buf}))"
        if node.filter is not None:
            value = self.filter_chain(node.filter, value)
        self.assign(node.target, value)

    def s_FilterBlock(self, node: nodes.FilterBlock) -> None:
        buf = self.rendered_block(node.body)
        self.emit(f"emit(out, {self.filter_chain(node.filter, f'Value(std::move({buf}))')});")

    def filter_chain(self, f: nodes.Filter, inner: str) -> str:
        """A block's filter (`node` None at the innermost) applied to `inner`."""
        arg = inner if f.node is None else self.filter_chain(f.node, inner)  # type: ignore[arg-type]
        return self.apply_filter(f, arg)

    def s_CallBlock(self, node: nodes.CallBlock) -> None:
        call = node.call
        if (isinstance(call, nodes.Call) and isinstance(call.node, nodes.ExtensionAttribute)
                and call.node.name == "_generation_support"):
            self.emit("{")
            self.indent += 1
            self.open_frame(node.body)
            self.block(node.body)
            self.frames.pop()
            self.indent -= 1
            self.emit("}")
            return
        raise _unsupported(node, "a {% call %} block")

    def s_Macro(self, node: nodes.Macro) -> None:
        var = self.resolve_macro(node.name)
        assert var is not None
        names = [a.name for a in node.args]
        for n in node.find_all(nodes.Name):
            if n.name in ("caller", "varargs", "kwargs") and n.name not in names:
                raise _unsupported(n, f"'{n.name}' in a macro")
        params = ", ".join(cpp_string(a) for a in names)
        self.emit(f"{var} = [&](const Args& args) -> Value {{")
        self.indent += 1
        self.emit(f"MacroArgs bound(args, {cpp_string(node.name)}, {{{params}}});")
        self.emit("std::string out;")
        params_vars = {name: self.fresh("v_" + name) for name in names}
        first_default = len(names) - len(node.defaults)
        self.frames.append(_Frame(barrier=True))  # defaults see the earlier parameters
        for k, name in enumerate(names):
            var = params_vars[name]
            self.emit(f"Value {var};")
            self.emit(f"if (bound.given({k})) {var} = bound[{k}];")
            if k >= first_default:
                self.emit(f"else {var} = {self.expr(node.defaults[k - first_default])};")
            else:
                msg = f"parameter {name!r} was not provided"
                self.emit(f"else {var} = Value::undefined({cpp_string(msg)});")
            self.frames[-1].vars[name] = var
        self.frames.pop()
        self.open_frame(node.body, declared=params_vars, barrier=True)
        self.block(node.body)
        self.frames.pop()
        self.emit("return Value(std::move(out));")
        self.indent -= 1
        self.emit("};")

    # ------------------------------------------------------------------ expressions

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
            raise _unsupported(node, f"the expression '{type(node).__name__}'")
        return str(method(node))

    def e_Const(self, node: nodes.Const) -> str:
        v = node.value
        if v is None:
            return "Value::none()"
        if isinstance(v, bool):
            return f"Value({'true' if v else 'false'})"
        if isinstance(v, int):
            if abs(v) >= 2**63:
                raise _unsupported(node, "an integer beyond 64 bits")
            return f"Value(int64_t{{{v}}})"
        if isinstance(v, float):
            return f"Value({v.hex()})" if v == v and abs(v) != float("inf") else (
                f"Value(std::numeric_limits<double>::{'quiet_NaN' if v != v else 'infinity'}())")
        if isinstance(v, str):
            return self.const(f"Value(std::string({cpp_string(v)}, {len(v.encode())}))")
        raise _unsupported(node, f"a constant of type {type(v).__name__}")

    def e_TemplateData(self, node: nodes.TemplateData) -> str:
        return self.const(f"Value(std::string({cpp_string(node.data)}, "
                          f"{len(node.data.encode())}))")

    def e_Name(self, node: nodes.Name) -> str:
        if node.name == "loop" and self.current_loop() is not None:
            raise _unsupported(node, "'loop' used as a value")
        if self.resolve_macro(node.name) is not None:
            raise _unsupported(node, f"the macro '{node.name}' used as a value")
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
            raise _unsupported(node, f"the operator '{node.operator}'")
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
            raise _unsupported(node, "*args or **kwargs in a call")
        if not args and not kwargs:
            return "Args{}"
        pos = ", ".join(self.expr(a) for a in args)
        kw = ", ".join(f"{{{cpp_string(str(k.key))}, {self.expr(k.value)}}}" for k in kwargs)
        return f"Args{{List{{{pos}}}, {{{kw}}}}}"

    def apply_filter(self, node: nodes.Filter, value: str) -> str:
        if node.name not in SUPPORTED_FILTERS:
            raise _unsupported(node, f"the filter '{node.name}'")
        self.filters.add(node.name)
        return f"F_{_ident(node.name)}({value}, {self.args(node.args, node.kwargs, node)})"

    def e_Filter(self, node: nodes.Filter) -> str:
        if node.node is None:
            raise _unsupported(node, "a filter without a value")
        return self.apply_filter(node, self.expr(node.node))

    def test(self, node: nodes.Test) -> str:
        if node.name not in SUPPORTED_TESTS:
            raise _unsupported(node, f"the test '{node.name}'")
        self.tests.add(node.name)
        return (f"T_{_test_ident(node.name)}({self.expr(node.node)}, "
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
            raise _unsupported(node, f"'loop.{node.attr}'")
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
                    raise _unsupported(node, f"'loop.{callee.attr}()'")
                p = self.current_loop()
                return (f"List{{{', '.join(self.expr(a) for a in node.args)}}}"
                        f"[{p}_i % {len(node.args)}]")
            if callee.attr not in SUPPORTED_METHODS:
                raise _unsupported(node, f"the method '.{callee.attr}()'")
            return f"call_method({self.expr(callee.node)}, {cpp_string(callee.attr)}, {args})"
        return f"call_value({self.expr(callee)}, {args})"

    def e_MarkSafe(self, node: nodes.MarkSafe) -> str:
        return f"Value({self.expr(node.expr)}.str())"

    e_MarkSafeIfAutoescape = e_MarkSafe


def _test_ident(name: str) -> str:
    return {"!=": "ne_op", "<": "lt_op", "<=": "le_op", "==": "eq_op", ">": "gt_op",
            ">=": "ge_op"}.get(name, _ident(name))


def generate(template: ChatTemplate, namespace: str, register_as: str) -> str:
    """The C++ translation unit of `template`; its function registers as `register_as`."""
    ast = parse(template.source)
    gen = _Generator()
    gen.indent = 1
    gen.open_frame(ast.body)
    gen.block(ast.body)
    body = gen.lines
    head = [f"const Value {v} = lookup(context, {cpp_string(n)});"
            for n, v in gen.globals.items()]
    consts = [f"const Value {name} = {init};" for init, name in gen.consts.items()]
    filters = [f"const FilterFn F_{_ident(f)} = find_filter({cpp_string(f)});"
               for f in sorted(gen.filters)]
    tests = [f"const TestFn T_{_test_ident(t)} = find_test({cpp_string(t)});"
             for t in sorted(gen.tests)]
    return "\n".join([
        "// generated by ninfer-compile from a chat template, do not edit",
        f"// template '{template.name}', sha256 {template.sha256}",
        '#include <limits>',
        '#include <memory>',
        '#include <string>',
        '',
        '#include "text/chat_template.h"',
        '#include "text/jinja/runtime.h"',
        '',
        f"namespace ninfer::chat_templates::{namespace} {{",
        "namespace {",
        "using namespace ninfer::jinja;  // NOLINT",
        *consts, *filters, *tests,
        "",
        "void render(const Value& context, std::string& out) {",
        *["  " + h for h in head],
        *body,
        "}",
        "",
        f"const ChatTemplateRegistration registration({cpp_string(register_as)}, "
        f"{cpp_string(template.sha256)}, &render);",
        "}  // namespace",
        f"}}  // namespace ninfer::chat_templates::{namespace}",
        "",
    ])


def chat_template_sources(templates: Sequence[ChatTemplate]) -> dict[str, str]:
    """File name -> generated C++ for a model's templates (registered by template name)."""
    return {f"chat_template_{_ident(t.name)}.cpp": generate(t, f"t_{_ident(t.name)}", t.name)
            for t in templates}
