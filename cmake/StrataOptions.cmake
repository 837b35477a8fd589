# Options of strata. Tests, examples and benchmarks default to ON only when strata is the
# top-level project, so a consumer's add_subdirectory/FetchContent builds nothing but the target.
include_guard(GLOBAL)

option(STRATA_BUILD_TESTS "Build strata's tests" ${PROJECT_IS_TOP_LEVEL})
option(STRATA_BUILD_EXAMPLES "Build strata's examples" ${PROJECT_IS_TOP_LEVEL})
option(STRATA_BUILD_BENCH "Build strata's benchmarks" ${PROJECT_IS_TOP_LEVEL})
option(STRATA_INSTALL "Generate strata's install rules" ON)

# Tri-state switches: AUTO uses the feature when it is found, ON requires it, OFF ignores it.
function(strata_tristate name doc)
  set(${name} AUTO CACHE STRING "${doc} (AUTO, ON or OFF)")
  set_property(CACHE ${name} PROPERTY STRINGS AUTO ON OFF)
  string(TOUPPER "${${name}}" _value)
  if(_value STREQUAL "TRUE" OR _value STREQUAL "YES" OR _value STREQUAL "1")
    set(_value ON)
  elseif(_value STREQUAL "FALSE" OR _value STREQUAL "NO" OR _value STREQUAL "0")
    set(_value OFF)
  endif()
  if(NOT _value MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "${name} is '${${name}}'; expected AUTO, ON or OFF")
  endif()
  set(${name}_MODE ${_value} PARENT_SCOPE)
endfunction()

strata_tristate(STRATA_ENABLE_CUDA "Use the CUDA toolkit (pinned memory, CUDA kernels and tests)")
strata_tristate(STRATA_ENABLE_URING "Use liburing for the io_uring file backend")
strata_tristate(STRATA_ENABLE_S3 "Build the S3 object-store tier (libcurl and OpenSSL's libcrypto)")
strata_tristate(STRATA_BUILD_PYTHON "Build the Python front (Python development files and nanobind)")

# A compiler cache for strata's own build (tests, examples, benchmarks): AUTO uses ccache when it
# is installed, unless a launcher is already set. A fresh clone elsewhere on the machine hits the
# same cache: paths under the source tree are hashed relative to it, and the build directory is
# left out of the hash. Depend mode takes the headers from the compiler's own -MD output, so a
# miss costs no extra preprocessor run.
strata_tristate(STRATA_COMPILER_CACHE "Compile through ccache when it is installed")
if(PROJECT_IS_TOP_LEVEL AND NOT STRATA_COMPILER_CACHE_MODE STREQUAL "OFF")
  find_program(STRATA_CCACHE_PROGRAM ccache)
  if(STRATA_CCACHE_PROGRAM)
    set(_strata_launcher ${CMAKE_COMMAND} -E env CCACHE_BASEDIR=${PROJECT_SOURCE_DIR} CCACHE_NOHASHDIR=true
                         CCACHE_DEPEND=true ${STRATA_CCACHE_PROGRAM})
    foreach(_lang IN ITEMS CXX CUDA)
      if(NOT CMAKE_${_lang}_COMPILER_LAUNCHER)
        set(CMAKE_${_lang}_COMPILER_LAUNCHER ${_strata_launcher})
      endif()
    endforeach()
  elseif(STRATA_COMPILER_CACHE_MODE STREQUAL "ON")
    message(FATAL_ERROR "STRATA_COMPILER_CACHE is ON but ccache was not found (apt-get install ccache)")
  endif()
endif()
