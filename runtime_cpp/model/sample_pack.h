// The device sampler's inputs for one step's SampleRows (model.h), and its outputs back
// as SampledTokens, in the layout SamplerSpec describes (compiler/ninfer/kernels/spec.py,
// templates/cuda/sampler.cu.j2): per row 4 floats and 9 ints, the edits of all rows in one
// array (each row names its offset and count), the constrained rows' masks packed (each
// row names its mask row, -1 for none). Used by the generated CUDA model
// (templates/model.cpp.j2) and by the engine test that runs the kernel under emulation.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/model.h"

namespace ninfer {

struct SamplePack {
  static constexpr int kInts = 9, kFloats = 4;
  std::vector<float> fparams, edit_vals;
  std::vector<int32_t> iparams, edit_ids, masks;

  // Packs rows[0..m). Throws std::out_of_range for more than `top` logprobs and
  // std::runtime_error when the rows' edits together exceed `max_edits`.
  void pack(const SampleRow* rows, int m, int top, int max_edits, int words) {
    fparams.assign(static_cast<size_t>(m) * kFloats, 0.0f);
    iparams.assign(static_cast<size_t>(m) * kInts, 0);
    edit_ids.clear();
    edit_vals.clear();
    masks.clear();
    for (int k = 0; k < m; ++k) {
      const SampleRow& r = rows[k];
      if (r.logprobs > top)
        throw std::out_of_range("sample: " + std::to_string(r.logprobs) + " top logprobs above " +
                                std::to_string(top));
      const int offset = static_cast<int>(edit_ids.size() / 2);
      if (offset + r.n_edits > max_edits)
        throw std::runtime_error(
            "this step's requests need " + std::to_string(offset + r.n_edits) +
            "+ logit edits (logit_bias entries, penalized tokens, min_tokens stop ids); the "
            "device sampler holds " +
            std::to_string(max_edits) +
            ": send fewer logit_bias entries or shorter penalized prompts");
      for (int e = 0; e < r.n_edits; ++e) {
        const SampleEdit& x = r.edits[e];
        edit_ids.insert(edit_ids.end(), {x.token, static_cast<int32_t>(x.flags)});
        edit_vals.insert(edit_vals.end(), {x.bias, x.frequency, x.presence});
      }
      int mask_row = -1;
      if (r.mask) {
        mask_row = static_cast<int>(masks.size() / words);
        const auto* w = reinterpret_cast<const int32_t*>(r.mask);
        masks.insert(masks.end(), w, w + words);
      }
      float* f = &fparams[static_cast<size_t>(k) * kFloats];
      f[0] = r.temperature, f[1] = r.top_p, f[2] = r.min_p, f[3] = r.repetition_penalty;
      const int32_t ints[kInts] = {r.top_k,
                                   offset,
                                   r.n_edits,
                                   mask_row,
                                   r.logprobs,
                                   static_cast<int32_t>(static_cast<uint32_t>(r.seed)),
                                   static_cast<int32_t>(static_cast<uint32_t>(r.seed >> 32)),
                                   static_cast<int32_t>(static_cast<uint32_t>(r.counter)),
                                   static_cast<int32_t>(static_cast<uint32_t>(r.counter >> 32))};
      std::copy(ints, ints + kInts, &iparams[static_cast<size_t>(k) * kInts]);
    }
  }

  // Reads m rows of (ids, logprobs), top + 1 columns each: the token (-1: all masked), then
  // the alternatives (-1 past the end).
  static void unpack(const SampleRow* rows, int m, int top, const int32_t* ids, const float* lps,
                     SampledToken* out) {
    for (int k = 0; k < m; ++k) {
      const int32_t* id = ids + static_cast<size_t>(k) * (top + 1);
      const float* lp = lps + static_cast<size_t>(k) * (top + 1);
      SampledToken& t = out[k];
      t.token = id[0];
      t.logprob = lp[0];
      t.top.clear();
      for (int j = 0; j < rows[k].logprobs && j < top && id[1 + j] >= 0; ++j)
        t.top.emplace_back(id[1 + j], lp[1 + j]);
    }
  }
};

}  // namespace ninfer
