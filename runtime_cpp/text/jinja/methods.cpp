// Python's str, dict and list methods that chat templates call (`s.strip()`,
// `d.items()`, ...: call_method), and the string algorithms over code points that the
// filters share (builtin_args.h). Methods that would change a list or dict raise
// SecurityError, as the sandbox does.
#include <algorithm>

#include "text/jinja/builtin_args.h"
#include "text/jinja/builtins.h"
#include "text/utf8.h"

namespace ninfer::jinja {

using namespace detail;  // NOLINT

namespace {

// Simple case mapping for ASCII, Latin-1, Greek and Cyrillic (Python's full Unicode mapping
// beyond these is not implemented; chat templates change the case of role names and types).
char32_t to_upper(char32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if (c < 0x80) return c;
  if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 32;
  if (c == 0xFF) return 0x178;
  if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) return c - 32;
  if (c == 0x3C2) return 0x3A3;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  return c;
}

char32_t to_lower(char32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c < 0x80) return c;
  if ((c >= 0xC0 && c <= 0xDE && c != 0xD7)) return c + 32;
  if (c == 0x178) return 0xFF;
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  return c;
}

bool is_cased(char32_t c) { return to_upper(c) != c || to_lower(c) != c; }

std::string map_case(std::string_view s, char32_t (*f)(char32_t)) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const char32_t c = utf8::next(s, i);
    if (c == 0xDF && f == to_upper) {
      out += "SS";
      continue;
    }
    utf8::append(out, f(c));
  }
  return out;
}

}  // namespace

// ------------------------------------------------------------------------------ shared

namespace detail {

std::vector<char32_t> code_points(std::string_view s) {
  std::vector<char32_t> out;
  for (size_t i = 0; i < s.size();) out.push_back(utf8::next(s, i));
  return out;
}

std::string encode(const std::vector<char32_t>& cps, size_t b, size_t e) {
  std::string out;
  for (size_t i = b; i < e; ++i) utf8::append(out, cps[i]);
  return out;
}

std::string py_capitalize(std::string_view s) {
  auto cps = code_points(s);
  std::string out;
  for (size_t i = 0; i < cps.size(); ++i)
    utf8::append(out, i == 0 ? to_upper(cps[i]) : to_lower(cps[i]));
  return out;
}

std::string jinja_title(std::string_view s) {  // the title filter: words split at [-\s({[<]+
  auto cps = code_points(s);
  std::string out;
  bool word_start = true;
  for (char32_t c : cps) {
    const bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || is_python_space(c);
    if (sep) {
      utf8::append(out, c);
      word_start = true;
    } else {
      utf8::append(out, word_start ? to_upper(c) : to_lower(c));
      word_start = false;
    }
  }
  return out;
}

std::string replace_all(const std::string& s, const std::string& old, const std::string& repl,
                        int64_t count) {
  std::string out;
  if (old.empty()) {  // Python inserts `repl` between every code point
    auto cps = code_points(s);
    int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += repl;
        ++done;
      }
      if (i < cps.size()) utf8::append(out, cps[i]);
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(old, pos);
    if (at == std::string::npos) break;
    out.append(s, pos, at - pos);
    out += repl;
    pos = at + old.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

std::vector<std::string> splitlines(const std::string& s, bool keepends) {
  std::vector<std::string> out;
  auto cps = code_points(s);
  size_t b = 0, i = 0;
  while (i < cps.size()) {
    const char32_t c = cps[i];
    const bool brk = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D ||
                     c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) {
      ++i;
      continue;
    }
    size_t e = i + 1;
    if (c == '\r' && e < cps.size() && cps[e] == '\n') ++e;
    out.push_back(encode(cps, b, keepends ? e : i));
    b = i = e;
  }
  if (b < cps.size()) out.push_back(encode(cps, b, cps.size()));
  return out;
}

Value items_list(const Dict& d) {
  List out;
  out.reserve(d.items.size());
  for (const auto& [k, v] : d.items) out.emplace_back(List{Value(k), v}, true);
  return Value(std::move(out));
}

}  // namespace detail

namespace {

// ------------------------------------------------------------------------------ str

std::string py_title(std::string_view s) {  // str.title()
  std::string out;
  bool prev_cased = false;
  for (size_t i = 0; i < s.size();) {
    const char32_t c = utf8::next(s, i);
    utf8::append(out, prev_cased ? to_lower(c) : to_upper(c));
    prev_cased = is_cased(c);
  }
  return out;
}

std::vector<std::string> split_whitespace(std::string_view s, int64_t maxsplit) {
  auto cps = code_points(s);
  std::vector<std::string> out;
  size_t i = 0, n = cps.size();
  while (i < n) {
    while (i < n && is_python_space(cps[i])) ++i;
    if (i == n) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      size_t e = n;
      while (e > i && is_python_space(cps[e - 1])) --e;
      out.push_back(encode(cps, i, e));
      break;
    }
    size_t j = i;
    while (j < n && !is_python_space(cps[j])) ++j;
    out.push_back(encode(cps, i, j));
    i = j;
  }
  return out;
}

std::vector<std::string> rsplit_whitespace(std::string_view s, int64_t maxsplit) {
  auto cps = code_points(s);
  std::vector<std::string> out;
  size_t e = cps.size();
  while (e > 0) {
    while (e > 0 && is_python_space(cps[e - 1])) --e;
    if (e == 0) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      size_t b = 0;
      while (b < e && is_python_space(cps[b])) ++b;
      out.push_back(encode(cps, b, e));
      break;
    }
    size_t b = e;
    while (b > 0 && !is_python_space(cps[b - 1])) --b;
    out.push_back(encode(cps, b, e));
    e = b;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> split_sep(const std::string& s, const std::string& sep, int64_t maxsplit) {
  if (sep.empty()) raise("ValueError", "empty separator");
  std::vector<std::string> out;
  size_t pos = 0;
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    const size_t at = s.find(sep, pos);
    if (at == std::string::npos) break;
    out.push_back(s.substr(pos, at - pos));
    pos = at + sep.size();
  }
  out.push_back(s.substr(pos));
  return out;
}

std::vector<std::string> rsplit_sep(const std::string& s, const std::string& sep,
                                    int64_t maxsplit) {
  if (sep.empty()) raise("ValueError", "empty separator");
  std::vector<std::string> out;
  size_t end = s.size();
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    if (end < sep.size()) break;
    const size_t at = s.rfind(sep, end - sep.size());
    if (at == std::string::npos) break;
    out.push_back(s.substr(at + sep.size(), end - at - sep.size()));
    end = at;
  }
  out.push_back(s.substr(0, end));
  std::reverse(out.begin(), out.end());
  return out;
}

List string_list(std::vector<std::string> parts) {
  List out;
  out.reserve(parts.size());
  for (auto& p : parts) out.emplace_back(std::move(p));
  return out;
}

bool affix_match(const std::string& s, const Value& affix, bool start, const char* method) {
  auto one = [&](const std::string& a) {
    if (a.size() > s.size()) return false;
    return start ? s.compare(0, a.size(), a) == 0
                 : s.compare(s.size() - a.size(), a.size(), a) == 0;
  };
  if (affix.is_string()) return one(affix.str_ref());
  if (affix.is_tuple()) {
    for (const auto& a : affix.list()) {
      if (!a.is_string())
        type_error(std::string("tuple for ") + method + " must only contain str, not " +
                   a.type_name());
      if (one(a.str_ref())) return true;
    }
    return false;
  }
  affix.defined();
  type_error(std::string(method) + " first arg must be str or a tuple of str, not " +
             affix.type_name());
}

int64_t cp_index(const std::string& s, size_t byte_pos) {
  return static_cast<int64_t>(utf8_count(std::string_view(s).substr(0, byte_pos)));
}

Value str_method(const Value& self, std::string_view name, const Args& a) {
  const std::string& s = self.str_ref();
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    Bound b(a, std::string(name).c_str(), {"chars"});
    return Value(py_strip(s, b.get(0, kNone), name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    Bound b(a, std::string(name).c_str(), {"sep", "maxsplit"});
    const Value& sep = b.get(0, kNone);
    const int64_t maxsplit = b.has(1) ? need_int(*b[1], "") : -1;
    if (sep.is_none())
      return Value(string_list(name == "split" ? split_whitespace(s, maxsplit)
                                               : rsplit_whitespace(s, maxsplit)));
    const std::string& sp = need_str(sep, "sep");
    return Value(
        string_list(name == "split" ? split_sep(s, sp, maxsplit) : rsplit_sep(s, sp, maxsplit)));
  }
  if (name == "startswith" || name == "endswith") {
    Bound b(a, std::string(name).c_str(), {"prefix"});
    if (!b.has(0)) type_error(std::string(name) + "() takes at least 1 argument (0 given)");
    return Value(affix_match(s, *b[0], name == "startswith", std::string(name).c_str()));
  }
  if (name == "replace") {
    if (a.pos.size() < 2) type_error("replace expected at least 2 arguments");
    Bound b(a, "replace", {"old", "new", "count"});
    return Value(replace_all(s, need_str(*b[0], "replace() argument 1"),
                             need_str(*b[1], "replace() argument 2"),
                             b.has(2) ? need_int(*b[2], "") : -1));
  }
  if (name == "upper") return Value(py_upper(s));
  if (name == "lower") return Value(py_lower(s));
  if (name == "title") return Value(py_title(s));
  if (name == "capitalize") return Value(py_capitalize(s));
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    Bound b(a, std::string(name).c_str(), {"sub"});
    if (!b.has(0)) type_error(std::string(name) + "() takes at least 1 argument (0 given)");
    const std::string& sub = need_str(*b[0], "must be str");
    if (name == "count") {
      if (sub.empty()) return Value(static_cast<int64_t>(utf8_count(s)) + 1);
      int64_t n = 0;
      for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
      return Value(n);
    }
    const size_t at = (name == "find" || name == "index") ? s.find(sub) : s.rfind(sub);
    if (at == std::string::npos) {
      if (name == "index" || name == "rindex") raise("ValueError", "substring not found");
      return Value(-1);
    }
    return Value(cp_index(s, at));
  }
  if (name == "join") {
    Bound b(a, "join", {"iterable"});
    std::string out;
    auto items = iterate(b.get(0, kUndef));
    for (size_t i = 0; i < items->size(); ++i) {
      const Value& x = (*items)[i];
      if (!x.is_string())
        type_error("sequence item " + std::to_string(i) + ": expected str instance, " +
                   x.type_name() + " found");
      if (i) out += s;
      out += x.str_ref();
    }
    return Value(std::move(out));
  }
  if (name == "splitlines") {
    Bound b(a, "splitlines", {"keepends"});
    return Value(string_list(splitlines(s, b.get(0, kFalse).truthy())));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    Bound b(a, std::string(name).c_str(), {"affix"});
    const std::string& x = need_str(b.get(0, kUndef), "argument");
    if (name == "removeprefix")
      return Value(s.compare(0, x.size(), x) == 0 && x.size() <= s.size() ? s.substr(x.size()) : s);
    const bool ends = x.size() <= s.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
    return Value(ends ? s.substr(0, s.size() - x.size()) : s);
  }
  if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isalnum" ||
      name == "isupper" || name == "islower") {
    auto cps = code_points(s);
    if (name == "isupper" || name == "islower") {
      bool any = false;
      for (char32_t c : cps) {
        if (!is_cased(c)) continue;
        any = true;
        if ((name == "isupper") != (to_upper(c) == c)) return Value(false);
      }
      return Value(any);
    }
    if (cps.empty()) return Value(false);
    for (char32_t c : cps) {
      const bool digit = c >= '0' && c <= '9';
      const bool alpha =
          (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= 0x80 && is_cased(c));
      bool ok = name == "isdigit"   ? digit
                : name == "isspace" ? is_python_space(c)
                : name == "isalpha" ? alpha
                                    : alpha || digit;
      if (!ok) return Value(false);
    }
    return Value(true);
  }
  raise("TypeError", "str." + std::string(name) + "() is not supported by ninfer's chat templates");
}

// ------------------------------------------------------------------------------ dict, list

Value dict_method(const Value& self, std::string_view name, const Args& a) {
  const Dict& d = self.dict();
  if (name == "get") {
    if (a.pos.empty() || a.pos.size() > 2 || !a.kw.empty())
      type_error("get expected at most 2 arguments, got " + std::to_string(a.pos.size()));
    const Value* v = a.pos[0].is_string() ? d.find(a.pos[0].str_ref()) : nullptr;
    return v ? *v : (a.pos.size() > 1 ? a.pos[1] : kNone);
  }
  if (name == "items") return items_list(d);
  if (name == "keys" || name == "values") {
    List out;
    for (const auto& [k, v] : d.items) out.push_back(name == "keys" ? Value(k) : v);
    return Value(std::move(out));
  }
  if (name == "copy") return self;
  raise("SecurityError",
        "access to attribute '" + std::string(name) + "' of 'dict' object is unsafe.");
}

Value list_method(const Value& self, std::string_view name, const Args& a) {
  const List& l = self.list();
  if (name == "count" || name == "index") {
    if (a.pos.size() != 1) type_error(std::string(name) + "() takes exactly one argument");
    int64_t n = 0;
    for (size_t i = 0; i < l.size(); ++i) {
      if (!equal(l[i], a.pos[0])) continue;
      if (name == "index") return Value(static_cast<int64_t>(i));
      ++n;
    }
    if (name == "index") raise("ValueError", a.pos[0].repr() + " is not in list");
    return Value(n);
  }
  if (name == "copy") return self;
  raise("SecurityError", "access to attribute '" + std::string(name) + "' of '" + self.type_name() +
                             "' object is unsafe.");
}

}  // namespace

// ------------------------------------------------------------------------------ public

std::string py_strip(std::string_view s, const Value& chars, bool left, bool right) {
  std::vector<char32_t> set;
  const bool ws = chars.is_none() || chars.is_undefined();
  if (!ws) {
    if (!chars.is_string()) type_error("strip arg must be None or str");
    set = code_points(chars.str_ref());
  }
  auto strip_it = [&](char32_t c) {
    return ws ? is_python_space(c) : std::find(set.begin(), set.end(), c) != set.end();
  };
  // Byte offsets of the kept range.
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e) {
      size_t i = b;
      if (!strip_it(utf8::next(s, i))) break;
      b = i;
    }
  }
  if (right) {
    while (e > b) {
      size_t start = e - 1;
      while (start > b && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
      size_t i = start;
      if (!strip_it(utf8::next(s, i))) break;
      e = start;
    }
  }
  return std::string(s.substr(b, e - b));
}

std::string py_upper(std::string_view s) { return map_case(s, to_upper); }
std::string py_lower(std::string_view s) { return map_case(s, to_lower); }

std::vector<std::string> method_names() {
  return {"str.strip",        "str.lstrip",     "str.rstrip",  "str.split",      "str.rsplit",
          "str.startswith",   "str.endswith",   "str.replace", "str.upper",      "str.lower",
          "str.title",        "str.capitalize", "str.find",    "str.rfind",      "str.index",
          "str.rindex",       "str.count",      "str.join",    "str.splitlines", "str.removeprefix",
          "str.removesuffix", "str.isdigit",    "str.isspace", "str.isalpha",    "str.isalnum",
          "str.isupper",      "str.islower",    "dict.get",    "dict.items",     "dict.keys",
          "dict.values",      "dict.copy",      "list.count",  "list.index",     "list.copy"};
}

Value call_method(const Value& obj, std::string_view name, const Args& args) {
  Value m = getattr(obj, name);
  if (m.kind() == Kind::kMethod) {
    const Value& self = m.method_self();
    if (self.is_string()) return str_method(self, name, args);
    if (self.is_dict()) return dict_method(self, name, args);
    if (self.is_list()) return list_method(self, name, args);
  }
  return call_value(m, args);
}

}  // namespace ninfer::jinja
