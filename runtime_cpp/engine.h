// The engine: one loop thread that owns the model; requests arrive through a queue
// and results leave through a per-request channel, so the HTTP threads never touch
// the model and the model never sees JSON.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "model.h"
#include "sampling.h"
#include "tokenizer.h"

namespace ninfer {

struct GenerationRequest {
  std::vector<int32_t> prompt;
  int max_tokens = 16;
  SamplingParams sampling;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  bool ignore_eos = false;
};

struct Timings {
  int prompt_n = 0;
  double prompt_ms = 0;
  int predicted_n = 0;
  double predicted_ms = 0;
  double queue_ms = 0;
};

struct GenerationEvent {
  enum class Kind { kText, kDone, kError };
  Kind kind = Kind::kText;
  std::string text;              // kText: the new text (complete UTF-8)
  std::vector<int32_t> tokens;   // kText: tokens this delta completes
  std::string finish_reason;     // kDone: "stop" | "length" | "cancelled"
  std::string error;             // kError
  Timings timings;               // kDone
};

// Shared between the HTTP thread that submitted a request and the engine loop.
class RequestState {
 public:
  explicit RequestState(GenerationRequest r) : request(std::move(r)) {}
  // Blocks until the next event; false only if the request was abandoned.
  GenerationEvent next();
  void push(GenerationEvent ev);
  void cancel() { cancelled.store(true); }

  const GenerationRequest request;
  std::atomic<bool> cancelled{false};
  double submitted_ms = 0;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<GenerationEvent> events_;
};

class Engine {
 public:
  // `context_limit` (<= the compiled maximum) bounds prompt + generated tokens.
  Engine(Model& model, const Tokenizer& tokenizer, std::vector<int32_t> eos_ids,
         int context_limit);
  ~Engine();
  std::shared_ptr<RequestState> submit(GenerationRequest request);
  const ModelInfo& info() const { return model_.info(); }
  int context_limit() const { return context_limit_; }

 private:
  void loop();
  void run(RequestState& state);

  Model& model_;
  const Tokenizer& tokenizer_;
  std::vector<int32_t> eos_ids_;
  int context_limit_;
  std::vector<float> logits_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<RequestState>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

double now_ms();

}  // namespace ninfer
