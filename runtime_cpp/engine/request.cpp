#include "engine/request.h"

#include <chrono>

namespace ninfer {

const char* RequestRejected::name(Reason r) {
  switch (r) {
    case Reason::kQueueFull: return "queue_full";
    case Reason::kContextLength: return "context_length";
    case Reason::kKvCapacity: return "kv_capacity";
    case Reason::kShuttingDown: return "shutting_down";
  }
  return "unknown";
}

GenerationEvent RequestState::next() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !events_.empty(); });
  GenerationEvent ev = std::move(events_.front());
  events_.pop_front();
  return ev;
}

bool RequestState::next_for(int timeout_ms, GenerationEvent& ev) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return !events_.empty(); }))
    return false;
  ev = std::move(events_.front());
  events_.pop_front();
  return true;
}

bool RequestState::wait_started(int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                      [&] { return started_ || !events_.empty(); });
}

bool RequestState::started() {
  std::lock_guard<std::mutex> lock(mu_);
  return started_;
}

void RequestState::push(GenerationEvent ev) {
  const bool wake = ev.kind != GenerationEvent::Kind::kText || wake_per_token.load();
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(ev));
  }
  if (wake) cv_.notify_all();
}

void RequestState::mark_started() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    started_ = true;
  }
  cv_.notify_all();
}

}  // namespace ninfer
