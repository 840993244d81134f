# Finds asynctp's dependencies and reports each in one line: where it is and which version.
# A missing or too old one stops configure with a message that says what to install.

set(ASYNCTP_MIN_NCCL_VERSION 2.28.0)
set(ASYNCTP_CUTLASS_VERSION 4.2)

function(asynctp_report name where version)
  message(STATUS "asynctp: ${name} ${version} at ${where}")
endfunction()

# --- CUDA toolkit: cudart, the driver API header (its functions are looked up at run time, so no
# --- libcuda is linked and the CPU tests load on machines without a driver), cuBLASLt.
find_package(CUDAToolkit 13.0 REQUIRED)
if(NOT TARGET CUDA::cublasLt)
  message(FATAL_ERROR "asynctp: cuBLASLt not found in the CUDA toolkit at ${CUDAToolkit_LIBRARY_DIR}; "
                      "install the toolkit's cuBLAS (apt: libcublas-dev-13-0)")
endif()
find_file(ASYNCTP_CUDA_H cuda.h PATHS ${CUDAToolkit_INCLUDE_DIRS} NO_DEFAULT_PATH)
if(NOT ASYNCTP_CUDA_H)
  message(FATAL_ERROR "asynctp: the CUDA driver API header cuda.h is missing from ${CUDAToolkit_INCLUDE_DIRS}")
endif()
asynctp_report("CUDA toolkit (cudart, driver API, cuBLASLt)" "${CUDAToolkit_LIBRARY_DIR}" "${CUDAToolkit_VERSION}")

# --- NCCL >= 2.28 with the device API (nccl_device.h). NCCL_ROOT (variable or environment) wins.
set(NCCL_ROOT "${NCCL_ROOT}" CACHE PATH "NCCL installation root (include/ and lib/)")
if(NOT NCCL_ROOT AND DEFINED ENV{NCCL_ROOT})
  set(NCCL_ROOT "$ENV{NCCL_ROOT}")
endif()
set(_nccl_hints ${NCCL_ROOT} ${CUDAToolkit_LIBRARY_ROOT} ${CUDAToolkit_TARGET_DIR})
if(NCCL_ROOT)
  set(_nccl_search NO_DEFAULT_PATH)
endif()
find_path(NCCL_INCLUDE_DIR nccl_device.h HINTS ${_nccl_hints} PATH_SUFFIXES include ${_nccl_search})
# A pip wheel's lib/ holds only libnccl.so.2, hence the explicit soname.
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_nccl_hints} PATH_SUFFIXES lib lib64 ${_nccl_search})
if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
  message(FATAL_ERROR "asynctp: NCCL >= ${ASYNCTP_MIN_NCCL_VERSION} with nccl_device.h not found "
                      "(include: ${NCCL_INCLUDE_DIR}, library: ${NCCL_LIBRARY}). Install NCCL 2.28 or newer "
                      "(apt: libnccl-dev, or pip: nvidia-nccl-cu13) and point NCCL_ROOT at it.")
endif()
file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_defs REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
foreach(_line IN LISTS _nccl_defs)
  if(_line MATCHES "^#define NCCL_(MAJOR|MINOR|PATCH) +([0-9]+)")
    set(_nccl_${CMAKE_MATCH_1} ${CMAKE_MATCH_2})
  endif()
endforeach()
set(NCCL_VERSION "${_nccl_MAJOR}.${_nccl_MINOR}.${_nccl_PATCH}")
if(NCCL_VERSION VERSION_LESS ASYNCTP_MIN_NCCL_VERSION)
  message(FATAL_ERROR "asynctp: NCCL ${NCCL_VERSION} at ${NCCL_INCLUDE_DIR} is too old: asynctp needs "
                      ">= ${ASYNCTP_MIN_NCCL_VERSION} for symmetric windows and the device API. "
                      "Install a newer NCCL and point NCCL_ROOT at it.")
endif()
add_library(asynctp::nccl UNKNOWN IMPORTED)
set_target_properties(asynctp::nccl PROPERTIES
  IMPORTED_LOCATION "${NCCL_LIBRARY}" INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
asynctp_report("NCCL (with nccl_device.h)" "${NCCL_LIBRARY}" "${NCCL_VERSION}")

# --- CUTLASS 4.2 headers. CUTLASS_DIR (variable or environment) wins; by default the headers of the
# --- nvidia-cutlass wheel that scripts/setup.sh installs into third_party/cutlass.
set(CUTLASS_DIR "${CUTLASS_DIR}" CACHE PATH "CUTLASS include folder (holding cutlass/ and cute/)")
if(NOT CUTLASS_DIR AND DEFINED ENV{CUTLASS_DIR})
  set(CUTLASS_DIR "$ENV{CUTLASS_DIR}")
endif()
find_path(CUTLASS_INCLUDE_DIR cutlass/version.h
  HINTS ${CUTLASS_DIR} ${CUTLASS_DIR}/include
        ${PROJECT_SOURCE_DIR}/third_party/cutlass/cutlass_library/source/include
  NO_DEFAULT_PATH)
if(NOT CUTLASS_INCLUDE_DIR)
  message(FATAL_ERROR "asynctp: CUTLASS ${ASYNCTP_CUTLASS_VERSION} headers not found. Run scripts/setup.sh "
                      "(it installs nvidia-cutlass==4.2.0.0 into third_party/cutlass), or set CUTLASS_DIR "
                      "to a folder holding cutlass/version.h.")
endif()
file(STRINGS "${CUTLASS_INCLUDE_DIR}/cutlass/version.h" _cutlass_defs REGEX "^#define CUTLASS_(MAJOR|MINOR|PATCH) ")
foreach(_line IN LISTS _cutlass_defs)
  if(_line MATCHES "^#define CUTLASS_(MAJOR|MINOR|PATCH) +([0-9]+)")
    set(_cutlass_${CMAKE_MATCH_1} ${CMAKE_MATCH_2})
  endif()
endforeach()
set(CUTLASS_VERSION "${_cutlass_MAJOR}.${_cutlass_MINOR}.${_cutlass_PATCH}")
if(NOT CUTLASS_VERSION VERSION_GREATER_EQUAL ${ASYNCTP_CUTLASS_VERSION} OR
   CUTLASS_VERSION VERSION_GREATER_EQUAL 5.0)
  message(FATAL_ERROR "asynctp: CUTLASS ${CUTLASS_VERSION} at ${CUTLASS_INCLUDE_DIR}; asynctp needs 4.x "
                      ">= ${ASYNCTP_CUTLASS_VERSION} (pip: nvidia-cutlass==4.2.0.0).")
endif()
add_library(asynctp::cutlass INTERFACE IMPORTED)
set_target_properties(asynctp::cutlass PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${CUTLASS_INCLUDE_DIR}")
asynctp_report("CUTLASS headers" "${CUTLASS_INCLUDE_DIR}" "${CUTLASS_VERSION}")

# --- GoogleTest (Debian's libgtest-dev), for the tests only.
if(ASYNCTP_BUILD_TESTS)
  find_package(GTest CONFIG QUIET)
  if(NOT GTest_FOUND)
    find_package(GTest MODULE)
  endif()
  if(NOT TARGET GTest::gtest)
    message(FATAL_ERROR "asynctp: GoogleTest not found. Install it (apt: libgtest-dev), point GTest_DIR "
                        "at its CMake package, or configure with -DASYNCTP_BUILD_TESTS=OFF.")
  endif()
  get_target_property(_gtest_loc GTest::gtest LOCATION)
  asynctp_report("GoogleTest" "${_gtest_loc}" "${GTest_VERSION}")
endif()
