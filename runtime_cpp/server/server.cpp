// ninfer-server: flags, the route table, and one error wrapper that turns any failure
// into an OpenAI-style error body. Everything model-specific is behind create_model().
//
// Overload and failure statuses: a request that can never fit (context or KV pool) is
// refused at once with 400; when --max-pending-requests requests already wait, 429 with
// Retry-After (type rate_limit_error, code queue_full: "come back later", which OpenAI
// clients retry); a request not admitted within --pending-timeout-ms gets 503 with
// Retry-After (type server_error, code pending_timeout: the server, not the client's
// rate, is the problem; clients retry 503 too). Streaming responses send their headers
// only once the request is admitted, so these statuses reach streaming clients as well.
// A client that disconnects (a failed write, or the socket found closed while waiting)
// has its request cancelled; the engine frees its slot and blocks within one step.
#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
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
#include <thread>
#include <type_traits>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "server/api.h"
#include "model/artifact.h"
#include "text/chat_format.h"
#include "backend/backend.h"
#include "engine/engine.h"
#include "observe/metrics.h"
#include "model/model.h"
#include "observe/request_log.h"
#include "text/tokenizer.h"

namespace ninfer {
namespace {

using nlohmann::json;

struct Options {
  std::string host = "127.0.0.1";
  int port = 8080;
  int threads = 0;
  int max_context = 0;
  int max_concurrency = 0;      // 0: compiled
  int prefill_chunk = 0;        // 0: compiled
  int max_pending = 64;         // 0: unbounded
  int pending_timeout_ms = 0;   // 0: none
  double max_decode_slowdown = 1.5;
  std::string request_log;
  std::string artifact;
  bool verify_checksums = true;
  bool allow_more_sms = false;
  bool cuda_graphs = true;
};

const char* kUsage =
    "usage: ninfer-server [--host H] [--port P] [--threads N] [--max-context N]\n"
    "                     [--max-concurrency N] [--prefill-chunk N]\n"
    "                     [--max-pending-requests N] [--pending-timeout-ms MS]\n"
    "                     [--max-decode-slowdown X] [--request-log FILE]\n"
    "                     [--artifact FILE] [--no-verify-checksums]\n"
    "                     [--allow-more-sms] [--no-cuda-graph]\n"
    "  --port 0 picks a free port and prints it.\n"
    "  --max-concurrency N       requests running at once (default and maximum: compiled)\n"
    "  --prefill-chunk N         token rows per step, decode rows and prompt chunks\n"
    "                            together (default and maximum: compiled)\n"
    "  --max-pending-requests N  requests that may wait for a slot; more get 429\n"
    "                            (default 64, 0 = unbounded)\n"
    "  --pending-timeout-ms MS   a request waiting longer gets 503 (default 0 = never)\n"
    "  --max-decode-slowdown X   while requests decode, prompt rows per step are limited so\n"
    "                            a step takes at most X times a decode-only step (default\n"
    "                            1.5, 0 = no limit: prompts take the whole step budget)\n"
    "  --request-log FILE        append one JSON line per request event\n"
    "  --no-cuda-graph           CUDA: launch every kernel of a step eagerly instead of\n"
    "                            replaying the step's CUDA graph (no effect on the CPU)\n"
    "  GET /metrics serves Prometheus metrics.\n";

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
  auto positive = [&](int& i) {
    const std::string flag = argv[i];
    const int x = integer(i);
    if (x < 1) throw std::invalid_argument(flag + " must be at least 1");
    return x;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--host") o.host = value(i);
    else if (a == "--port") o.port = integer(i);
    else if (a == "--threads") o.threads = integer(i);
    else if (a == "--max-context") o.max_context = integer(i);
    else if (a == "--max-concurrency") o.max_concurrency = positive(i);
    else if (a == "--prefill-chunk") o.prefill_chunk = positive(i);
    else if (a == "--max-pending-requests") o.max_pending = integer(i);
    else if (a == "--pending-timeout-ms") o.pending_timeout_ms = integer(i);
    else if (a == "--max-decode-slowdown") {
      const std::string v = value(i);
      char* end = nullptr;
      o.max_decode_slowdown = std::strtod(v.c_str(), &end);
      if (*end || v.empty() || !(o.max_decode_slowdown == 0 || o.max_decode_slowdown > 1))
        throw std::invalid_argument("--max-decode-slowdown expects 0 or a number above 1, got '" +
                                    v + "'");
    }
    else if (a == "--request-log") o.request_log = value(i);
    else if (a == "--artifact") o.artifact = value(i);
    else if (a == "--no-verify-checksums") o.verify_checksums = false;
    else if (a == "--allow-more-sms") o.allow_more_sms = true;
    else if (a == "--no-cuda-graph") o.cuda_graphs = false;
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

// ---------------------------------------------------------------------------------------
// Noticing a client that went away while its request waits or prefills (nothing is
// written then, so no write can fail). Newer cpp-httplib has
// Request::is_connection_closed; older ones (0.11 in Ubuntu 22.04) do not expose the
// socket, so it is found among this process's descriptors by the request's addresses:
// the handler runs on the connection's thread, so the socket stays open meanwhile.

template <typename R, typename = void>
struct HasIsConnectionClosed : std::false_type {};
template <typename R>
struct HasIsConnectionClosed<R, std::void_t<decltype(std::declval<R&>().is_connection_closed)>>
    : std::true_type {};

// `host` empty: compare the port only.
bool same_endpoint(const sockaddr_storage& a, socklen_t len, const std::string& host, int port) {
  char h[NI_MAXHOST], p[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, h, sizeof h, p, sizeof p,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  return (host.empty() || host == h) && port == std::atoi(p);
}

int find_connection_socket(const std::string& remote_addr, int remote_port,
                           const std::string& local_addr, int local_port) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  int found = -1;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const int fd = std::atoi(e->d_name);
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) continue;
    if (!same_endpoint(addr, len, remote_addr, remote_port)) continue;
    if (local_port >= 0) {
      len = sizeof addr;
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) continue;
      if (!same_endpoint(addr, len, local_addr, local_port)) continue;
    }
    found = fd;
    break;
  }
  closedir(dir);
  return found;
}

// True when the peer closed (or reset) the connection; data waiting to be read (a
// pipelined request) counts as alive.
bool socket_closed(int fd) {
  pollfd p{fd, static_cast<short>(POLLIN | POLLRDHUP), 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLERR | POLLHUP | POLLNVAL | POLLRDHUP)) return true;
  char c;
  const ssize_t k = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

constexpr int kPollMs = 50;  // how often a waiting handler checks its client

class ClientWatch {
 public:
  explicit ClientWatch(const httplib::Request& req) { init(req); }
  // Checks at most every kPollMs (cheap to call after every event).
  bool gone() {
    const double now = now_ms();
    if (gone_ || now - last_check_ < kPollMs) return gone_;
    last_check_ = now;
    if (probe_) {
      gone_ = probe_();
    } else {
      if (fd_ == -2)
        fd_ = find_connection_socket(remote_addr_, remote_port_, local_addr_, local_port_);
      gone_ = fd_ >= 0 && socket_closed(fd_);
    }
    return gone_;
  }

 private:
  template <typename R>
  void init(const R& req) {
    if constexpr (HasIsConnectionClosed<R>::value) {
      probe_ = req.is_connection_closed;
    } else {
      remote_addr_ = req.remote_addr;
      remote_port_ = req.remote_port;
      local_addr_ = req.local_addr;
      local_port_ = req.local_port;
    }
  }
  std::function<bool()> probe_;
  std::string remote_addr_, local_addr_;
  int remote_port_ = -1, local_port_ = -1;
  int fd_ = -2;  // -2: not looked up yet, -1: not found (never reported gone)
  double last_check_ = now_ms();
  bool gone_ = false;
};

// ---------------------------------------------------------------------------------------

struct Server {
  Engine& engine;
  const Tokenizer& tokenizer;
  const ChatFormat& chat;
  Metrics& metrics;
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

  // An engine event that is an error, as the status the client should see.
  static ApiError event_error(const GenerationEvent& ev, httplib::Response& res) {
    if (ev.error_code == "pending_timeout") {
      res.set_header("Retry-After", "1");
      return ApiError(503, ev.error, "server_error", "", "pending_timeout");
    }
    if (ev.error_code == "shutting_down")
      return ApiError(503, ev.error, "server_error", "", "shutting_down");
    return ApiError(500, ev.error, "server_error");
  }

  std::shared_ptr<RequestState> submit(GenerationRequest g, httplib::Response& res,
                                       bool is_chat) {
    try {
      return engine.submit(std::move(g));
    } catch (const RequestRejected& e) {
      const std::string param =
          e.param == "prompt" && is_chat ? std::string("messages") : e.param;
      switch (e.reason) {
        case RequestRejected::Reason::kQueueFull:
          res.set_header("Retry-After", "1");
          throw ApiError(429, e.what(), "rate_limit_error", "", "queue_full");
        case RequestRejected::Reason::kContextLength:
          throw ApiError(400, e.what(), "invalid_request_error", param,
                         "context_length_exceeded");
        case RequestRejected::Reason::kKvCapacity:
          throw ApiError(400, e.what(), "invalid_request_error", param,
                         "kv_cache_capacity_exceeded");
        case RequestRejected::Reason::kShuttingDown:
          throw ApiError(503, e.what(), "server_error", "", "shutting_down");
      }
      throw;
    }
  }

  void client_gone(httplib::Response& res) {
    // Nobody reads this; 499 is nginx's "client closed request".
    send_json(res, 499, error_body(ApiError(499, "client closed the connection", "server_error")));
  }

  void completions(const httplib::Request& req, httplib::Response& res, bool is_chat) {
    CompletionRequest r =
        parse_completion_request(req.body, is_chat, model_id, engine.info().vocab_size);
    GenerationRequest g;
    g.prompt = prompt_tokens(r);
    if (g.prompt.empty())
      throw ApiError(400, "the prompt is empty after tokenization", "invalid_request_error",
                     is_chat ? "messages" : "prompt");
    g.max_tokens = r.max_tokens;  // -1: the engine fills what the context and pool allow
    g.sampling = r.sampling;
    g.seed = r.seed ? *r.seed : std::random_device{}();
    g.stop = r.stop;
    g.ignore_eos = r.ignore_eos;
    ResponseContext ctx{new_request_id(is_chat), static_cast<int64_t>(std::time(nullptr)),
                        r.model, is_chat};
    g.id = ctx.id;
    auto state = submit(std::move(g), res, is_chat);
    state->wake_per_token = r.stream;
    auto watch = std::make_shared<ClientWatch>(req);

    // Until admitted nothing is sent, so a refusal while queued keeps its own status.
    while (!state->wait_started(kPollMs)) {
      if (watch->gone()) {
        state->cancel();
        return client_gone(res);
      }
    }
    if (!state->started()) {
      GenerationEvent ev = state->next();
      if (ev.kind == GenerationEvent::Kind::kError) throw event_error(ev, res);
      return client_gone(res);  // cancelled while queued
    }

    if (!r.stream) {
      std::string text;
      std::vector<int32_t> ids;
      for (;;) {
        GenerationEvent ev;
        const bool got = state->next_for(kPollMs, ev);
        if (watch->gone()) {
          state->cancel();
          return client_gone(res);
        }
        if (!got) continue;
        if (ev.kind == GenerationEvent::Kind::kError) throw event_error(ev, res);
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
        [state, ctx, with_ids, usage, watch](size_t, httplib::DataSink& sink) {
          auto send = [&](const json& j) {
            const std::string line =
                "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
            return sink.write(line.data(), line.size());
          };
          bool first = true;
          for (;;) {
            GenerationEvent ev;
            const bool got = state->next_for(kPollMs, ev);
            if (watch->gone()) {  // client went away: stop generating for it
              state->cancel();
              return false;
            }
            if (!got) continue;
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
    http.Get("/metrics", guarded([this](const httplib::Request&, httplib::Response& res) {
      res.status = 200;
      res.set_content(metrics.render(), Metrics::content_type());
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
                                        {"vocab_size", info.vocab_size},
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
  // SIGTERM / SIGINT stop the server: blocked here, before any thread exists (every
  // thread inherits the mask), and taken by one thread with sigwait. It ends every request
  // in flight or waiting with a 503 (streams: an error event; code shutting_down) within
  // one step, stops the HTTP server, and everything is torn down in order (exit code 0).
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  const Options opt = parse_args(argc, argv);
  const ModelInfo& compiled = compiled_model_info();
  if (opt.max_context > compiled.max_context)
    throw std::invalid_argument("--max-context " + std::to_string(opt.max_context) +
                                " exceeds the compiled maximum " +
                                std::to_string(compiled.max_context) +
                                "; recompile with --max-context " +
                                std::to_string(opt.max_context) + " or pass a smaller value");
  auto check_compiled = [](int value, int compiled_max, const char* flag, const char* compile_flag) {
    if (value > compiled_max)
      throw std::invalid_argument(std::string(flag) + " " + std::to_string(value) +
                                  " exceeds the compiled maximum " + std::to_string(compiled_max) +
                                  "; recompile with " + compile_flag + " " +
                                  std::to_string(value) + " or pass a smaller value");
  };
  check_compiled(opt.max_concurrency, compiled.max_concurrency, "--max-concurrency",
                 "--max-concurrency");
  check_compiled(opt.prefill_chunk, compiled.max_prefill_chunk, "--prefill-chunk",
                 "--max-prefill-chunk");
  std::unique_ptr<RequestLog> request_log;
  if (!opt.request_log.empty()) request_log = std::make_unique<RequestLog>(opt.request_log);
  // The artifact is checked first (target, version, checksums): a wrong file is refused
  // for what it is before any device is touched. Then the backend refuses a device the
  // compiled launch budgets were not proven for.
  const std::string path = opt.artifact.empty() ? default_artifact(argv[0]) : opt.artifact;
  Artifact artifact(path, compiled.target, compiled.target_hash, opt.verify_checksums);
  backend::init({opt.threads, opt.allow_more_sms, opt.cuda_graphs});
  const json& m = artifact.manifest();
  Tokenizer tokenizer = Tokenizer::from_json(m.at("tokenizer"));
  ChatFormat chat = ChatFormat::from_json(m.at("chat_format"));
  std::unique_ptr<Model> model = create_model(artifact);
  Metrics metrics;
  EngineOptions eo;
  eo.context_limit = opt.max_context > 0 ? opt.max_context : compiled.max_context;
  eo.max_concurrency = opt.max_concurrency;
  eo.step_tokens = opt.prefill_chunk;
  eo.max_pending = opt.max_pending;
  eo.pending_timeout_ms = opt.pending_timeout_ms;
  eo.max_decode_slowdown = opt.max_decode_slowdown;
  eo.metrics = &metrics;
  eo.request_log = request_log.get();
  Engine engine(*model, tokenizer, m.at("eos_token_ids").get<std::vector<int32_t>>(), eo);

  Server server{engine, tokenizer, chat, metrics, m.at("model").at("id").get<std::string>()};
  httplib::Server http;
  // Every running or waiting request holds an HTTP thread, so the pool must be larger
  // than what may be admitted plus queued; otherwise requests would queue inside
  // httplib, unseen by the admission control. Spare threads serve /metrics and /health.
  const size_t http_threads = static_cast<size_t>(engine.max_concurrency()) +
                              static_cast<size_t>(opt.max_pending > 0 ? opt.max_pending : 256) +
                              8;
  http.new_task_queue = [http_threads] { return new httplib::ThreadPool(http_threads); };
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
  std::printf("ninfer-server: %d concurrent requests, %d tokens per step, KV cache %d blocks "
              "of %d tokens in %s, %s waiting\n",
              engine.max_concurrency(), engine.step_tokens(), engine.kv_blocks_total(),
              engine.info().kv_block_size, engine.info().kv_dtype.c_str(),
              opt.max_pending > 0 ? ("up to " + std::to_string(opt.max_pending)).c_str()
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
      std::fprintf(stderr, "ninfer-server: %s, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
      engine.shutdown();
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
