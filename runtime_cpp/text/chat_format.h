// Prompt format derived at compile time from a checkpoint's Jinja chat template.
//
// The compiler (compiler/ninfer/frontend/chat_template.py) verifies that this format renders
// exactly like the template; ChatFormat.render there is the reference for render() here.
//
//   prefix
//   [roles.system.before + default_system + roles.system.after]   when default_system is set
//                                                                 and messages[0] is not system
//   for each message: before + content (Python str.strip()-ed when trim) + after
//   generation_prompt, or generation_prompt_no_thinking when enable_thinking is false and set
#pragma once

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

namespace ninfer {

struct ChatMessage {
  std::string role;
  std::string content;
};

struct ChatRoleFormat {
  std::string before;
  std::string after;
  bool trim = false;
};

class ChatFormat {
 public:
  static constexpr int kVersion = 1;

  // Parses the compiler's ChatFormat.to_json(); throws std::invalid_argument on a bad document.
  static ChatFormat from_json(const nlohmann::json& j);

  // Throws std::invalid_argument with a user-facing (OpenAI-style) message for an unknown role,
  // an empty conversation, or a violated constraint (system not first, roles not alternating).
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     bool enable_thinking = true) const;

  // Throws like render() does, without rendering.
  void validate(const std::vector<ChatMessage>& messages) const;

  // Role names in the order error messages list them: system, user, assistant, then sorted.
  const std::vector<std::string>& allowed_roles() const { return role_order_; }

 private:
  std::string prefix_;
  std::unordered_map<std::string, ChatRoleFormat> roles_;
  std::vector<std::string> role_order_;
  std::optional<std::string> default_system_;
  std::string generation_prompt_;
  std::optional<std::string> generation_prompt_no_thinking_;
  bool system_must_be_first_ = false;
  bool alternate_user_assistant_ = false;
};

// Strips leading and trailing whitespace from UTF-8 text exactly like Python's str.strip().
std::string python_strip(const std::string& text);

}  // namespace ninfer
