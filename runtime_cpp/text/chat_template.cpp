#include "text/chat_template.h"

#include <memory>

#include <nlohmann/json.hpp>

namespace ninfer {
namespace {

using nlohmann::ordered_json;

std::vector<std::unique_ptr<ChatTemplate>>& registry() {
  static std::vector<std::unique_ptr<ChatTemplate>> templates;
  return templates;
}

// transformers: _normalize_chat_messages (keys whose value is None dropped), then
// _alias_reasoning_fields ({"thinking": r, **message, "reasoning_content": r}).
jinja::Value normalize_message(const ordered_json& m) {
  if (!m.is_object()) return jinja::Value::from_json(m);
  const ordered_json* reasoning = nullptr;
  for (const char* key : {"reasoning_content", "thinking", "reasoning"}) {
    auto it = m.find(key);
    if (it != m.end() && !it->is_null()) {
      reasoning = &*it;
      break;
    }
  }
  jinja::Dict d;
  if (reasoning) {
    auto own = m.find("thinking");
    d.items.emplace_back(
        "thinking", jinja::Value::from_json(own != m.end() && !own->is_null() ? *own : *reasoning));
  }
  for (const auto& [k, v] : m.items()) {
    if (v.is_null()) continue;
    d.set(k, jinja::Value::from_json(v));
  }
  if (reasoning) d.set("reasoning_content", jinja::Value::from_json(*reasoning));
  return jinja::Value(std::move(d));
}

}  // namespace

ChatTemplateRegistration::ChatTemplateRegistration(const char* name, const char* sha256,
                                                   ChatTemplateFn fn) {
  registry().push_back(std::make_unique<ChatTemplate>(name, sha256, fn));
}

const ChatTemplate* find_chat_template(std::string_view name) {
  for (const auto& t : registry())
    if (t->name() == name) return t.get();
  return nullptr;
}

const ChatTemplate* find_chat_template_by_sha256(std::string_view sha256) {
  for (const auto& t : registry())
    if (t->sha256() == sha256) return t.get();
  return nullptr;
}

std::vector<std::string> chat_template_names() {
  std::vector<std::string> out;
  for (const auto& t : registry()) out.push_back(t->name());
  return out;
}

jinja::Value chat_template_context(const ordered_json& context) {
  jinja::Dict d;
  d.items.emplace_back("tools", jinja::Value::none());
  d.items.emplace_back("documents", jinja::Value::none());
  d.items.emplace_back("add_generation_prompt", jinja::Value(false));
  for (const auto& [k, v] : context.items()) {
    if (k == "messages" && v.is_array()) {
      jinja::List msgs;
      msgs.reserve(v.size());
      for (const auto& m : v) msgs.push_back(normalize_message(m));
      d.set(k, jinja::Value(std::move(msgs)));
    } else {
      d.set(k, jinja::Value::from_json(v));
    }
  }
  return jinja::Value(std::move(d));
}

std::string ChatTemplate::render_value(const jinja::Value& context) const {
  std::string out;
  try {
    fn_(context, out);
  } catch (const jinja::Error& e) {
    throw ChatTemplateError(e.type, e.what());
  }
  return out;
}

std::string ChatTemplate::render(const ordered_json& context) const {
  return render_value(chat_template_context(context));
}

}  // namespace ninfer
