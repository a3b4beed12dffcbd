#include "structured/grammar.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <limits>
#include <list>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>

#include <xgrammar/xgrammar.h>

#include "text/utf8.h"

namespace ninfer {

const char* GrammarSpec::kind_name(Kind k) {
  switch (k) {
    case Kind::kJsonObject: return "json_object";
    case Kind::kJsonSchema: return "json_schema";
    case Kind::kRegex: return "regex";
    case Kind::kEbnf: return "ebnf";
    case Kind::kLark: return "lark";
    case Kind::kStructuralTag: return "structural_tag";
  }
  return "?";
}

namespace {

int default_threads(int requested) {
  if (requested > 0) return requested;
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, std::min(4, hw));
}

// The workers that compute next-token masks while the model step runs.
class MaskPool {
 public:
  explicit MaskPool(int threads) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
  }
  ~MaskPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  std::future<void> submit(std::function<void()> fn) {
    std::packaged_task<void()> task(std::move(fn));
    std::future<void> done = task.get_future();
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
    return done;
  }

 private:
  void work() {
    for (;;) {
      std::packaged_task<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
        if (tasks_.empty()) return;  // stopping, and nothing left
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();  // an exception lands in the future
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> tasks_;
  std::vector<std::thread> workers_;
  bool stopping_ = false;
};

std::string cache_key(const GrammarSpec& spec) {
  return std::string(GrammarSpec::kind_name(spec.kind)) + (spec.any_whitespace ? "+ws" : "") +
         '\0' + spec.text;
}

// `s` as a string literal of xgrammar's EBNF (it reads JSON's escapes).
std::string ebnf_literal(const std::string& s) {
  std::string out;
  utf8::append_json_string(out, s, /*ensure_ascii=*/false);
  return out;
}

}  // namespace

GrammarSpec GrammarSpec::choice(const std::vector<std::string>& choices) {
  if (choices.empty()) throw std::invalid_argument("a choice needs at least one alternative");
  std::string ebnf = "root ::= ";
  for (size_t i = 0; i < choices.size(); ++i) {
    if (choices[i].empty()) throw std::invalid_argument("a choice may not be the empty string");
    ebnf += (i ? " | " : "") + ebnf_literal(choices[i]);
  }
  return {Kind::kEbnf, ebnf + "\n", false};
}

namespace detail {

struct CompiledGrammarHandle {
  explicit CompiledGrammarHandle(xgrammar::CompiledGrammar g) : grammar(std::move(g)) {}
  xgrammar::CompiledGrammar grammar;
};

struct GrammarCompilerImpl {
  Tokenizer tokenizer;
  int vocab_size;
  std::vector<int32_t> stop_ids;
  GrammarCompilerOptions options;
  std::shared_ptr<MaskPool> pool;

  // Built on first use, under compile_mu (the tokenizer info sorts the whole vocabulary).
  std::mutex compile_mu;
  std::optional<xgrammar::GrammarCompiler> compiler;

  mutable std::mutex cache_mu;
  using Entry = std::pair<std::string, std::shared_ptr<const CompiledGrammarHandle>>;
  std::list<Entry> lru;  // most recently used first
  std::unordered_map<std::string, std::list<Entry>::iterator> index;

  xgrammar::GrammarCompiler& get_compiler() {
    if (!compiler) {
      const int n = std::min(tokenizer.vocab_size(), vocab_size);
      std::vector<std::string> encoded(n);
      for (int32_t id = 0; id < n; ++id) {
        const bool stop = std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end();
        // Special tokens (other than the stop tokens) are never part of structured text:
        // an empty entry is what xgrammar treats as special. Holes in the ids too.
        if (!stop && tokenizer.is_special(id)) continue;
        try {
          encoded[id] = tokenizer.token_bytes(id);
        } catch (const std::out_of_range&) {
        }
      }
      check_concatenating(encoded);
      xgrammar::TokenizerInfo info(encoded, xgrammar::VocabType::RAW, vocab_size, stop_ids);
      compiler.emplace(info, default_threads(options.compile_threads), /*cache_enabled=*/false);
    }
    return *compiler;
  }

  // The grammar sees a token as its bytes, so the text must be the tokens' bytes one
  // after another: true of byte-level decoders, not of a decoder that joins tokens with
  // spaces (a tokenizer.json without one).
  void check_concatenating(const std::vector<std::string>& encoded) const {
    std::vector<int32_t> ascii;
    for (int32_t id = 0; id < static_cast<int32_t>(encoded.size()) && ascii.size() < 2; ++id) {
      const std::string& b = encoded[id];
      if (!b.empty() && std::all_of(b.begin(), b.end(), [](char c) { return c > ' ' && c < 127; }))
        ascii.push_back(id);
    }
    if (ascii.size() == 2 &&
        tokenizer.decode(ascii, false) != encoded[ascii[0]] + encoded[ascii[1]])
      throw GrammarError(
          "structured output needs a tokenizer whose text is its tokens' bytes in a row (a "
          "byte-level decoder); this one's decoder joins tokens with spaces");
  }

  xgrammar::CompiledGrammar compile(const GrammarSpec& spec) {
    xgrammar::GrammarCompiler& c = get_compiler();
    using Kind = GrammarSpec::Kind;
    switch (spec.kind) {
      case Kind::kJsonObject:
        // Any object: a schema without strict mode leaves its properties open.
        return c.CompileJSONSchema(R"({"type": "object"})", spec.any_whitespace, std::nullopt,
                                   std::nullopt, /*strict_mode=*/false);
      case Kind::kJsonSchema: return c.CompileJSONSchema(spec.text, spec.any_whitespace);
      case Kind::kRegex: return c.CompileRegex(spec.text);
      case Kind::kEbnf: return c.CompileGrammar(spec.text, "root");
      case Kind::kLark: return c.CompileLark(spec.text);
      case Kind::kStructuralTag: return c.CompileStructuralTag(spec.text);
    }
    throw GrammarError("unknown grammar kind");
  }

  std::shared_ptr<const CompiledGrammarHandle> lookup(const std::string& key) {
    std::lock_guard<std::mutex> lock(cache_mu);
    auto it = index.find(key);
    if (it == index.end()) return nullptr;
    lru.splice(lru.begin(), lru, it->second);
    return it->second->second;
  }

  void insert(const std::string& key, std::shared_ptr<const CompiledGrammarHandle> g) {
    std::lock_guard<std::mutex> lock(cache_mu);
    if (index.count(key)) return;
    lru.emplace_front(key, std::move(g));
    index[key] = lru.begin();
    while (lru.size() > std::max<size_t>(1, options.max_cached_grammars)) {
      index.erase(lru.back().first);
      lru.pop_back();
    }
  }
};

}  // namespace detail

GrammarCompiler::GrammarCompiler(const Tokenizer& tokenizer, int vocab_size,
                                 std::vector<int32_t> stop_ids, GrammarCompilerOptions options)
    : impl_(new detail::GrammarCompilerImpl{tokenizer, vocab_size, {}, options, nullptr}) {
  if (vocab_size <= 0) throw std::invalid_argument("GrammarCompiler: vocab_size must be > 0");
  for (int32_t id : stop_ids)
    if (id >= 0 && id < vocab_size) impl_->stop_ids.push_back(id);
  impl_->pool = std::make_shared<MaskPool>(default_threads(options.mask_threads));
}

GrammarCompiler::~GrammarCompiler() = default;

int GrammarCompiler::vocab_size() const { return impl_->vocab_size; }

size_t GrammarCompiler::cached_grammars() const {
  std::lock_guard<std::mutex> lock(impl_->cache_mu);
  return impl_->lru.size();
}

std::shared_ptr<const detail::CompiledGrammarHandle> GrammarCompiler::compiled(
    const GrammarSpec& spec) const {
  const std::string key = cache_key(spec);
  if (auto hit = impl_->lookup(key)) return hit;
  // One compile at a time: a second request for the same grammar finds it cached, and
  // compiles do not compete with the engine for more cores than xgrammar's own threads.
  std::lock_guard<std::mutex> lock(impl_->compile_mu);
  if (auto hit = impl_->lookup(key)) return hit;
  std::shared_ptr<const detail::CompiledGrammarHandle> g;
  try {
    g = std::make_shared<detail::CompiledGrammarHandle>(impl_->compile(spec));
  } catch (const GrammarError&) {
    throw;
  } catch (const std::exception& e) {
    throw GrammarError(e.what());
  }
  impl_->insert(key, g);
  return g;
}

void GrammarCompiler::check(const GrammarSpec& spec) const { compiled(spec); }

// ---- GrammarConstraint ----

struct GrammarConstraint::State {
  std::shared_ptr<const detail::CompiledGrammarHandle> grammar;
  std::shared_ptr<MaskPool> pool;
  xgrammar::GrammarMatcher matcher;
  int vocab_size;
  std::vector<int32_t> bitmask;  // xgrammar's layout: bit i of word i/32 allows token i
  int64_t shape[1];
  DLTensor tensor{};
  bool mask_ready = false;  // `bitmask` is the mask of the matcher's current state
  std::optional<std::future<void>> pending;

  void fill() { matcher.FillNextTokenBitmask(&tensor); }
  void join() {
    if (!pending) return;
    std::future<void> f = std::move(*pending);
    pending.reset();
    f.get();  // rethrows what the worker threw
    mask_ready = true;
  }
};

GrammarConstraint::GrammarConstraint(std::unique_ptr<State> state) : state_(std::move(state)) {}

GrammarConstraint::~GrammarConstraint() {
  // The worker writes into this object's mask: wait for it (errors no longer matter).
  if (state_ && state_->pending) state_->pending->wait();
}

namespace {

std::unique_ptr<GrammarConstraint::State> make_state(
    std::shared_ptr<const detail::CompiledGrammarHandle> g, std::shared_ptr<MaskPool> pool,
    xgrammar::GrammarMatcher matcher, int vocab_size) {
  auto st = std::unique_ptr<GrammarConstraint::State>(
      new GrammarConstraint::State{std::move(g), std::move(pool), std::move(matcher), vocab_size});
  st->bitmask.assign(xgrammar::GetBitmaskSize(vocab_size), 0);
  st->shape[0] = static_cast<int64_t>(st->bitmask.size());
  st->tensor.data = st->bitmask.data();
  st->tensor.device = DLDevice{kDLCPU, 0};
  st->tensor.ndim = 1;
  st->tensor.dtype = xgrammar::GetBitmaskDLType();
  st->tensor.shape = st->shape;
  st->tensor.strides = nullptr;
  st->tensor.byte_offset = 0;
  return st;
}

}  // namespace

std::shared_ptr<TokenConstraint> GrammarCompiler::constraint(const GrammarSpec& spec) const {
  auto g = compiled(spec);
  xgrammar::GrammarMatcher matcher(g->grammar, std::nullopt,
                                   /*terminate_without_stop_token=*/impl_->stop_ids.empty());
  return std::shared_ptr<TokenConstraint>(
      new GrammarConstraint(make_state(g, impl_->pool, std::move(matcher), impl_->vocab_size)));
}

std::shared_ptr<TokenConstraint> GrammarConstraint::clone() {
  State& s = *state_;
  s.join();  // no worker is inside the matcher while it is copied
  // A deep copy of the matcher's state; the compiled grammar is shared.
  return std::shared_ptr<TokenConstraint>(
      new GrammarConstraint(make_state(s.grammar, s.pool, s.matcher.Fork(), s.vocab_size)));
}

void GrammarConstraint::prepare() {
  State& s = *state_;
  if (s.mask_ready || s.pending || s.matcher.IsTerminated()) return;
  State* p = &s;
  s.pending = s.pool->submit([p] { p->fill(); });
}

const uint32_t* GrammarConstraint::mask() {
  State& s = *state_;
  s.join();
  if (!s.mask_ready) {
    if (s.matcher.IsTerminated()) {
      std::fill(s.bitmask.begin(), s.bitmask.end(), 0);
    } else {
      s.fill();
    }
    s.mask_ready = true;
  }
  return reinterpret_cast<const uint32_t*>(s.bitmask.data());
}

void GrammarConstraint::apply(float* logits, int vocab) {
  const uint32_t* bits = mask();
  const int n = std::min(vocab, state_->vocab_size);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int w = 0; w * 32 < n; ++w) {
    const uint32_t word = bits[w];
    if (word == 0xffffffffu) continue;
    const int end = std::min(n, w * 32 + 32);
    for (int id = w * 32; id < end; ++id)
      if (!((word >> (id - w * 32)) & 1u)) logits[id] = kNegInf;
  }
  for (int id = n; id < vocab; ++id) logits[id] = kNegInf;  // beyond the grammar's vocabulary
}

void GrammarConstraint::fill_bitmask(uint32_t* words, int vocab) {
  const uint32_t* bits = mask();
  const int n = std::min(vocab, state_->vocab_size);
  for (int w = 0; w < n / 32; ++w) words[w] &= bits[w];
  for (int id = n / 32 * 32; id < vocab;
       ++id)  // a partial word, and beyond the grammar's vocabulary
    if (id >= n || !((bits[id / 32] >> (id % 32)) & 1u)) words[id / 32] &= ~(1u << (id % 32));
}

bool GrammarConstraint::accept(int32_t token) {
  State& s = *state_;
  s.join();
  if (s.matcher.IsTerminated()) return false;
  if (!s.matcher.AcceptToken(token)) return false;
  s.mask_ready = false;
  return true;
}

bool GrammarConstraint::finished() const { return state_->matcher.IsTerminated(); }

bool GrammarConstraint::completed() const { return state_->matcher.IsCompleted(); }

std::vector<int32_t> GrammarConstraint::allowed_tokens() {
  const uint32_t* bits = mask();
  std::vector<int32_t> ids;
  for (int id = 0; id < state_->vocab_size; ++id)
    if ((bits[id / 32] >> (id % 32)) & 1u) ids.push_back(id);
  return ids;
}

bool GrammarConstraint::accept_string(const std::string& text) {
  State& s = *state_;
  s.join();
  if (!s.matcher.AcceptString(text)) return false;
  s.mask_ready = false;
  return true;
}

}  // namespace ninfer
