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
#include "server/options.h"
#include "server/routes.h"
#include "text/tokenizer.h"

namespace ninfer {
namespace {

void install(httplib::Server& http, const Routes& routes) {
  using Method = void (Routes::*)(const httplib::Request&, httplib::Response&) const;
  auto route = [&routes](Method handler) {
    return guarded([&routes, handler](const httplib::Request& req, httplib::Response& res) {
      (routes.*handler)(req, res);
    });
  };
  http.Get("/health", route(&Routes::health));
  http.Get("/metrics", route(&Routes::metrics_text));
  http.Get("/v1/models", route(&Routes::models));
  http.Post("/v1/chat/completions", route(&Routes::chat_completions));
  http.Post("/v1/completions", route(&Routes::completions));
  http.set_error_handler([&routes](const httplib::Request& req, httplib::Response& res) {
    routes.not_found(req, res);
  });
  http.set_exception_handler(
      [&routes](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        routes.internal_error(req, res, ep);
      });
}

int run(int argc, char** argv) {
  // SIGTERM / SIGINT stop the server: blocked here, before any thread exists (every
  // thread inherits the mask), and taken by one thread with sigwait. It ends every request
  // in flight or waiting with a 503 (streams: an error event; code shutting_down) within
  // one step, stops the HTTP server, and everything is torn down in order (exit code 0).
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  const Options opt = parse_options(argc, argv);
  if (!opt.render_chat_template.empty()) return render_chat_template_file(opt.render_chat_template);
  const ModelInfo& compiled = compiled_model_info();
  EngineOptions eo = resolve(opt, compiled);
  std::unique_ptr<RequestLog> request_log;
  if (!opt.request_log.empty()) request_log = std::make_unique<RequestLog>(opt.request_log);
  // The artifact is checked first (target, version, checksums): a wrong file is refused
  // for what it is before any device is touched. Then the backend refuses a device the
  // compiled launch budgets were not proven for.
  Artifact artifact(artifact_path(opt, argv[0]), compiled.target, compiled.target_hash,
                    opt.verify_checksums);
  backend::init({opt.threads, opt.allow_more_sms, opt.cuda_graphs});
  const nlohmann::json& m = artifact.manifest();
  Tokenizer tokenizer = Tokenizer::from_json(m.at("tokenizer"));
  const ChatPrompt chat = ChatPrompt::from_manifest(m.value("chat_template", nlohmann::json()));
  std::unique_ptr<Model> model = create_model(artifact);
  Metrics metrics;
  eo.metrics = &metrics;
  eo.request_log = request_log.get();
  Engine engine(*model, tokenizer, m.at("eos_token_ids").get<std::vector<int32_t>>(), eo);

  const Routes routes{engine, tokenizer, chat, metrics, m.at("model").at("id").get<std::string>()};
  httplib::Server http;
  // Every running or waiting request holds an HTTP thread, so the pool must be larger
  // than what may be admitted plus queued; otherwise requests would queue inside
  // httplib, unseen by the admission control. Spare threads serve /metrics and /health.
  const size_t http_threads =
      static_cast<size_t>(engine.max_concurrency()) +
      static_cast<size_t>(opt.max_pending_requests > 0 ? opt.max_pending_requests : 256) + 8;
  http.new_task_queue = [http_threads] { return new httplib::ThreadPool(http_threads); };
  install(http, routes);
  int port = opt.port;
  if (port == 0) {
    port = http.bind_to_any_port(opt.host);
  } else if (!http.bind_to_port(opt.host, port)) {
    port = -1;
  }
  if (port < 0)
    throw std::runtime_error("cannot listen on " + opt.host + ":" + std::to_string(opt.port));
  std::printf("ninfer-server: model %s, target %s, %s, context %d\n", routes.model_id.c_str(),
              compiled.target.c_str(), backend::describe().c_str(), engine.max_context());
  std::printf(
      "ninfer-server: %d concurrent requests, %d tokens per step, KV cache %d blocks "
      "of %d tokens in %s, %s waiting\n",
      engine.max_concurrency(), engine.prefill_chunk(), engine.kv_blocks_total(),
      engine.info().kv_block_size, engine.info().kv_dtype.c_str(),
      opt.max_pending_requests > 0 ? ("up to " + std::to_string(opt.max_pending_requests)).c_str()
                                   : "unbounded");
  std::printf("ninfer-server listening on http://%s:%d\n", opt.host.c_str(), port);
  std::fflush(stdout);
  std::atomic<bool> listen_done{false};
  std::thread stopper([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    // a signal before listen() starts waits for it, or stop() would be a no-op
    while (!listen_done && !http.is_running())
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (http.is_running()) {
      engine.shutdown();
      // Printed once the engine refuses new work (tests wait for this line).
      std::fprintf(stderr, "ninfer-server: %s, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
      http.stop();
    }
  });
  const bool ok = http.listen_after_bind();
  listen_done = true;
  pthread_kill(stopper.native_handle(), SIGTERM);  // wakes the stopper if no signal came
  stopper.join();
  return ok ? 0 : 1;
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
