#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "engine/clock.h"
#include "engine/engine_seq.h"
#include "engine/ngram.h"
#include "engine/stop_matcher.h"
#include "observe/metrics.h"
#include "observe/request_log.h"

namespace ninfer {

namespace {

// The scheduler's configuration from engine options whose limits were resolved against
// the compiled ones (server/options.cpp resolve(): the one place that checks a user's
// values and says what to do); 0 takes the compiled value. A value out of range here is a
// caller's bug, reported by the Scheduler as a logic_error.
SchedulerConfig scheduler_config(const ModelInfo& info, const EngineOptions& o) {
  SchedulerConfig c;
  c.table_rows = info.max_concurrency;
  c.prefill_chunk = o.prefill_chunk > 0 ? o.prefill_chunk : info.prefill_chunk;
  c.max_concurrency =
      o.max_concurrency > 0 ? o.max_concurrency : std::min(info.max_concurrency, c.prefill_chunk);
  c.kv_blocks = info.kv_blocks;
  c.block_size = info.kv_block_size;
  c.blocks_per_seq = info.blocks_per_seq;
  c.share_prompt_blocks = info.state_slots == 0;
  // A model with recurrent state has hits only where a checkpoint holds the state.
  c.recurrent = info.state_slots > 0;
  c.prefix_caching = o.prefix_caching && (!c.recurrent || info.state_checkpoints > 0);
  c.hash_extra = info.spec == "mtp" && o.draft_tokens > 0 ? 1 : 0;  // the head in use
  c.state_align = info.prefill_align;
  c.state_checkpoints = info.state_checkpoints;
  c.checkpoint_interval = o.checkpoint_interval;
  // The model's alignment where a step of this configuration can always honour it; a
  // smaller one would cut where the kernels do not, so none then (any cut is still
  // correct, only not bit-identical across schedules).
  if (c.prefill_chunk - c.max_concurrency + 1 >= info.prefill_align)
    c.prefill_align = info.prefill_align;
  if (c.prefill_chunk > info.prefill_chunk)
    throw std::logic_error("engine options: prefill chunk " + std::to_string(c.prefill_chunk) +
                           " above the compiled " + std::to_string(info.prefill_chunk));
  return c;
}

int resolved_max_context(const ModelInfo& info, const EngineOptions& o) {
  if (o.max_context > info.max_context)
    throw std::logic_error("engine options: max context " + std::to_string(o.max_context) +
                           " above the compiled " + std::to_string(info.max_context));
  return o.max_context > 0 ? o.max_context : info.max_context;
}

}  // namespace

Engine::Engine(Model& model, const Tokenizer& tokenizer, std::vector<int32_t> eos_ids,
               const EngineOptions& options)
    : model_(model), tokenizer_(tokenizer), eos_ids_(std::move(eos_ids)),
      sched_config_(scheduler_config(model.info(), options)),
      max_context_(resolved_max_context(model.info(), options)), max_positions_(0),
      max_pending_requests_(options.max_pending_requests),
      pending_timeout_ms_(options.pending_timeout_ms),
      max_decode_slowdown_(options.max_decode_slowdown), draft_tokens_(options.draft_tokens),
      ngram_min_(options.ngram_min), ngram_max_(options.ngram_max), make_drafter_(options.drafter),
      metrics_(options.metrics), log_(options.request_log),
      clock_(options.clock ? *options.clock : steady_clock()), sched_(sched_config_) {
  const ModelInfo& info = model.info();
  max_positions_ = sched_.max_positions();
  if (draft_tokens_ < 0 || draft_tokens_ > info.max_draft_tokens)
    throw std::logic_error("engine options: " + std::to_string(draft_tokens_) +
                           " draft tokens; the model was compiled for " +
                           std::to_string(info.max_draft_tokens));
  if (info.state_slots > 0 && info.state_slots != info.max_concurrency * info.state_group())
    throw std::logic_error("model info: " + std::to_string(info.state_slots) + " state slots for " +
                           std::to_string(info.max_concurrency) + " sequence slots of " +
                           std::to_string(info.state_group()) + " each");
  mtp_ = draft_tokens_ > 0 && info.spec == "mtp";
  if (draft_tokens_ > 0) {
    NgramDrafter check(ngram_min_, ngram_max_);  // throws std::invalid_argument
    if (metrics_) metrics_->enable_spec(draft_tokens_);
  }
  logits_.resize(static_cast<size_t>(info.logit_rows()) * info.vocab_size);
  tokens_.resize(info.prefill_chunk);
  positions_.resize(info.prefill_chunk);
  slots_.resize(info.prefill_chunk);
  if (info.state_slots > 0) {
    state_slots_.resize(info.prefill_chunk);
    save_slots_.resize(info.prefill_chunk);
  }
  logit_rows_.resize(info.logit_rows());
  if (model.samples_on_device()) {
    sample_rows_.resize(info.logit_rows());
    sample_edits_.resize(info.logit_rows());
    sample_masks_.resize(info.logit_rows());
    sampled_.resize(info.logit_rows());
  }
  block_tables_.resize(static_cast<size_t>(info.max_concurrency) * info.blocks_per_seq);
  free_slots_ = sched_.free_slots();
  publish();
  thread_ = std::thread([this] { loop(); });
}

void Engine::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutting_down_ = true;
  }
  cv_.notify_all();
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Engine::publish() {
  // Loop thread (or constructor): the scheduler is not shared.
  const int running = static_cast<int>(sched_.running().size());
  const int waiting = static_cast<int>(sched_.waiting().size());
  int incoming;
  {
    std::lock_guard<std::mutex> lock(mu_);
    waiting_ = waiting;
    free_slots_ = sched_.free_slots();
    incoming = static_cast<int>(incoming_.size());
  }
  if (metrics_) {
    metrics_->set_requests(running, waiting + incoming);
    metrics_->set_kv_blocks(sched_.kv().used(), sched_.kv().total());
    if (model_.info().state_slots > 0)  // a running sequence holds its slot's whole group
      metrics_->set_state_slots(running * model_.info().state_group(), model_.info().state_slots);
    if (sched_config_.prefix_caching) {
      metrics_->set_prefix_cache(sched_.prefix_queries(), sched_.prefix_hits(),
                                 sched_.kv().cached(), sched_.kv().evictions());
      if (sched_config_.recurrent)
        metrics_->set_state_checkpoints(sched_.checkpoints_used(), sched_config_.state_checkpoints);
    }
  }
}

void Engine::loop() {
  bool shutting_down = false;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock,
               [&] { return stopping_ || !incoming_.empty() || !seqs_.empty() || shutting_down_; });
      if (stopping_) break;
      shutting_down = shutting_down_;
      for (auto& state : incoming_) {
        const GenerationRequest& r = state->request;
        auto choices = std::make_shared<Choices>();
        auto lead = std::make_unique<Seq>(state, choices, 0, tokenizer_, r.max_tokens);
        auto speculate = [&](Seq& s) {
          if (draft_tokens_ == 0) return;
          if (make_drafter_) s.drafter = make_drafter_(s.state->request, s.index);
          else if (mtp_) s.drafter = std::make_unique<HeldDrafter>();
          else s.drafter = std::make_unique<NgramDrafter>(ngram_min_, ngram_max_);
          s.drafter->extend(s.tokens);
        };
        speculate(*lead);
        for (int i = 1; i < r.n; ++i) {
          auto fork = std::make_unique<Seq>(state, choices, i, tokenizer_, r.max_tokens);
          speculate(*fork);
          lead->forks.push_back(fork.get());
          seqs_.push_back(std::move(fork));
        }
        sched_.add(lead.get());
        seqs_.push_back(std::move(lead));
      }
      waiting_ += static_cast<int>(incoming_.size());
      incoming_.clear();
    }
    if (shutting_down && !seqs_.empty()) {
      std::vector<Seq*> all;
      for (auto& p : seqs_) all.push_back(static_cast<Seq*>(p.get()));
      const double now = clock_.now_ms();
      for (Seq* s : all) fail(*s, "The server is shutting down", "shutting_down", now);
    }
    reap(clock_.now_ms());
    if (seqs_.empty()) {
      publish();
      if (shutting_down) {  // nothing left to do until the destructor stops the loop
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !incoming_.empty(); });
      }
      continue;
    }
    if (draft_tokens_ > 0) propose_drafts();
    StepPlan plan = sched_.plan(prefill_limit());
    const double now = clock_.now_ms();
    for (Sequence* p : plan.admitted) {
      Seq& s = static_cast<Seq&>(*p);
      if (s.t_admit >= 0) continue;  // readmitted after a preemption
      s.t_admit = now;
      s.state->mark_started();
      if (s.index > 0) continue;  // the request's other choices, admitted with it
      const double queue_ms = now - s.state->submitted_ms;
      if (metrics_) metrics_->observe_queue(queue_ms / 1000);
      if (log_) {
        RequestRecord rec;
        rec.event = "start";
        rec.id = s.state->request.id;
        rec.prompt_tokens = s.prompt_n();
        rec.max_tokens = s.max_tokens;
        rec.queue_ms = queue_ms;
        log_->write(rec);
      }
    }
    if (metrics_ && !plan.preempted.empty())
      metrics_->add_preemptions(static_cast<int>(plan.preempted.size()));
    publish();
    if (plan.rows == 0) {  // nothing runnable (should not happen); do not spin
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(5));
      continue;
    }
    run_step(plan);
    publish();
  }
  // Shutting down: nobody will serve what is left.
  const double now = clock_.now_ms();
  while (!seqs_.empty()) fail(*seqs_.back(), "the server is shutting down", "", now);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& state : incoming_) {
    GenerationEvent ev;
    ev.kind = GenerationEvent::Kind::kError;
    ev.error = "the server is shutting down";
    state->push(std::move(ev));
  }
  incoming_.clear();
}

void Engine::reap(double now) {
  std::vector<Seq*> cancelled, expired;
  for (auto& p : seqs_) {
    Seq& s = *p;
    if (s.state->cancelled.load()) cancelled.push_back(&s);
    else if (pending_timeout_ms_ > 0 && s.t_admit < 0 &&
             now - s.state->submitted_ms > pending_timeout_ms_)
      expired.push_back(&s);
  }
  for (Seq* s : cancelled) {
    if (s->choices->failed) drop(*s);  // another choice failed the request: said already
    else finish(*s, "cancelled", now);
  }
  for (Seq* s : expired) {
    if (!s->choices->failed) {
      s->choices->failed = true;
      const std::string msg = "The request waited " +
                              std::to_string(static_cast<int64_t>(now - s->state->submitted_ms)) +
                              " ms without being scheduled (the pending timeout is " +
                              std::to_string(static_cast<int64_t>(pending_timeout_ms_)) +
                              " ms); the server is overloaded, retry later";
      log_rejected(s->state->request, s->max_tokens, "pending_timeout", msg);
      GenerationEvent ev;
      ev.kind = GenerationEvent::Kind::kError;
      ev.error = msg;
      ev.error_code = "pending_timeout";
      s->state->push(std::move(ev));
    }
    drop(*s);
  }
}

int Engine::prefill_limit() const {
  if (max_decode_slowdown_ <= 1 || decode_step_ms_ <= 0 || prompt_row_ms_ <= 0)
    return std::numeric_limits<int>::max();
  const double rows = (max_decode_slowdown_ - 1) * decode_step_ms_ / prompt_row_ms_;
  return rows >= sched_config_.prefill_chunk ? std::numeric_limits<int>::max()
                                             : std::max(1, static_cast<int>(rows));
}

void Engine::run_step(StepPlan& plan) {
  const ModelInfo& info = model_.info();
  int row = 0, n_logits = 0;
  const int group = info.state_group();
  for (const Chunk& c : plan.chunks) {
    const int real = c.count - c.drafts;  // rows of tokens; then the drafts after them
    const int base = c.seq->slot * group;
    for (int i = 0; i < c.count; ++i, ++row) {
      tokens_[row] = i < real ? c.seq->tokens[c.start + i] : c.seq->drafts[i - real];
      positions_[row] = c.start + i;
      slots_[row] = c.seq->slot;
      if (group > 0) {
        // The state after the last token (j = 0) and after each draft but the last goes to
        // the group's next slots: verify_drafts makes the accepted one current.
        const int j = i - (real - 1);
        state_slots_[row] = base + c.seq->state_index;
        save_slots_[row] =
            j >= 0 && j < c.drafts ? base + (c.seq->state_index + 1 + j) % group : -1;
      }
    }
    if (c.logits)  // the last token's row, and each draft's
      for (int i = c.drafts; i >= 0; --i) logit_rows_[n_logits++] = row - 1 - i;
  }
  sched_.fill_block_tables(block_tables_.data());
  StepBatch batch;
  batch.n = plan.rows;
  batch.tokens = tokens_.data();
  batch.positions = positions_.data();
  batch.slots = slots_.data();
  batch.block_tables = block_tables_.data();
  batch.n_logits = n_logits;
  batch.logit_rows = logit_rows_.data();
  if (group > 0) {
    batch.state_slots = state_slots_.data();
    batch.save_slots = save_slots_.data();
  }
  // Constraints may compute their next mask while the step runs (constraint.h).
  for (const Chunk& c : plan.chunks)
    if (c.logits)
      for (const auto& constraint : static_cast<Seq&>(*c.seq).constraints) constraint->prepare();
  const double t0 = clock_.now_ms();
  const bool device = model_.samples_on_device();
  auto state_slot = [&](const Sequence& q) { return q.slot * group + q.state_index; };
  // Device sampling: a row whose description fails (a constraint's mask) fails only its
  // request; it is sampled greedily meanwhile.
  std::vector<std::string> row_errors(device ? n_logits : 0);
  try {
    // Sequences starting from a cached prefix of a recurrent model: its state first.
    for (const StateRestore& r : plan.restores)
      model_.copy_state(info.state_slots + r.checkpoint, state_slot(*r.seq));
    if (device) {
      model_.launch(batch);
      int k = 0;
      for (const Chunk& c : plan.chunks) {
        if (!c.logits) continue;
        for (int j = 0; j <= c.drafts; ++j, ++k) {  // a draft row: as if the drafts before it
          try {                                     // were accepted (the others are dropped)
            device_row(static_cast<Seq&>(*c.seq), k, j);
          } catch (const std::exception& e) {
            row_errors[k] = e.what();
            sample_rows_[k] = SampleRow{};
            sample_rows_[k].temperature = 0;
          }
        }
      }
      model_.sample(sample_rows_.data(), sampled_.data());
    } else {
      model_.step(batch, logits_.data());
    }
    // Prompt chunks that end at a checkpoint position: the state after them, kept.
    for (const Chunk& c : plan.chunks)
      if (c.checkpoint >= 0) model_.copy_state(state_slot(*c.seq), info.state_slots + c.checkpoint);
  } catch (const std::exception& e) {
    const double now = clock_.now_ms();
    for (const Chunk& c : plan.chunks)
      fail(static_cast<Seq&>(*c.seq), std::string("model step failed: ") + e.what(), "", now);
    return;
  }
  {
    const double ms = clock_.now_ms() - t0;
    // Decode rows with their drafts (and last prompt tokens): a "decode-only" step is any
    // step without prompt chunks, so with speculation its cost varies with the drafts it
    // verified (the average follows them; the cap stays approximate).
    int single = 0;
    for (const Chunk& c : plan.chunks)
      if (c.count - c.drafts == 1) single += c.count;
    const int prompt_rows = plan.rows - single;
    auto ema = [](double& avg, double x) { avg = avg > 0 ? 0.75 * avg + 0.25 * x : x; };
    if (prompt_rows == 0) ema(decode_step_ms_, ms);
    else if (single > 0 && decode_step_ms_ > 0)
      ema(prompt_row_ms_, std::max(1e-3, ms - decode_step_ms_) / prompt_rows);
  }
  sched_.commit(plan);
  if (metrics_) {
    metrics_->observe_step_rows(plan.rows);
    metrics_->observe_step_sequences(static_cast<int>(plan.chunks.size()));
  }
  const double now = clock_.now_ms();
  int k = 0;
  for (const Chunk& c : plan.chunks) {
    if (!c.logits) continue;
    Seq& s = static_cast<Seq&>(*c.seq);
    const int row = k;
    k += 1 + c.drafts;
    if (c.drafts > 0) {
      try {
        verify_drafts(s, row, now, device ? &row_errors : nullptr);  // may destroy s
      } catch (const std::exception& e) {
        fail(s, e.what(), "", now);
      }
      continue;
    }
    try {
      TokenLogprob lp;
      TokenLogprob* want = s.state->request.logprobs >= 0 ? &lp : nullptr;
      int32_t token;
      if (device) {
        if (!row_errors[row].empty()) throw std::runtime_error(row_errors[row]);
        SampledToken& t = sampled_[row];
        if (t.token < 0) throw std::runtime_error(kAllMaskedError);
        token = t.token;
        if (want) *want = {token, t.logprob, std::move(t.top)};
      } else {
        token = sample_host(s, logits_.data() + static_cast<size_t>(row) * info.vocab_size, want);
      }
      on_token(s, token, want, now);  // may finish and destroy s
    } catch (const std::exception& e) {
      fail(s, e.what(), "", now);
    }
  }
  if (mtp_) {
    draft_mtp(plan);
    sched_.publish_running();  // the head's cells of the step's rows are written now
  }
}

bool Engine::on_token(Seq& s, int32_t token, TokenLogprob* logprob, double now,
                      bool first_in_step) {
  const GenerationRequest& req = s.state->request;
  for (const auto& c : s.constraints)
    if (!c->accept(token))
      throw std::logic_error("a constraint refused token " + std::to_string(token) +
                             " after its own mask allowed it");
  if (req.sampling.has_penalties()) s.counts.add_output(token);
  ++s.generated;
  if (metrics_) {
    metrics_->add_generation_tokens(1);
    if (s.generated == 1 && s.index == 0) {
      metrics_->add_prompt_tokens(s.prompt_n());
      metrics_->observe_ttft((now - s.state->submitted_ms) / 1000);
      metrics_->observe_prefill((now - s.t_admit) / 1000);
    } else if (s.generated > 1 && first_in_step) {
      metrics_->observe_inter_token((now - s.t_last) / 1000);
    }
  }
  if (s.generated == 1) s.t_first = now;
  s.t_last = now;
  auto in = [token](const std::vector<int32_t>& ids) {
    return std::find(ids.begin(), ids.end(), token) != ids.end();
  };
  if ((!req.ignore_eos && in(eos_ids_)) || in(req.stop_token_ids)) {
    finish(s, "stop", now);
    return true;
  }
  s.pending_tokens.push_back(token);
  if (logprob) s.pending_logprobs.push_back(std::move(*logprob));
  // Stop strings count from min_tokens on (vLLM): one may still start before.
  const StopMatcher::Result r =
      s.stops.feed(s.decoder.push(token), /*armed=*/s.generated >= req.min_tokens);
  if (!r.text.empty() || r.stopped) send_pending(s, r.text);
  if (r.stopped) {
    finish(s, "stop", now);
    return true;
  }
  bool complete = false;  // a constraint says nothing more may follow
  for (const auto& c : s.constraints) complete = complete || c->finished();
  if (complete) {
    finish(s, "stop", now);
    return true;
  }
  if (s.generated >= s.max_tokens || static_cast<int>(s.tokens.size()) >= max_context_) {
    finish(s, "length", now);
    return true;
  }
  s.tokens.push_back(token);  // fed back in the next step
  if (s.drafter) s.drafter->append(token);
  return false;
}

void Engine::send_pending(Seq& s, const std::string& text) {
  GenerationEvent ev;
  ev.index = s.index;
  ev.text = text;
  ev.tokens.swap(s.pending_tokens);
  ev.logprobs.swap(s.pending_logprobs);
  s.state->push(std::move(ev));
}

void Engine::finish(Seq& s, const std::string& reason, double now) {
  if (reason != "stop" || !s.stops.stopped()) {
    const StopMatcher::Result r = s.stops.finish(s.decoder.flush());
    if (!r.text.empty() || !s.pending_tokens.empty()) send_pending(s, r.text);
  }
  Timings t;
  t.prompt_n = s.prompt_n();
  t.cache_n = std::max(0, std::min(s.cached_tokens, s.prompt_n()));
  t.predicted_n = s.generated;
  const bool admitted = s.t_admit >= 0, first = s.t_first >= 0;
  t.queue_ms = (admitted ? s.t_admit : now) - s.state->submitted_ms;
  t.prompt_ms = admitted ? (first ? s.t_first : now) - s.t_admit : 0;
  t.predicted_ms = first ? now - s.t_first : 0;
  if (draft_tokens_ > 0) {
    t.draft_n = s.draft_n;
    t.draft_accepted_n = s.draft_accepted_n;
  }
  const double e2e_ms = now - s.state->submitted_ms;
  if (metrics_) {
    if (reason == "cancelled") {
      metrics_->request_cancelled();
    } else {
      metrics_->request_finished(reason);
      metrics_->observe_e2e(e2e_ms / 1000);
      metrics_->observe_decode(t.predicted_ms / 1000);
    }
  }
  if (log_) {
    RequestRecord rec;
    rec.event = reason == "cancelled" ? "cancelled" : "done";
    rec.id = s.state->request.id;
    rec.prompt_tokens = t.prompt_n;
    rec.max_tokens = s.max_tokens;
    rec.generated_tokens = s.generated;
    if (reason != "cancelled") rec.finish_reason = reason;
    rec.queue_ms = t.queue_ms;
    if (admitted) rec.prefill_ms = t.prompt_ms;
    if (first) {
      rec.ttft_ms = s.t_first - s.state->submitted_ms;
      rec.decode_ms = t.predicted_ms;
    }
    rec.e2e_ms = e2e_ms;
    rec.preemptions = s.preemptions;
    if (draft_tokens_ > 0) {
      rec.draft_tokens = s.draft_n;
      rec.draft_accepted_tokens = s.draft_accepted_n;
    }
    log_->write(rec);
  }
  GenerationEvent done;
  done.kind = GenerationEvent::Kind::kDone;
  done.index = s.index;
  done.finish_reason = reason;
  if (reason == "stop" && s.stops.stopped()) done.stop_sequence = s.stops.matched();
  done.timings = t;
  s.state->push(std::move(done));
  drop(s);
}

void Engine::fail(Seq& s, const std::string& error, const std::string& code, double now) {
  if (!s.choices->failed) {  // once per request; its other choices end silently
    s.choices->failed = true;
    if (log_) {
      RequestRecord rec;
      rec.event = "error";
      rec.id = s.state->request.id;
      rec.prompt_tokens = s.prompt_n();
      rec.max_tokens = s.max_tokens;
      rec.generated_tokens = s.generated;
      rec.e2e_ms = now - s.state->submitted_ms;
      rec.preemptions = s.preemptions;
      rec.error = error;
      log_->write(rec);
    }
    GenerationEvent ev;
    ev.kind = GenerationEvent::Kind::kError;
    ev.error = error;
    ev.error_code = code;
    s.state->push(std::move(ev));
    s.state->cancel();  // the next reap drops the other choices
  }
  drop(s);
}

void Engine::drop(Seq& s) {
  sched_.remove(&s);
  auto it = std::find_if(seqs_.begin(), seqs_.end(),
                         [&](const std::unique_ptr<Seq>& p) { return p.get() == &s; });
  if (it != seqs_.end()) seqs_.erase(it);  // destroys s
}

}  // namespace ninfer
