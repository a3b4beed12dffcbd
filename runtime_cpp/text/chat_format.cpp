#include "text/chat_format.h"

#include <algorithm>
#include <stdexcept>

namespace ninfer {
namespace {

// Code points for which Python's str.isspace() is true.
bool is_python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// Decodes the UTF-8 sequence of `len` bytes at `p`; returns U+FFFF (not a space) when malformed.
char32_t decode(const unsigned char* p, size_t len) {
  static constexpr unsigned char kLeadMask[] = {0, 0x7F, 0x1F, 0x0F, 0x07};
  if (len == 0 || len > 4) return 0xFFFF;
  char32_t c = p[0] & kLeadMask[len];
  for (size_t i = 1; i < len; ++i) {
    if ((p[i] & 0xC0) != 0x80) return 0xFFFF;
    c = (c << 6) | (p[i] & 0x3F);
  }
  return c;
}

size_t sequence_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 0;
}

std::string quoted_list(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += (i + 1 == names.size()) ? (names.size() > 2 ? ", and " : " and ") : ", ";
    out += "'" + names[i] + "'";
  }
  return out;
}

std::optional<std::string> optional_string(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  return it->get<std::string>();
}

}  // namespace

std::string python_strip(const std::string& text) {
  const auto* data = reinterpret_cast<const unsigned char*>(text.data());
  size_t begin = 0, end = text.size();
  while (begin < end) {
    size_t len = sequence_length(data[begin]);
    if (len == 0 || begin + len > end || !is_python_space(decode(data + begin, len))) break;
    begin += len;
  }
  while (end > begin) {
    size_t start = end - 1;
    while (start > begin && (data[start] & 0xC0) == 0x80 && end - start < 4) --start;
    size_t len = end - start;
    if (sequence_length(data[start]) != len || !is_python_space(decode(data + start, len))) break;
    end = start;
  }
  return text.substr(begin, end - begin);
}

ChatFormat ChatFormat::from_json(const nlohmann::json& j) {
  try {
    if (!j.is_object() || j.value("version", 0) != kVersion) {
      throw std::invalid_argument("unsupported chat format version");
    }
    ChatFormat f;
    f.prefix_ = j.at("prefix").get<std::string>();
    for (const auto& [name, r] : j.at("roles").items()) {
      f.roles_[name] = ChatRoleFormat{r.at("before").get<std::string>(),
                                      r.at("after").get<std::string>(), r.value("trim", false)};
      f.role_order_.push_back(name);
    }
    if (f.role_order_.empty()) throw std::invalid_argument("chat format has no roles");
    auto rank = [](const std::string& role) {
      static const std::vector<std::string> canonical = {"system", "user", "assistant"};
      return std::find(canonical.begin(), canonical.end(), role) - canonical.begin();
    };
    std::sort(f.role_order_.begin(), f.role_order_.end(),
              [&](const std::string& a, const std::string& b) {
                return std::make_pair(rank(a), a) < std::make_pair(rank(b), b);
              });
    f.default_system_ = optional_string(j, "default_system");
    if (f.default_system_ && !f.roles_.count("system")) {
      throw std::invalid_argument("chat format has default_system but no system role");
    }
    f.generation_prompt_ = j.at("generation_prompt").get<std::string>();
    f.generation_prompt_no_thinking_ = optional_string(j, "generation_prompt_no_thinking");
    f.system_must_be_first_ = j.value("system_must_be_first", false);
    f.alternate_user_assistant_ = j.value("alternate_user_assistant", false);
    return f;
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(std::string("invalid chat format: ") + e.what());
  }
}

void ChatFormat::validate(const std::vector<ChatMessage>& messages) const {
  if (messages.empty()) throw std::invalid_argument("messages must contain at least one message.");
  std::string expected = "user";
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!roles_.count(role)) {
      throw std::invalid_argument("Invalid value for " + where + ".role: '" + role +
                                  "'. Supported values are: " + quoted_list(role_order_) + ".");
    }
    if (role == "system") {
      if (system_must_be_first_ && i != 0) {
        throw std::invalid_argument("Invalid " + where +
                                    ": a system message is only allowed as the first message "
                                    "for this model.");
      }
      continue;
    }
    if (alternate_user_assistant_) {
      if (role != expected) {
        throw std::invalid_argument(
            "Invalid " + where +
            ": conversation roles must alternate user/assistant/user/assistant/... after an "
            "optional leading system message, but got '" +
            role + "' where '" + expected + "' was expected.");
      }
      expected = role == "user" ? "assistant" : "user";
    }
  }
}

std::string ChatFormat::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                               bool enable_thinking) const {
  validate(messages);
  std::string out = prefix_;
  if (default_system_ && messages.front().role != "system") {
    const ChatRoleFormat& system = roles_.at("system");
    out += system.before + *default_system_ + system.after;
  }
  for (const ChatMessage& m : messages) {
    const ChatRoleFormat& f = roles_.at(m.role);
    out += f.before;
    out += f.trim ? python_strip(m.content) : m.content;
    out += f.after;
  }
  if (add_generation_prompt) {
    out += (!enable_thinking && generation_prompt_no_thinking_) ? *generation_prompt_no_thinking_
                                                                : generation_prompt_;
  }
  return out;
}

}  // namespace ninfer
