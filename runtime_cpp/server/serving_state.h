// What the route table checks before any handler runs: the API key (--api-key) and the
// server's phase. The port is bound before the model loads, so requests may arrive while
// it loads (they get 503 model_loading; /health 503 "loading") and after SIGTERM
// (/health 503 "shutting_down" while the requests in flight are answered).
#pragma once

#include <mutex>
#include <string>

#include <httplib.h>

namespace ninfer {

struct Routes;

class ServingState {
 public:
  enum class Phase { kLoading, kReady, kStopping };

  explicit ServingState(std::string api_key) : api_key_(std::move(api_key)) {}
  // Whether `req` carries the key, as `Authorization: Bearer KEY` or `x-api-key: KEY`
  // (compared in constant time); always true when no key is set.
  bool authorized(const httplib::Request& req) const;
  Phase phase() const;
  // The routes once the model is loaded; nullptr while loading.
  const Routes* routes() const;
  // Makes the loaded routes live; false if the server began stopping meanwhile.
  bool publish(const Routes* routes);
  // Begins stopping; returns the routes (nullptr if the model never finished loading).
  const Routes* stop();

 private:
  const std::string api_key_;
  mutable std::mutex mu_;
  Phase phase_ = Phase::kLoading;
  const Routes* routes_ = nullptr;
};

}  // namespace ninfer
