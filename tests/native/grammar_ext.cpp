// ninfer_grammar_ext: the structured-output grammars (runtime_cpp/structured/) for the
// Python tests (tests/test_structured_output.py): a GrammarCompiler over a tokenizer.json,
// its constraints driven token by token (and copied), the tool-call grammars, and a grammar
// behind a reasoning block (ReasoningGate).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "structured/grammar.h"
#include "structured/reasoning_gate.h"
#include "structured/tool_grammar.h"
#include "text/tokenizer.h"

namespace py = pybind11;
using ninfer::GrammarCompiler;
using ninfer::GrammarConstraint;
using ninfer::GrammarSpec;

namespace {

GrammarSpec::Kind kind_of(const std::string& name) {
  using Kind = GrammarSpec::Kind;
  for (Kind k : {Kind::kJsonObject, Kind::kJsonSchema, Kind::kRegex, Kind::kEbnf, Kind::kLark,
                 Kind::kStructuralTag})
    if (name == GrammarSpec::kind_name(k)) return k;
  throw std::invalid_argument("unknown grammar kind " + name);
}

ninfer::ToolReasoning reasoning_of(const std::string& name) {
  if (name == "none") return ninfer::ToolReasoning::kNone;
  if (name == "block") return ninfer::ToolReasoning::kThinkBlock;
  if (name == "inside") return ninfer::ToolReasoning::kInsideThink;
  throw std::invalid_argument("unknown reasoning " + name);
}

std::shared_ptr<GrammarConstraint> as_grammar(std::shared_ptr<ninfer::TokenConstraint> c) {
  return std::dynamic_pointer_cast<GrammarConstraint>(c);
}

struct Compiler {
  Compiler(const std::string& tokenizer_json, int vocab_size, std::vector<int32_t> stop_ids)
      : tokenizer(ninfer::Tokenizer::from_json(nlohmann::json::parse(tokenizer_json))),
        compiler(std::make_unique<GrammarCompiler>(tokenizer, vocab_size, stop_ids)) {}
  ninfer::Tokenizer tokenizer;
  std::unique_ptr<GrammarCompiler> compiler;
};

}  // namespace

PYBIND11_MODULE(ninfer_grammar_ext, m) {
  py::register_exception<ninfer::GrammarError>(m, "GrammarError", PyExc_ValueError);
  py::class_<GrammarConstraint, std::shared_ptr<GrammarConstraint>>(m, "Constraint")
      .def("prepare", &GrammarConstraint::prepare)
      .def("allowed_tokens", &GrammarConstraint::allowed_tokens)
      .def("accept", &GrammarConstraint::accept, py::arg("token"))
      .def("accept_string", &GrammarConstraint::accept_string, py::arg("text"))
      .def("finished", &GrammarConstraint::finished)
      .def("completed", &GrammarConstraint::completed)
      .def("clone", [](GrammarConstraint& c) { return as_grammar(c.clone()); })
      .def(
          "apply",
          [](GrammarConstraint& c, std::vector<float> logits) {
            c.apply(logits.data(), static_cast<int>(logits.size()));
            return logits;
          },
          py::arg("logits"))
      .def(
          "fill_bitmask",
          [](GrammarConstraint& c, int vocab) {  // into all-ones words: the allowed bits
            std::vector<uint32_t> words((vocab + 31) / 32, ~0u);
            c.fill_bitmask(words.data(), vocab);
            return words;
          },
          py::arg("vocab"));
  // A gate over a grammar: allowed_tokens() are those apply() leaves finite.
  py::class_<ninfer::ReasoningGate, std::shared_ptr<ninfer::ReasoningGate>>(m, "Gate")
      .def(
          "allowed_tokens",
          [](ninfer::ReasoningGate& g, int vocab) {
            g.prepare();
            std::vector<float> logits(vocab, 0.0f);
            g.apply(logits.data(), vocab);
            std::vector<int32_t> ids;
            for (int v = 0; v < vocab; ++v)
              if (logits[v] == 0.0f) ids.push_back(v);
            return ids;
          },
          py::arg("vocab"))
      .def("accept", &ninfer::ReasoningGate::accept, py::arg("token"))
      .def("finished", &ninfer::ReasoningGate::finished)
      .def("answering", &ninfer::ReasoningGate::answering)
      .def("clone", [](ninfer::ReasoningGate& g) {
        return std::dynamic_pointer_cast<ninfer::ReasoningGate>(g.clone());
      });
  py::class_<Compiler>(m, "GrammarCompiler")
      .def(py::init<const std::string&, int, std::vector<int32_t>>(), py::arg("tokenizer_json"),
           py::arg("vocab_size"), py::arg("stop_ids"))
      .def(
          "constraint",
          [](Compiler& c, const std::string& kind, const std::string& text) {
            py::gil_scoped_release release;
            return as_grammar(c.compiler->constraint({kind_of(kind), text}));
          },
          py::arg("kind"), py::arg("text") = "")
      .def(
          "gated",
          [](Compiler& c, const std::string& kind, const std::string& text,
             const std::string& reasoning) {
            return std::make_shared<ninfer::ReasoningGate>(
                c.compiler->constraint({kind_of(kind), text}), c.tokenizer,
                reasoning_of(reasoning));
          },
          py::arg("kind"), py::arg("text"), py::arg("reasoning"),
          py::keep_alive<0, 1>())  // the gate reads the compiler's tokenizer
      .def("cached_grammars", [](Compiler& c) { return c.compiler->cached_grammars(); })
      .def(
          "tool_constraint",
          [](Compiler& c, const std::string& format, const std::string& tools,
             const std::string& tool_choice, const std::string& reasoning) {
            return as_grammar(ninfer::make_tool_call_constraint(
                *c.compiler, format, nlohmann::ordered_json::parse(tools),
                nlohmann::ordered_json::parse(tool_choice), reasoning_of(reasoning)));
          },
          py::arg("format"), py::arg("tools"), py::arg("tool_choice"),
          py::arg("reasoning") = "none");
  m.def(
      "tool_structural_tag",
      [](const std::string& format, const std::string& tools, const std::string& tool_choice) {
        return ninfer::tool_call_structural_tag(format, nlohmann::ordered_json::parse(tools),
                                                nlohmann::ordered_json::parse(tool_choice));
      },
      py::arg("format"), py::arg("tools"), py::arg("tool_choice"));
}
