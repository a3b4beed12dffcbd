// pybind11 binding of the chat templates compiled into the module (ninfer_bind_chat): a
// model's module carries that model's templates ("default", "tool_use"); the test module
// carries the demo and corpus templates.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/chat_template.h"
#include "text/jinja/builtins.h"

namespace py = pybind11;

namespace {

// (ok, text) or (false, "Type: message").
std::tuple<bool, std::string, std::string> render_one(const ninfer::ChatTemplate& t,
                                                      const std::string& context_json) {
  try {
    return {true, t.render(nlohmann::ordered_json::parse(context_json)), ""};
  } catch (const ninfer::ChatTemplateError& e) {
    return {false, e.type, e.what()};
  }
}

const ninfer::ChatTemplate& find(const std::string& name) {
  const ninfer::ChatTemplate* t = ninfer::find_chat_template(name);
  if (!t) throw py::key_error("no chat template '" + name + "' is compiled into this module");
  return *t;
}

}  // namespace

void ninfer_bind_chat(py::module_& m) {
  m.def("chat_template_names", &ninfer::chat_template_names,
        "Names of the chat templates compiled into this module.");
  m.def(
      "chat_template_sha256", [](const std::string& name) { return find(name).sha256(); },
      py::arg("name"));
  m.def(
      "render_chat_template",
      [](const std::string& name, const std::vector<std::string>& contexts) {
        const ninfer::ChatTemplate& t = find(name);
        std::vector<std::tuple<bool, std::string, std::string>> out;
        py::gil_scoped_release release;
        out.reserve(contexts.size());
        for (const auto& c : contexts) out.push_back(render_one(t, c));
        return out;
      },
      py::arg("name"), py::arg("contexts_json"),
      "Render each JSON context: a list of (True, text, '') or (False, error type, message).");
  m.def(
      "time_chat_template",
      [](const std::string& name, const std::string& context_json, int iterations) {
        const ninfer::ChatTemplate& t = find(name);
        py::gil_scoped_release release;
        using clock = std::chrono::steady_clock;
        const auto t0 = clock::now();
        ninfer::jinja::Value ctx;
        for (int i = 0; i < iterations; ++i)
          ctx = ninfer::chat_template_context(nlohmann::ordered_json::parse(context_json));
        const auto t1 = clock::now();
        size_t chars = 0;
        for (int i = 0; i < iterations; ++i) chars += t.render_value(ctx).size();
        const auto t2 = clock::now();
        const double n = iterations > 0 ? iterations : 1;
        return std::make_tuple(std::chrono::duration<double>(t1 - t0).count() / n,
                               std::chrono::duration<double>(t2 - t1).count() / n, chars);
      },
      py::arg("name"), py::arg("context_json"), py::arg("iterations"),
      "Seconds per iteration: (parse the JSON context and convert it, render it), and the "
      "characters rendered in all.");
  m.def("jinja_builtins", [] {
    return py::dict(py::arg("filters") = ninfer::jinja::filter_names(),
                    py::arg("tests") = ninfer::jinja::test_names(),
                    py::arg("methods") = ninfer::jinja::method_names());
  });
}
