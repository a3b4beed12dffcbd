// The Engine class of the `ninfer_engine_<model>` Python module (engine_module.cpp), over
// the same runtime and generated model as ninfer-server: load an artifact, tokenize, run
// forward passes, read logits. Model-independent, so it is compiled once for every model
// (only the module's entry point carries the model's name).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/sampling.h"
#include "model/artifact.h"
#include "model/model.h"
#include "text/tokenizer.h"

namespace py = pybind11;

namespace ninfer {
namespace {

class PyEngine {
 public:
  PyEngine(const std::string& path, int threads, bool mmap_weights) {
    const ModelInfo& info = compiled_model_info();
    artifact_ =
        std::make_unique<Artifact>(path, info.target, info.target_hash, true, info.build_digest);
    if (backend::host_weights() && !mmap_weights) artifact_->copy_to_huge_pages();
    backend::init({threads, false});
    tokenizer_ =
        std::make_unique<Tokenizer>(Tokenizer::from_json(artifact_->manifest().at("tokenizer")));
    model_ = create_model(*artifact_);
  }

  bool weights_in_memory() const { return artifact_->in_memory(); }

  // Runs `tokens` at positions pos0.. (prefill in chunks) and returns the last logits.
  py::array_t<float> forward(const std::vector<int32_t>& tokens, int pos0) {
    const ModelInfo& info = model_->info();
    py::array_t<float> logits(info.vocab_size);
    py::gil_scoped_release release;
    for (size_t i = 0; i < tokens.size();) {
      const int n = std::min<int>(info.prefill_chunk, static_cast<int>(tokens.size() - i));
      model_->forward(tokens.data() + i, n, pos0 + static_cast<int>(i), logits_buffer(info));
      i += n;
    }
    py::gil_scoped_acquire acquire;
    std::copy(last_.begin(), last_.end(), logits.mutable_data());
    return logits;
  }

  // Greedy generation from a fresh sequence; stops at max_new or an eos id.
  std::vector<int32_t> generate_greedy(const std::vector<int32_t>& prompt, int max_new,
                                       const std::vector<int32_t>& eos) {
    const ModelInfo& info = model_->info();
    std::vector<int32_t> out;
    py::gil_scoped_release release;
    int pos = 0;
    for (size_t i = 0; i < prompt.size();) {
      const int n = std::min<int>(info.prefill_chunk, static_cast<int>(prompt.size() - i));
      model_->forward(prompt.data() + i, n, pos, logits_buffer(info));
      pos += n;
      i += n;
    }
    while (static_cast<int>(out.size()) < max_new && pos < info.max_context) {
      const int32_t t = argmax(last_.data(), info.vocab_size);
      out.push_back(t);
      if (std::find(eos.begin(), eos.end(), t) != eos.end()) break;
      if (static_cast<int>(out.size()) == max_new) break;
      model_->forward(&t, 1, pos++, last_.data());
    }
    return out;
  }

  // One Model::step as the engine runs it (model.h's StepBatch): rows of several sequences,
  // their slots' block tables [max_concurrency x blocks_per_seq], and for models with
  // recurrent state each row's state slot and save slot (empty: the defaults). Returns the
  // logits of `logit_rows` [len x vocab]. For tests of the step contract (speculative
  // decoding's verify steps).
  py::array_t<float> step(const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions,
                          const std::vector<int32_t>& slots,
                          const std::vector<int32_t>& block_tables,
                          const std::vector<int32_t>& logit_rows,
                          const std::vector<int32_t>& state_slots,
                          const std::vector<int32_t>& save_slots) {
    const ModelInfo& info = model_->info();
    const size_t n = tokens.size();
    auto need = [](bool ok, const std::string& what) {
      if (!ok) throw std::invalid_argument("step: " + what);
    };
    need(positions.size() == n && slots.size() == n,
         "tokens, positions and slots differ in length");
    need(block_tables.size() == size_t(info.max_concurrency) * info.blocks_per_seq,
         "block_tables needs max_concurrency x blocks_per_seq entries");
    need(state_slots.empty() || state_slots.size() == n, "state_slots: one per row");
    need(save_slots.empty() || save_slots.size() == n, "save_slots: one per row");
    StepBatch b;
    b.n = static_cast<int>(n);
    b.tokens = tokens.data();
    b.positions = positions.data();
    b.slots = slots.data();
    b.block_tables = block_tables.data();
    b.n_logits = static_cast<int>(logit_rows.size());
    b.logit_rows = logit_rows.data();
    b.state_slots = state_slots.empty() ? nullptr : state_slots.data();
    b.save_slots = save_slots.empty() ? nullptr : save_slots.data();
    py::array_t<float> logits(
        {static_cast<py::ssize_t>(logit_rows.size()), static_cast<py::ssize_t>(info.vocab_size)});
    std::vector<float> out(logit_rows.size() * info.vocab_size);
    {
      py::gil_scoped_release release;
      model_->step(b, out.data());
    }
    std::copy(out.begin(), out.end(), logits.mutable_data());
    return logits;
  }

  // --spec mtp: the draft head over the last step's rows (model.h's DraftBatch); each
  // sequence's drafts.
  std::vector<std::vector<int32_t>> draft(const std::vector<int32_t>& next,
                                          const std::vector<int32_t>& rows,
                                          const std::vector<int32_t>& counts,
                                          const std::vector<int32_t>& block_tables) {
    const ModelInfo& info = model_->info();
    if (rows.size() != counts.size())
      throw std::invalid_argument("draft: rows and counts differ in length");
    if (block_tables.size() != size_t(info.max_concurrency) * info.blocks_per_seq)
      throw std::invalid_argument(
          "draft: block_tables needs max_concurrency x blocks_per_seq entries");
    DraftBatch b;
    b.next = next.data();
    b.n_seqs = static_cast<int>(rows.size());
    b.rows = rows.data();
    b.counts = counts.data();
    b.block_tables = block_tables.data();
    std::vector<int32_t> out(rows.size() * size_t(info.max_draft_tokens), -1);
    {
      py::gil_scoped_release release;
      model_->draft(b, out.data());
    }
    std::vector<std::vector<int32_t>> drafts(rows.size());
    for (size_t j = 0; j < rows.size(); ++j) {
      const auto* o = out.data() + j * size_t(info.max_draft_tokens);
      drafts[j].assign(o, o + counts[j]);
    }
    return drafts;
  }

  std::vector<int32_t> encode(const std::string& text, bool add_special) {
    return tokenizer_->encode(text, add_special);
  }
  std::string manifest() const { return artifact_->manifest().dump(); }
  py::dict info() const {
    const ModelInfo& i = model_->info();
    py::dict d;
    d["model_id"] = i.model_id;
    d["target"] = i.target;
    d["vocab_size"] = i.vocab_size;
    d["max_context"] = i.max_context;
    d["prefill_chunk"] = i.prefill_chunk;
    d["num_layers"] = i.num_layers;
    d["max_concurrency"] = i.max_concurrency;
    d["blocks_per_seq"] = i.blocks_per_seq;
    d["kv_blocks"] = i.kv_blocks;
    d["state_slots"] = i.state_slots;
    d["state_group"] = i.state_group();
    d["max_draft_tokens"] = i.max_draft_tokens;
    d["spec"] = i.spec;
    d["build_digest"] = i.build_digest;
    d["backend"] = backend::describe();
    return d;
  }

 private:
  float* logits_buffer(const ModelInfo& info) {
    last_.resize(info.vocab_size);
    return last_.data();
  }

  std::unique_ptr<Artifact> artifact_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Model> model_;
  std::vector<float> last_;
};

}  // namespace
}  // namespace ninfer

void ninfer_bind_engine(py::module_& m) {
  // module_local: several compiled models (each its own module) may share a process.
  py::class_<ninfer::PyEngine>(m, "Engine", py::module_local())
      .def(py::init<const std::string&, int, bool>(), py::arg("artifact"), py::arg("threads") = 0,
           py::arg("mmap_weights") = false)
      .def_property_readonly("weights_in_memory", &ninfer::PyEngine::weights_in_memory)
      .def("forward", &ninfer::PyEngine::forward, py::arg("tokens"), py::arg("pos0") = 0,
           "Run tokens at positions pos0.. and return the last position's logits")
      .def("generate_greedy", &ninfer::PyEngine::generate_greedy, py::arg("prompt"),
           py::arg("max_new_tokens"), py::arg("eos_token_ids") = std::vector<int32_t>{})
      .def("step", &ninfer::PyEngine::step, py::arg("tokens"), py::arg("positions"),
           py::arg("slots"), py::arg("block_tables"), py::arg("logit_rows"),
           py::arg("state_slots") = std::vector<int32_t>{},
           py::arg("save_slots") = std::vector<int32_t>{},
           "One step of rows of several sequences (model.h's StepBatch); the logits of "
           "logit_rows")
      .def("draft", &ninfer::PyEngine::draft, py::arg("next"), py::arg("rows"), py::arg("counts"),
           py::arg("block_tables"),
           "--spec mtp: the draft head over the last step's rows (model.h's DraftBatch); "
           "each sequence's greedy drafts")
      .def("encode", &ninfer::PyEngine::encode, py::arg("text"),
           py::arg("add_special_tokens") = true)
      .def("manifest", &ninfer::PyEngine::manifest)
      .def("info", &ninfer::PyEngine::info);
}
