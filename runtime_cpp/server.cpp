// ninfer-server: flags, the route table, and one error wrapper that turns any failure
// into an OpenAI-style error body. Everything model-specific is behind create_model().
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <string>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "api.h"
#include "artifact.h"
#include "chat_format.h"
#include "backend.h"
#include "engine.h"
#include "model.h"
#include "tokenizer.h"

namespace ninfer {
namespace {

using nlohmann::json;

struct Options {
  std::string host = "127.0.0.1";
  int port = 8080;
  int threads = 0;
  int max_context = 0;
  std::string artifact;
  bool verify_checksums = true;
  bool allow_more_sms = false;
};

const char* kUsage =
    "usage: ninfer-server [--host H] [--port P] [--threads N] [--max-context N]\n"
    "                     [--artifact FILE] [--no-verify-checksums] [--allow-more-sms]\n"
    "  --port 0 picks a free port and prints it.\n";

Options parse_args(int argc, char** argv) {
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
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--host") o.host = value(i);
    else if (a == "--port") o.port = integer(i);
    else if (a == "--threads") o.threads = integer(i);
    else if (a == "--max-context") o.max_context = integer(i);
    else if (a == "--artifact") o.artifact = value(i);
    else if (a == "--no-verify-checksums") o.verify_checksums = false;
    else if (a == "--allow-more-sms") o.allow_more_sms = true;
    else if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      std::exit(0);
    } else {
      throw std::invalid_argument("unknown flag '" + a + "'\n" + kUsage);
    }
  }
  if (o.port > 65535) throw std::invalid_argument("--port must be <= 65535");
  return o;
}

std::string default_artifact(const char* argv0) {
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) exe = std::filesystem::absolute(argv0);
  return (exe.parent_path() / "model.ninfer").string();
}

struct Server {
  Engine& engine;
  const Tokenizer& tokenizer;
  const ChatFormat& chat;
  std::string model_id;

  void send_json(httplib::Response& res, int status, const json& body) {
    res.status = status;
    res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace),
                    "application/json");
  }

  // Wraps every handler: any exception becomes an OpenAI-style error body.
  httplib::Server::Handler guarded(std::function<void(const httplib::Request&,
                                                      httplib::Response&)> fn) {
    return [this, fn](const httplib::Request& req, httplib::Response& res) {
      try {
        fn(req, res);
      } catch (const ApiError& e) {
        send_json(res, e.status, error_body(e));
      } catch (const std::exception& e) {
        send_json(res, 500, error_body(ApiError(500, e.what(), "server_error")));
      }
    };
  }

  std::vector<int32_t> prompt_tokens(const CompletionRequest& r) {
    if (r.prompt_ids) return *r.prompt_ids;
    if (r.chat) {
      std::string text;
      try {
        text = chat.render(r.messages, /*add_generation_prompt=*/true);
      } catch (const std::invalid_argument& e) {
        throw ApiError(400, e.what(), "invalid_request_error", "messages");
      }
      return tokenizer.encode(text, /*add_special_tokens=*/false);
    }
    return tokenizer.encode(r.prompt, /*add_special_tokens=*/true);
  }

  void completions(const httplib::Request& req, httplib::Response& res, bool is_chat) {
    CompletionRequest r =
        parse_completion_request(req.body, is_chat, model_id, engine.info().vocab_size);
    GenerationRequest g;
    g.prompt = prompt_tokens(r);
    const int limit = engine.context_limit();
    const int n = static_cast<int>(g.prompt.size());
    if (n == 0) throw ApiError(400, "the prompt is empty after tokenization", "invalid_request_error", "prompt");
    if (n >= limit)
      throw ApiError(400, "This model's maximum context length is " + std::to_string(limit) +
                              " tokens, but the prompt has " + std::to_string(n) +
                              " tokens (at least one token must be left for the reply)",
                     "invalid_request_error", is_chat ? "messages" : "prompt",
                     "context_length_exceeded");
    g.max_tokens = r.max_tokens < 0 ? limit - n : r.max_tokens;
    g.sampling = r.sampling;
    g.seed = r.seed ? *r.seed : std::random_device{}();
    g.stop = r.stop;
    g.ignore_eos = r.ignore_eos;
    ResponseContext ctx{new_request_id(is_chat), static_cast<int64_t>(std::time(nullptr)),
                        r.model, is_chat};
    auto state = engine.submit(std::move(g));
    if (!r.stream) {
      std::string text;
      std::vector<int32_t> ids;
      for (;;) {
        GenerationEvent ev = state->next();
        if (ev.kind == GenerationEvent::Kind::kError) throw ApiError(500, ev.error, "server_error");
        if (ev.kind == GenerationEvent::Kind::kDone) {
          send_json(res, 200, completion_response(ctx, text, ev.finish_reason, ev.timings,
                                                  r.return_token_ids ? &state->request.prompt : nullptr,
                                                  r.return_token_ids ? &ids : nullptr));
          return;
        }
        text += ev.text;
        ids.insert(ids.end(), ev.tokens.begin(), ev.tokens.end());
      }
    }
    const bool with_ids = r.return_token_ids, usage = r.include_usage;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, state, ctx, with_ids, usage](size_t, httplib::DataSink& sink) {
          auto send = [&](const json& j) {
            const std::string line =
                "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
            return sink.write(line.data(), line.size());
          };
          bool first = true;
          for (;;) {
            GenerationEvent ev = state->next();
            if (ev.kind == GenerationEvent::Kind::kError) {
              send(error_body(ApiError(500, ev.error, "server_error")));
              break;
            }
            if (ev.kind == GenerationEvent::Kind::kDone) {
              json last = stream_chunk(ctx, "", false, ev.finish_reason, nullptr);
              if (usage) last["usage"] = nullptr;
              send(last);
              if (usage) {
                json u = stream_chunk(ctx, "", false, "", nullptr);
                u["choices"] = json::array();
                u["usage"] = usage_json(ev.timings);
                u["timings"] = timings_json(ev.timings);
                send(u);
              }
              break;
            }
            json chunk = stream_chunk(ctx, ev.text, first, "", with_ids ? &ev.tokens : nullptr);
            first = false;
            if (!send(chunk)) {  // client went away: stop generating for it
              state->cancel();
              while (state->next().kind == GenerationEvent::Kind::kText) {
              }
              return false;
            }
          }
          const std::string done = "data: [DONE]\n\n";
          sink.write(done.data(), done.size());
          sink.done();
          return true;
        });
  }

  void install(httplib::Server& http) {
    http.Get("/health", guarded([this](const httplib::Request&, httplib::Response& res) {
      send_json(res, 200, {{"status", "ok"}});
    }));
    http.Get("/v1/models", guarded([this](const httplib::Request&, httplib::Response& res) {
      const ModelInfo& info = engine.info();
      send_json(res, 200,
                {{"object", "list"},
                 {"data", json::array({{{"id", model_id},
                                        {"object", "model"},
                                        {"created", 0},
                                        {"owned_by", "ninfer"},
                                        {"max_model_len", engine.context_limit()},
                                        {"target", info.target}}})}});
    }));
    http.Post("/v1/chat/completions",
              guarded([this](const httplib::Request& q, httplib::Response& s) {
                completions(q, s, true);
              }));
    http.Post("/v1/completions", guarded([this](const httplib::Request& q, httplib::Response& s) {
      completions(q, s, false);
    }));
    http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (res.status == 404 && res.body.empty())
        send_json(res, 404, error_body(ApiError(404, "no route " + req.method + " " + req.path,
                                                "invalid_request_error", "", "not_found")));
    });
    http.set_exception_handler([this](const httplib::Request&, httplib::Response& res,
                                      std::exception_ptr ep) {
      std::string msg = "internal error";
      try {
        if (ep) std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        msg = e.what();
      }
      send_json(res, 500, error_body(ApiError(500, msg, "server_error")));
    });
  }
};

int run(int argc, char** argv) {
  const Options opt = parse_args(argc, argv);
  const ModelInfo& compiled = compiled_model_info();
  if (opt.max_context > compiled.max_context)
    throw std::invalid_argument("--max-context " + std::to_string(opt.max_context) +
                                " exceeds the compiled maximum " +
                                std::to_string(compiled.max_context) +
                                "; recompile with --max-context " +
                                std::to_string(opt.max_context) + " or pass a smaller value");
  // The artifact is checked first (target, version, checksums): a wrong file is refused
  // for what it is before any device is touched. Then the backend refuses a device the
  // compiled launch budgets were not proven for.
  const std::string path = opt.artifact.empty() ? default_artifact(argv[0]) : opt.artifact;
  Artifact artifact(path, compiled.target, compiled.target_hash, opt.verify_checksums);
  backend::init({opt.threads, opt.allow_more_sms});
  const json& m = artifact.manifest();
  Tokenizer tokenizer = Tokenizer::from_json(m.at("tokenizer"));
  ChatFormat chat = ChatFormat::from_json(m.at("chat_format"));
  std::unique_ptr<Model> model = create_model(artifact);
  Engine engine(*model, tokenizer, m.at("eos_token_ids").get<std::vector<int32_t>>(),
                opt.max_context > 0 ? opt.max_context : compiled.max_context);

  Server server{engine, tokenizer, chat, m.at("model").at("id").get<std::string>()};
  httplib::Server http;
  server.install(http);
  int port = opt.port;
  if (port == 0) {
    port = http.bind_to_any_port(opt.host);
  } else if (!http.bind_to_port(opt.host, port)) {
    port = -1;
  }
  if (port < 0) throw std::runtime_error("cannot listen on " + opt.host + ":" + std::to_string(opt.port));
  std::printf("ninfer-server: model %s, target %s, %s, context %d\n",
              server.model_id.c_str(), compiled.target.c_str(), backend::describe().c_str(),
              engine.context_limit());
  std::printf("ninfer-server listening on http://%s:%d\n", opt.host.c_str(), port);
  std::fflush(stdout);
  return http.listen_after_bind() ? 0 : 1;
}

}  // namespace
}  // namespace ninfer

int main(int argc, char** argv) {
  try {
    return ninfer::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ninfer-server: error: %s\n", e.what());
    return 2;
  }
}
