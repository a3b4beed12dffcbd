#include "observe/request_log.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace ninfer {

RequestLog::RequestLog(const std::string& path) {
  file_ = std::fopen(path.c_str(), "a");
  if (!file_)
    throw std::runtime_error("cannot open request log '" + path + "': " + std::strerror(errno));
}

RequestLog::~RequestLog() {
  if (file_) std::fclose(file_);
}

std::string RequestLog::to_json_line(const RequestRecord& r) {
  using nlohmann::json;
  using namespace std::chrono;
  json j;
  j["event"] = r.event;
  j["id"] = r.id;
  j["time"] = duration<double>(system_clock::now().time_since_epoch()).count();
  j["prompt_tokens"] = r.prompt_tokens;
  j["max_tokens"] = r.max_tokens;
  if (r.generated_tokens) j["generated_tokens"] = *r.generated_tokens;
  if (!r.finish_reason.empty()) j["finish_reason"] = r.finish_reason;
  if (!r.reason.empty()) j["reason"] = r.reason;
  if (!r.error.empty()) j["error"] = r.error;
  auto ms = [&](const char* key, const std::optional<double>& v) {
    if (v) j[key] = *v;
  };
  ms("queue_ms", r.queue_ms);
  ms("prefill_ms", r.prefill_ms);
  ms("decode_ms", r.decode_ms);
  ms("ttft_ms", r.ttft_ms);
  ms("e2e_ms", r.e2e_ms);
  if (r.preemptions) j["preemptions"] = *r.preemptions;
  if (r.draft_tokens) j["draft_tokens"] = *r.draft_tokens;
  if (r.draft_accepted_tokens) j["draft_accepted_tokens"] = *r.draft_accepted_tokens;
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

void RequestLog::write(const RequestRecord& r) {
  const std::string line = to_json_line(r) + "\n";
  std::lock_guard<std::mutex> lock(mu_);
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fflush(file_);
}

}  // namespace ninfer
