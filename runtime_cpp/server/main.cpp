// ninfer-server: parses the flags, loads the artifact, starts the backend, the model and
// the engine, binds the route table, and serves until SIGTERM / SIGINT. Everything
// model-specific is behind create_model() (model/model.h); the handlers are in routes.h.
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "engine/engine.h"
#include "model/artifact.h"
#include "model/model.h"
#include "observe/metrics.h"
#include "observe/request_log.h"
#include "server/chat_prompt.h"
#include "server/client_watch.h"
#include "server/options.h"
#include "server/routes.h"
#include "server/sampling_params.h"
#include "server/serving_state.h"
#include "structured/grammar.h"
#include "text/tokenizer.h"

namespace ninfer {
namespace {

// Requests routed and not yet answered (see install), which the stopper waits for;
// counted_here: this HTTP thread's request is one of them.
std::atomic<int> unanswered{0};
thread_local bool counted_here = false;

// The route table. Every route but /health needs the API key when one is set; until the
// model is loaded every other route answers 503 model_loading.
void install(httplib::Server& http, const ServingState& state) {
  using Method = void (Routes::*)(const httplib::Request&, httplib::Response&) const;
  auto route = [&state](Method handler, ErrorShape shape = ErrorShape::kOpenAI) {
    return guarded(
        [&state, handler](const httplib::Request& req, httplib::Response& res) {
          if (!state.authorized(req)) {
            res.set_header("WWW-Authenticate", "Bearer");
            throw ApiError(401,
                           "missing or wrong API key: send 'Authorization: Bearer KEY' or "
                           "'x-api-key: KEY' with the key the server was started with",
                           "invalid_request_error", "", "invalid_api_key");
          }
          const Routes* routes = state.routes();
          if (!routes) {
            res.set_header("Retry-After", "1");
            throw ApiError(503, "the model is still loading", "server_error", "", "model_loading");
          }
          (routes->*handler)(req, res);
        },
        shape);
  };
  http.Get("/health", guarded([&state](const httplib::Request& req, httplib::Response& res) {
             switch (state.phase()) {
               case ServingState::Phase::kReady: return state.routes()->health(req, res);
               case ServingState::Phase::kLoading:
                 res.set_header("Retry-After", "1");
                 res.status = 503;
                 return res.set_content(R"({"status":"loading"})", "application/json");
               case ServingState::Phase::kStopping:
                 res.status = 503;
                 return res.set_content(R"({"status":"shutting_down"})", "application/json");
             }
           }));
  http.Get("/metrics", route(&Routes::metrics_text));
  http.Get("/v1/models", route(&Routes::models));
  http.Get(R"(/v1/models/(.+))", route(&Routes::model));
  http.Post("/v1/chat/completions", route(&Routes::chat_completions));
  http.Post("/v1/completions", route(&Routes::completions));
  http.Post("/v1/messages", route(&Routes::messages, ErrorShape::kAnthropic));
  http.Post("/v1/messages/count_tokens", route(&Routes::count_tokens, ErrorShape::kAnthropic));
  http.Post("/tokenize", route(&Routes::tokenize));
  http.Post("/detokenize", route(&Routes::detokenize));
  http.set_error_handler(not_found);
  http.set_exception_handler(internal_error);
  // Requests routed but not yet answered: a generation leaves Routes::in_flight before
  // httplib writes its response, so the stopper also waits for these. The logger runs on
  // the request's thread after the response is written; requests httplib answers itself
  // (malformed ones) never reach the pre-routing handler and are not counted.
  http.set_pre_routing_handler([](const httplib::Request&, httplib::Response&) {
    ++unanswered;
    counted_here = true;
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http.set_logger([](const httplib::Request&, const httplib::Response&) {
    if (counted_here) --unanswered;
    counted_here = false;
  });
}

// What a loaded model serves with, destroyed after the HTTP server has stopped.
struct Loaded {
  std::unique_ptr<Artifact> artifact;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ChatPrompt> chat;
  std::unique_ptr<Model> model;
  Metrics metrics;
  std::unique_ptr<Engine> engine;
  // Structured output: the grammar engine's view of the vocabulary is built on first use.
  std::unique_ptr<GrammarCompiler> grammars;
  std::unique_ptr<Routes> routes;
};

void load(Loaded& l, const Options& opt, const ModelInfo& compiled, EngineOptions eo,
          RequestLog* request_log, const char* argv0) {
  // The artifact is checked first (target, version, checksums): a wrong file is refused
  // for what it is before any device is touched. Then the backend refuses a device the
  // compiled launch budgets were not proven for.
  l.artifact =
      std::make_unique<Artifact>(artifact_path(opt, argv0), compiled.target, compiled.target_hash,
                                 opt.verify_checksums, compiled.build_digest);
  if (backend::host_weights() && !opt.mmap_weights) {
    const auto t0 = std::chrono::steady_clock::now();
    if (l.artifact->copy_to_huge_pages())
      std::printf("ninfer-server: weights loaded into huge-page memory (%.2f GB in %.2f s)\n",
                  static_cast<double>(l.artifact->file_bytes()) / 1e9,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    else std::printf("ninfer-server: transparent huge pages are off: weights read in place\n");
  }
  backend::init({opt.threads, opt.allow_more_sms, opt.cuda_graphs});
  const nlohmann::json& m = l.artifact->manifest();
  l.tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_json(m.at("tokenizer")));
  l.chat = std::make_unique<ChatPrompt>(
      ChatPrompt::from_manifest(m.value("chat_template", nlohmann::json())));
  l.model = create_model(*l.artifact);
  eo.metrics = &l.metrics;
  eo.request_log = request_log;
  const auto eos_ids = m.at("eos_token_ids").get<std::vector<int32_t>>();
  l.grammars = std::make_unique<GrammarCompiler>(*l.tokenizer, l.model->info().vocab_size, eos_ids);
  l.engine = std::make_unique<Engine>(*l.model, *l.tokenizer, eos_ids, eo);
  std::vector<std::string> names = opt.served_model_names;
  if (names.empty()) names.push_back(m.at("model").at("id").get<std::string>());
  const GenerationDefaults defaults =
      opt.generation_config == "auto"
          ? GenerationDefaults::from_manifest(m.value("generation_config", nlohmann::json()))
          : GenerationDefaults{};
  if (!defaults.empty())
    std::printf("ninfer-server: defaults from generation_config.json: %s\n",
                defaults.describe().c_str());
  l.routes = std::unique_ptr<Routes>(new Routes{*l.engine, *l.tokenizer, *l.chat, l.metrics,
                                                std::move(names), defaults, resolve_output(opt, m),
                                                l.grammars.get()});
}

int run(int argc, char** argv) {
  // SIGTERM / SIGINT stop the server: blocked here, before any thread exists (every
  // thread inherits the mask), and taken by one thread with sigwait. /health answers 503
  // from then on; every request in flight or waiting ends with a 503 (streams: an error
  // event; code shutting_down) within one step and is answered, then the HTTP server
  // stops and everything is torn down in order (exit code 0).
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  const Options opt = parse_options(argc, argv);
  if (!opt.render_chat_template.empty()) return render_chat_template_file(opt.render_chat_template);
  const ModelInfo& compiled = compiled_model_info();
  const EngineOptions eo = resolve(opt, compiled);
  std::unique_ptr<RequestLog> request_log;
  if (!opt.request_log.empty()) request_log = std::make_unique<RequestLog>(opt.request_log);

  Loaded loaded;  // outlives `http`: handlers may use it until http has stopped
  ServingState state(opt.api_key);
  httplib::Server http;
  // Every running or waiting request holds an HTTP thread, so the pool must be larger
  // than what may be admitted plus queued; otherwise requests would queue inside
  // httplib, unseen by the admission control. Spare threads serve /metrics and /health.
  const size_t http_threads =
      static_cast<size_t>(eo.max_concurrency) +
      static_cast<size_t>(opt.max_pending_requests > 0 ? opt.max_pending_requests : 256) + 8;
  http.new_task_queue = [http_threads] { return new httplib::ThreadPool(http_threads); };
  http.set_keep_alive_timeout(opt.keep_alive_timeout_s);
  install(http, state);
  // The port is bound and served before the model loads: /health says 503 until ready.
  int port = opt.port;
  if (port == 0) {
    port = http.bind_to_any_port(opt.host);
  } else if (!http.bind_to_port(opt.host, port)) {
    port = -1;
  }
  if (port < 0)
    throw std::runtime_error("cannot listen on " + opt.host + ":" + std::to_string(opt.port));
  std::printf("ninfer-server listening on http://%s:%d (loading the model)\n", opt.host.c_str(),
              port);
  std::fflush(stdout);
  std::atomic<bool> listen_done{false}, listen_ok{false};
  std::thread listener([&] {
    listen_ok = http.listen_after_bind();
    listen_done = true;
  });
  std::thread stopper([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    // a signal before listen() starts waits for it, or stop() would be a no-op
    while (!listen_done && !http.is_running())
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (!http.is_running()) return;
    const Routes* routes = state.stop();
    if (routes) routes->engine.shutdown();
    // Printed once the engine refuses new work (tests wait for this line).
    std::fprintf(stderr, "ninfer-server: %s, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    // The requests in flight end within one step; they are answered before the port
    // closes (bounded, in case a step never returns).
    for (int waited_ms = 0;
         routes && (routes->in_flight > 0 || unanswered > 0) && waited_ms < 30000; waited_ms += 5)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    http.stop();
    end_kept_alive_connections();  // idle clients would hold the exit for the keep-alive timeout
  });
  auto stop_threads = [&] {
    listener.join();
    pthread_kill(stopper.native_handle(), SIGTERM);  // wakes the stopper if no signal came
    stopper.join();
  };
  try {
    load(loaded, opt, compiled, eo, request_log.get(), argv[0]);
  } catch (...) {
    // stop() is a no-op until listen() runs
    while (!listen_done && !http.is_running())
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    http.stop();
    stop_threads();
    throw;
  }
  // Stopped while loading: the stopper closes the port; nothing is served.
  if (state.phase() != ServingState::Phase::kStopping) {
    const Engine& engine = *loaded.engine;
    std::printf("ninfer-server: model %s, target %s, %s, context %d\n",
                loaded.routes->model_names[0].c_str(), compiled.target.c_str(),
                backend::describe().c_str(), engine.max_context());
    std::printf(
        "ninfer-server: %d concurrent requests, %d tokens per step, KV cache %d blocks "
        "of %d tokens in %s, %s waiting\n",
        engine.max_concurrency(), engine.prefill_chunk(), engine.kv_blocks_total(),
        engine.info().kv_block_size, engine.info().kv_dtype.c_str(),
        opt.max_pending_requests > 0 ? ("up to " + std::to_string(opt.max_pending_requests)).c_str()
                                     : "unbounded");
    if (engine.info().state_slots > 0)
      std::printf("ninfer-server: recurrent state (Gated DeltaNet) in %d slots\n",
                  engine.info().state_slots);
    std::printf("ninfer-server ready\n");
    std::fflush(stdout);
  }
  state.publish(loaded.routes.get());  // false if stopped meanwhile
  stop_threads();
  return listen_ok ? 0 : 1;
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
