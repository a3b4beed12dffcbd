// The generated-model side of ninfer-server replaced by the fake paged model, so the real
// server.cpp can be tested over HTTP (admission control, cancellation on disconnect,
// /metrics, the request log) without compiling a checkpoint. Built by
// tests/test_scheduler_native.py with the runtime sources. NINFER_FAKE_STEP_MS sets how
// long each step sleeps.
#include <cstdlib>
#include <memory>
#include <string>

#include "model/artifact.h"
#include "backend/backend.h"
#include "fake_model.h"
#include "model/model.h"

namespace ninfer {

const ModelInfo& compiled_model_info() {
  static const ModelInfo info = [] {
    ModelInfo i;
    i.model_id = "fake";
    i.target = "fake";
    i.target_hash = "0";
    i.vocab_size = fake::kVocab;
    i.max_context = 64;
    i.max_prefill_chunk = 16;
    i.num_layers = 1;
    i.max_concurrency = 4;
    i.kv_block_size = 4;
    i.kv_blocks = 1 + 4 * 16;
    i.blocks_per_seq = 16;
    return i;
  }();
  return info;
}

std::unique_ptr<Model> create_model(const Artifact&) {
  const ModelInfo& i = compiled_model_info();
  const char* ms = std::getenv("NINFER_FAKE_STEP_MS");
  return std::make_unique<fake::FakeModel>(i.max_concurrency, i.max_prefill_chunk, i.kv_blocks,
                                           i.kv_block_size, i.max_context,
                                           ms ? std::atoi(ms) : 0);
}

namespace backend {
void init(const Options&) {}
std::string describe() { return "fake backend"; }
}  // namespace backend

}  // namespace ninfer
