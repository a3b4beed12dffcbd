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

This module holds the statements and the translation unit around them; the expressions,
and the scope state both use, are in ninfer.frontend.chat_codegen_expr.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from jinja2 import nodes

from ninfer.frontend.chat_codegen_expr import (
    Expressions,
    Frame,
    cpp_string,
    ident,
    test_ident,
    unsupported,
)
from ninfer.frontend.chat_template import ChatTemplate, ChatTemplateError, parse


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


class _Generator(Expressions):
    """The statements of a template (`block`), each frame's locals declared on entry."""

    def open_frame(self, body: Sequence[nodes.Node], declared: dict[str, str] | None = None,
                   loop: str | None = None, barrier: bool = False) -> Frame:
        """Push a frame for `body`: `declared` are its locals already emitted (loop targets,
        macro parameters); every other name it stores is declared here, initialized from the
        enclosing frames' value."""
        frame = Frame(vars=dict(declared or {}), loop=loop, barrier=barrier)
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

    def framed_block(self, opener: str, body: Sequence[nodes.Node]) -> None:
        """`opener` (a line ending in `{`), then `body` one level in and in a frame of its
        own, then `}`."""
        self.emit(opener)
        self.indent += 1
        self.open_frame(body)
        self.block(body)
        self.frames.pop()
        self.indent -= 1
        self.emit("}")

    # ------------------------------------------------------------------ statements

    def stmt(self, node: nodes.Node) -> None:
        method = getattr(self, f"s_{type(node).__name__}", None)
        if method is None:
            raise unsupported(node, f"the '{type(node).__name__}' statement")
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
            raise unsupported(node, "a recursive for loop")
        p = self.fresh("loop")
        items, n, i = f"{p}_items", f"{p}_n", f"{p}_i"
        targets = [t.name for t in _target_names(node.target)]
        if not isinstance(node.target, nodes.Name | nodes.Tuple) or (
                isinstance(node.target, nodes.Tuple)
                and not all(isinstance(t, nodes.Name) for t in node.target.items)):
            raise unsupported(node, "this loop target")
        self.emit("{")
        self.indent += 1
        self.emit(f"std::shared_ptr<const List> {items} = iterate({self.expr(node.iter)});")
        if node.test is not None:
            kept = f"{p}_kept"
            self.emit(f"List {kept};")
            self.emit(f"for (const Value& item : *{items}) {{")
            self.indent += 1
            frame = Frame(vars={name: self.fresh("v_" + name) for name in targets})
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
            self.framed_block(f"if ({n} == 0) {{", node.else_)
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
            raise unsupported(target, "this assignment target")

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
            self.framed_block("{", node.body)
            return
        raise unsupported(node, "a {% call %} block")

    def s_Macro(self, node: nodes.Macro) -> None:
        var = self.resolve_macro(node.name)
        assert var is not None
        names = [a.name for a in node.args]
        for n in node.find_all(nodes.Name):
            if n.name in ("caller", "varargs", "kwargs") and n.name not in names:
                raise unsupported(n, f"'{n.name}' in a macro")
        params = ", ".join(cpp_string(a) for a in names)
        self.emit(f"{var} = [&](const Args& args) -> Value {{")
        self.indent += 1
        self.emit(f"MacroArgs bound(args, {cpp_string(node.name)}, {{{params}}});")
        self.emit("std::string out;")
        params_vars = {name: self.fresh("v_" + name) for name in names}
        first_default = len(names) - len(node.defaults)
        self.frames.append(Frame(barrier=True))  # defaults see the earlier parameters
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
    filters = [f"const FilterFn F_{ident(f)} = find_filter({cpp_string(f)});"
               for f in sorted(gen.filters)]
    tests = [f"const TestFn T_{test_ident(t)} = find_test({cpp_string(t)});"
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
    return {f"chat_template_{ident(t.name)}.cpp": generate(t, f"t_{ident(t.name)}", t.name)
            for t in templates}
