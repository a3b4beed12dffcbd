// The chat path's prompt: the request's messages (as the client sent them, validated and
// normalized the way vLLM does) rendered through the model's chat template, compiled into
// this server from the checkpoint's Jinja template (text/chat_template.h).
//
// Context of the template: messages, tools (when given), add_generation_prompt, the
// checkpoint's special tokens (bos_token, eos_token, ...), and chat_template_kwargs merged in
// last. With "tool_use" among the checkpoint's named templates, a request with tools uses it
// (as transformers and vLLM do). continue_final_message renders the last message open, as
// transformers does.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "server/api.h"
#include "text/chat_template.h"

namespace ninfer {

// Parses the chat fields of a request body (messages, tools, tool_choice,
// chat_template_kwargs, add_generation_prompt, continue_final_message) into `r`; throws
// ApiError naming the field.
void parse_chat_fields(const std::string& body_text, CompletionRequest& r);

class ChatPrompt {
 public:
  // From the manifest's "chat_template" entry (null: the model has none). Throws
  // std::runtime_error when a template of the artifact is not the one compiled in.
  static ChatPrompt from_manifest(const nlohmann::json& entry);

  bool available() const { return default_ != nullptr; }
  // The prompt text of a chat request; throws ApiError (400) for a template error or when
  // the model has no template.
  std::string render(const CompletionRequest& r) const;

 private:
  const ChatTemplate* default_ = nullptr;
  const ChatTemplate* tool_use_ = nullptr;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
};

// `ninfer-server --render-chat-template FILE`: one JSON line out per line in
// ({"text"} or {"error_type", "error"}); returns the exit code.
int render_chat_template_file(const std::string& path);

}  // namespace ninfer
