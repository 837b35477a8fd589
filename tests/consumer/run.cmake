# Drives one consumer test: cmake -DMODE=... -DSOURCE_DIR=... -DWORK_DIR=... -P run.cmake
# Configures, builds and runs tests/consumer against strata consumed in the given MODE, and
# checks that the program sees the same STRATA_HAS_CUDA/STRATA_HAS_URING as strata's own build.
cmake_minimum_required(VERSION 3.21)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "FAILED (${rc}): ${cmd}\n--- stdout\n${out}\n--- stderr\n${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(common -G "${GENERATOR}" -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_BUILD_TYPE=Release)
set(strata_switches -DSTRATA_ENABLE_CUDA=${ENABLE_CUDA} -DSTRATA_ENABLE_URING=${ENABLE_URING})
set(consumer_args -DSTRATA_SOURCE_DIR=${SOURCE_DIR})

if(MODE STREQUAL "subdirectory" OR MODE STREQUAL "fetchcontent_source_dir")
  set(consumer_mode ${MODE})
  list(APPEND consumer_args ${strata_switches})
elseif(MODE STREQUAL "fetchcontent_url")
  # A release-like tarball of what a user needs, served from the local file system.
  run(${CMAKE_COMMAND} -E chdir "${SOURCE_DIR}"
      ${CMAKE_COMMAND} -E tar czf "${WORK_DIR}/strata.tar.gz" -- CMakeLists.txt cmake include LICENSE)
  set(consumer_mode fetchcontent_url)
  list(APPEND consumer_args ${strata_switches} -DSTRATA_URL=file://${WORK_DIR}/strata.tar.gz)
elseif(MODE STREQUAL "find_package")
  run(${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${WORK_DIR}/strata-build" ${common} ${strata_switches}
      -DSTRATA_BUILD_TESTS=OFF -DSTRATA_BUILD_EXAMPLES=OFF -DSTRATA_BUILD_BENCH=OFF)
  run(${CMAKE_COMMAND} --build "${WORK_DIR}/strata-build")
  run(${CMAKE_COMMAND} --install "${WORK_DIR}/strata-build" --prefix "${WORK_DIR}/prefix")
  if(NOT EXISTS "${WORK_DIR}/prefix/include/strata/strata.hpp")
    message(FATAL_ERROR "install did not put the headers under ${WORK_DIR}/prefix/include")
  endif()
  set(consumer_mode find_package)
  list(APPEND consumer_args -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
else()
  message(FATAL_ERROR "unknown MODE '${MODE}'")
endif()

run(${CMAKE_COMMAND} -S "${SOURCE_DIR}/tests/consumer" -B "${WORK_DIR}/consumer-build" ${common}
    -DSTRATA_CONSUMER_MODE=${consumer_mode} ${consumer_args})
run(${CMAKE_COMMAND} --build "${WORK_DIR}/consumer-build")
run("${WORK_DIR}/consumer-build/consumer")
message(STATUS "consumer (${MODE}) printed: ${last_output}")
set(expected "STRATA_HAS_CUDA=${EXPECT_CUDA} STRATA_HAS_URING=${EXPECT_URING}")
string(FIND "${last_output}" "${expected}" pos)
if(pos EQUAL -1)
  message(FATAL_ERROR "consumer (${MODE}) expected '${expected}', got: ${last_output}")
endif()
file(REMOVE_RECURSE "${WORK_DIR}")
