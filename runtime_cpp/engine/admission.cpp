// Admission: Engine::submit refuses at once a request that can never fit (context, KV
// pool) or that finds the waiting queue full, and otherwise queues it for the loop.
#include <algorithm>
#include <string>

#include "engine/clock.h"
#include "engine/engine.h"
#include "observe/metrics.h"
#include "observe/request_log.h"

namespace ninfer {

void Engine::log_rejected(const GenerationRequest& r, int max_tokens, const std::string& reason,
                          const std::string& message) {
  if (metrics_) metrics_->request_rejected(reason);
  if (!log_) return;
  RequestRecord rec;
  rec.event = "rejected";
  rec.id = r.id;
  rec.prompt_tokens = static_cast<int>(r.prompt.size());
  rec.max_tokens = max_tokens;
  rec.reason = reason;
  rec.error = message;
  log_->write(rec);
}

std::shared_ptr<RequestState> Engine::submit(GenerationRequest request) {
  const int n = static_cast<int>(request.prompt.size());
  if (n == 0) throw std::invalid_argument("the prompt is empty");
  const int limit = max_context_;
  auto reject = [&](RequestRejected::Reason reason, const std::string& msg,
                    const std::string& param) {
    log_rejected(request, request.max_tokens, RequestRejected::name(reason), msg);
    throw RequestRejected(reason, msg, param);
  };
  // The last sampled token is never fed back, so a request stores at most
  // prompt + max_tokens - 1 positions.
  if (n >= limit)
    reject(RequestRejected::Reason::kContextLength,
           "This model's maximum context length is " + std::to_string(limit) +
               " tokens, but the prompt has " + std::to_string(n) +
               " tokens (at least one token must be left for the reply)",
           "prompt");
  if (n > max_positions_)
    reject(RequestRejected::Reason::kKvCapacity,
           "The prompt has " + std::to_string(n) + " tokens, but the KV cache holds at most " +
               std::to_string(max_positions_) + " tokens per request (" +
               std::to_string(kv_blocks_total()) + " blocks of " +
               std::to_string(sched_config_.block_size) + " tokens)",
           "prompt");
  int max_tokens = request.max_tokens;
  if (max_tokens < 0) {
    max_tokens = std::min(limit - n, max_positions_ + 1 - n);
  } else if (static_cast<int64_t>(n) + max_tokens > limit) {
    reject(RequestRejected::Reason::kContextLength,
           "This model's maximum context length is " + std::to_string(limit) + " tokens, but " +
               std::to_string(static_cast<int64_t>(n) + max_tokens) + " tokens were requested (" +
               std::to_string(n) + " in the prompt, " + std::to_string(max_tokens) +
               " in max_tokens)",
           "max_tokens");
  } else if (n + max_tokens - 1 > max_positions_) {
    const int need = (n + max_tokens - 1 + sched_config_.block_size - 1) / sched_config_.block_size;
    reject(RequestRejected::Reason::kKvCapacity,
           "The request needs " + std::to_string(need) + " KV blocks of " +
               std::to_string(sched_config_.block_size) + " tokens (" + std::to_string(n) +
               " prompt tokens + " + std::to_string(max_tokens) + " max_tokens - 1), but at most " +
               std::to_string(max_positions_ / sched_config_.block_size) +
               " fit one request (the pool has " + std::to_string(kv_blocks_total()) + " blocks)",
           "max_tokens");
  }
  request.max_tokens = max_tokens;
  if (request.n < 1 || request.n > sched_config_.max_concurrency)
    throw std::invalid_argument("n must be in [1, " +
                                std::to_string(sched_config_.max_concurrency) + "], got " +
                                std::to_string(request.n));
  if (request.logprobs > kMaxLogprobs)
    throw std::invalid_argument("at most " + std::to_string(kMaxLogprobs) + " logprobs");
  if (request.n > 1) {
    // The group is admitted at once: the prompt's blocks, and for each other choice the
    // blocks from the one holding the prompt's last position on (scheduler.h).
    const int bs = sched_config_.block_size;
    const int own = (n + bs - 1) / bs - (n - 1) / bs;
    const int need = (n + bs - 1) / bs + (request.n - 1) * own;
    if (need > kv_blocks_total())
      reject(RequestRejected::Reason::kKvCapacity,
             "The request's " + std::to_string(request.n) + " choices need " +
                 std::to_string(need) + " KV blocks at once for a " + std::to_string(n) +
                 "-token prompt, but the pool has " + std::to_string(kv_blocks_total()),
             "n");
  }

  // Each choice its own constraint state: copies made before any token.
  std::vector<TokenConstraints> per_choice(request.n);
  per_choice[0] = request.constraints;
  for (int i = 1; i < request.n; ++i)
    for (const auto& c : request.constraints) {
      auto copy = c->clone();
      if (!copy)
        throw std::invalid_argument(
            "n > 1 with a constraint that cannot be copied for each choice");
      per_choice[i].push_back(std::move(copy));
    }

  auto state = std::make_shared<RequestState>(std::move(request));
  state->choice_constraints = std::move(per_choice);
  state->submitted_ms = clock_.now_ms();
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (shutting_down_) {
      lock.unlock();
      const std::string msg = "The server is shutting down";
      log_rejected(state->request, max_tokens, "shutting_down", msg);
      throw RequestRejected(RequestRejected::Reason::kShuttingDown, msg);
    }
    const int queued = static_cast<int>(incoming_.size()) + waiting_;
    if (max_pending_requests_ > 0 && queued - free_slots_ >= max_pending_requests_) {
      lock.unlock();
      const std::string msg = "The server is busy: " + std::to_string(queued) +
                              " requests are already waiting (at most " +
                              std::to_string(max_pending_requests_) + " may wait); retry later";
      log_rejected(state->request, max_tokens, "queue_full", msg);
      throw RequestRejected(RequestRejected::Reason::kQueueFull, msg);
    }
    incoming_.push_back(state);
    if (metrics_) metrics_->set_requests(sched_config_.max_concurrency - free_slots_, queued + 1);
  }
  cv_.notify_one();
  return state;
}

}  // namespace ninfer
