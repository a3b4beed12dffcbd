// Jinja2's tests (`x is defined`, `x is divisibleby(3)`, ...) over jinja::Value;
// find_test() looks them up by name.
#include "text/jinja/builtin_args.h"
#include "text/jinja/builtins.h"

namespace ninfer::jinja {

using namespace detail;  // NOLINT

namespace {

const Value& arg0(const Args& a, const char* test) {
  if (a.pos.empty()) type_error(std::string("test '") + test + "' needs an argument");
  return a.pos[0];
}

bool t_defined(const Value& v, const Args&) { return !v.is_undefined(); }
bool t_undefined(const Value& v, const Args&) { return v.is_undefined(); }
bool t_none(const Value& v, const Args&) { return v.is_none(); }
bool t_boolean(const Value& v, const Args&) { return v.is_bool(); }
bool t_true(const Value& v, const Args&) { return v.is_bool() && v.as_bool(); }
bool t_false(const Value& v, const Args&) { return v.is_bool() && !v.as_bool(); }
bool t_integer(const Value& v, const Args&) { return v.is_int(); }
bool t_float(const Value& v, const Args&) { return v.is_float(); }
bool t_number(const Value& v, const Args&) { return v.is_number(); }
bool t_string(const Value& v, const Args&) { return v.is_string(); }
bool t_mapping(const Value& v, const Args&) { return v.is_dict(); }
bool t_iterable(const Value& v, const Args&) {
  return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined() || v.is_iterator();
}
bool t_sequence(const Value& v, const Args&) {
  return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
}
bool t_callable(const Value& v, const Args&) { return v.kind() == Kind::kMethod; }
bool t_odd(const Value& v, const Args&) {
  if (!v.is_int() && !v.is_bool()) mod(v, Value(2));
  return (v.as_int() % 2 + 2) % 2 == 1;
}
bool t_even(const Value& v, const Args&) {
  if (!v.is_int() && !v.is_bool()) mod(v, Value(2));
  return v.as_int() % 2 == 0;
}
bool t_divisibleby(const Value& v, const Args& a) {
  return equal(mod(v, arg0(a, "divisibleby")), Value(0));
}
bool t_eq(const Value& v, const Args& a) { return equal(v, arg0(a, "eq")); }
bool t_ne(const Value& v, const Args& a) { return !equal(v, arg0(a, "ne")); }
bool t_lt(const Value& v, const Args& a) { return lt(v, arg0(a, "lt")); }
bool t_le(const Value& v, const Args& a) { return le(v, arg0(a, "le")); }
bool t_gt(const Value& v, const Args& a) { return gt(v, arg0(a, "gt")); }
bool t_ge(const Value& v, const Args& a) { return ge(v, arg0(a, "ge")); }
bool t_in(const Value& v, const Args& a) { return contains(arg0(a, "in"), v); }
bool t_lower(const Value& v, const Args&) {
  const std::string s = v.str();
  return py_lower(s) == s;
}
bool t_upper(const Value& v, const Args&) {
  const std::string s = v.str();
  return py_upper(s) == s;
}
bool t_sameas(const Value& v, const Args& a) {
  const Value& o = arg0(a, "sameas");
  if (v.kind() != o.kind()) return false;
  if (v.is_none() || v.is_bool()) return equal(v, o);
  return false;  // identity of other objects is not modelled
}

const Named<TestFn> kTests[] = {
    {"!=", t_ne},
    {"<", t_lt},
    {"<=", t_le},
    {"==", t_eq},
    {">", t_gt},
    {">=", t_ge},
    {"boolean", t_boolean},
    {"callable", t_callable},
    {"defined", t_defined},
    {"divisibleby", t_divisibleby},
    {"eq", t_eq},
    {"equalto", t_eq},
    {"even", t_even},
    {"false", t_false},
    {"float", t_float},
    {"ge", t_ge},
    {"greaterthan", t_gt},
    {"gt", t_gt},
    {"in", t_in},
    {"integer", t_integer},
    {"iterable", t_iterable},
    {"le", t_le},
    {"lessthan", t_lt},
    {"lower", t_lower},
    {"lt", t_lt},
    {"mapping", t_mapping},
    {"ne", t_ne},
    {"none", t_none},
    {"number", t_number},
    {"odd", t_odd},
    {"sameas", t_sameas},
    {"sequence", t_sequence},
    {"string", t_string},
    {"true", t_true},
    {"undefined", t_undefined},
    {"upper", t_upper},
};

}  // namespace

TestFn find_test(std::string_view name) { return find_named(kTests, name); }

std::vector<std::string> test_names() { return names_of(kTests); }

}  // namespace ninfer::jinja
