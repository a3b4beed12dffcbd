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

 private:
  // The target, then every tensor of the table (throws std::runtime_error saying why).
  void check_manifest(const unsigned char* base, const std::string& expected_target,
                      const std::string& expected_target_hash, bool verify_checksums,
                      const std::string& expected_build);

  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  nlohmann::json manifest_;
  std::map<std::string, TensorView> tensors_;
};

}  // namespace ninfer
