#include "text/jinja/builtins.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <functional>
#include <initializer_list>

#include "text/utf8.h"

namespace ninfer::jinja {
namespace {

// ------------------------------------------------------------------------------ arguments

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
      size_t i = 0;
      for (const char* p : params) {
        if (k == p) break;
        ++i;
      }
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

const Value kNone = Value::none();
const Value kFalse = Value(false);
const Value kUndef;

[[noreturn]] void type_error(const std::string& msg) { raise("TypeError", msg); }

// soft_str: what filters turn their input into (str(); undefined is '').
std::string soft_str(const Value& v) { return v.str(); }

// ------------------------------------------------------------------------------ strings

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

std::string py_capitalize(std::string_view s) {
  auto cps = code_points(s);
  std::string out;
  for (size_t i = 0; i < cps.size(); ++i)
    utf8::append(out, i == 0 ? to_upper(cps[i]) : to_lower(cps[i]));
  return out;
}

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

List string_list(std::vector<std::string> parts) {
  List out;
  out.reserve(parts.size());
  for (auto& p : parts) out.emplace_back(std::move(p));
  return out;
}

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

Value items_list(const Dict& d) {
  List out;
  out.reserve(d.items.size());
  for (const auto& [k, v] : d.items) out.emplace_back(List{Value(k), v}, true);
  return Value(std::move(out));
}

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

// ------------------------------------------------------------------------------ filters

// A dotted attribute path ("a.b", integer parts as indices), as make_attrgetter.
Value attr_path(const Value& item, const Value& attribute) {
  if (attribute.is_int()) return getitem(item, attribute);
  const std::string path = attribute.str();
  Value cur = item;
  size_t pos = 0;
  while (true) {
    const size_t dot = path.find('.', pos);
    std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    cur = digits ? getitem(cur, Value(static_cast<int64_t>(std::stoll(part))))
                 : getitem(cur, Value(part));
    if (dot == std::string::npos) break;
    pos = dot + 1;
  }
  return cur;
}

Value ignore_case(const Value& v) { return v.is_string() ? Value(py_lower(v.str_ref())) : v; }

List to_list(const Value& v) { return *iterate(v); }

Value f_abs(const Value& v, const Args&) {
  if (v.is_float()) return Value(std::fabs(v.as_float()));
  if (v.is_number()) return Value(static_cast<int64_t>(std::llabs(v.as_int())));
  v.defined();
  type_error(std::string("bad operand type for abs(): '") + v.type_name() + "'");
}

Value f_attr(const Value& v, const Args& a) {
  Bound b(a, "attr", {"name"});
  return getattr(v, need_str(b.get(0, kUndef), "attribute name"));
}

Value f_capitalize(const Value& v, const Args&) { return Value(py_capitalize(soft_str(v))); }

Value f_center(const Value& v, const Args& a) {
  Bound b(a, "center", {"width"});
  const std::string s = v.str();
  const int64_t width = b.has(0) ? need_int(*b[0], "") : 80;
  const int64_t n = static_cast<int64_t>(utf8_count(s));
  if (width <= n) return Value(s);
  const int64_t pad = width - n, left = pad / 2 + (pad & width & 1);
  return Value(std::string(static_cast<size_t>(left), ' ') + s +
               std::string(static_cast<size_t>(pad - left), ' '));
}

Value f_length(const Value& v, const Args&) { return Value(length(v)); }

Value f_default(const Value& v, const Args& a) {
  Bound b(a, "default", {"default_value", "boolean"});
  static const Value kEmpty = Value(std::string());
  if (v.is_undefined() || (b.get(1, kFalse).truthy() && !v.truthy())) return b.get(0, kEmpty);
  return v;
}

Value f_dictsort(const Value& v, const Args& a) {
  Bound b(a, "dictsort", {"case_sensitive", "by", "reverse"});
  const bool cs = b.get(0, kFalse).truthy();
  const std::string by = b.has(1) ? b[1]->str() : "key";
  if (by != "key" && by != "value")
    raise("FilterArgumentError", "You can only sort by either \"key\" or \"value\"");
  if (!v.is_dict()) {
    v.defined();
    raise("AttributeError", std::string("'") + v.type_name() + "' object has no attribute 'items'");
  }
  List items = items_list(v.dict()).list();
  const size_t pos = by == "key" ? 0 : 1;
  auto key = [&](const Value& item) {
    const Value& x = item.list()[pos];
    return cs ? x : ignore_case(x);
  };
  const bool rev = b.get(2, kFalse).truthy();
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return rev ? less(key(y), key(x)) : less(key(x), key(y));
  });
  return Value(std::move(items));
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

Value f_escape(const Value& v, const Args&) {
  if (v.is_none()) return Value(std::string("None"));
  return Value(html_escape(v.str()));
}

Value f_first(const Value& v, const Args&) {
  List l = to_list(v);
  if (l.empty()) return Value::undefined("No first item, sequence was empty.");
  return l.front();
}

Value f_last(const Value& v, const Args&) {
  if (v.is_iterator() || v.kind() == Kind::kNone || v.is_number())
    type_error(std::string("'") + v.type_name() + "' object is not reversible");
  List l = to_list(v);
  if (l.empty()) return Value::undefined("No last item, sequence was empty.");
  return l.back();
}

bool parse_int(std::string s, int64_t* out) {
  // int(str): optional whitespace, sign, digits with single underscores.
  auto cps = code_points(s);
  size_t b = 0, e = cps.size();
  while (b < e && is_python_space(cps[b])) ++b;
  while (e > b && is_python_space(cps[e - 1])) --e;
  std::string t = encode(cps, b, e);
  if (t.empty()) return false;
  size_t i = 0;
  bool negative = false;
  if (t[0] == '+' || t[0] == '-') {
    negative = t[0] == '-';
    ++i;
  }
  if (i == t.size()) return false;
  int64_t n = 0;
  bool prev_digit = false;
  for (; i < t.size(); ++i) {
    if (t[i] == '_' && prev_digit && i + 1 < t.size()) {
      prev_digit = false;
      continue;
    }
    if (t[i] < '0' || t[i] > '9') return false;
    n = n * 10 + (t[i] - '0');
    prev_digit = true;
  }
  if (!prev_digit) return false;
  *out = negative ? -n : n;
  return true;
}

bool parse_float(const std::string& s, double* out) {
  auto cps = code_points(s);
  size_t b = 0, e = cps.size();
  while (b < e && is_python_space(cps[b])) ++b;
  while (e > b && is_python_space(cps[e - 1])) --e;
  std::string t = encode(cps, b, e);
  if (t.empty()) return false;
  std::string lower = py_lower(t);
  const std::string body = (lower[0] == '+' || lower[0] == '-') ? lower.substr(1) : lower;
  if (body == "inf" || body == "infinity" || body == "nan") {
    *out = body == "nan" ? NAN : (lower[0] == '-' ? -INFINITY : INFINITY);
    return true;
  }
  for (char c : t)
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == 'E' ||
          c == '+' || c == '-'))
      return false;
  char* end = nullptr;
  *out = std::strtod(t.c_str(), &end);
  return end && *end == '\0';
}

Value f_int(const Value& v, const Args& a) {
  Bound b(a, "int", {"default", "base"});
  static const Value kZero = Value(0);
  if (v.is_int() || v.is_bool()) return Value(v.as_int());
  if (v.is_float() && std::isfinite(v.as_float()))
    return Value(static_cast<int64_t>(std::trunc(v.as_float())));
  if (v.is_string()) {
    int64_t n;
    if ((!b.has(1) || b[1]->as_int() == 10) && parse_int(v.str_ref(), &n)) return Value(n);
    double f;
    if (parse_float(v.str_ref(), &f) && std::isfinite(f))
      return Value(static_cast<int64_t>(std::trunc(f)));
  }
  return b.get(0, kZero);
}

Value f_float(const Value& v, const Args& a) {
  Bound b(a, "float", {"default"});
  static const Value kZero = Value(0.0);
  if (v.is_number()) return Value(v.as_float());
  double f;
  if (v.is_string() && parse_float(v.str_ref(), &f)) return Value(f);
  return b.get(0, kZero);
}

Value f_join(const Value& v, const Args& a) {
  Bound b(a, "join", {"d", "attribute"});
  const std::string sep = b.has(0) ? b[0]->str() : "";
  List items = to_list(v);
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    (b.has(1) && !b[1]->is_none() ? attr_path(items[i], *b[1]) : items[i]).append_str(out);
  }
  return Value(std::move(out));
}

Value f_list(const Value& v, const Args&) { return Value(to_list(v)); }

Value f_lower(const Value& v, const Args&) { return Value(py_lower(soft_str(v))); }
Value f_upper(const Value& v, const Args&) { return Value(py_upper(soft_str(v))); }
Value f_title(const Value& v, const Args&) { return Value(jinja_title(soft_str(v))); }

Value f_items(const Value& v, const Args&) {
  if (v.is_undefined()) return Value::iterator({});
  if (!v.is_dict()) type_error("Can only get item pairs from a mapping.");
  return Value::iterator(items_list(v.dict()).list());
}

Value apply_filter(const std::string& name, const Value& v, const Args& a);
bool apply_test(const std::string& name, const Value& v, const Args& a);

Value f_map(const Value& v, const Args& a) {
  List items = v.truthy() ? to_list(v) : List{};
  List out;
  if (a.pos.empty()) {
    const Value* attribute = nullptr;
    const Value* dflt = nullptr;
    for (const auto& [k, x] : a.kw) {
      if (k == "attribute") attribute = &x;
      else if (k == "default") dflt = &x;
      else raise("FilterArgumentError", "Unexpected keyword argument '" + k + "'");
    }
    if (!attribute) raise("FilterArgumentError", "map requires a filter argument");
    for (const auto& item : items) {
      Value x = attr_path(item, *attribute);
      out.push_back(x.is_undefined() && dflt ? *dflt : x);
    }
    return Value::iterator(std::move(out));
  }
  const std::string name = need_str(a.pos[0], "filter name");
  Args rest{List(a.pos.begin() + 1, a.pos.end()), a.kw};
  for (const auto& item : items) out.push_back(apply_filter(name, item, rest));
  return Value::iterator(std::move(out));
}

Value select_or_reject(const Value& v, const Args& a, bool select, bool attr) {
  List out;
  if (!v.truthy()) return Value::iterator({});
  size_t off = 0;
  const Value* attribute = nullptr;
  if (attr) {
    if (a.pos.empty()) raise("FilterArgumentError", "Missing parameter for attribute name");
    attribute = &a.pos[0];
    off = 1;
  }
  const bool has_test = a.pos.size() > off;
  const std::string test = has_test ? need_str(a.pos[off], "test name") : "";
  Args rest{has_test ? List(a.pos.begin() + off + 1, a.pos.end()) : List{}, a.kw};
  for (const auto& item : to_list(v)) {
    const Value x = attribute ? attr_path(item, *attribute) : item;
    const bool ok = has_test ? apply_test(test, x, rest) : x.truthy();
    if (ok == select) out.push_back(item);
  }
  return Value::iterator(std::move(out));
}

Value f_select(const Value& v, const Args& a) { return select_or_reject(v, a, true, false); }
Value f_reject(const Value& v, const Args& a) { return select_or_reject(v, a, false, false); }
Value f_selectattr(const Value& v, const Args& a) { return select_or_reject(v, a, true, true); }
Value f_rejectattr(const Value& v, const Args& a) { return select_or_reject(v, a, false, true); }

Value f_replace(const Value& v, const Args& a) {
  Bound b(a, "replace", {"old", "new", "count"});
  return Value(replace_all(v.str(), b.get(0, kUndef).str(), b.get(1, kUndef).str(),
                           b.has(2) && !b[2]->is_none() ? need_int(*b[2], "") : -1));
}

Value f_reverse(const Value& v, const Args&) {
  if (v.is_string()) return slice(v, kNone, kNone, Value(-1));
  List l = to_list(v);
  std::reverse(l.begin(), l.end());
  if (v.is_list()) return Value::iterator(std::move(l), "list_reverseiterator");
  return Value(std::move(l));
}

Value f_round(const Value& v, const Args& a) {
  Bound b(a, "round", {"precision", "method"});
  const int64_t precision = b.has(0) ? need_int(*b[0], "") : 0;
  const std::string method = b.has(1) ? b[1]->str() : "common";
  if (method != "common" && method != "ceil" && method != "floor")
    raise("FilterArgumentError", "method must be common, ceil or floor");
  if (!v.is_number()) {
    v.defined();
    type_error(std::string("type ") + v.type_name() + " doesn't define __round__ method");
  }
  const double x = v.as_float(), scale = std::pow(10.0, static_cast<double>(precision));
  if (method == "ceil") return Value(std::ceil(x * scale) / scale);
  if (method == "floor") return Value(std::floor(x * scale) / scale);
  if (v.is_int() && precision >= 0) return Value(v.as_int());  // round(int) stays int
  // Python rounds half to even on the decimal value; near enough for templates.
  return Value(std::nearbyint(x * scale) / scale);
}

Value f_safe(const Value& v, const Args&) { return Value(v.str()); }
Value f_string(const Value& v, const Args&) { return Value(v.str()); }

Value f_sort(const Value& v, const Args& a) {
  Bound b(a, "sort", {"reverse", "case_sensitive", "attribute"});
  const bool rev = b.get(0, kFalse).truthy(), cs = b.get(1, kFalse).truthy();
  const Value* attribute = b.has(2) && !b[2]->is_none() ? b[2] : nullptr;
  List l = to_list(v);
  auto key = [&](const Value& x) {
    Value k = attribute ? attr_path(x, *attribute) : x;
    return cs ? k : ignore_case(k);
  };
  std::stable_sort(l.begin(), l.end(), [&](const Value& x, const Value& y) {
    return rev ? less(key(y), key(x)) : less(key(x), key(y));
  });
  return Value(std::move(l));
}

Value f_unique(const Value& v, const Args& a) {
  Bound b(a, "unique", {"case_sensitive", "attribute"});
  const bool cs = b.get(0, kFalse).truthy();
  const Value* attribute = b.has(1) && !b[1]->is_none() ? b[1] : nullptr;
  List out, seen;
  for (const auto& x : to_list(v)) {
    Value k = attribute ? attr_path(x, *attribute) : x;
    if (!cs) k = ignore_case(k);
    bool dup = false;
    for (const auto& s : seen) dup = dup || equal(s, k);
    if (dup) continue;
    seen.push_back(k);
    out.push_back(x);
  }
  return Value::iterator(std::move(out));
}

Value min_max(const Value& v, const Args& a, bool max) {
  Bound b(a, max ? "max" : "min", {"case_sensitive", "attribute"});
  const bool cs = b.get(0, kFalse).truthy();
  const Value* attribute = b.has(1) && !b[1]->is_none() ? b[1] : nullptr;
  List l = to_list(v);
  if (l.empty()) return Value::undefined(std::string("No aggregated item, sequence was empty."));
  auto key = [&](const Value& x) {
    Value k = attribute ? attr_path(x, *attribute) : x;
    return cs ? k : ignore_case(k);
  };
  size_t best = 0;
  for (size_t i = 1; i < l.size(); ++i)
    if (max ? less(key(l[best]), key(l[i])) : less(key(l[i]), key(l[best]))) best = i;
  return l[best];
}

Value f_min(const Value& v, const Args& a) { return min_max(v, a, false); }
Value f_max(const Value& v, const Args& a) { return min_max(v, a, true); }

Value f_sum(const Value& v, const Args& a) {
  Bound b(a, "sum", {"attribute", "start"});
  Value total = b.has(1) ? *b[1] : Value(0);
  for (const auto& x : to_list(v)) total = add(total, b.has(0) ? attr_path(x, *b[0]) : x);
  return total;
}

Value f_trim(const Value& v, const Args& a) {
  Bound b(a, "trim", {"chars"});
  return Value(py_strip(soft_str(v), b.get(0, kNone), true, true));
}

Value f_indent(const Value& v, const Args& a) {
  Bound b(a, "indent", {"width", "first", "blank"});
  std::string ind;
  if (b.has(0) && b[0]->is_string()) ind = b[0]->str_ref();
  else ind = std::string(static_cast<size_t>(b.has(0) ? need_int(*b[0], "") : 4), ' ');
  const bool first = b.get(1, kFalse).truthy(), blank = b.get(2, kFalse).truthy();
  const std::vector<std::string> lines = splitlines(v.str() + "\n", false);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) rv += (i ? "\n" + ind : "") + lines[i];
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i)
      rv += "\n" + (lines[i].empty() ? lines[i] : ind + lines[i]);
  }
  if (first) rv = ind + rv;
  return Value(std::move(rv));
}

Value f_wordcount(const Value& v, const Args&) {
  const std::string s = soft_str(v);
  int64_t n = 0;
  bool in_word = false;
  for (size_t i = 0; i < s.size();) {
    const char32_t c = utf8::next(s, i);
    const bool w = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                   c == '_' ||
                   (c >= 0x80 && !is_python_space(c) && !(c >= 0x2000 && c <= 0x206F) &&
                    !(c >= 0x3000 && c <= 0x303F));
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value(n);
}

Value f_tojson(const Value& v, const Args& a) {
  Bound b(a, "tojson", {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonOptions o;
  o.ensure_ascii = b.get(0, kFalse).truthy();
  if (b.has(1) && !b[1]->is_none()) {
    if (b[1]->is_string()) o.indent_str = b[1]->str_ref();
    else o.indent = static_cast<int>(need_int(*b[1], ""));
  }
  if (b.has(2) && !b[2]->is_none()) {
    const Value& sep = *b[2];
    if (!sep.is_list() || sep.list().size() != 2)
      raise("ValueError", "separators must be a (item_separator, key_separator) pair");
    o.item_sep = need_str(sep.list()[0], "separator");
    o.key_sep = need_str(sep.list()[1], "separator");
    o.separators_given = true;
  }
  o.sort_keys = b.get(3, kFalse).truthy();
  return Value(dumps(v, o));
}

struct FilterEntry {
  const char* name;
  FilterFn fn;
};

const FilterEntry kFilters[] = {
    {"abs", f_abs},
    {"attr", f_attr},
    {"capitalize", f_capitalize},
    {"center", f_center},
    {"count", f_length},
    {"d", f_default},
    {"default", f_default},
    {"dictsort", f_dictsort},
    {"e", f_escape},
    {"escape", f_escape},
    {"first", f_first},
    {"float", f_float},
    {"indent", f_indent},
    {"int", f_int},
    {"items", f_items},
    {"join", f_join},
    {"last", f_last},
    {"length", f_length},
    {"list", f_list},
    {"lower", f_lower},
    {"map", f_map},
    {"max", f_max},
    {"min", f_min},
    {"reject", f_reject},
    {"rejectattr", f_rejectattr},
    {"replace", f_replace},
    {"reverse", f_reverse},
    {"round", f_round},
    {"safe", f_safe},
    {"select", f_select},
    {"selectattr", f_selectattr},
    {"sort", f_sort},
    {"string", f_string},
    {"sum", f_sum},
    {"title", f_title},
    {"tojson", f_tojson},
    {"trim", f_trim},
    {"unique", f_unique},
    {"upper", f_upper},
    {"wordcount", f_wordcount},
};

Value apply_filter(const std::string& name, const Value& v, const Args& a) {
  FilterFn f = find_filter(name);
  if (!f) raise("TemplateRuntimeError", "No filter named '" + name + "' found.");
  return f(v, a);
}

// ------------------------------------------------------------------------------ tests

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

struct TestEntry {
  const char* name;
  TestFn fn;
};

const TestEntry kTests[] = {
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

bool apply_test(const std::string& name, const Value& v, const Args& a) {
  TestFn t = find_test(name);
  if (!t) raise("TemplateRuntimeError", "No test named '" + name + "' found.");
  return t(v, a);
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

FilterFn find_filter(std::string_view name) {
  for (const auto& f : kFilters)
    if (name == f.name) return f.fn;
  return nullptr;
}

TestFn find_test(std::string_view name) {
  for (const auto& t : kTests)
    if (name == t.name) return t.fn;
  return nullptr;
}

std::vector<std::string> filter_names() {
  std::vector<std::string> out;
  for (const auto& f : kFilters) out.emplace_back(f.name);
  return out;
}

std::vector<std::string> test_names() {
  std::vector<std::string> out;
  for (const auto& t : kTests) out.emplace_back(t.name);
  return out;
}

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

Value make_namespace(const Args& args) {
  Dict d;
  if (!args.pos.empty()) {
    if (args.pos.size() > 1 || !args.pos[0].is_dict())
      type_error("namespace() takes at most one mapping argument");
    d = args.pos[0].dict();
  }
  for (const auto& [k, v] : args.kw) {
    if (!k.empty() && k[0] == '_')
      raise("SecurityError",
            "Chat templates cannot store underscore-prefixed attributes on a "
            "namespace, but got '" +
                k + "'. Please rename the attribute.");
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
  Dict d;
  if (!args.pos.empty()) {
    if (args.pos.size() > 1 || !args.pos[0].is_dict())
      type_error("dict() takes at most one mapping argument");
    d = args.pos[0].dict();
  }
  for (const auto& [k, v] : args.kw) d.set(k, v);
  return Value(std::move(d));
}

void set_namespace_attr(const Value& ns, const std::string& attr, Value value) {
  if (!ns.is_namespace())
    raise("TemplateRuntimeError", "cannot assign attribute on non-namespace object");
  if (!attr.empty() && attr[0] == '_')
    raise("SecurityError",
          "Chat templates cannot store underscore-prefixed attributes on a "
          "namespace, but got '" +
              attr + "'. Please rename the attribute.");
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
