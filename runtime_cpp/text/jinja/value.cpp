#include "text/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "text/utf8.h"

namespace ninfer::jinja {

void raise(const char* type, const std::string& message) { throw Error(type, message); }

namespace {

struct MethodRef {
  Value self;
  std::string name;
};

struct IteratorState {
  List items;
  const char* type;
  bool consumed = false;
};

const std::string& empty_string() {
  static const std::string empty;
  return empty;
}

}  // namespace

Value::Value(const Value& other) = default;
Value::Value(Value&& other) noexcept = default;
Value& Value::operator=(const Value& other) = default;
Value& Value::operator=(Value&& other) noexcept = default;
Value::~Value() = default;

Value::Value(std::string s)
    : kind_(Kind::kString), p_(std::make_shared<const std::string>(std::move(s))) {}

Value::Value(List l, bool tuple)
    : kind_(Kind::kList), tuple_(tuple), p_(std::make_shared<const List>(std::move(l))) {}

Value::Value(Dict d) : kind_(Kind::kDict), p_(std::make_shared<const Dict>(std::move(d))) {}

Value Value::undefined(std::string message) {
  Value v;
  v.p_ = std::make_shared<const std::string>(std::move(message));
  return v;
}

Value Value::undefined_name(std::string_view name) {
  return undefined(string_repr(name) + " is undefined");
}

Value Value::undefined_attr(const Value& obj, std::string_view name) {
  return undefined(string_repr(obj.object_type_repr()) + " has no attribute " + string_repr(name));
}

Value Value::undefined_item(const Value& obj, int64_t index) {
  return undefined(obj.object_type_repr() + " has no element " + std::to_string(index));
}

Value Value::namespace_(Dict d) {
  Value v;
  v.kind_ = Kind::kNamespace;
  v.p_ = std::make_shared<Dict>(std::move(d));
  return v;
}

Value Value::method(const Value& obj, std::string name) {
  Value v;
  v.kind_ = Kind::kMethod;
  v.p_ = std::make_shared<const MethodRef>(MethodRef{obj, std::move(name)});
  return v;
}

Value Value::iterator(List items, const char* type) {
  Value v;
  v.kind_ = Kind::kIterator;
  v.p_ = std::make_shared<IteratorState>(IteratorState{std::move(items), type});
  return v;
}

List Value::consume() const {
  auto* st = const_cast<IteratorState*>(static_cast<const IteratorState*>(p_.get()));
  if (st->consumed) return {};
  st->consumed = true;
  return std::move(st->items);
}

const std::string& Value::undefined_message() const {
  static const std::string generic = "undefined value";
  return p_ ? *static_cast<const std::string*>(p_.get()) : generic;
}

const std::string& Value::method_name() const {
  return static_cast<const MethodRef*>(p_.get())->name;
}

const Value& Value::method_self() const { return static_cast<const MethodRef*>(p_.get())->self; }

Value Value::from_json(const nlohmann::ordered_json& j) {
  using T = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case T::null:
    case T::discarded: return none();
    case T::boolean: return Value(j.get<bool>());
    case T::number_integer: return Value(j.get<int64_t>());
    case T::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case T::number_float: return Value(j.get<double>());
    case T::string: return Value(j.get<std::string>());
    case T::array: {
      List l;
      l.reserve(j.size());
      for (const auto& x : j) l.push_back(from_json(x));
      return Value(std::move(l));
    }
    case T::object: {
      Dict d;
      d.items.reserve(j.size());
      for (const auto& [k, x] : j.items()) d.items.emplace_back(k, from_json(x));
      return Value(std::move(d));
    }
    case T::binary: break;
  }
  return none();
}

nlohmann::ordered_json Value::to_json() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
    case Kind::kMethod:
    case Kind::kIterator: return nullptr;
    case Kind::kBool: return b_;
    case Kind::kInt: return i_;
    case Kind::kFloat: return f_;
    case Kind::kString: return str_ref();
    case Kind::kList: {
      auto a = nlohmann::ordered_json::array();
      for (const auto& x : list()) a.push_back(x.to_json());
      return a;
    }
    case Kind::kDict:
    case Kind::kNamespace: {
      auto o = nlohmann::ordered_json::object();
      for (const auto& [k, x] : dict().items) o[k] = x.to_json();
      return o;
    }
  }
  return nullptr;
}

const Value& Value::defined() const {
  if (kind_ == Kind::kUndefined) raise("UndefinedError", undefined_message());
  return *this;
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return b_;
    case Kind::kInt: return i_ != 0;
    case Kind::kFloat: return f_ != 0.0;
    case Kind::kString: return !str_ref().empty();
    case Kind::kList: return !list().empty();
    case Kind::kDict: return !dict().items.empty();
    case Kind::kNamespace:
    case Kind::kMethod:
    case Kind::kIterator: return true;
  }
  return false;
}

const char* Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return tuple_ ? "tuple" : "list";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "TemplateNamespace";
    case Kind::kMethod: return "builtin_function_or_method";
    case Kind::kIterator: return static_cast<const IteratorState*>(p_.get())->type;
  }
  return "object";
}

std::string Value::object_type_repr() const {
  if (kind_ == Kind::kNone) return "None";
  if (kind_ == Kind::kNamespace)
    return "transformers.utils.chat_template_utils.TemplateNamespace object";
  if (kind_ == Kind::kUndefined) return "jinja2.runtime.Undefined object";
  return std::string(type_name()) + " object";
}

void Value::append_str(std::string& out) const {
  switch (kind_) {
    case Kind::kUndefined: return;
    case Kind::kString: out += str_ref(); return;
    case Kind::kNone: out += "None"; return;
    case Kind::kBool: out += b_ ? "True" : "False"; return;
    case Kind::kInt: out += std::to_string(i_); return;
    case Kind::kFloat: out += float_repr(f_); return;
    default: out += repr();
  }
}

std::string Value::str() const {
  if (kind_ == Kind::kString) return str_ref();
  std::string out;
  append_str(out);
  return out;
}

std::string Value::repr() const {
  switch (kind_) {
    case Kind::kString: return string_repr(str_ref());
    case Kind::kList: {
      std::string out = tuple_ ? "(" : "[";
      const List& l = list();
      for (size_t i = 0; i < l.size(); ++i) {
        if (i) out += ", ";
        out += l[i].repr();
      }
      if (tuple_ && l.size() == 1) out += ",";
      out += tuple_ ? ")" : "]";
      return out;
    }
    case Kind::kDict:
    case Kind::kNamespace: {
      std::string out = kind_ == Kind::kNamespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, v] : dict().items) {
        if (!first) out += ", ";
        first = false;
        out += string_repr(k) + ": " + v.repr();
      }
      out += kind_ == Kind::kNamespace ? "}>" : "}";
      return out;
    }
    case Kind::kUndefined: return "Undefined";
    case Kind::kMethod:
      if (method_self().is_none()) return "<function " + method_name() + ">";
      return "<built-in method " + method_name() + " of " + method_self().object_type_repr() + ">";
    case Kind::kIterator: return std::string("<") + type_name() + " object>";
    default: return str();
  }
}

// ------------------------------------------------------------------------------ Dict

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(std::string key, Value value) {
  for (auto& [k, v] : items) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

// ------------------------------------------------------------------------------ strings

bool is_python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

size_t utf8_count(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

namespace {

// Code points str.isprintable() rejects that chat templates may meet (repr escapes them).
bool is_unprintable(char32_t c) {
  return c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) ||
         (c >= 0x205F && c <= 0x2064) || (c >= 0x2066 && c <= 0x206F) || c == 0x3000 ||
         c == 0xFEFF || (c >= 0xD800 && c <= 0xDFFF) || (c >= 0xFFF9 && c <= 0xFFFB) ||
         c == 0x061C || c == 0x180E;
}

void append_hex(std::string& out, const char* prefix, uint32_t v, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%0*x", digits, v);
  out += prefix;
  out += buf;
}

}  // namespace

std::string string_repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  size_t i = 0;
  while (i < s.size()) {
    const char32_t c = utf8::next(s, i);
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (is_unprintable(c)) {
      if (c <= 0xFF) append_hex(out, "\\x", c, 2);
      else if (c <= 0xFFFF) append_hex(out, "\\u", c, 4);
      else append_hex(out, "\\U", c, 8);
    } else {
      utf8::append(out, c);
    }
  }
  out += quote;
  return out;
}

std::string float_repr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  if (f == 0) return std::signbit(f) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, f, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  // sci: [-]d[.ddd]e[+-]XX
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  const size_t e = sci.find('e');
  std::string digits;
  for (size_t i = 0; i < e; ++i)
    if (sci[i] != '.') digits += sci[i];
  const int exp = std::stoi(sci.substr(e + 1));
  const int decpt = exp + 1;  // digits before the decimal point
  std::string out = negative ? "-" : "";
  if (decpt > -4 && decpt <= 16) {  // positional, else exponent (as Python's repr)
    if (decpt <= 0) {
      out += "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
    } else if (static_cast<size_t>(decpt) >= digits.size()) {
      out += digits + std::string(static_cast<size_t>(decpt) - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(decpt)) + "." +
             digits.substr(static_cast<size_t>(decpt));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
  return out + ebuf;
}

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

// ------------------------------------------------------------------------------ lookup

namespace {

bool is_str_method(std::string_view n) {
  static const char* const kNames[] = {
      "capitalize",   "casefold",    "center",    "count",      "encode",       "endswith",
      "expandtabs",   "find",        "format",    "format_map", "index",        "isalnum",
      "isalpha",      "isascii",     "isdecimal", "isdigit",    "isidentifier", "islower",
      "isnumeric",    "isprintable", "isspace",   "istitle",    "isupper",      "join",
      "ljust",        "lower",       "lstrip",    "maketrans",  "partition",    "removeprefix",
      "removesuffix", "replace",     "rfind",     "rindex",     "rjust",        "rpartition",
      "rsplit",       "rstrip",      "split",     "splitlines", "startswith",   "strip",
      "swapcase",     "title",       "translate", "upper",      "zfill"};
  for (const char* k : kNames)
    if (n == k) return true;
  return false;
}

bool is_dict_method(std::string_view n) {
  static const char* const kNames[] = {"clear", "copy",    "fromkeys",   "get",    "items", "keys",
                                       "pop",   "popitem", "setdefault", "update", "values"};
  for (const char* k : kNames)
    if (n == k) return true;
  return false;
}

bool is_list_method(std::string_view n, bool tuple) {
  if (tuple) return n == "count" || n == "index";
  static const char* const kNames[] = {"append", "clear", "copy",   "count",   "extend", "index",
                                       "insert", "pop",   "remove", "reverse", "sort"};
  for (const char* k : kNames)
    if (n == k) return true;
  return false;
}

// The attribute of `obj` called `name`, if Python has one (a method), else undefined.
Value attribute(const Value& obj, std::string_view name, bool* found) {
  *found = true;
  switch (obj.kind()) {
    case Kind::kString:
      if (is_str_method(name)) return Value::method(obj, std::string(name));
      break;
    case Kind::kDict:
      if (is_dict_method(name)) return Value::method(obj, std::string(name));
      break;
    case Kind::kList:
      if (is_list_method(name, obj.is_tuple())) return Value::method(obj, std::string(name));
      break;
    case Kind::kNamespace:
      if (const Value* v = obj.dict().find(name)) return *v;
      break;
    case Kind::kInt:
      if (name == "real" || name == "numerator") return Value(obj.as_int());
      if (name == "imag") return Value(0);
      if (name == "denominator") return Value(1);
      break;
    case Kind::kUndefined: obj.defined(); break;
    default: break;
  }
  *found = false;
  return Value();
}

size_t byte_offset(std::string_view s, int64_t cp) {
  size_t i = 0;
  for (int64_t n = 0; n < cp && i < s.size(); ++n) i += utf8::sequence_length(s[i]);
  return std::min(i, s.size());
}

}  // namespace

Value getattr(const Value& obj, std::string_view name) {
  bool found = false;
  Value a = attribute(obj, name, &found);
  if (found) return a;
  if (obj.is_dict()) {
    if (const Value* v = obj.dict().find(name)) return *v;
  }
  return Value::undefined_attr(obj, name);
}

Value getitem(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Kind::kDict:
      if (key.is_string()) {
        if (const Value* v = obj.dict().find(key.str_ref())) return *v;
      }
      break;
    case Kind::kList:
      if (key.is_int() || key.is_bool()) {
        const List& l = obj.list();
        int64_t i = key.as_int();
        const int64_t n = static_cast<int64_t>(l.size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) return l[static_cast<size_t>(i)];
        return Value::undefined_item(obj, key.as_int());
      }
      break;
    case Kind::kString:
      if (key.is_int() || key.is_bool()) {
        const std::string& s = obj.str_ref();
        int64_t i = key.as_int();
        const int64_t n = static_cast<int64_t>(utf8_count(s));
        if (i < 0) i += n;
        if (i >= 0 && i < n) {
          const size_t at = byte_offset(s, i);
          return Value(s.substr(at, utf8::sequence_length(s[at])));
        }
        return Value::undefined_item(obj, key.as_int());
      }
      break;
    case Kind::kUndefined: obj.defined(); break;
    default: break;
  }
  if (key.is_string()) {
    bool found = false;
    Value a = attribute(obj, key.str_ref(), &found);
    if (found) return a;
    return Value::undefined_attr(obj, key.str_ref());
  }
  if (key.is_int()) return Value::undefined_item(obj, key.as_int());
  return Value::undefined(obj.object_type_repr() + " has no element " + key.repr());
}

namespace {

// Python's slice.indices(n).
void slice_indices(const Value& start, const Value& stop, const Value& step, int64_t n, int64_t* lo,
                   int64_t* hi, int64_t* st) {
  auto as_index = [](const Value& v, const char* what) -> int64_t {
    if (v.is_int() || v.is_bool()) return v.as_int();
    raise("TypeError", std::string("slice indices must be integers or None or have an "
                                   "__index__ method") +
                           (what[0] ? "" : ""));
  };
  const bool no_step = step.is_none() || step.is_undefined();
  *st = no_step ? 1 : as_index(step, "step");
  if (*st == 0) raise("ValueError", "slice step cannot be zero");
  const int64_t lower = *st < 0 ? -1 : 0, upper = *st < 0 ? n - 1 : n;
  auto clamp = [&](const Value& v, int64_t dflt) {
    if (v.is_none() || v.is_undefined()) return dflt;
    int64_t i = as_index(v, "");
    if (i < 0) {
      i += n;
      if (i < lower) i = lower;
    } else if (i > upper) {
      i = upper;
    }
    return i;
  };
  *lo = clamp(start, *st < 0 ? upper : lower);
  *hi = clamp(stop, *st < 0 ? lower : upper);
}

}  // namespace

Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_list()) {
    const List& l = obj.list();
    int64_t lo, hi, st;
    slice_indices(start, stop, step, static_cast<int64_t>(l.size()), &lo, &hi, &st);
    List out;
    if (st > 0)
      for (int64_t i = lo; i < hi; i += st) out.push_back(l[static_cast<size_t>(i)]);
    else
      for (int64_t i = lo; i > hi; i += st) out.push_back(l[static_cast<size_t>(i)]);
    return Value(std::move(out), obj.is_tuple());
  }
  if (obj.is_string()) {
    const std::string& s = obj.str_ref();
    std::vector<size_t> starts;  // byte offset of each code point
    for (size_t i = 0; i < s.size(); i += utf8::sequence_length(s[i])) starts.push_back(i);
    const int64_t n = static_cast<int64_t>(starts.size());
    int64_t lo, hi, st;
    slice_indices(start, stop, step, n, &lo, &hi, &st);
    auto cp = [&](int64_t i) {
      const size_t b = starts[static_cast<size_t>(i)];
      const size_t e = i + 1 < n ? starts[static_cast<size_t>(i + 1)] : s.size();
      return std::string_view(s).substr(b, e - b);
    };
    std::string out;
    if (st == 1) {
      if (lo < hi) {
        const size_t b = starts[static_cast<size_t>(lo)];
        const size_t e = hi < n ? starts[static_cast<size_t>(hi)] : s.size();
        out = s.substr(b, e - b);
      }
    } else if (st > 0) {
      for (int64_t i = lo; i < hi; i += st) out += cp(i);
    } else {
      for (int64_t i = lo; i > hi; i += st) out += cp(i);
    }
    return Value(std::move(out));
  }
  obj.defined();
  raise("TypeError", std::string("'") + obj.type_name() + "' object is not subscriptable");
}

std::shared_ptr<const List> iterate(const Value& v) {
  static const auto kEmpty = std::make_shared<const List>();
  switch (v.kind()) {
    case Kind::kList: return v.list_ptr();
    case Kind::kDict: {
      List keys;
      for (const auto& kv : v.dict().items) keys.emplace_back(kv.first);
      return std::make_shared<const List>(std::move(keys));
    }
    case Kind::kString: {
      List chars;
      const std::string& s = v.str_ref();
      for (size_t i = 0; i < s.size();) {
        const size_t len = utf8::sequence_length(s[i]);
        chars.emplace_back(s.substr(i, len));
        i += len;
      }
      return std::make_shared<const List>(std::move(chars));
    }
    case Kind::kIterator: return std::make_shared<const List>(v.consume());
    case Kind::kUndefined: return kEmpty;
    default: raise("TypeError", std::string("'") + v.type_name() + "' object is not iterable");
  }
}

int64_t length(const Value& v) {
  switch (v.kind()) {
    case Kind::kString: return static_cast<int64_t>(utf8_count(v.str_ref()));
    case Kind::kList: return static_cast<int64_t>(v.list().size());
    case Kind::kDict: return static_cast<int64_t>(v.dict().items.size());
    case Kind::kUndefined: return 0;
    default: raise("TypeError", std::string("object of type '") + v.type_name() + "' has no len()");
  }
}

// ------------------------------------------------------------------------------ json.dumps

namespace {

void dump_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
          if (c < 0x20) append_hex(out, "\\u", c, 4);
          else out += static_cast<char>(c);
      }
      continue;
    }
    const size_t start = i;
    const char32_t cp = utf8::next(s, i);
    if (!ensure_ascii) {
      out.append(s.substr(start, i - start));
    } else if (cp >= 0x10000) {
      const uint32_t v = cp - 0x10000;
      append_hex(out, "\\u", 0xD800 + (v >> 10), 4);
      append_hex(out, "\\u", 0xDC00 + (v & 0x3FF), 4);
    } else {
      append_hex(out, "\\u", cp, 4);
    }
  }
  out += '"';
}

void dump(std::string& out, const Value& v, const JsonOptions& o, const std::string& indent_unit,
          int depth) {
  auto newline = [&](int d) {
    out += '\n';
    for (int i = 0; i < d; ++i) out += indent_unit;
  };
  const bool pretty = o.indent >= 0 || !o.indent_str.empty();
  switch (v.kind()) {
    case Kind::kNone: out += "null"; return;
    case Kind::kBool: out += v.as_bool() ? "true" : "false"; return;
    case Kind::kInt: out += std::to_string(v.as_int()); return;
    case Kind::kFloat: {
      const double f = v.as_float();
      if (std::isnan(f)) out += "NaN";
      else if (std::isinf(f)) out += f > 0 ? "Infinity" : "-Infinity";
      else out += float_repr(f);
      return;
    }
    case Kind::kString: dump_string(out, v.str_ref(), o.ensure_ascii); return;
    case Kind::kList: {
      const List& l = v.list();
      if (l.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < l.size(); ++i) {
        if (i) out += o.item_sep;
        if (pretty) newline(depth + 1);
        dump(out, l[i], o, indent_unit, depth + 1);
      }
      if (pretty) newline(depth);
      out += ']';
      return;
    }
    case Kind::kDict: {
      const Dict& d = v.dict();
      if (d.items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : d.items) items.push_back(&kv);
      if (o.sort_keys)
        std::stable_sort(items.begin(), items.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += o.item_sep;
        if (pretty) newline(depth + 1);
        dump_string(out, items[i]->first, o.ensure_ascii);
        out += o.key_sep;
        dump(out, items[i]->second, o, indent_unit, depth + 1);
      }
      if (pretty) newline(depth);
      out += '}';
      return;
    }
    default:
      raise("TypeError",
            std::string("Object of type ") + v.type_name() + " is not JSON serializable");
  }
}

}  // namespace

std::string dumps(const Value& v, const JsonOptions& options) {
  JsonOptions o = options;
  const bool pretty = o.indent >= 0 || !o.indent_str.empty();
  if (!o.separators_given && pretty) o.item_sep = ",";
  const std::string unit = o.indent_str.empty()
                               ? std::string(static_cast<size_t>(std::max(o.indent, 0)), ' ')
                               : o.indent_str;
  std::string out;
  dump(out, v, o, unit, 0);
  return out;
}

}  // namespace ninfer::jinja
