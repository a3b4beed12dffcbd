// ninfer-server's command line: the flags, their usage text, and one resolve() that checks
// every value against the limits the model was compiled for and turns them into the
// engine's options.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "engine/engine.h"
#include "model/model.h"
#include "server/output_parser.h"

namespace ninfer {

struct Options {
  std::string host = "127.0.0.1";
  int port = 8080;
  int threads = 0;
  int max_context = 0;            // 0: compiled
  int max_concurrency = 0;        // 0: compiled
  int prefill_chunk = 0;          // 0: compiled
  int max_pending_requests = 64;  // 0: unbounded
  int pending_timeout_ms = 0;     // 0: none
  int keep_alive_timeout_s = 5;   // an idle connection is closed after this (cpp-httplib's)
  double max_decode_slowdown = 1.5;
  std::string request_log;
  std::string artifact;  // empty: model.ninfer beside the binary
  bool verify_checksums = true;
  bool mmap_weights = false;  // CPU: read weights in place from the mapped artifact
  bool allow_more_sms = false;
  bool cuda_graphs = true;
  // "auto": the checkpoint's generation_config.json supplies the defaults of the sampling
  // fields a request leaves out (vLLM's --generation-config auto); "ninfer": ninfer's own
  // (OpenAI's) defaults.
  std::string generation_config = "auto";
  std::string reasoning_parser = "auto";  // auto: the manifest's "output_parsers"
  std::string tool_call_parser = "auto";
  int reasoning_budget = -1;  // tokens of reasoning per request; -1 unlimited
  // The names clients send as `model` and see in responses (the first one); empty: the
  // compiled model id.
  std::vector<std::string> served_model_names;
  std::string api_key;  // empty: no key needed (--api-key, else NINFER_API_KEY)
  // Speculative decoding: "" = what the model was compiled for (--spec at compile time),
  // "none" = off, or the compiled kind again; draft tokens 0 = the compiled maximum.
  std::string spec;
  int draft_tokens = 0;
  int ngram_min = 0, ngram_max = 0;  // 0: the engine's defaults (2 and 4)
  bool prefix_caching = true;        // --no-prefix-caching
  int checkpoint_interval = 0;       // --state-checkpoint-interval; 0: end of prompts only
  // Hidden: render the JSON lines of FILE ({"template", "context"}) through the compiled chat
  // templates and exit (ninfer-compile's check against jinja2; needs no artifact).
  std::string render_chat_template;
};

extern const char* const kUsage;

// Parses the flags; throws std::invalid_argument naming the flag. --help prints the usage
// and exits.
Options parse_options(int argc, char** argv);

// Checks every value against the compiled limits (throws std::invalid_argument saying
// how to recompile or what to pass instead) and returns the engine's options, every
// limit resolved to a number. Metrics and the request log are left for the caller.
EngineOptions resolve(const Options& options, const ModelInfo& compiled);

// The output parsers: --reasoning-parser / --tool-call-parser, or with "auto" what the
// compiler chose from the chat template (the manifest's "output_parsers"; none when the
// artifact has no such key); and the default thinking budget.
OutputConfig resolve_output(const Options& options, const nlohmann::json& manifest);

// --artifact, or model.ninfer in the directory of the running binary.
std::string artifact_path(const Options& options, const char* argv0);

}  // namespace ninfer
