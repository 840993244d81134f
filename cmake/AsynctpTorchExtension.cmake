# libasynctp_torch.so: the torch ops in C++ (python/csrc), registered with PyTorch's dispatcher, so
# that a call costs the dispatcher's C++ path and no Python. Built where Python3_EXECUTABLE imports
# torch; elsewhere the Python package registers the same ops in Python (python/asynctp/ops.py).
# ASYNCTP_TORCH_EXTENSION: AUTO (default: build it where PyTorch is found), ON (PyTorch required), OFF.
set(ASYNCTP_TORCH_EXTENSION AUTO CACHE STRING "Build libasynctp_torch.so: AUTO, ON or OFF")

if(ASYNCTP_TORCH_EXTENSION STREQUAL "OFF")
  return()
endif()
find_package(Python3 COMPONENTS Interpreter QUIET)
set(_asynctp_torch_found FALSE)
if(Python3_Interpreter_FOUND)
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c
      "import torch, torch.utils.cpp_extension as c; print(';'.join(c.include_paths())); print(c.library_paths()[0]); print(int(torch.compiled_with_cxx11_abi())); print(torch.__version__)"
    OUTPUT_VARIABLE _asynctp_torch_info ERROR_VARIABLE _asynctp_torch_error RESULT_VARIABLE _asynctp_torch_rc
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(_asynctp_torch_rc EQUAL 0)
    string(REPLACE "\n" ";" _asynctp_torch_lines "${_asynctp_torch_info}")
    list(LENGTH _asynctp_torch_lines _asynctp_n)
    math(EXPR _asynctp_last "${_asynctp_n} - 1")
    list(GET _asynctp_torch_lines ${_asynctp_last} ASYNCTP_TORCH_VERSION)
    math(EXPR _asynctp_i "${_asynctp_n} - 2")
    list(GET _asynctp_torch_lines ${_asynctp_i} ASYNCTP_TORCH_CXX11_ABI)
    math(EXPR _asynctp_i "${_asynctp_n} - 3")
    list(GET _asynctp_torch_lines ${_asynctp_i} ASYNCTP_TORCH_LIBRARY_DIR)
    list(SUBLIST _asynctp_torch_lines 0 ${_asynctp_i} ASYNCTP_TORCH_INCLUDE_DIRS)
    set(_asynctp_torch_found TRUE)
  endif()
endif()

if(NOT _asynctp_torch_found)
  if(ASYNCTP_TORCH_EXTENSION STREQUAL "ON")
    message(FATAL_ERROR "ASYNCTP_TORCH_EXTENSION=ON, but ${Python3_EXECUTABLE} cannot import torch")
  endif()
  message(STATUS "asynctp: PyTorch not found for ${Python3_EXECUTABLE}: libasynctp_torch.so is not built "
                 "(the Python package registers its torch ops in Python instead)")
  return()
endif()
message(STATUS "asynctp: building libasynctp_torch.so against PyTorch ${ASYNCTP_TORCH_VERSION}")

add_library(asynctp_torch SHARED
  python/csrc/library.cc
  python/csrc/shapes.cc
  python/csrc/ops.cc
  python/csrc/autograd.cc)
# Not linked to libasynctp_c.so: the Python package hands over the C functions of the copy it loaded
# (library.h), so that a communicator made through ctypes is one this library knows.
target_include_directories(asynctp_torch PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/include)
target_include_directories(asynctp_torch SYSTEM PRIVATE ${ASYNCTP_TORCH_INCLUDE_DIRS} ${CUDAToolkit_INCLUDE_DIRS})
target_compile_definitions(asynctp_torch PRIVATE _GLIBCXX_USE_CXX11_ABI=${ASYNCTP_TORCH_CXX11_ABI})
target_compile_options(asynctp_torch PRIVATE ${ASYNCTP_CXX_WARNINGS})
target_link_directories(asynctp_torch PRIVATE ${ASYNCTP_TORCH_LIBRARY_DIR})
# Resolved against the torch that is loaded already: the package loads this library after importing torch.
target_link_libraries(asynctp_torch PRIVATE c10 c10_cuda torch_cpu)
set_target_properties(asynctp_torch PROPERTIES CXX_VISIBILITY_PRESET hidden)
# OPTIONAL: a wheel (pyproject.toml) builds asynctp_c alone, even where this project found torch.
install(TARGETS asynctp_torch LIBRARY DESTINATION ${ASYNCTP_PYTHON_INSTALL_DIR} OPTIONAL)
