// The x86 vector features a CPU server's kernels were compiled for (the LLVM target of the
// machine that ran ninfer-compile: ninfer.kernels.cpu.common.host_target), checked against
// the CPU the server starts on: a kernel object built where AVX-512 BF16 exists dies of
// SIGILL on a CPU without it, so the backend refuses to start instead, naming what is
// missing (backend::init).
#pragma once

#include <string>
#include <vector>

namespace ninfer::cpu {

// Whether this CPU (and its OS) supports the feature, by LLVM's (and GCC's) name
// ("avx512f", "avx512bf16", "avxvnni", ...); false for a name this runtime does not know.
inline bool cpu_supports(const std::string& name) {
#define NINFER_FEATURE(x) \
  if (name == x) return __builtin_cpu_supports(x);
  NINFER_FEATURE("avx2")
  NINFER_FEATURE("fma")
  NINFER_FEATURE("f16c")
  NINFER_FEATURE("avx512f")
  NINFER_FEATURE("avx512bw")
  NINFER_FEATURE("avx512vl")
  NINFER_FEATURE("avx512dq")
  NINFER_FEATURE("avx512cd")
  NINFER_FEATURE("avx512vnni")
  NINFER_FEATURE("avxvnni")
  NINFER_FEATURE("avx512bf16")
  NINFER_FEATURE("avx512fp16")
  NINFER_FEATURE("avx512vbmi")
  NINFER_FEATURE("avx512vbmi2")
  NINFER_FEATURE("avx512bitalg")
  NINFER_FEATURE("avx512vpopcntdq")
  NINFER_FEATURE("avx512ifma")
  NINFER_FEATURE("gfni")
  NINFER_FEATURE("vaes")
  NINFER_FEATURE("vpclmulqdq")
#undef NINFER_FEATURE
  return false;
}

// The features of `required` this CPU lacks, in order.
inline std::vector<std::string> missing_features(const std::vector<std::string>& required) {
  std::vector<std::string> missing;
  for (const auto& f : required)
    if (!cpu_supports(f)) missing.push_back(f);
  return missing;
}

// Empty when this CPU has every feature of `required`, else why the kernels cannot run.
inline std::string features_refusal(const std::vector<std::string>& required) {
  const auto missing = missing_features(required);
  if (missing.empty()) return {};
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& f : v) s += (s.empty() ? "" : ", ") + f;
    return s;
  };
  return "this server's kernels were compiled for a CPU with " + join(required) +
         "; this CPU lacks " + join(missing) +
         ": compile the model on this machine (ninfer-compile --target cpu)";
}

// The features the kernels linked into this server need (the generated launch table).
extern const std::vector<std::string> kKernelFeatures;

}  // namespace ninfer::cpu
