// Jinja2's filters and tests, the Python methods templates call, and the globals of
// transformers' chat template environment, over jinja::Value (filters.cpp, tests.cpp,
// methods.cpp, builtins.cpp).
//
// The compiler (compiler/ninfer/frontend/chat_codegen.py) accepts a template only if every
// filter, test and method it names is in these tables (SUPPORTED_FILTERS & co. in
// chat_codegen_expr.py list the same names; tests/test_chat_template.py checks they agree).
#pragma once

#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/jinja/value.h"

namespace ninfer::jinja {

// Call arguments: positional, then keyword (in call order).
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

// The position of keyword `name` among a function's `params` (params.size() when it is not
// one): how call arguments bind to parameters (builtins and macros alike).
inline size_t param_index(std::initializer_list<const char*> params, std::string_view name) {
  size_t i = 0;
  for (const char* p : params) {
    if (name == p) break;
    ++i;
  }
  return i;
}

using FilterFn = Value (*)(const Value& value, const Args& args);
using TestFn = bool (*)(const Value& value, const Args& args);

// nullptr when Jinja's name is not implemented.
FilterFn find_filter(std::string_view name);
TestFn find_test(std::string_view name);
std::vector<std::string> filter_names();
std::vector<std::string> test_names();
std::vector<std::string> method_names();  // "str.strip", "dict.get", ...

// obj.name(args): str, dict and list methods (the sandbox's rules: methods that change a
// list or dict raise SecurityError).
Value call_method(const Value& obj, std::string_view name, const Args& args);
// callee(args) for a value that was looked up without being called (a bound method).
Value call_value(const Value& callee, const Args& args);

// Globals of transformers' environment.
[[noreturn]] void raise_exception(const Args& args);  // jinja2.TemplateError(message)
Value strftime_now(const Args& args);                 // datetime.now().strftime(format)
Value make_namespace(const Args& args);               // namespace(...)
Value range(const Args& args);
Value make_dict(const Args& args);  // dict(...)

// `{% set ns.attr = value %}`.
void set_namespace_attr(const Value& ns, const std::string& attr, Value value);
// Unpacks a value into `n` targets (`{% for k, v in ... %}`, `{% set a, b = ... %}`).
List unpack(const Value& v, size_t n);

// Python's str methods (also used by the filters).
std::string py_strip(std::string_view s, const Value& chars, bool left, bool right);
std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);

}  // namespace ninfer::jinja
