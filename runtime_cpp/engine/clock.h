// Time as the engine measures it: milliseconds on a monotonic clock, from an arbitrary
// origin. Everything the engine times (when a request was submitted, the pending
// timeout, the step costs behind --max-decode-slowdown, each request's timings) reads
// one Clock (EngineOptions::clock), so a test can substitute one that advances by the
// work a fake model reports instead of by what a busy machine happened to do.
#pragma once

namespace ninfer {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual double now_ms() const = 0;
};

// std::chrono::steady_clock: the engine's default.
const Clock& steady_clock();

// steady_clock().now_ms(), for code outside the engine (e.g. the HTTP threads).
double now_ms();

}  // namespace ninfer
