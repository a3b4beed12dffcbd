# xgrammar's C++ core as the static library ninfer_xgrammar: the grammar engine behind
# structured output (runtime_cpp/structured/). The sources come from xgrammar's PyPI
# source distribution, which scripts/setup.sh fetches into build/third_party/; its
# Python bindings (cpp/tvm_ffi) and tests are left out. Included by
# runtime_cpp/CMakeLists.txt.
set(NINFER_XGRAMMAR_VERSION 0.2.8)
set(NINFER_XGRAMMAR_DIR "${NINFER_RUNTIME_DIR}/../build/third_party/xgrammar-${NINFER_XGRAMMAR_VERSION}"
    CACHE PATH "xgrammar ${NINFER_XGRAMMAR_VERSION} source tree (its PyPI sdist, unpacked)")
if(NOT EXISTS "${NINFER_XGRAMMAR_DIR}/cpp/grammar_matcher.cc")
  message(FATAL_ERROR "xgrammar ${NINFER_XGRAMMAR_VERSION} sources not found at "
                      "${NINFER_XGRAMMAR_DIR}: run scripts/setup.sh (it fetches them), or "
                      "pass -DNINFER_XGRAMMAR_DIR=<unpacked xgrammar sdist>")
endif()

file(GLOB _ninfer_xgrammar_sources CONFIGURE_DEPENDS
     "${NINFER_XGRAMMAR_DIR}/cpp/*.cc"
     "${NINFER_XGRAMMAR_DIR}/cpp/support/*.cc"
     "${NINFER_XGRAMMAR_DIR}/cpp/converter_ext/*.cc")
add_library(ninfer_xgrammar STATIC ${_ninfer_xgrammar_sources})
target_compile_features(ninfer_xgrammar PUBLIC cxx_std_17)
target_include_directories(ninfer_xgrammar PUBLIC "${NINFER_XGRAMMAR_DIR}/include")
target_include_directories(ninfer_xgrammar SYSTEM PUBLIC
                           "${NINFER_XGRAMMAR_DIR}/3rdparty/picojson"
                           "${NINFER_XGRAMMAR_DIR}/3rdparty/dlpack/include")
target_compile_definitions(ninfer_xgrammar PUBLIC XGRAMMAR_ENABLE_CPPTRACE=0
                                                  XGRAMMAR_ENABLE_INTERNAL_CHECK=0)
# Third-party code: no warnings; no debug info even in RelWithDebInfo builds (it would
# double the compile time of these template-heavy sources on a 2-core machine), always
# optimized (the mask computation runs once per generated token).
target_compile_options(ninfer_xgrammar PRIVATE -w -g0 -O2)
target_link_libraries(ninfer_xgrammar PUBLIC Threads::Threads)
set_target_properties(ninfer_xgrammar PROPERTIES POSITION_INDEPENDENT_CODE ON)
