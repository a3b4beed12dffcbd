#include "engine.h"

#include <algorithm>
#include <chrono>

#include "stop_matcher.h"

namespace ninfer {

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

GenerationEvent RequestState::next() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !events_.empty(); });
  GenerationEvent ev = std::move(events_.front());
  events_.pop_front();
  return ev;
}

void RequestState::push(GenerationEvent ev) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(ev));
  }
  cv_.notify_one();
}

Engine::Engine(Model& model, const Tokenizer& tokenizer, std::vector<int32_t> eos_ids,
               int context_limit)
    : model_(model), tokenizer_(tokenizer), eos_ids_(std::move(eos_ids)),
      context_limit_(std::min(context_limit, model.info().max_context)),
      logits_(model.info().vocab_size) {
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_ptr<RequestState> Engine::submit(GenerationRequest request) {
  auto state = std::make_shared<RequestState>(std::move(request));
  state->submitted_ms = now_ms();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(state);
  }
  cv_.notify_one();
  return state;
}

void Engine::loop() {
  for (;;) {
    std::shared_ptr<RequestState> state;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      state = queue_.front();
      queue_.pop_front();
    }
    try {
      run(*state);
    } catch (const std::exception& e) {
      GenerationEvent ev;
      ev.kind = GenerationEvent::Kind::kError;
      ev.error = e.what();
      state->push(std::move(ev));
    }
  }
}

void Engine::run(RequestState& state) {
  const GenerationRequest& req = state.request;
  const ModelInfo& info = model_.info();
  Timings t;
  t.queue_ms = now_ms() - state.submitted_ms;
  t.prompt_n = static_cast<int>(req.prompt.size());
  if (req.prompt.empty() || t.prompt_n >= context_limit_)
    throw std::runtime_error("prompt of " + std::to_string(t.prompt_n) +
                             " tokens does not fit the context of " +
                             std::to_string(context_limit_) + " tokens");

  const double t0 = now_ms();
  int pos = 0;
  while (pos < t.prompt_n) {
    const int n = std::min(info.max_prefill_chunk, t.prompt_n - pos);
    model_.forward(req.prompt.data() + pos, n, pos, logits_.data());
    pos += n;
    if (state.cancelled.load()) break;
  }
  t.prompt_ms = now_ms() - t0;

  Sampler sampler(req.seed);
  StreamDecoder decoder(tokenizer_, /*skip_special_tokens=*/true);
  StopMatcher stops(req.stop);
  std::string finish = "length";
  std::vector<int32_t> pending_tokens;
  const double t1 = now_ms();
  while (!state.cancelled.load()) {
    if (t.predicted_n >= req.max_tokens || pos >= context_limit_) break;
    const int32_t token = sampler.sample(logits_.data(), info.vocab_size, req.sampling);
    ++t.predicted_n;
    const bool is_eos =
        std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end();
    if (is_eos && !req.ignore_eos) {
      finish = "stop";
      break;
    }
    pending_tokens.push_back(token);
    const StopMatcher::Result r = stops.feed(decoder.push(token));
    if (!r.text.empty() || r.stopped) {
      GenerationEvent ev;
      ev.text = r.text;
      ev.tokens.swap(pending_tokens);
      state.push(std::move(ev));
    }
    if (r.stopped) {
      finish = "stop";
      break;
    }
    if (t.predicted_n >= req.max_tokens || pos >= context_limit_) break;
    model_.forward(&token, 1, pos, logits_.data());
    ++pos;
  }
  if (state.cancelled.load()) finish = "cancelled";
  if (finish != "stop" || !stops.stopped()) {
    const StopMatcher::Result r = stops.finish(decoder.flush());
    if (!r.text.empty() || !pending_tokens.empty()) {
      GenerationEvent ev;
      ev.text = r.text;
      ev.tokens.swap(pending_tokens);
      state.push(std::move(ev));
    }
  }
  t.predicted_ms = now_ms() - t1;
  GenerationEvent done;
  done.kind = GenerationEvent::Kind::kDone;
  done.finish_reason = finish;
  done.timings = t;
  state.push(std::move(done));
}

}  // namespace ninfer
