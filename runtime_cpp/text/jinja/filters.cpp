// Jinja2's filters (`x | join(", ")`, `x | tojson`, ...) over jinja::Value, with Jinja's
// argument names and error messages; find_filter() looks them up by name.
#include <algorithm>
#include <cmath>

#include "text/jinja/builtin_args.h"
#include "text/jinja/builtins.h"
#include "text/utf8.h"

namespace ninfer::jinja {

using namespace detail;  // NOLINT

namespace {

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

// `s` without the whitespace Python's int() and float() allow around a number.
std::string strip_number(const std::string& s) {
  auto cps = code_points(s);
  size_t b = 0, e = cps.size();
  while (b < e && is_python_space(cps[b])) ++b;
  while (e > b && is_python_space(cps[e - 1])) --e;
  return encode(cps, b, e);
}

bool parse_int(std::string s, int64_t* out) {
  // int(str): optional whitespace, sign, digits with single underscores.
  const std::string t = strip_number(s);
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
  const std::string t = strip_number(s);
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
  for (const auto& item : items)
    out.push_back(need_named(find_filter(name), "filter", name)(item, rest));
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
    const bool ok = has_test ? need_named(find_test(test), "test", test)(x, rest) : x.truthy();
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

const Named<FilterFn> kFilters[] = {
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

}  // namespace

FilterFn find_filter(std::string_view name) { return find_named(kFilters, name); }

std::vector<std::string> filter_names() { return names_of(kFilters); }

}  // namespace ninfer::jinja
