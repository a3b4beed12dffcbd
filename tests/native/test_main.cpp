// Standalone tests of the continuous-batching runtime (KvBlocks, Scheduler, Engine,
// Sampler, StopMatcher, Metrics, RequestLog) against the fake paged model of
// fake_model.h; built by tests/native/CMakeLists.txt, run by tests/test_scheduler_native.py.
//
// usage: test_engine scheduler | invariance | cancel | admission | sampling | slowdown |
//        stops | fork | token_controls | processors | speculate | prefix | metrics | log FILE |
//        cpu_features NAME...
#include <cstdio>
#include <functional>
#include <map>
#include <string>

#include "backend/cpu/cpu_features.h"
#include "harness.h"

int main(int argc, char** argv) {
  using namespace ninfer::fake;
  const std::map<std::string, std::function<void()>> cases = {
      {"scheduler", test_scheduler},
      {"invariance", test_invariance},
      {"cancel", test_cancel},
      {"admission", test_admission},
      {"sampling", test_sampling},
      {"slowdown", test_slowdown},
      {"stops", test_stops},
      {"metrics", print_metrics},
      {"fork", test_fork},
      {"token_controls", test_token_controls},
      {"processors", test_logits_processors},
      {"speculate", test_speculate},
      {"prefix", test_prefix},
  };
  const std::string what = argc > 1 ? argv[1] : "";
  if (what == "log" && argc > 2) {
    write_log(argv[2]);
    return 0;
  }
  if (what == "cpu_features") {  // NAME...: "NAME 0|1" each, then the refusal of them all
    std::vector<std::string> names(argv + 2, argv + argc);
    for (const auto& n : names) std::printf("%s %d\n", n.c_str(), ninfer::cpu::cpu_supports(n));
    std::printf("refusal: %s\n", ninfer::cpu::features_refusal(names).c_str());
    return 0;
  }
  auto it = cases.find(what);
  if (it == cases.end()) {
    std::fprintf(stderr,
                 "usage: test_engine scheduler|invariance|cancel|admission|sampling|slowdown|"
                 "stops|fork|token_controls|processors|speculate|prefix|metrics|log FILE|"
                 "cpu_features NAME...\n");
    return 2;
  }
  it->second();
  return 0;
}
