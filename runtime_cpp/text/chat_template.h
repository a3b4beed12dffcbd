// Chat templates compiled ahead of time: each is a C++ function generated from the
// checkpoint's Jinja template (compiler/ninfer/frontend/chat_codegen.py) that registers
// itself here under a name ("default", "tool_use", or a corpus name in the tests) with the
// SHA-256 of its source. render() does what transformers' apply_chat_template does around
// the template (messages' None values dropped, reasoning fields aliased, tools and documents
// None when not given) and raises ChatTemplateError where jinja2 would raise.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "text/jinja/value.h"

namespace ninfer {

// The template raised (raise_exception: the template's own message) or failed the way
// jinja2 would (UndefinedError, TypeError, ...); `type` is the Python exception class.
class ChatTemplateError : public std::runtime_error {
 public:
  ChatTemplateError(std::string type, const std::string& message)
      : std::runtime_error(message), type(std::move(type)) {}
  std::string type;
};

using ChatTemplateFn = void (*)(const jinja::Value& context, std::string& out);

class ChatTemplate {
 public:
  ChatTemplate(std::string name, std::string sha256, ChatTemplateFn fn)
      : name_(std::move(name)), sha256_(std::move(sha256)), fn_(fn) {}

  // `context`: {"messages": [...], "tools"?: [...], "add_generation_prompt"?: bool, ...}; every
  // key is a template variable (bos_token, chat_template_kwargs merged in, ...).
  std::string render(const nlohmann::ordered_json& context) const;
  // The same over an already converted context (no normalization).
  std::string render_value(const jinja::Value& context) const;

  const std::string& name() const { return name_; }
  const std::string& sha256() const { return sha256_; }

 private:
  std::string name_, sha256_;
  ChatTemplateFn fn_;
};

// Every generated template linked into this binary, by name or by the SHA-256 of its
// source; nullptr when absent.
const ChatTemplate* find_chat_template(std::string_view name);
const ChatTemplate* find_chat_template_by_sha256(std::string_view sha256);
std::vector<std::string> chat_template_names();

// Registers a generated template (one static instance per generated translation unit).
struct ChatTemplateRegistration {
  ChatTemplateRegistration(const char* name, const char* sha256, ChatTemplateFn fn);
};

// transformers' normalization of a context, as a template value.
jinja::Value chat_template_context(const nlohmann::ordered_json& context);

}  // namespace ninfer
