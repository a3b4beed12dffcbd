// model.ninfer reader: mmaps the file, checks magic, version, manifest and tensor
// checksums, and refuses an artifact built for another target. Layout: see
// compiler/ninfer/artifact.py.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ninfer {

struct TensorView {
  const void* data = nullptr;
  std::string dtype;  // f32 | f16 | bf16 | i8 | u8
  std::vector<int64_t> shape;
  size_t nbytes = 0;
};

class Artifact {
 public:
  // Throws std::runtime_error naming the file and what is wrong with it.
  // `expected_target` / `expected_target_hash` are the target the binary was built for;
  // `expected_build` the build digest of the plan its code was generated from (the
  // manifest's build.digest; empty: not checked, for tools that read any artifact).
  Artifact(const std::string& path, const std::string& expected_target,
           const std::string& expected_target_hash, bool verify_checksums = true,
           const std::string& expected_build = "");
  ~Artifact();
  Artifact(const Artifact&) = delete;
  Artifact& operator=(const Artifact&) = delete;

  const nlohmann::json& manifest() const { return manifest_; }
  const std::string& path() const { return path_; }
  // The tensor, checked against the expected dtype and shape; throws if absent or
  // different, naming both.
  const void* tensor(const std::string& name, const std::string& dtype,
                     const std::vector<int64_t>& shape) const;
  const float* tensor(const std::string& name, const std::vector<int64_t>& shape) const {
    return static_cast<const float*>(tensor(name, "f32", shape));
  }
  bool has_tensor(const std::string& name) const { return tensors_.count(name) != 0; }

  // Copies the whole file into anonymous memory that asks for transparent huge pages
  // (madvise MADV_HUGEPAGE) and reads every tensor from there; the file is unmapped. A
  // decode step streams all the weights, and page-cache pages of the mmapped file are
  // mostly 4 KiB-mapped: on the VM of benchmarks/RESULTS.md (2026-12-05) a 1 GB file read
  // at 28-29 GB/s through the mapping and at 34-35 GB/s from such a copy, and decode ran
  // 2-6% faster. Returns false, and keeps reading the mapping, where the kernel's
  // transparent huge pages are off ("never": the copy would be the same 4 KiB pages).
  bool copy_to_huge_pages();
  bool in_memory() const { return owned_ != nullptr; }
  size_t file_bytes() const { return size_; }

 private:
  // The target, then every tensor of the table (throws std::runtime_error saying why).
  void check_manifest(const unsigned char* base, const std::string& expected_target,
                      const std::string& expected_target_hash, bool verify_checksums,
                      const std::string& expected_build);

  std::string path_;
  int fd_ = -1;            // the file, open until copied
  void* map_ = nullptr;    // the file's mapping, or nullptr once copied
  void* owned_ = nullptr;  // the copy_to_huge_pages() copy
  size_t owned_bytes_ = 0;
  size_t size_ = 0;
  nlohmann::json manifest_;
  std::map<std::string, TensorView> tensors_;
};

}  // namespace ninfer
