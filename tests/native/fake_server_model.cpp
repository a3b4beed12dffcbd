// The generated-model side of ninfer-server replaced by the fake paged model, so the real
// server (runtime_cpp/server/) can be tested over HTTP (admission control, cancellation on
// disconnect, /metrics, the request log) without compiling a checkpoint. Built by
// tests/native/CMakeLists.txt; driven by tests/test_scheduler_native.py.
//
// NINFER_FAKE_GATE=<fifo>: every step first reads one byte from the FIFO, so the test
// decides how many steps run; once the test closes its end, later steps run freely.
// Without it, steps run as fast as they can.
//
// NINFER_FAKE_SCRIPT=<text>: the model writes `text` (tokenized with the artifact's
// tokenizer, which must have the added tokens "<gen>" and "</think>") as the continuation
// of the prompt's last "<gen>" token, then its first end-of-sequence token. Where a
// "</think>" comes later than the script has it (a thinking budget forced it), the model
// goes on with what follows "</think>" in the script. A prompt that already holds the
// script's first tokens after "<gen>" (a generation prompt that opens <think>) is
// continued from there. The model then has a vocabulary of 320 and a context of 1024
// (tests/test_output_parsers.py).
//
// NINFER_FAKE_LOAD_GATE=<fifo>: loading the model waits for one byte from the FIFO, so a
// test sees the server while it loads.
//
// NINFER_FAKE_MAX_CONTEXT=<n>: the compiled context (default 64), for prompts of real chat
// templates (tests/test_chat_parity.py).
#include <fcntl.h>
#include <unistd.h>
#include <cstdio>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "fake_model.h"
#include "model/artifact.h"
#include "model/model.h"
#include "text/tokenizer.h"

namespace ninfer {
namespace {

class FifoGate : public fake::StepGate {
 public:
  explicit FifoGate(const std::string& path) : fd_(::open(path.c_str(), O_RDONLY)) {
    if (fd_ < 0) throw std::runtime_error("NINFER_FAKE_GATE " + path + ": " + std::strerror(errno));
  }
  ~FifoGate() override { ::close(fd_); }
  void pass() override {
    if (open_) return;
    char c;
    ssize_t n;
    do {
      n = ::read(fd_, &c, 1);
    } while (n < 0 && errno == EINTR);
    if (n <= 0) open_ = true;  // the test closed its end
  }

 private:
  int fd_;
  bool open_ = false;  // the engine loop is the only caller
};

class GatedFakeModel : public fake::FakeModel {
 public:
  using FakeModel::FakeModel;
  std::unique_ptr<FifoGate> gate;
};

class ScriptedFakeModel : public GatedFakeModel {
 public:
  ScriptedFakeModel(const ModelInfo& i, const Artifact& artifact, const std::string& script)
      : GatedFakeModel(i.max_concurrency, i.prefill_chunk, i.kv_blocks, i.kv_block_size,
                       i.max_context),
        info_(i) {
    const nlohmann::json& m = artifact.manifest();
    const Tokenizer tok = Tokenizer::from_json(m.at("tokenizer"));
    script_ = tok.encode(script, /*add_special_tokens=*/false);
    gen_ = tok.token_to_id("<gen>").value();
    close_ = tok.token_to_id("</think>").value();
    eos_ = m.at("eos_token_ids").at(0).get<int32_t>();
    const auto at = std::find(script_.begin(), script_.end(), close_);
    after_close_.assign(at == script_.end() ? script_.end() : at + 1, script_.end());
    CHECK(tok.vocab_size() <= i.vocab_size);
  }
  const ModelInfo& info() const override { return info_; }

  void step(const StepBatch& b, float* logits) override {
    std::vector<float> letters(static_cast<size_t>(b.n_logits) * fake::kVocab);
    GatedFakeModel::step(b, letters.data());  // the paged pool and the batch contract
    for (int k = 0; k < b.n_logits; ++k) {
      const int r = b.logit_rows[k];
      const std::vector<int32_t>* seg = nullptr;
      int anchor = 0;
      for (int p = b.positions[r]; p >= 0 && !seg; --p) {
        const int32_t t = cell(b, b.slots[r], p).token;
        if (t == gen_) seg = &script_;
        else if (t == close_) seg = &after_close_;
        anchor = p;
      }
      const size_t next = static_cast<size_t>(b.positions[r] - anchor);
      const int32_t want = seg && next < seg->size() ? (*seg)[next] : eos_;
      float* out = logits + static_cast<size_t>(k) * info_.vocab_size;
      std::fill(out, out + info_.vocab_size, 0.0f);
      out[want] = 30.0f;
    }
  }

 private:
  ModelInfo info_;
  std::vector<int32_t> script_, after_close_;
  int32_t gen_ = -1, close_ = -1, eos_ = -1;
};

const char* script() { return std::getenv("NINFER_FAKE_SCRIPT"); }

}  // namespace

const ModelInfo& compiled_model_info() {
  static const ModelInfo info = [] {
    ModelInfo i;
    if (script()) {  // room for a script of byte tokens
      i.model_id = "fake";
      i.target = "fake";
      i.target_hash = "0";
      i.vocab_size = 320;
      i.max_context = 1024;
      i.prefill_chunk = 64;
      i.num_layers = 1;
      i.max_concurrency = 4;
      i.kv_block_size = 16;
      i.blocks_per_seq = 64;
      i.kv_blocks = 1 + 4 * 64;
      return i;
    }
    i.model_id = "fake";
    i.target = "fake";
    i.target_hash = "0";
    i.vocab_size = fake::kVocab;
    const char* ctx = std::getenv("NINFER_FAKE_MAX_CONTEXT");
    i.max_context = ctx ? std::atoi(ctx) / 4 * 4 : 64;
    i.prefill_chunk = 16;
    i.num_layers = 1;
    i.max_concurrency = 4;
    i.kv_block_size = 4;
    i.blocks_per_seq = i.max_context / 4;
    i.kv_blocks = 1 + 4 * i.blocks_per_seq;
    return i;
  }();
  return info;
}

std::unique_ptr<Model> create_model(const Artifact& artifact) {
  if (const char* path = std::getenv("NINFER_FAKE_LOAD_GATE")) FifoGate(path).pass();
  const ModelInfo& i = compiled_model_info();
  std::unique_ptr<GatedFakeModel> model;
  if (script()) model = std::make_unique<ScriptedFakeModel>(i, artifact, script());
  else
    model = std::make_unique<GatedFakeModel>(i.max_concurrency, i.prefill_chunk, i.kv_blocks,
                                             i.kv_block_size, i.max_context);
  if (const char* path = std::getenv("NINFER_FAKE_GATE")) {
    model->gate = std::make_unique<FifoGate>(path);
    model->set_gate(model->gate.get());
  }
  return model;
}

namespace backend {
void init(const Options&) {}
bool host_weights() { return true; }  // as the CPU: the artifact is copied at start
std::string describe() { return "fake backend"; }
// NINFER_FAKE_GRAPHS="CAPTURED,REPLAYS": the counters of a CUDA backend, for the tests of
// /metrics (no graphs otherwise, as on the CPU).
GraphCounts graph_counts() {
  GraphCounts g;
  unsigned long long captured = 0, replays = 0;
  const char* v = std::getenv("NINFER_FAKE_GRAPHS");
  if (v && std::sscanf(v, "%llu,%llu", &captured, &replays) == 2) g = {true, captured, replays};
  return g;
}
}  // namespace backend

}  // namespace ninfer
