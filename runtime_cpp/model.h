// The interface between the model-independent runtime and the generated model code
// (templates/model.cpp.j2 implements it for each compiled checkpoint).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace ninfer {

class Artifact;

struct ModelInfo {
  std::string model_id;
  std::string target;       // target profile name the kernels were built for
  std::string target_hash;  // Target.stable_hash() at compile time
  int vocab_size = 0;
  int max_context = 0;      // compiled maximum
  int max_prefill_chunk = 0;
  int num_layers = 0;
};

// One sequence's forward pass over the KV cache of slot 0.
class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelInfo& info() const = 0;
  // Runs `n` tokens at positions pos0..pos0+n-1 (n <= max_prefill_chunk,
  // pos0 + n <= max_context), appending their keys/values to the cache, and writes
  // the logits of the last of them to `logits` (vocab_size floats).
  virtual void forward(const int32_t* tokens, int n, int pos0, float* logits) = 0;
};

// Compile-time facts about the generated model, available before loading weights.
const ModelInfo& compiled_model_info();
// Binds the artifact's weights (checked by name and shape) and allocates buffers.
std::unique_ptr<Model> create_model(const Artifact& artifact);

}  // namespace ninfer
