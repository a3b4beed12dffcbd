// Python's operators over values: == and the orderings (with Python's TypeErrors for
// unorderable kinds), `in`, and the arithmetic (int/float promotion, str and list + and *,
// floor division and modulo with Python's signs).
#include <cmath>

#include "text/jinja/value.h"

namespace ninfer::jinja {

// ------------------------------------------------------------------------------ compare

bool equal(const Value& a, const Value& b) {
  const Kind ka = a.kind(), kb = b.kind();
  if (a.is_number() && b.is_number()) {
    if (ka == Kind::kFloat || kb == Kind::kFloat) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (ka != kb) return false;
  switch (ka) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kString: return a.str_ref() == b.str_ref();
    case Kind::kList: {
      if (a.is_tuple() != b.is_tuple()) return false;
      const List &x = a.list(), &y = b.list();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!equal(x[i], y[i])) return false;
      return true;
    }
    case Kind::kDict: {
      const Dict &x = a.dict(), &y = b.dict();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* w = y.find(k);
        if (!w || !equal(v, *w)) return false;
      }
      return true;
    }
    default: return &a.dict() == &b.dict();
  }
}

namespace {

// -1, 0, 1 like Python's ordering of a and b; raises for unorderable kinds naming `op`.
int order(const Value& a, const Value& b, const char* op) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      const double x = a.as_float(), y = b.as_float();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    const int64_t x = a.as_int(), y = b.as_int();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.str_ref().compare(b.str_ref());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const List &x = a.list(), &y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equal(x[i], y[i])) return order(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  if (a.is_undefined()) a.defined();
  if (b.is_undefined()) b.defined();
  raise("TypeError", std::string("'") + op + "' not supported between instances of '" +
                         a.type_name() + "' and '" + b.type_name() + "'");
}

}  // namespace

bool less(const Value& a, const Value& b, const char* op) { return order(a, b, op) < 0; }
bool lt(const Value& a, const Value& b) { return order(a, b, "<") < 0; }
bool le(const Value& a, const Value& b) { return order(a, b, "<=") <= 0; }
bool gt(const Value& a, const Value& b) { return order(a, b, ">") > 0; }
bool ge(const Value& a, const Value& b) { return order(a, b, ">=") >= 0; }

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::kString:
      if (!item.is_string())
        raise("TypeError", std::string("'in <string>' requires string as left operand, not ") +
                               item.type_name());
      return container.str_ref().find(item.str_ref()) != std::string::npos;
    case Kind::kList:
      for (const auto& x : container.list())
        if (equal(x, item)) return true;
      return false;
    case Kind::kDict:
      if (!item.is_string()) return false;
      return container.dict().find(item.str_ref()) != nullptr;
    case Kind::kUndefined: return false;
    case Kind::kIterator:
      for (const auto& x : container.consume())
        if (equal(x, item)) return true;
      return false;
    default:
      raise("TypeError",
            std::string("argument of type '") + container.type_name() + "' is not iterable");
  }
}

// ------------------------------------------------------------------------------ arithmetic

namespace {

[[noreturn]] void bad_operands(const char* op, const Value& a, const Value& b) {
  if (a.is_undefined()) a.defined();
  if (b.is_undefined()) b.defined();
  raise("TypeError", std::string("unsupported operand type(s) for ") + op + ": '" + a.type_name() +
                         "' and '" + b.type_name() + "'");
}

double py_fmod(double a, double b) {
  double m = std::fmod(a, b);
  if (m != 0 && ((b < 0) != (m < 0))) m += b;
  return m;
}

int64_t py_floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

Value repeat(const Value& seq, int64_t n) {
  if (seq.is_string()) {
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.str_ref();
    return Value(std::move(out));
  }
  List out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.list().begin(), seq.list().end());
  return Value(std::move(out), seq.is_tuple());
}

}  // namespace

Value add(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return Value(a.as_float() + b.as_float());
    return Value(a.as_int() + b.as_int());
  }
  if (a.is_string() && b.is_string()) return Value(a.str_ref() + b.str_ref());
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    List out = a.list();
    out.insert(out.end(), b.list().begin(), b.list().end());
    return Value(std::move(out), a.is_tuple());
  }
  if (a.is_undefined()) a.defined();
  if (b.is_undefined()) b.defined();
  if (a.is_string())
    raise("TypeError",
          std::string("can only concatenate str (not \"") + b.type_name() + "\") to str");
  if (a.is_list())
    raise("TypeError", std::string("can only concatenate ") + a.type_name() + " (not \"" +
                           b.type_name() + "\") to " + a.type_name());
  bad_operands("+", a, b);
}

Value sub(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return Value(a.as_float() - b.as_float());
    return Value(a.as_int() - b.as_int());
  }
  bad_operands("-", a, b);
}

Value mul(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return Value(a.as_float() * b.as_float());
    return Value(a.as_int() * b.as_int());
  }
  if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) return repeat(a, b.as_int());
  if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) return repeat(b, a.as_int());
  bad_operands("*", a, b);
}

Value truediv(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (b.as_float() == 0)
      raise("ZeroDivisionError", b.is_float() ? "float division by zero" : "division by zero");
    return Value(a.as_float() / b.as_float());
  }
  bad_operands("/", a, b);
}

Value floordiv(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      if (b.as_float() == 0) raise("ZeroDivisionError", "float floor division by zero");
      return Value(std::floor(a.as_float() / b.as_float()));
    }
    if (b.as_int() == 0) raise("ZeroDivisionError", "integer division or modulo by zero");
    return Value(py_floordiv(a.as_int(), b.as_int()));
  }
  bad_operands("//", a, b);
}

Value mod(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      if (b.as_float() == 0) raise("ZeroDivisionError", "float modulo");
      return Value(py_fmod(a.as_float(), b.as_float()));
    }
    if (b.as_int() == 0) raise("ZeroDivisionError", "integer division or modulo by zero");
    const int64_t x = a.as_int(), y = b.as_int();
    return Value(x - py_floordiv(x, y) * y);
  }
  if (a.is_string()) raise("TypeError", "printf-style string formatting is not supported");
  bad_operands("%", a, b);
}

Value power(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float() || b.as_int() < 0)
      return Value(std::pow(a.as_float(), b.as_float()));
    int64_t r = 1, base = a.as_int();
    for (int64_t e = b.as_int(); e > 0; --e) r *= base;
    return Value(r);
  }
  bad_operands("** or pow()", a, b);
}

Value neg(const Value& a) {
  if (a.is_float()) return Value(-a.as_float());
  if (a.is_number()) return Value(-a.as_int());
  a.defined();
  raise("TypeError", std::string("bad operand type for unary -: '") + a.type_name() + "'");
}

Value pos(const Value& a) {
  if (a.is_float()) return a;
  if (a.is_number()) return Value(a.as_int());
  a.defined();
  raise("TypeError", std::string("bad operand type for unary +: '") + a.type_name() + "'");
}

Value concat(std::initializer_list<Value> parts) {
  std::string out;
  for (const auto& p : parts) p.append_str(out);
  return Value(std::move(out));
}

}  // namespace ninfer::jinja
