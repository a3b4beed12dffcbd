// Values as text, exactly as Python writes them: str() and repr() of every kind (Value),
// the repr of floats and strings, and json.dumps with its options (dumps()).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "text/jinja/value.h"
#include "text/utf8.h"

namespace ninfer::jinja {

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

// ------------------------------------------------------------------------------ repr

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

// ------------------------------------------------------------------------------ json.dumps

namespace {

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
    case Kind::kString: utf8::append_json_string(out, v.str_ref(), o.ensure_ascii); return;
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
        utf8::append_json_string(out, items[i]->first, o.ensure_ascii);
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
