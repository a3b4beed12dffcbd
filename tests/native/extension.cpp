// A pybind11 module over one binder of runtime_cpp/python/ (tests/native/CMakeLists.txt
// builds one per binder): NINFER_MODULE_NAME is the module, NINFER_BIND the binder.
#include <pybind11/pybind11.h>

void NINFER_BIND(pybind11::module_& m);

PYBIND11_MODULE(NINFER_MODULE_NAME, m) { NINFER_BIND(m); }
