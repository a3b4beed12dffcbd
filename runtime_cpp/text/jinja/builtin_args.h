// Internal to the builtins of text/jinja/ (builtins.cpp, methods.cpp, filters.cpp,
// tests.cpp): binding call arguments to parameter names, the argument checks with Python's
// messages, the string algorithms the filters share with the str methods, and the lookup
// of a builtin by name in its table. Generated templates include builtins.h, never this.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "text/jinja/builtins.h"
#include "text/jinja/value.h"

namespace ninfer::jinja::detail {

// Binds call arguments to parameter names the way Python does (positional first, then
// keywords); raises TypeError for an unknown keyword or too many positionals.
class Bound {
 public:
  Bound(const Args& a, const char* fn, std::initializer_list<const char*> params)
      : values_(params.size(), nullptr) {
    if (a.pos.size() > params.size())
      raise("TypeError", std::string(fn) + "() takes at most " + std::to_string(params.size()) +
                             " argument(s) (" + std::to_string(a.pos.size()) + " given)");
    for (size_t i = 0; i < a.pos.size(); ++i) values_[i] = &a.pos[i];
    for (const auto& [k, v] : a.kw) {
      const size_t i = param_index(params, k);
      if (i == params.size())
        raise("TypeError", std::string(fn) + "() got an unexpected keyword argument '" + k + "'");
      values_[i] = &v;
    }
  }
  const Value* operator[](size_t i) const { return values_[i]; }
  bool has(size_t i) const { return values_[i] != nullptr; }
  const Value& get(size_t i, const Value& dflt) const { return values_[i] ? *values_[i] : dflt; }

 private:
  std::vector<const Value*> values_;
};

inline const Value kNone = Value::none();
inline const Value kFalse = Value(false);
inline const Value kUndef;

[[noreturn]] void type_error(const std::string& msg);

// soft_str: what filters turn their input into (str(); undefined is '').
inline std::string soft_str(const Value& v) { return v.str(); }

// The argument as a str / an int (a bool counts), else TypeError naming `what`.
const std::string& need_str(const Value& v, const char* what);
int64_t need_int(const Value& v, const char* what);

// String algorithms over code points (methods.cpp), shared by the str methods and filters.
std::vector<char32_t> code_points(std::string_view s);
std::string encode(const std::vector<char32_t>& cps, size_t b, size_t e);  // cps[b, e)
std::string py_capitalize(std::string_view s);                             // str.capitalize()
std::string jinja_title(std::string_view s);  // the title filter: words split at [-\s({[<]+
// str.replace(old, repl, count); count < 0: all.
std::string replace_all(const std::string& s, const std::string& old, const std::string& repl,
                        int64_t count);
std::vector<std::string> splitlines(const std::string& s, bool keepends);  // str.splitlines()
Value items_list(const Dict& d);  // dict.items() as a list of (key, value) tuples

// A builtin's entry in its table (filters.cpp, tests.cpp).
template <typename Fn>
struct Named {
  const char* name;
  Fn fn;
};

// nullptr when `table` has no entry `name`.
template <typename Fn, size_t N>
Fn find_named(const Named<Fn> (&table)[N], std::string_view name) {
  for (const auto& e : table)
    if (name == e.name) return e.fn;
  return nullptr;
}

template <typename Fn, size_t N>
std::vector<std::string> names_of(const Named<Fn> (&table)[N]) {
  std::vector<std::string> out;
  for (const auto& e : table) out.emplace_back(e.name);
  return out;
}

// `fn` as found by name (find_filter, find_test); when null, jinja2's TemplateRuntimeError
// "No filter named 'x' found." (`kind` "filter" or "test").
template <typename Fn>
Fn need_named(Fn fn, const char* kind, const std::string& name) {
  if (!fn)
    raise("TemplateRuntimeError", std::string("No ") + kind + " named '" + name + "' found.");
  return fn;
}

}  // namespace ninfer::jinja::detail
