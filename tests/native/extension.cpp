// A pybind11 module over binders of runtime_cpp/python/ (tests/native/CMakeLists.txt builds
// one per use): NINFER_MODULE_NAME is the module, NINFER_BIND (and NINFER_BIND2) the binders.
#include <pybind11/pybind11.h>

void NINFER_BIND(pybind11::module_& m);
#ifdef NINFER_BIND2
void NINFER_BIND2(pybind11::module_& m);
#endif

PYBIND11_MODULE(NINFER_MODULE_NAME, m) {
  NINFER_BIND(m);
#ifdef NINFER_BIND2
  NINFER_BIND2(m);
#endif
}
