// The tokenizer endpoints of Routes (routes.h): /tokenize and /detokenize, as vLLM and
// llama.cpp's servers offer them.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/api.h"
#include "server/routes.h"

namespace ninfer {

using nlohmann::json;

namespace {

bool flag(const json& body, const char* key, bool dflt) {
  if (!body.contains(key) || body[key].is_null()) return dflt;
  if (!body[key].is_boolean())
    throw ApiError(400, std::string("'") + key + "' must be a boolean", "invalid_request_error",
                   key);
  return body[key].get<bool>();
}

}  // namespace

void Routes::tokenize(const httplib::Request& req, httplib::Response& res) const {
  json body = parse_body(req.body);
  const bool chat_form = body.contains("messages");
  if (chat_form == body.contains("prompt"))
    throw ApiError(400, "send either 'prompt' (a string) or 'messages' (a chat)",
                   "invalid_request_error", "prompt");
  if (flag(body, "return_token_strs", false))
    throw ApiError(400, "'return_token_strs' is not supported", "invalid_request_error",
                   "return_token_strs");
  std::vector<int32_t> ids;
  if (chat_form) {
    // The prompt a chat request would get, through the same chat path.
    if (flag(body, "add_special_tokens", false))
      throw ApiError(400,
                     "'add_special_tokens' must be false with 'messages' (the chat template "
                     "places the special tokens)",
                     "invalid_request_error", "add_special_tokens");
    if (!flag(body, "add_generation_prompt", true))
      throw ApiError(400, "'add_generation_prompt': false is not supported",
                     "invalid_request_error", "add_generation_prompt");
    if (flag(body, "continue_final_message", false))
      throw ApiError(400, "'continue_final_message' is not supported", "invalid_request_error",
                     "continue_final_message");
    for (const char* key : {"add_special_tokens", "add_generation_prompt", "continue_final_message",
                            "return_token_strs"})
      body.erase(key);
    ids = prompt_tokens(
        parse_completion_request(body, /*chat=*/true, model_names, engine.info().vocab_size));
  } else {
    requested_model(body, model_names);
    if (!body["prompt"].is_string())
      throw ApiError(400, "'prompt' must be a string", "invalid_request_error", "prompt");
    ids =
        tokenizer.encode(body["prompt"].get<std::string>(), flag(body, "add_special_tokens", true));
  }
  send_json(res, 200,
            {{"count", ids.size()}, {"max_model_len", engine.max_context()}, {"tokens", ids}});
}

void Routes::detokenize(const httplib::Request& req, httplib::Response& res) const {
  const json body = parse_body(req.body);
  requested_model(body, model_names);
  const int vocab = engine.info().vocab_size;
  if (!body.contains("tokens") || !body["tokens"].is_array())
    throw ApiError(400, "'tokens' must be an array of token ids", "invalid_request_error",
                   "tokens");
  std::vector<int32_t> ids;
  for (const json& t : body["tokens"]) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab)
      throw ApiError(400,
                     "'tokens' entries must be integers in [0, " + std::to_string(vocab) +
                         "), got " + t.dump(),
                     "invalid_request_error", "tokens");
    ids.push_back(t.get<int32_t>());
  }
  send_json(res, 200, {{"prompt", tokenizer.decode(ids, /*skip_special_tokens=*/false)}});
}

}  // namespace ninfer
