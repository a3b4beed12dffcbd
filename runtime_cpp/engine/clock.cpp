#include "engine/clock.h"

#include <chrono>

namespace ninfer {
namespace {

class SteadyClock : public Clock {
 public:
  double now_ms() const override {
    const auto since_epoch = std::chrono::steady_clock::now().time_since_epoch();
    return std::chrono::duration<double, std::milli>(since_epoch).count();
  }
};

}  // namespace

const Clock& steady_clock() {
  static SteadyClock clock;
  return clock;
}

double now_ms() { return steady_clock().now_ms(); }

}  // namespace ninfer
