#include "server/options.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <numeric>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace ninfer {
namespace {

constexpr int kMaxNgram = 32;

// "--flag N exceeds the compiled maximum M; recompile with --compile-flag N ...".
void check_compiled(int value, int compiled_max, const char* flag, const char* compile_flag) {
  if (value > compiled_max)
    throw std::invalid_argument(std::string(flag) + " " + std::to_string(value) +
                                " exceeds the compiled maximum " + std::to_string(compiled_max) +
                                "; recompile with " + compile_flag + " " + std::to_string(value) +
                                " or pass a smaller value");
}

}  // namespace

const char* const kUsage =
    "usage: ninfer-server [--host H] [--port P] [--threads N] [--max-context N]\n"
    "                     [--max-concurrency N] [--prefill-chunk N]\n"
    "                     [--max-pending-requests N] [--pending-timeout-ms MS]\n"
    "                     [--keep-alive-timeout S]\n"
    "                     [--max-decode-slowdown X] [--request-log FILE]\n"
    "                     [--artifact FILE] [--no-verify-checksums] [--mmap-weights]\n"
    "                     [--allow-more-sms] [--no-cuda-graph]\n"
    "                     [--generation-config auto|ninfer]\n"
    "                     [--reasoning-parser NAME] [--tool-call-parser NAME]\n"
    "                     [--reasoning-budget N]\n"
    "                     [--served-model-name NAME [NAME ...]] [--api-key KEY]\n"
    "                     [--spec none|ngram|mtp] [--draft-tokens K]\n"
    "                     [--ngram-min N] [--ngram-max N]\n"
    "                     [--no-prefix-caching] [--state-checkpoint-interval N]\n"
    "  --port 0 picks a free port and prints it.\n"
    "  --threads N               CPU: worker threads (default: one per core)\n"
    "  --max-context N           tokens per request, prompt and reply (default and\n"
    "                            maximum: compiled)\n"
    "  --max-concurrency N       requests running at once (default: compiled, at most the\n"
    "                            prefill chunk; maximum: compiled)\n"
    "  --prefill-chunk N         token rows per step, decode rows and prompt chunks\n"
    "                            together (default and maximum: compiled)\n"
    "  --max-pending-requests N  requests that may wait for a slot; more get 429\n"
    "                            (default 64, 0 = unbounded)\n"
    "  --pending-timeout-ms MS   a request waiting longer gets 503 (default 0 = never)\n"
    "  --keep-alive-timeout S    an idle kept-alive connection is closed after S seconds\n"
    "                            (default 5; at shutdown idle ones close at once)\n"
    "  --max-decode-slowdown X   while requests decode, prompt rows per step are limited so\n"
    "                            a step takes at most X times a decode-only step (default\n"
    "                            1.5, 0 = no limit: prompts take the whole step budget)\n"
    "  --request-log FILE        append one JSON line per request event\n"
    "  --mmap-weights            CPU: read the weights in place from the mmapped artifact\n"
    "                            (starts at once and shares the page cache between\n"
    "                            servers) instead of copying them into huge-page memory at\n"
    "                            start (the default: decode 2-6% faster on the benchmark\n"
    "                            VM; on CUDA they are uploaded from the mapping either way)\n"
    "  --no-cuda-graph           CUDA: launch every kernel of a step eagerly instead of\n"
    "                            replaying the step's CUDA graph (no effect on the CPU)\n"
    "  --generation-config auto|ninfer  defaults of the sampling fields a request leaves\n"
    "                            out: auto (default) takes the checkpoint's\n"
    "                            generation_config.json (temperature, top_p, top_k, min_p,\n"
    "                            repetition_penalty, max_new_tokens), ninfer ignores it\n"
    "  --reasoning-parser auto|none|think\n"
    "                            how reasoning is split off the answer (default auto: as\n"
    "                            the compiler chose from the chat template)\n"
    "  --tool-call-parser auto|none|hermes|qwen3_coder|llama3_json\n"
    "                            how tool calls are parsed from the output (default auto)\n"
    "  --reasoning-budget N      close the reasoning block after N tokens unless a request\n"
    "                            sets thinking_budget (default -1 = unlimited)\n"
    "  --served-model-name NAME  the model id clients send and see (default: the\n"
    "                            compiled id); more names are accepted as aliases\n"
    "  --api-key KEY             every route but /health needs 'Authorization: Bearer KEY'\n"
    "                            or 'x-api-key: KEY' (default: $NINFER_API_KEY, else none)\n"
    "  --spec none|ngram|mtp     speculative decoding (default: what the model was compiled\n"
    "                            for with ninfer-compile --spec; none turns it off). ngram:\n"
    "                            each decoding request proposes the tokens that followed an\n"
    "                            earlier occurrence of its last n tokens (prompt and output),\n"
    "                            verified in one step; mtp: the checkpoint's draft head\n"
    "                            proposes them greedily after each step; either way the\n"
    "                            outputs are those of plain decoding\n"
    "  --draft-tokens K          drafts per request and step (default and maximum: the\n"
    "                            compiled --max-draft-tokens)\n"
    "  --ngram-min N, --ngram-max N  n-gram sizes the lookup matches, longest first\n"
    "                            (default 2 and 4, at most 32)\n"
    "  --no-prefix-caching       compute every prompt in full (default: a prompt starts from\n"
    "                            the longest block-aligned prefix whose keys/values an\n"
    "                            earlier request left in the KV pool; a model with recurrent\n"
    "                            state also needs a state checkpoint there, see\n"
    "                            ninfer-compile --state-checkpoints)\n"
    "  --state-checkpoint-interval N  recurrent-state models: besides the end of each\n"
    "                            prompt, checkpoint a long prompt's state every N positions\n"
    "                            (a multiple of the block size and the model's prefill\n"
    "                            alignment; default 0 = only the end of each prompt)\n"
    "  GET /metrics serves Prometheus metrics.\n";

Options parse_options(int argc, char** argv) {
  Options o;
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) throw std::invalid_argument(std::string(argv[i]) + " needs a value");
    return argv[++i];
  };
  auto integer = [&](int& i) {
    const std::string flag = argv[i], v = value(i);
    char* end = nullptr;
    const long x = std::strtol(v.c_str(), &end, 10);
    if (*end || v.empty() || x < 0 || x > INT_MAX)
      throw std::invalid_argument(flag + " expects a non-negative integer, got '" + v + "'");
    return static_cast<int>(x);
  };
  auto positive = [&](int& i) {
    const std::string flag = argv[i];
    const int x = integer(i);
    if (x < 1) throw std::invalid_argument(flag + " must be at least 1");
    return x;
  };
  auto slowdown = [&](int& i) {
    const std::string v = value(i);
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (*end || v.empty() || !(x == 0 || x > 1))
      throw std::invalid_argument("--max-decode-slowdown expects 0 or a number above 1, got '" + v +
                                  "'");
    return x;
  };
  auto parser_name = [&](int& i, bool reasoning) {
    const std::string flag = argv[i], v = value(i);
    if (v == "auto") return v;
    try {
      if (reasoning) parse_reasoning_format(v);
      else parse_tool_call_format(v);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(flag + ": " + e.what() + ", or auto");
    }
    return v;
  };
  auto budget = [&](int& i) {
    const std::string v = value(i);
    char* end = nullptr;
    const long x = std::strtol(v.c_str(), &end, 10);
    if (*end || v.empty() || x < -1 || x > INT_MAX)
      throw std::invalid_argument(
          "--reasoning-budget expects -1 (unlimited) or a token count, got '" + v + "'");
    return static_cast<int>(x);
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--host") o.host = value(i);
    else if (a == "--port") o.port = integer(i);
    else if (a == "--threads") o.threads = integer(i);
    else if (a == "--max-context") o.max_context = integer(i);
    else if (a == "--max-concurrency") o.max_concurrency = positive(i);
    else if (a == "--prefill-chunk") o.prefill_chunk = positive(i);
    else if (a == "--max-pending-requests") o.max_pending_requests = integer(i);
    else if (a == "--pending-timeout-ms") o.pending_timeout_ms = integer(i);
    else if (a == "--keep-alive-timeout") o.keep_alive_timeout_s = positive(i);
    else if (a == "--max-decode-slowdown") o.max_decode_slowdown = slowdown(i);
    else if (a == "--request-log") o.request_log = value(i);
    else if (a == "--artifact") o.artifact = value(i);
    else if (a == "--no-verify-checksums") o.verify_checksums = false;
    else if (a == "--mmap-weights") o.mmap_weights = true;
    else if (a == "--allow-more-sms") o.allow_more_sms = true;
    else if (a == "--no-cuda-graph") o.cuda_graphs = false;
    else if (a == "--generation-config") {
      o.generation_config = value(i);
      if (o.generation_config != "auto" && o.generation_config != "ninfer")
        throw std::invalid_argument("--generation-config expects auto or ninfer, got '" +
                                    o.generation_config + "'");
    } else if (a == "--reasoning-parser") o.reasoning_parser = parser_name(i, true);
    else if (a == "--tool-call-parser") o.tool_call_parser = parser_name(i, false);
    else if (a == "--reasoning-budget") o.reasoning_budget = budget(i);
    else if (a == "--api-key") o.api_key = value(i);
    else if (a == "--served-model-name") {
      o.served_model_names.push_back(value(i));
      while (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0)
        o.served_model_names.push_back(argv[++i]);
    } else if (a == "--render-chat-template") o.render_chat_template = value(i);
    else if (a == "--spec") {
      o.spec = value(i);
      if (o.spec != "none" && o.spec != "ngram" && o.spec != "mtp")
        throw std::invalid_argument("--spec expects none, ngram or mtp, got '" + o.spec + "'");
    } else if (a == "--draft-tokens") o.draft_tokens = positive(i);
    else if (a == "--ngram-min") o.ngram_min = positive(i);
    else if (a == "--ngram-max") o.ngram_max = positive(i);
    else if (a == "--no-prefix-caching") o.prefix_caching = false;
    else if (a == "--state-checkpoint-interval") o.checkpoint_interval = positive(i);
    else if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      std::exit(0);
    } else {
      throw std::invalid_argument("unknown flag '" + a + "'\n" + kUsage);
    }
  }
  if (o.port > 65535) throw std::invalid_argument("--port must be <= 65535");
  for (const auto& name : o.served_model_names)
    if (name.empty()) throw std::invalid_argument("--served-model-name must not be empty");
  // From the environment, so the key need not show in the process list.
  if (o.api_key.empty())
    if (const char* key = std::getenv("NINFER_API_KEY")) o.api_key = key;
  return o;
}

EngineOptions resolve(const Options& o, const ModelInfo& compiled) {
  check_compiled(o.max_context, compiled.max_context, "--max-context", "--max-context");
  check_compiled(o.max_concurrency, compiled.max_concurrency, "--max-concurrency",
                 "--max-concurrency");
  check_compiled(o.prefill_chunk, compiled.prefill_chunk, "--prefill-chunk", "--prefill-chunk");
  EngineOptions eo;
  eo.max_context = o.max_context > 0 ? o.max_context : compiled.max_context;
  eo.prefill_chunk = o.prefill_chunk > 0 ? o.prefill_chunk : compiled.prefill_chunk;
  // Every running request needs a row in each step, or decodes would crowd out admission.
  eo.max_concurrency = o.max_concurrency > 0 ? o.max_concurrency
                                             : std::min(compiled.max_concurrency, eo.prefill_chunk);
  if (eo.max_concurrency > eo.prefill_chunk)
    throw std::invalid_argument("--max-concurrency " + std::to_string(eo.max_concurrency) +
                                " exceeds --prefill-chunk " + std::to_string(eo.prefill_chunk) +
                                ": every running request needs a row in each step; lower it "
                                "or raise the prefill chunk");
  eo.max_pending_requests = o.max_pending_requests;
  eo.pending_timeout_ms = o.pending_timeout_ms;
  eo.max_decode_slowdown = o.max_decode_slowdown;
  eo.prefix_caching = o.prefix_caching;
  if (o.checkpoint_interval > 0) {
    const std::string flag = "--state-checkpoint-interval " + std::to_string(o.checkpoint_interval);
    if (compiled.state_slots == 0)
      throw std::invalid_argument(flag + ": the model has no recurrent state to checkpoint");
    if (compiled.state_checkpoints == 0)
      throw std::invalid_argument(flag +
                                  ": the model was compiled without state checkpoints "
                                  "(ninfer-compile --state-checkpoints N)");
    if (!o.prefix_caching)
      throw std::invalid_argument(flag +
                                  ": state checkpoints serve the prefix cache, which "
                                  "--no-prefix-caching turned off");
    const int g = std::lcm(compiled.kv_block_size, std::max(1, compiled.prefill_align));
    if (o.checkpoint_interval % g != 0)
      throw std::invalid_argument(flag + " is not a multiple of " + std::to_string(g) +
                                  " (the KV block size " + std::to_string(compiled.kv_block_size) +
                                  " and the prefill alignment " +
                                  std::to_string(compiled.prefill_align) + ")");
    eo.checkpoint_interval = o.checkpoint_interval;
  }
  const std::string spec = o.spec.empty() ? compiled.spec : o.spec;
  if (spec != "none") {
    if (spec != compiled.spec)
      throw std::invalid_argument(
          "--spec " + spec + ": the model was compiled " +
          (compiled.spec == "none" ? std::string("without speculative decoding")
                                   : "for --spec " + compiled.spec) +
          "; recompile with ninfer-compile --spec " + spec + " or pass --spec " +
          (compiled.spec == "none" ? std::string("none") : compiled.spec + " or none"));
    check_compiled(o.draft_tokens, compiled.max_draft_tokens, "--draft-tokens",
                   "--max-draft-tokens");
    eo.draft_tokens = o.draft_tokens > 0 ? o.draft_tokens : compiled.max_draft_tokens;
    if (spec != "ngram" && (o.ngram_min > 0 || o.ngram_max > 0))
      throw std::invalid_argument(
          "--ngram-min/--ngram-max size the prompt lookup of --spec "
          "ngram; this model drafts with --spec " +
          spec);
    if (o.ngram_min > 0) eo.ngram_min = o.ngram_min;
    if (o.ngram_max > 0) eo.ngram_max = o.ngram_max;
    // one of the two given: the other default follows it
    if (o.ngram_max == 0 && eo.ngram_min > eo.ngram_max) eo.ngram_max = eo.ngram_min;
    if (o.ngram_min == 0 && eo.ngram_min > eo.ngram_max) eo.ngram_min = eo.ngram_max;
    if (eo.ngram_max > kMaxNgram)
      throw std::invalid_argument("--ngram-min/--ngram-max " + std::to_string(eo.ngram_max) +
                                  " exceeds " + std::to_string(kMaxNgram) +
                                  " (each token indexes every n-gram size)");
    if (eo.ngram_min > eo.ngram_max)
      throw std::invalid_argument("--ngram-min " + std::to_string(eo.ngram_min) +
                                  " exceeds --ngram-max " + std::to_string(eo.ngram_max));
  } else if (o.draft_tokens > 0 || o.ngram_min > 0 || o.ngram_max > 0) {
    throw std::invalid_argument(
        std::string(o.draft_tokens > 0 ? "--draft-tokens" : "--ngram-min/--ngram-max") +
        " needs speculative decoding: " +
        (compiled.spec == "none" ? "the model was compiled without it (ninfer-compile --spec ngram)"
                                 : "--spec none turned it off"));
  }
  return eo;
}

OutputConfig resolve_output(const Options& o, const nlohmann::json& manifest) {
  const nlohmann::json none = nlohmann::json::object();
  const nlohmann::json& chosen =
      manifest.contains("output_parsers") && manifest["output_parsers"].is_object()
          ? manifest["output_parsers"]
          : none;
  auto pick = [&](const std::string& flag_value, const char* key) {
    if (flag_value != "auto") return flag_value;
    return chosen.contains(key) && chosen[key].is_string() ? chosen[key].get<std::string>()
                                                           : std::string("none");
  };
  OutputConfig c;
  try {
    c.parsers.reasoning = parse_reasoning_format(pick(o.reasoning_parser, "reasoning"));
    c.parsers.tool_calls = parse_tool_call_format(pick(o.tool_call_parser, "tool_calls"));
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("the artifact's output_parsers: ") + e.what() +
                                "; pass --reasoning-parser / --tool-call-parser");
  }
  c.reasoning_budget = o.reasoning_budget;
  return c;
}

std::string artifact_path(const Options& o, const char* argv0) {
  if (!o.artifact.empty()) return o.artifact;
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) exe = std::filesystem::absolute(argv0);
  return (exe.parent_path() / "model.ninfer").string();
}

}  // namespace ninfer
