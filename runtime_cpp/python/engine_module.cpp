// The `ninfer_engine_<model>` Python module: its entry point, named per model
// (NINFER_MODULE_NAME; CPython caches extension modules by name). Everything it binds is
// model-independent and compiled once (bind_engine.cpp, bind_tokenizer.cpp, bind_chat.cpp).
#include <pybind11/pybind11.h>

namespace py = pybind11;

void ninfer_bind_engine(py::module_& m);
void ninfer_bind_tokenizer(py::module_& m);
void ninfer_bind_chat(py::module_& m);

#ifndef NINFER_MODULE_NAME
#define NINFER_MODULE_NAME ninfer_engine
#endif

PYBIND11_MODULE(NINFER_MODULE_NAME, m) {
  m.doc() = "ninfer compiled model (same runtime and kernels as ninfer-server)";
  ninfer_bind_engine(m);
  ninfer_bind_tokenizer(m);
  ninfer_bind_chat(m);
}
