// pybind11 binding of ninfer::Tokenizer for tests and tools (ninfer_bind_tokenizer).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace py = pybind11;

void ninfer_bind_tokenizer(py::module_& m) {
  using ninfer::Tokenizer;
  // module_local: several compiled models (each its own module) may share a process.
  py::class_<Tokenizer>(m, "Tokenizer", py::module_local())
      .def(py::init([](const std::string& tokenizer_json) {
             return Tokenizer::from_json(nlohmann::json::parse(tokenizer_json));
           }),
           py::arg("tokenizer_json"), "Build from the text of a tokenizer.json.")
      .def(
          "encode",
          [](const Tokenizer& t, const std::string& text, bool add_special_tokens) {
            py::gil_scoped_release release;
            return t.encode(text, add_special_tokens);
          },
          py::arg("text"), py::arg("add_special_tokens"))
      .def(
          "decode",
          [](const Tokenizer& t, const std::vector<int32_t>& ids, bool skip_special_tokens) {
            std::string text;
            {
              py::gil_scoped_release release;
              text = t.decode(ids, skip_special_tokens);
            }
            return py::str(text);
          },
          py::arg("ids"), py::arg("skip_special_tokens"))
      .def(
          "decode_bytes",
          [](const Tokenizer& t, const std::vector<int32_t>& ids, bool skip_special_tokens) {
            return py::bytes(t.decode(ids, skip_special_tokens));
          },
          py::arg("ids"), py::arg("skip_special_tokens"))
      .def(
          "stream_decode",
          [](const Tokenizer& t, const std::vector<int32_t>& ids, bool skip_special_tokens) {
            ninfer::StreamDecoder decoder(t, skip_special_tokens);
            py::list chunks;
            for (int32_t id : ids) chunks.append(py::str(decoder.push(id)));
            chunks.append(py::str(decoder.flush()));
            return chunks;
          },
          py::arg("ids"), py::arg("skip_special_tokens"))
      .def("vocab_size", &Tokenizer::vocab_size)
      .def("token_to_id", &Tokenizer::token_to_id, py::arg("token"))
      .def(
          "token_bytes",
          [](const Tokenizer& t, int32_t id) { return py::bytes(t.token_bytes(id)); },
          py::arg("id"))
      .def("is_special", &Tokenizer::is_special, py::arg("id"));
}
