// --request-log FILE: one JSON object per line for each request event, appended and
// flushed as it happens. Thread-safe. Events:
//   start      admitted to run for the first time: queue_ms
//   done       finished: finish_reason ("stop" | "length"), all timings
//   cancelled  the client went away: timings so far
//   error      the engine failed it: error
//   rejected   refused without running: reason ("queue_full" | "context_length" |
//              "kv_capacity" | "pending_timeout"), error (the message sent)
// Every line has "event", "id", "time" (Unix seconds), "prompt_tokens", "max_tokens";
// after start also "generated_tokens", "queue_ms", "prefill_ms", "decode_ms", "ttft_ms",
// "e2e_ms", "preemptions" (prefill_ms/ttft_ms/decode_ms only once a token exists); with
// speculative decoding, done and cancelled lines have "draft_tokens" (verified) and
// "draft_accepted_tokens".
#pragma once

#include <cstdio>
#include <mutex>
#include <optional>
#include <string>

namespace ninfer {

struct RequestRecord {
  std::string event;  // start | done | cancelled | error | rejected
  std::string id;
  int prompt_tokens = 0;
  int max_tokens = 0;
  std::optional<int> generated_tokens;
  std::optional<double> queue_ms, prefill_ms, decode_ms, ttft_ms, e2e_ms;
  std::optional<int> preemptions;
  std::optional<int> draft_tokens, draft_accepted_tokens;  // speculative decoding
  std::string finish_reason;                               // done
  std::string reason;                                      // rejected
  std::string error;                                       // error, rejected
};

class RequestLog {
 public:
  explicit RequestLog(const std::string& path);  // appends; throws if it cannot open
  ~RequestLog();
  RequestLog(const RequestLog&) = delete;
  RequestLog& operator=(const RequestLog&) = delete;
  void write(const RequestRecord& r);

  static std::string to_json_line(const RequestRecord& r);  // without the newline

 private:
  std::mutex mu_;
  std::FILE* file_ = nullptr;
};

}  // namespace ninfer
