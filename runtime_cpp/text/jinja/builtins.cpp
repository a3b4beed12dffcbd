// The globals of transformers' chat template environment (raise_exception, strftime_now,
// namespace, range, dict), calling a value (call_value), `{% set ns.attr %}`, unpacking;
// and the argument checks all builtins share (builtin_args.h). The filters, tests and
// methods are in filters.cpp, tests.cpp and methods.cpp.
#include "text/jinja/builtins.h"

#include <ctime>

#include "text/jinja/builtin_args.h"

namespace ninfer::jinja {

using namespace detail;  // NOLINT

namespace detail {

void type_error(const std::string& msg) { raise("TypeError", msg); }

const std::string& need_str(const Value& v, const char* what) {
  if (!v.is_string()) {
    v.defined();
    type_error(std::string(what) + " must be str, not " + v.type_name());
  }
  return v.str_ref();
}

int64_t need_int(const Value& v, const char* what) {
  if (!v.is_int() && !v.is_bool()) {
    v.defined();
    type_error(std::string("'") + v.type_name() + "' object cannot be interpreted as an integer" +
               (what[0] ? "" : ""));
  }
  return v.as_int();
}

}  // namespace detail

Value call_value(const Value& callee, const Args& args) {
  if (callee.kind() == Kind::kMethod && callee.method_self().is_none()) {  // a global
    const std::string& n = callee.method_name();
    if (n == "raise_exception") raise_exception(args);
    if (n == "strftime_now") return strftime_now(args);
    if (n == "namespace") return make_namespace(args);
    if (n == "range") return range(args);
    if (n == "dict") return make_dict(args);
  }
  if (callee.kind() == Kind::kMethod)
    return call_method(callee.method_self(), callee.method_name(), args);
  callee.defined();
  type_error(std::string("'") + callee.type_name() + "' object is not callable");
}

void raise_exception(const Args& args) {
  raise("TemplateError", args.pos.empty() ? std::string() : args.pos[0].str());
}

Value strftime_now(const Args& args) {
  Bound b(args, "strftime_now", {"format"});
  const std::string fmt = need_str(b.get(0, kUndef), "strftime() argument 1");
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  std::string out(256 + fmt.size() * 8, '\0');
  const size_t n = std::strftime(out.data(), out.size(), fmt.c_str(), &tm);
  out.resize(n);
  return Value(std::move(out));
}

namespace {

// namespace(...) and dict(...): the items of the one mapping argument, if given.
Dict mapping_arg(const Args& args, const char* fn) {
  if (args.pos.empty()) return Dict{};
  if (args.pos.size() > 1 || !args.pos[0].is_dict())
    type_error(std::string(fn) + "() takes at most one mapping argument");
  return args.pos[0].dict();
}

// transformers' namespace refuses attributes starting with an underscore.
void check_namespace_attr(const std::string& attr) {
  if (!attr.empty() && attr[0] == '_')
    raise("SecurityError",
          "Chat templates cannot store underscore-prefixed attributes on a "
          "namespace, but got '" +
              attr + "'. Please rename the attribute.");
}

}  // namespace

Value make_namespace(const Args& args) {
  Dict d = mapping_arg(args, "namespace");
  for (const auto& [k, v] : args.kw) {
    check_namespace_attr(k);
    d.set(k, v);
  }
  return Value::namespace_(std::move(d));
}

Value range(const Args& args) {
  if (args.pos.empty() || args.pos.size() > 3 || !args.kw.empty())
    type_error("range expected at most 3 arguments");
  int64_t start = 0, stop, step = 1;
  if (args.pos.size() == 1) {
    stop = need_int(args.pos[0], "");
  } else {
    start = need_int(args.pos[0], "");
    stop = need_int(args.pos[1], "");
    if (args.pos.size() == 3) step = need_int(args.pos[2], "");
  }
  if (step == 0) raise("ValueError", "range() arg 3 must not be zero");
  List out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    out.emplace_back(i);
    if (out.size() > 100000)
      raise("OverflowError",
            "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  }
  return Value(std::move(out));
}

Value make_dict(const Args& args) {
  Dict d = mapping_arg(args, "dict");
  for (const auto& [k, v] : args.kw) d.set(k, v);
  return Value(std::move(d));
}

void set_namespace_attr(const Value& ns, const std::string& attr, Value value) {
  if (!ns.is_namespace())
    raise("TemplateRuntimeError", "cannot assign attribute on non-namespace object");
  check_namespace_attr(attr);
  ns.ns_mut().set(attr, std::move(value));
}

List unpack(const Value& v, size_t n) {
  List items = *iterate(v);
  if (items.size() != n) {
    if (items.size() < n)
      raise("ValueError", "not enough values to unpack (expected " + std::to_string(n) + ", got " +
                              std::to_string(items.size()) + ")");
    raise("ValueError", "too many values to unpack (expected " + std::to_string(n) + ")");
  }
  return items;
}

}  // namespace ninfer::jinja
