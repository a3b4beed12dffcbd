// The generated-model side of ninfer-server replaced by the fake paged model, so the real
// server (runtime_cpp/server/) can be tested over HTTP (admission control, cancellation on
// disconnect, /metrics, the request log) without compiling a checkpoint. Built by
// tests/native/CMakeLists.txt; driven by tests/test_scheduler_native.py.
//
// NINFER_FAKE_GATE=<fifo>: every step first reads one byte from the FIFO, so the test
// decides how many steps run; once the test closes its end, later steps run freely.
// Without it, steps run as fast as they can.
// NINFER_FAKE_MAX_CONTEXT=<n>: the compiled context (default 64), for prompts of real chat
// templates (tests/test_chat_parity.py).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include "backend/backend.h"
#include "fake_model.h"
#include "model/artifact.h"
#include "model/model.h"

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

}  // namespace

const ModelInfo& compiled_model_info() {
  static const ModelInfo info = [] {
    ModelInfo i;
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

std::unique_ptr<Model> create_model(const Artifact&) {
  const ModelInfo& i = compiled_model_info();
  auto model = std::make_unique<GatedFakeModel>(i.max_concurrency, i.prefill_chunk, i.kv_blocks,
                                                i.kv_block_size, i.max_context);
  if (const char* path = std::getenv("NINFER_FAKE_GATE")) {
    model->gate = std::make_unique<FifoGate>(path);
    model->set_gate(model->gate.get());
  }
  return model;
}

namespace backend {
void init(const Options&) {}
std::string describe() { return "fake backend"; }
}  // namespace backend

}  // namespace ninfer
