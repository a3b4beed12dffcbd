// Opens a model.ninfer as ninfer-server does and reads tensors from it, for
// tests/test_artifact_reader.py: every check of model/artifact.cpp, reached through the
// real reader with files made by the real writer (compiler/ninfer/artifact.py).
//
// usage: test_artifact FILE TARGET TARGET_HASH [NAME:DTYPE:SHAPE ...]
//   SHAPE is dims joined by 'x' ("4x8"; "" for a scalar). Prints "ok", or the reader's
//   error on stderr with exit status 1.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "model/artifact.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: test_artifact FILE TARGET TARGET_HASH [NAME:DTYPE:SHAPE ...]\n");
    return 2;
  }
  try {
    ninfer::Artifact artifact(argv[1], argv[2], argv[3]);
    for (int i = 4; i < argc; ++i) {
      const std::string spec = argv[i];
      const size_t a = spec.find(':'), b = spec.find(':', a + 1);
      if (a == std::string::npos || b == std::string::npos) {
        std::fprintf(stderr, "bad tensor spec '%s'\n", spec.c_str());
        return 2;
      }
      std::vector<int64_t> shape;
      for (size_t p = b + 1; p < spec.size();) {
        size_t q = spec.find('x', p);
        if (q == std::string::npos) q = spec.size();
        shape.push_back(std::stoll(spec.substr(p, q - p)));
        p = q + 1;
      }
      artifact.tensor(spec.substr(0, a), spec.substr(a + 1, b - a - 1), shape);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  std::puts("ok");
  return 0;
}
