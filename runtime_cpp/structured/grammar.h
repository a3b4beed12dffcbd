// Structured output: token masks from grammars, computed by xgrammar's C++ core.
//
// One GrammarCompiler per server holds what is costly and shared: xgrammar's view of the
// tokenizer (every token's raw bytes, built once, on first use) and the compiled grammars,
// cached per grammar (kind + text) in a bounded LRU. Each request gets its own
// GrammarConstraint (engine/constraint.h) over a compiled grammar: a matcher whose next
// token mask is computed on the compiler's worker threads while the model step runs
// (prepare), then applied to the logits (apply), advanced by the sampled token (accept),
// and finished once the grammar accepted a stop token (or, for a model without one, once
// the grammar is complete).
//
// xgrammar's types stay inside grammar.cpp; errors in a grammar (a schema, a regex, an
// EBNF grammar xgrammar rejects) are GrammarError with xgrammar's message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/constraint.h"
#include "text/tokenizer.h"

namespace ninfer {

// What a request constrains its output to.
struct GrammarSpec {
  enum class Kind {
    kJsonObject,     // any JSON object (text unused)
    kJsonSchema,     // text: a JSON schema
    kRegex,          // text: a regular expression (xgrammar's dialect, ECMAScript-like)
    kEbnf,           // text: an EBNF grammar (xgrammar's GBNF dialect, root rule "root")
    kLark,           // text: a Lark grammar
    kStructuralTag,  // text: an xgrammar structural tag (JSON)
  };
  Kind kind = Kind::kJsonObject;
  std::string text;
  // JSON kinds: any whitespace between tokens, as vLLM allows by default. Otherwise the
  // spacing of Python's json.dumps (", " and ": ") and no other: a weak model given free
  // whitespace can spend its whole budget on blanks and never close the value.
  bool any_whitespace = false;

  static const char* kind_name(Kind k);
  // An EBNF grammar matching exactly one of `choices` (throws std::invalid_argument for
  // an empty list or an empty choice).
  static GrammarSpec choice(const std::vector<std::string>& choices);
};

// A grammar xgrammar rejects; what() is xgrammar's message.
class GrammarError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct GrammarCompilerOptions {
  size_t max_cached_grammars = 64;  // compiled grammars kept (least recently used dropped)
  int mask_threads = 0;             // mask workers; 0: min(4, hardware threads)
  int compile_threads = 0;          // xgrammar's threads per compile; 0: min(4, hardware)
};

namespace detail {
struct GrammarCompilerImpl;
struct CompiledGrammarHandle;
}  // namespace detail

class GrammarCompiler {
 public:
  // `vocab_size` is the model's (the logits' width; at least the tokenizer's ids that the
  // model can emit): ids the tokenizer lacks are never allowed. `stop_ids` end a grammar.
  GrammarCompiler(const Tokenizer& tokenizer, int vocab_size, std::vector<int32_t> stop_ids,
                  GrammarCompilerOptions options = {});
  ~GrammarCompiler();
  GrammarCompiler(const GrammarCompiler&) = delete;
  GrammarCompiler& operator=(const GrammarCompiler&) = delete;

  // Thread-safe. Compiles (or takes from the cache) and returns a fresh constraint at the
  // grammar's start. Throws GrammarError for a grammar xgrammar rejects.
  std::shared_ptr<TokenConstraint> constraint(const GrammarSpec& spec) const;
  // Thread-safe. Compiles (or takes from the cache) without making a matcher.
  void check(const GrammarSpec& spec) const;

  int vocab_size() const;
  size_t cached_grammars() const;

 private:
  std::shared_ptr<const detail::CompiledGrammarHandle> compiled(const GrammarSpec& spec) const;
  std::unique_ptr<detail::GrammarCompilerImpl> impl_;
};

// A grammar as a token constraint; GrammarCompiler::constraint makes them. Exposed for
// tests and tools that drive a matcher directly.
class GrammarConstraint : public TokenConstraint {
 public:
  ~GrammarConstraint() override;
  void prepare() override;
  void apply(float* logits, int vocab) override;
  void fill_bitmask(uint32_t* words, int vocab) override;  // xgrammar's own mask
  bool accept(int32_t token) override;
  bool finished() const override;
  // A matcher in the same state (xgrammar's Fork), over the same compiled grammar.
  std::shared_ptr<TokenConstraint> clone() override;

  // The ids the grammar allows next (computes the mask now if prepare() did not).
  std::vector<int32_t> allowed_tokens();
  // Feeds text as if its tokens had been sampled (false if the grammar refuses it; the
  // matcher is then unchanged).
  bool accept_string(const std::string& text);
  bool completed() const;  // the grammar could end here (a stop token is allowed)

  struct State;

 private:
  friend class GrammarCompiler;
  explicit GrammarConstraint(std::unique_ptr<State> state);
  const uint32_t* mask();  // joins or computes the mask of the current state
  std::unique_ptr<State> state_;
};

}  // namespace ninfer
