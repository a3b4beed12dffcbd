// pybind11 module ninfer_anthropic_ext over server/anthropic.h, for tests/test_anthropic.py:
// the Anthropic <-> OpenAI translation on hand-made JSON, without a server. JSON crosses
// as strings; an ApiError becomes ValueError("<status> <message>").
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "server/anthropic.h"

namespace py = pybind11;
using nlohmann::json;

namespace {

template <typename F>
std::string translate(F&& f) {
  try {
    return f().dump();
  } catch (const ninfer::ApiError& e) {
    throw py::value_error(std::to_string(e.status) + " " + e.what());
  }
}

}  // namespace

PYBIND11_MODULE(ninfer_anthropic_ext, m) {
  m.def(
      "to_openai_request",
      [](const std::string& body, bool count_tokens) {
        return translate([&] {
          return ninfer::anthropic::to_openai_request(nlohmann::ordered_json::parse(body),
                                                      count_tokens);
        });
      },
      py::arg("body"), py::arg("count_tokens") = false);
  m.def("from_openai_response", [](const std::string& completion, const std::string& id) {
    return translate(
        [&] { return ninfer::anthropic::from_openai_response(json::parse(completion), id); });
  });
  // The events for a chunk stream: [[name, data], ...], start() to finish().
  m.def("stream_events", [](const std::string& chunks, int input_tokens) {
    return translate([&] {
      ninfer::anthropic::StreamTranslator t("msg_test", "m", input_tokens);
      json out = json::array();
      auto add = [&](const std::vector<ninfer::anthropic::Event>& events) {
        for (const auto& e : events) out.push_back({e.name, e.data});
      };
      add(t.start());
      for (const json& c : json::parse(chunks)) add(t.feed(c));
      add(t.finish());
      return out;
    });
  });
}
