// The value type's core (value.h): construction, the kinds' accessors, JSON in and out
// (nlohmann), truthiness and type names, Dict, code-point counting. str()/repr() and
// json.dumps are in value_format.cpp, ==/ordering/arithmetic in value_ops.cpp, attribute,
// item and slice access and iteration in value_access.cpp.
#include "text/jinja/value.h"

#include <nlohmann/json.hpp>

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

// ------------------------------------------------------------------------------ code points

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

}  // namespace ninfer::jinja
