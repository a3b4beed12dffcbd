#include "server/serving_state.h"

#include <cctype>

namespace ninfer {
namespace {

// Compares in time that depends only on the key's length, not on how much matches.
bool same_key(const std::string& key, const std::string& given) {
  unsigned char diff = key.size() != given.size();
  for (size_t i = 0; i < key.size(); ++i)
    diff |= static_cast<unsigned char>(key[i] ^ (i < given.size() ? given[i] : 0));
  return diff == 0;
}

bool iequals_prefix(const std::string& s, const std::string& prefix) {
  if (s.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(s[i])) != prefix[i]) return false;
  return true;
}

}  // namespace

bool ServingState::authorized(const httplib::Request& req) const {
  if (api_key_.empty()) return true;
  bool ok = false;
  if (req.has_header("x-api-key")) ok |= same_key(api_key_, req.get_header_value("x-api-key"));
  if (req.has_header("Authorization")) {
    const std::string auth = req.get_header_value("Authorization");
    if (iequals_prefix(auth, "bearer ")) ok |= same_key(api_key_, auth.substr(7));
  }
  return ok;
}

ServingState::Phase ServingState::phase() const {
  std::lock_guard<std::mutex> lock(mu_);
  return phase_;
}

const Routes* ServingState::routes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return routes_;
}

bool ServingState::publish(const Routes* routes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (phase_ == Phase::kStopping) return false;
  routes_ = routes;
  phase_ = Phase::kReady;
  return true;
}

const Routes* ServingState::stop() {
  std::lock_guard<std::mutex> lock(mu_);
  phase_ = Phase::kStopping;
  return routes_;
}

}  // namespace ninfer
