// Reaching into values: `obj.name` and `obj[key]` with Jinja's attribute/item rules (the
// methods of str, dict and list are attributes), slices with Python's index rules over code
// points, what `for` iterates and len().
#include <algorithm>

#include "text/jinja/value.h"
#include "text/utf8.h"

namespace ninfer::jinja {

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

}  // namespace ninfer::jinja
