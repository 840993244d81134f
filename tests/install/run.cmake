# Installs the build in BUILD into a fresh prefix, then configures, builds and runs the consumer in
# tests/install against it. Usage: cmake -DBUILD=<build dir> -DSOURCE=<repository> -P run.cmake
set(prefix ${BUILD}/install-test/prefix)
set(consumer ${BUILD}/install-test/consumer)
file(REMOVE_RECURSE ${BUILD}/install-test)
function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()
step(${CMAKE_COMMAND} --install ${BUILD} --prefix ${prefix})
step(${CMAKE_COMMAND} -S ${SOURCE}/tests/install -B ${consumer} -G Ninja -DCMAKE_PREFIX_PATH=${prefix}
     -DCMAKE_BUILD_TYPE=Release)
step(${CMAKE_COMMAND} --build ${consumer})
step(${consumer}/consumer)
