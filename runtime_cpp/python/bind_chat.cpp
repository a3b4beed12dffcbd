// Python binding of ChatFormat, for tests: render_chat(format_json, messages,
// add_generation_prompt)
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <utility>
#include <vector>

#include "text/chat_format.h"

namespace py = pybind11;

void ninfer_bind_chat(py::module_& m) {
  m.def(
      "render_chat",
      [](const std::string& format_json,
         const std::vector<std::pair<std::string, std::string>>& messages,
         bool add_generation_prompt, bool enable_thinking) {
        ninfer::ChatFormat format =
            ninfer::ChatFormat::from_json(nlohmann::json::parse(format_json));
        std::vector<ninfer::ChatMessage> msgs;
        msgs.reserve(messages.size());
        for (const auto& [role, content] : messages) msgs.push_back({role, content});
        return format.render(msgs, add_generation_prompt, enable_thinking);
      },
      py::arg("format_json"), py::arg("messages"), py::arg("add_generation_prompt"),
      py::arg("enable_thinking") = true,
      "Render (role, content) messages with a ChatFormat given as JSON (ChatFormat.to_json()).");
}
