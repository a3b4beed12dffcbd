#include "server/chat_prompt.h"

#include <fstream>
#include <iostream>
#include <stdexcept>

namespace ninfer {
namespace {

using nlohmann::ordered_json;

[[noreturn]] void bad(const std::string& param, const std::string& msg) {
  throw ApiError(400, msg, "invalid_request_error", param);
}

// A message's content: a string, or text parts joined with "\n" (vLLM's "string" content
// format); null stays null.
ordered_json content_of(const ordered_json& c, const std::string& param) {
  if (c.is_string() || c.is_null()) return c;
  if (!c.is_array()) bad(param, param + " must be a string or an array of text parts");
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    const ordered_json& part = c[i];
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
        !part["text"].is_string())
      bad(param, param + ": only parts of type 'text' with a string 'text' are supported");
    if (i) out += "\n";
    out += part["text"].get<std::string>();
  }
  return out;
}

ordered_json tool_calls_of(const ordered_json& calls, const std::string& param) {
  if (!calls.is_array()) bad(param, param + " must be an array");
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string p = param + "[" + std::to_string(i) + "]";
    ordered_json call = calls[i];
    if (!call.is_object()) bad(p, p + " must be an object");
    if (call.contains("type") && call["type"] != "function")
      bad(p + ".type", p + ".type must be 'function'");
    if (!call.contains("function") || !call["function"].is_object())
      bad(p + ".function", p + ".function must be an object");
    ordered_json& fn = call["function"];
    if (!fn.contains("name") || !fn["name"].is_string())
      bad(p + ".function.name", p + ".function.name must be a string");
    // vLLM: arguments given as a JSON string are parsed, so templates see an object (and
    // render it with tojson as the model was trained); missing or empty means {}.
    if (!fn.contains("arguments") || fn["arguments"].is_null() ||
        (fn["arguments"].is_string() && fn["arguments"].get<std::string>().empty())) {
      fn["arguments"] = ordered_json::object();
    } else if (fn["arguments"].is_string()) {
      try {
        fn["arguments"] = ordered_json::parse(fn["arguments"].get<std::string>());
      } catch (const ordered_json::parse_error&) {
        bad(p + ".function.arguments", p + ".function.arguments is not valid JSON");
      }
    } else if (!fn["arguments"].is_object()) {
      bad(p + ".function.arguments", p + ".function.arguments must be a JSON string or object");
    }
    out.push_back(std::move(call));
  }
  return out;
}

ordered_json message_of(const ordered_json& m, size_t i) {
  const std::string p = "messages[" + std::to_string(i) + "]";
  if (!m.is_object()) bad(p, p + " must be an object");
  if (!m.contains("role") || !m["role"].is_string()) bad(p + ".role", p + ".role must be a string");
  std::string role = m["role"].get<std::string>();
  if (role == "developer") role = "system";
  if (role != "system" && role != "user" && role != "assistant" && role != "tool")
    bad(p + ".role", "Invalid value for " + p + ".role: '" + role +
                         "'. Supported values are: 'system', 'developer', 'user', 'assistant' "
                         "and 'tool'.");
  ordered_json out = ordered_json::object();
  for (const auto& [k, v] : m.items()) {
    if (k == "role") out[k] = role;
    else if (k == "content") out[k] = content_of(v, p + ".content");
    else if (k == "tool_calls" && role == "assistant" && !v.is_null())
      out[k] = tool_calls_of(v, p + ".tool_calls");
    else out[k] = v;
  }
  const bool has_calls = out.contains("tool_calls") && !out["tool_calls"].is_null();
  if ((!out.contains("content") || out["content"].is_null()) &&
      !(role == "assistant" && (has_calls || out.contains("reasoning_content"))))
    bad(p + ".content", p + ".content is required");
  if (role == "tool" && (!out.contains("tool_call_id") || !out["tool_call_id"].is_string()))
    bad(p + ".tool_call_id", p + ".tool_call_id must be a string (the id of the tool call "
                                 "it answers)");
  return out;
}

ordered_json tools_of(const ordered_json& tools) {
  if (!tools.is_array()) bad("tools", "'tools' must be an array");
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string p = "tools[" + std::to_string(i) + "]";
    const ordered_json& t = tools[i];
    if (!t.is_object() || t.value("type", "") != "function")
      bad(p, p + " must be an object with type 'function'");
    if (!t.contains("function") || !t["function"].is_object())
      bad(p + ".function", p + ".function must be an object");
    const ordered_json& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty())
      bad(p + ".function.name", p + ".function.name must be a non-empty string");
    if (f.contains("description") && !f["description"].is_string() && !f["description"].is_null())
      bad(p + ".function.description", p + ".function.description must be a string");
    if (f.contains("parameters") && !f["parameters"].is_object() && !f["parameters"].is_null())
      bad(p + ".function.parameters", p + ".function.parameters must be a JSON Schema object");
  }
  return tools;
}

bool flag(const ordered_json& body, const char* key, bool dflt) {
  if (!body.contains(key) || body[key].is_null()) return dflt;
  if (!body[key].is_boolean()) bad(key, std::string("'") + key + "' must be a boolean");
  return body[key].get<bool>();
}

}  // namespace

void parse_chat_fields(const std::string& body_text, CompletionRequest& r) {
  // Parsed again in order: templates render tools and arguments with their keys as sent.
  const ordered_json body = ordered_json::parse(body_text);
  if (!body.contains("messages")) bad("messages", "'messages' is required");
  const ordered_json& msgs = body["messages"];
  if (!msgs.is_array()) bad("messages", "'messages' must be an array");
  if (msgs.empty()) bad("messages", "'messages' must contain at least one message");
  r.messages = ordered_json::array();
  for (size_t i = 0; i < msgs.size(); ++i) r.messages.push_back(message_of(msgs[i], i));
  if (body.contains("tools") && !body["tools"].is_null()) r.tools = tools_of(body["tools"]);
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const ordered_json& c = body["tool_choice"];
    const bool named = c.is_object() && c.value("type", "") == "function" &&
                       c.contains("function") && c["function"].is_object() &&
                       c["function"].contains("name") && c["function"]["name"].is_string();
    if (!named && !(c.is_string() && (c == "none" || c == "auto" || c == "required")))
      bad("tool_choice",
          "'tool_choice' must be 'none', 'auto', 'required' or "
          "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    r.tool_choice = c;
  }
  if (body.contains("chat_template_kwargs") && !body["chat_template_kwargs"].is_null()) {
    if (!body["chat_template_kwargs"].is_object())
      bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    r.chat_template_kwargs = body["chat_template_kwargs"];
  }
  r.continue_final_message = flag(body, "continue_final_message", false);
  r.add_generation_prompt = flag(body, "add_generation_prompt", !r.continue_final_message);
  if (r.continue_final_message && r.add_generation_prompt)
    bad("continue_final_message",
        "'continue_final_message' and 'add_generation_prompt' cannot both be true");
  if (r.continue_final_message) {
    const ordered_json& last = r.messages.back();
    if (!last.contains("content") || !last["content"].is_string())
      bad("continue_final_message",
          "'continue_final_message' needs a final message with string content");
  }
}

ChatPrompt ChatPrompt::from_manifest(const nlohmann::json& entry) {
  ChatPrompt p;
  if (entry.is_null()) return p;
  for (const auto& t : entry.at("templates")) {
    const std::string name = t.at("name").get<std::string>();
    const std::string sha = t.at("sha256").get<std::string>();
    const ChatTemplate* compiled = find_chat_template_by_sha256(sha);
    if (!compiled) {
      std::string have;
      for (const auto& n : chat_template_names()) have += (have.empty() ? "" : ", ") + n;
      throw std::runtime_error(
          "the artifact's chat template '" + name + "' (sha256 " + sha.substr(0, 12) +
          "...) is not compiled into this server (compiled: " + (have.empty() ? "none" : have) +
          "): model.ninfer and ninfer-server come from different compiles; recompile, or "
          "pass the matching --artifact");
    }
    if (name == "default") p.default_ = compiled;
    else if (name == "tool_use") p.tool_use_ = compiled;
  }
  if (entry.contains("special_tokens"))
    for (const auto& [k, v] : entry["special_tokens"].items()) p.special_tokens_[k] = v;
  return p;
}

std::string ChatPrompt::render(const CompletionRequest& r) const {
  if (!default_)
    throw ApiError(400,
                   "this model has no chat template, so /v1/chat/completions cannot build a "
                   "prompt; recompile with `ninfer-compile --chat-template FILE` (a Jinja chat "
                   "template) or send the prompt to /v1/completions",
                   "invalid_request_error", "messages", "no_chat_template");
  const bool with_tools = !r.tools.is_null();
  const ChatTemplate& t = with_tools && tool_use_ ? *tool_use_ : *default_;
  ordered_json ctx = special_tokens_;
  ctx["messages"] = r.messages;
  if (with_tools) ctx["tools"] = r.tools;
  ctx["add_generation_prompt"] = r.add_generation_prompt;
  // transformers' continue_final_message: render the last message with a tag after it and
  // cut the text at the tag (trailing spaces too, where the template trimmed them).
  static const std::string kTag = "CONTINUE_FINAL_MESSAGE_TAG ";
  std::string final_text;
  if (r.continue_final_message) {
    ordered_json& last = ctx["messages"].back();
    final_text = last["content"].get<std::string>();
    last["content"] = final_text + kTag;
  }
  if (r.chat_template_kwargs.is_object())
    for (const auto& [k, v] : r.chat_template_kwargs.items()) ctx[k] = v;
  std::string text;
  try {
    text = t.render(ctx);
  } catch (const ChatTemplateError& e) {
    throw ApiError(400, std::string("chat template error: ") + e.what(), "invalid_request_error",
                   "messages");
  }
  if (r.continue_final_message) {
    const std::string stripped_tag = "CONTINUE_FINAL_MESSAGE_TAG";
    const size_t at = text.rfind(stripped_tag);
    if (at == std::string::npos)
      throw ApiError(400,
                     "continue_final_message: the chat template does not render the final "
                     "message's content",
                     "invalid_request_error", "continue_final_message");
    if (text.compare(at, kTag.size(), kTag) == 0) {
      text.resize(at);
    } else {
      text.resize(at);
      while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
        text.pop_back();
    }
  }
  return text;
}

int render_chat_template_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::cerr << "ninfer-server: cannot read " << path << "\n";
    return 2;
  }
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const ordered_json req = ordered_json::parse(line);
    const std::string name = req.at("template").get<std::string>();
    const ChatTemplate* t = find_chat_template(name);
    ordered_json out;
    if (!t) {
      out = {{"error_type", "KeyError"}, {"error", "no chat template '" + name + "' compiled in"}};
    } else {
      try {
        out = {{"text", t->render(req.at("context"))}};
      } catch (const ChatTemplateError& e) {
        out = {{"error_type", e.type}, {"error", e.what()}};
      }
    }
    std::cout << out.dump(-1, ' ', false, ordered_json::error_handler_t::replace) << "\n";
  }
  std::cout.flush();
  return 0;
}

}  // namespace ninfer
