# Compile options for strata's own tests, examples and benchmarks (never imposed on consumers).
include_guard(GLOBAL)

option(STRATA_WERROR "Treat warnings as errors in strata's own tests, examples and benchmarks" ON)

# Test sources are mostly code generation of test bodies (at -O2 two thirds of a heavy test's
# compile time); -O1 cuts a third of it. What the tests exercise stays -O2: the CPU kernels, the
# pipeline and the optimizer core come from strata_instances, built with the configuration's
# flags, and examples and benchmarks keep them too. CUDA test sources keep the build's level
# (nvcc warns when -O is given twice). Empty keeps the configuration's level everywhere.
set(STRATA_TEST_OPTIMIZATION "-O1" CACHE STRING
    "Optimization flag for strata's test sources in optimized builds (empty: the build type's)")

# strata_test_target(<target>): a test or test helper; debug builds keep their -O0.
function(strata_test_target target)
  if(NOT STRATA_TEST_OPTIMIZATION STREQUAL "")
    target_compile_options(${target} PRIVATE
      "$<$<AND:$<COMPILE_LANGUAGE:CXX>,$<NOT:$<CONFIG:Debug>>>:${STRATA_TEST_OPTIMIZATION}>")
  endif()
endfunction()

function(strata_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${STRATA_WERROR}>>:-Werror>
    $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${STRATA_WERROR}>>:--Werror=all-warnings>)
endfunction()

# strata_cuda_target(<target>): compiles the target's .cu sources as C++20. CMake releases before
# 3.26 know no C++20 flag for nvcc (CUDA_STANDARD 20 is an error there), so pass it directly.
function(strata_cuda_target target)
  if(DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION AND NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION STREQUAL "")
    set_target_properties(${target} PROPERTIES CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON)
  else()
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>)
  endif()
  strata_warnings(${target})
endfunction()

# strata_instances(<target>): the target's C++ sources take the common instantiations from one
# object file (cmake/strata_instances.cpp, STRATA_EXTERN_TEMPLATES in core/config.hpp) instead of
# compiling them in each translation unit. CUDA sources compile their own.
function(strata_instances target)
  if(NOT TARGET strata_instances)
    add_library(strata_instances OBJECT ${PROJECT_SOURCE_DIR}/cmake/strata_instances.cpp)
    target_link_libraries(strata_instances PUBLIC strata::strata)
    target_compile_definitions(strata_instances PRIVATE STRATA_EXTERN_TEMPLATES=1)
    strata_warnings(strata_instances)
  endif()
  target_link_libraries(${target} PRIVATE strata_instances)
  target_compile_definitions(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:STRATA_EXTERN_TEMPLATES=1>)
endfunction()
