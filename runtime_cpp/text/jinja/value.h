// The value type of generated chat templates: Python values as Jinja2 (in transformers'
// ImmutableSandboxedEnvironment) sees them, with Jinja's semantics.
//
// A chat template is compiled ahead of time (compiler/ninfer/frontend/chat_codegen.py): its
// jinja2 AST becomes C++ over this type, and the compiler checks the generated code against
// jinja2 on generated conversations. What is implemented here is therefore held to Python's
// and Jinja2's exact behaviour: truthiness, == between int/float/bool, str() and repr() of
// every kind, json.dumps formatting, code-point (not byte) string indices, the messages of
// UndefinedError and of the TypeErrors templates hit.
//
// Lists and dicts are immutable (the sandbox forbids changing them) and shared by pointer,
// so copying a Value is cheap; a namespace() is the one mutable container. Dict keys are
// strings (the only keys JSON and the corpus of chat templates produce), kept in insertion
// order like a Python dict.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ninfer::jinja {

// A Python exception raised while rendering; `type` is the Python class name
// (TemplateError for raise_exception, UndefinedError, TypeError, ...), what() its message.
class Error : public std::runtime_error {
 public:
  Error(std::string type, const std::string& message)
      : std::runtime_error(message), type(std::move(type)) {}
  std::string type;
};

[[noreturn]] void raise(const char* type, const std::string& message);

class Value;
using List = std::vector<Value>;
struct Dict;

enum class Kind : uint8_t {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,  // also a tuple (is_tuple)
  kDict,
  kNamespace,
  kMethod,    // a bound method looked up as an attribute but not called (e.g. `d.items`)
  kIterator,  // a generator (what selectattr, map, items, ... return): iterable once
};

class Value {
 public:
  Value() = default;  // undefined
  // Out of line: generated templates copy values everywhere, and inlining the shared
  // pointer's reference counting into them only slows their compile.
  Value(const Value& other);
  Value(Value&& other) noexcept;
  Value& operator=(const Value& other);
  Value& operator=(Value&& other) noexcept;
  ~Value();
  Value(bool b) : kind_(Kind::kBool), b_(b) {}                         // NOLINT
  Value(int i) : kind_(Kind::kInt), i_(i) {}                           // NOLINT
  Value(int64_t i) : kind_(Kind::kInt), i_(i) {}                       // NOLINT
  Value(size_t i) : kind_(Kind::kInt), i_(static_cast<int64_t>(i)) {}  // NOLINT
  Value(double f) : kind_(Kind::kFloat), f_(f) {}                      // NOLINT
  Value(std::string s);                                                // NOLINT
  Value(const char* s) : Value(std::string(s)) {}                      // NOLINT
  Value(List l, bool tuple = false);                                   // NOLINT
  Value(Dict d);                                                       // NOLINT

  static Value none() {
    Value v;
    v.kind_ = Kind::kNone;
    return v;
  }
  // An undefined value whose use raises UndefinedError(message).
  static Value undefined(std::string message);
  static Value undefined_name(std::string_view name);                    // 'x' is undefined
  static Value undefined_attr(const Value& obj, std::string_view name);  // no attribute
  static Value undefined_item(const Value& obj, int64_t index);          // no element
  static Value namespace_(Dict d);
  static Value method(const Value& obj, std::string name);
  // A generator over `items`; `type` is its Python type name ("generator").
  static Value iterator(List items, const char* type = "generator");
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }  // not bool
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || is_bool(); }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kList && tuple_; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_iterator() const { return kind_ == Kind::kIterator; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return kind_ == Kind::kBool ? (b_ ? 1 : 0) : i_; }  // int or bool
  double as_float() const { return kind_ == Kind::kFloat ? f_ : static_cast<double>(as_int()); }
  const std::string& str_ref() const { return *static_cast<const std::string*>(p_.get()); }
  const List& list() const { return *static_cast<const List*>(p_.get()); }
  std::shared_ptr<const List> list_ptr() const { return {p_, &list()}; }
  const Dict& dict() const { return *static_cast<const Dict*>(p_.get()); }  // dict, namespace
  Dict& ns_mut() const {  // a namespace: allocated non-const
    return *const_cast<Dict*>(static_cast<const Dict*>(p_.get()));
  }
  const std::string& undefined_message() const;
  const std::string& method_name() const;
  const Value& method_self() const;
  // The items of an iterator not yet consumed; consumes it.
  List consume() const;

  // Python truthiness; str() (what {{ }} prints); repr().
  bool truthy() const;
  std::string str() const;
  std::string repr() const;
  void append_str(std::string& out) const;  // out += str()
  // Python's type name (`type(x).__name__`), and Jinja's object_type_repr ("dict object").
  const char* type_name() const;
  std::string object_type_repr() const;
  // Raises UndefinedError when undefined (what most operations on an undefined value do).
  const Value& defined() const;

  nlohmann::ordered_json to_json() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool tuple_ = false;
  union {
    bool b_;
    int64_t i_ = 0;
    double f_;
  };
  std::shared_ptr<const void> p_;  // string, list, dict, undefined message, method, iterator
};

struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const;
  void set(std::string key, Value value);  // replaces in place or appends
};

// Python ==, and the orderings (raise TypeError for unorderable kinds, with Python's message).
bool equal(const Value& a, const Value& b);
bool less(const Value& a, const Value& b, const char* op = "<");
bool lt(const Value& a, const Value& b);
bool le(const Value& a, const Value& b);
bool gt(const Value& a, const Value& b);
bool ge(const Value& a, const Value& b);
// `a in b`.
bool contains(const Value& container, const Value& item);

// Arithmetic with Python's rules (int/float promotion, str and list + and *).
Value add(const Value& a, const Value& b);
Value sub(const Value& a, const Value& b);
Value mul(const Value& a, const Value& b);
Value truediv(const Value& a, const Value& b);
Value floordiv(const Value& a, const Value& b);
Value mod(const Value& a, const Value& b);
Value power(const Value& a, const Value& b);
Value neg(const Value& a);
Value pos(const Value& a);
// `a ~ b ~ ...`: str() of each, joined.
Value concat(std::initializer_list<Value> parts);

// `obj.name` (Jinja's getattr: attribute first, then item) and `obj[key]` (item first,
// then attribute): methods of str/dict/list are attributes; a missing key is undefined.
Value getattr(const Value& obj, std::string_view name);
Value getitem(const Value& obj, const Value& key);
// obj[start:stop:step]; an undefined bound is None.
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

// What `for x in v` iterates: list items, dict keys, string characters; undefined is empty.
// Raises TypeError for what Python cannot iterate.
std::shared_ptr<const List> iterate(const Value& v);
// len(v); raises TypeError for what has none.
int64_t length(const Value& v);

// json.dumps(v, ensure_ascii, indent, separators, sort_keys) exactly; indent < 0 is None,
// an empty `indent_str` with indent >= 0 means that many spaces.
struct JsonOptions {
  bool ensure_ascii = false;
  int indent = -1;
  std::string indent_str;  // indent given as a string
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool separators_given = false;
  bool sort_keys = false;
};
std::string dumps(const Value& v, const JsonOptions& options);

// Python float repr (shortest round-trip, Python's exponent rules).
std::string float_repr(double f);
// Python repr of a str.
std::string string_repr(std::string_view s);

// Code points: count, and the byte offset of code point `n` (size() when past the end).
size_t utf8_count(std::string_view s);
bool is_python_space(char32_t c);

}  // namespace ninfer::jinja
