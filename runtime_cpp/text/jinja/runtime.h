// What a generated chat template includes: the value type, the builtins, and the few helpers
// the generated code calls (compiler/ninfer/frontend/chat_codegen.py emits the calls).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>

#include "text/jinja/builtins.h"
#include "text/jinja/value.h"

namespace ninfer::jinja {

using Macro = std::function<Value(const Args&)>;

// A template variable: the render context's value, or undefined.
inline Value lookup(const Value& context, std::string_view name) {
  if (const Value* v = context.dict().find(name)) return *v;
  return Value::undefined_name(name);
}

// A global of the environment read as a value (`strftime_now is defined`): the render
// context's value if it has one, else the builtin as a callable.
inline Value builtin(const Value& context, std::string_view name) {
  if (const Value* v = context.dict().find(name)) return *v;
  return Value::method(Value::none(), std::string(name));
}

// `a and b`, `a or b` (Python: the deciding operand, not a bool).
template <class F>
Value and_(const Value& a, F&& b) {
  return a.truthy() ? Value(b()) : a;
}
template <class F>
Value or_(const Value& a, F&& b) {
  return a.truthy() ? a : Value(b());
}

// `{'k': v, ...}`: keys must be strings.
inline Value dict_literal(std::initializer_list<std::pair<Value, Value>> items) {
  Dict d;
  for (const auto& [k, v] : items) {
    if (!k.is_string()) raise("TypeError", "ninfer's chat templates support only string keys");
    d.set(k.str_ref(), v);
  }
  return Value(std::move(d));
}

inline Value call_macro(const Macro& m, const char* name, const Args& args) {
  if (!m) raise("UndefinedError", string_repr(name) + " is undefined");
  return m(args);
}

// Binds a macro's parameters: positional, then keyword; `missing` is set where neither gave
// one (the default expression is then evaluated by the generated code).
class MacroArgs {
 public:
  MacroArgs(const Args& a, const char* macro, std::initializer_list<const char*> params)
      : values_(params.size()) {
    if (a.pos.size() > params.size())
      raise("TypeError", std::string("macro '") + macro + "' takes not more than " +
                             std::to_string(params.size()) + " argument(s)");
    for (size_t i = 0; i < a.pos.size(); ++i) values_[i] = {true, a.pos[i]};
    for (const auto& [k, v] : a.kw) {
      const size_t i = param_index(params, k);
      if (i == params.size())
        raise("TypeError",
              std::string("macro '") + macro + "' takes no keyword argument '" + k + "'");
      values_[i] = {true, v};
    }
  }
  bool given(size_t i) const { return values_[i].first; }
  const Value& operator[](size_t i) const { return values_[i].second; }

 private:
  std::vector<std::pair<bool, Value>> values_;
};

inline void emit(std::string& out, const Value& v) { v.append_str(out); }

}  // namespace ninfer::jinja
