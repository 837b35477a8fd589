# Finds strata's dependencies. Everything comes from find_package/pkg-config: nothing is
# downloaded at configure time. A missing required package stops configure and names the
# Debian package that provides it.
include_guard(GLOBAL)

# strata_require(<package> <debian-package> [find_package args...])
macro(strata_require package debian)
  find_package(${package} ${ARGN} QUIET)
  if(NOT ${package}_FOUND)
    message(FATAL_ERROR
      "strata needs ${package}, which CMake could not find.\n"
      "On Debian/Ubuntu: apt-get install ${debian}\n"
      "Elsewhere: install ${package} and point CMAKE_PREFIX_PATH at it.")
  endif()
endmacro()

set(THREADS_PREFER_PTHREAD_FLAG ON)
find_package(Threads REQUIRED)
strata_require(fmt libfmt-dev CONFIG)

# xxHash (XXH3) checksums every stored block; used header-only (XXH_INLINE_ALL).
find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND AND NOT TARGET PkgConfig::strata_xxhash)
  pkg_check_modules(strata_xxhash QUIET IMPORTED_TARGET GLOBAL libxxhash)
endif()
if(NOT TARGET PkgConfig::strata_xxhash)
  # Without pkg-config (some GPU images): the header alone will do, as it is used header-only.
  find_path(STRATA_XXHASH_INCLUDE_DIR xxhash.h)
  if(STRATA_XXHASH_INCLUDE_DIR)
    add_library(PkgConfig::strata_xxhash INTERFACE IMPORTED GLOBAL)
    target_include_directories(PkgConfig::strata_xxhash INTERFACE ${STRATA_XXHASH_INCLUDE_DIR})
  endif()
endif()
if(NOT TARGET PkgConfig::strata_xxhash)
  message(FATAL_ERROR "strata needs xxHash (xxhash.h), which pkg-config could not find.\n"
                      "On Debian/Ubuntu: apt-get install libxxhash-dev pkg-config")
endif()

# --- CUDA (optional) ----------------------------------------------------------------------------
set(STRATA_HAS_CUDA OFF)
set(STRATA_CUDA_LANGUAGE OFF)  # whether .cu sources of this project are compiled
if(NOT STRATA_ENABLE_CUDA_MODE STREQUAL "OFF")
  # nvcc is often installed outside PATH; look where the toolkit puts it before giving up.
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(STRATA_NVCC nvcc
      HINTS ENV CUDA_PATH ENV CUDA_HOME ENV CUDA_ROOT PATH_SUFFIXES bin
      PATHS /usr/local/cuda/bin)
    if(STRATA_NVCC)
      set(CMAKE_CUDA_COMPILER "${STRATA_NVCC}" CACHE FILEPATH "CUDA compiler")
    endif()
  endif()
  if(PROJECT_IS_TOP_LEVEL AND (STRATA_BUILD_TESTS OR STRATA_BUILD_EXAMPLES OR STRATA_BUILD_BENCH))
    include(CheckLanguage)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
        set(CMAKE_CUDA_ARCHITECTURES 90)
      endif()
      enable_language(CUDA)
      set(STRATA_CUDA_LANGUAGE ON)
    endif()
  endif()
  # FindCUDAToolkit uses the CUDA compiler when the language is enabled; otherwise point it at
  # the toolkit that holds the nvcc found above.
  if(CMAKE_CUDA_COMPILER AND NOT DEFINED CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDAToolkit_ROOT})
    get_filename_component(_strata_cuda_bin "${CMAKE_CUDA_COMPILER}" DIRECTORY)
    get_filename_component(CUDAToolkit_ROOT "${_strata_cuda_bin}" DIRECTORY)
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    set(STRATA_HAS_CUDA ON)
  elseif(STRATA_ENABLE_CUDA_MODE STREQUAL "ON")
    message(FATAL_ERROR
      "STRATA_ENABLE_CUDA=ON but no CUDA toolkit was found. Install it (nvcc, cudart) and set "
      "CMAKE_CUDA_COMPILER or CUDAToolkit_ROOT, or configure with -DSTRATA_ENABLE_CUDA=OFF.")
  endif()
endif()

# --- liburing (optional; the POSIX thread-pool backend always exists) --------------------------
set(STRATA_HAS_URING OFF)
if(NOT STRATA_ENABLE_URING_MODE STREQUAL "OFF")
  find_package(PkgConfig QUIET)
  if(PKG_CONFIG_FOUND)
    if(NOT TARGET PkgConfig::strata_liburing)
      pkg_check_modules(strata_liburing QUIET IMPORTED_TARGET GLOBAL liburing)
    endif()
    if(TARGET PkgConfig::strata_liburing)
      set(STRATA_HAS_URING ON)
    endif()
  endif()
  if(NOT STRATA_HAS_URING AND STRATA_ENABLE_URING_MODE STREQUAL "ON")
    message(FATAL_ERROR
      "STRATA_ENABLE_URING=ON but liburing was not found through pkg-config.\n"
      "On Debian/Ubuntu: apt-get install liburing-dev pkg-config\n"
      "Or configure with -DSTRATA_ENABLE_URING=OFF to use the POSIX backend only.")
  endif()
endif()

# --- the S3 object-store tier (optional): libcurl's multi interface and libcrypto's HMAC-SHA256 ---
set(STRATA_HAS_S3 OFF)
if(NOT STRATA_ENABLE_S3_MODE STREQUAL "OFF")
  find_package(CURL QUIET)
  find_package(OpenSSL QUIET COMPONENTS Crypto)
  if(CURL_FOUND AND OpenSSL_FOUND AND TARGET CURL::libcurl AND TARGET OpenSSL::Crypto)
    set(STRATA_HAS_S3 ON)
  elseif(STRATA_ENABLE_S3_MODE STREQUAL "ON")
    message(FATAL_ERROR
      "STRATA_ENABLE_S3=ON but libcurl or OpenSSL's libcrypto was not found.\n"
      "On Debian/Ubuntu: apt-get install libcurl4-openssl-dev libssl-dev\n"
      "Or configure with -DSTRATA_ENABLE_S3=OFF to build without the object-store tier.")
  endif()
endif()

# --- Python front (optional) --------------------------------------------------------------------
# strata's own build and the wheel (scikit-build-core sets SKBUILD) build it; a consumer's
# add_subdirectory never does. Without a named Python, the virtual environment that
# tools/install-deps.sh makes in the source tree is used (it sees Debian's torch).
set(STRATA_HAS_PYTHON OFF)
if(NOT STRATA_BUILD_PYTHON_MODE STREQUAL "OFF" AND (PROJECT_IS_TOP_LEVEL OR SKBUILD))
  if(NOT DEFINED Python_EXECUTABLE AND EXISTS "${PROJECT_SOURCE_DIR}/.venv/bin/python")
    set(Python_EXECUTABLE "${PROJECT_SOURCE_DIR}/.venv/bin/python" CACHE FILEPATH "Python of the Python front")
  endif()
  find_package(Python 3.9 COMPONENTS Interpreter Development.Module QUIET)
  if(Python_FOUND)
    execute_process(COMMAND "${Python_EXECUTABLE}" -m nanobind --cmake_dir
                    OUTPUT_VARIABLE _strata_nb_dir OUTPUT_STRIP_TRAILING_WHITESPACE
                    RESULT_VARIABLE _strata_nb_rc ERROR_QUIET)
    if(_strata_nb_rc EQUAL 0)
      find_package(nanobind CONFIG QUIET PATHS "${_strata_nb_dir}" NO_DEFAULT_PATH)
    endif()
  endif()
  if(nanobind_FOUND)
    set(STRATA_HAS_PYTHON ON)
  elseif(STRATA_BUILD_PYTHON_MODE STREQUAL "ON")
    message(FATAL_ERROR "STRATA_BUILD_PYTHON is ON but Python development files or nanobind were not found.\n"
                        "On Debian: tools/install-deps.sh (python3-dev, and a .venv with nanobind from PyPI);\n"
                        "elsewhere: pip install nanobind, and pass -DPython_EXECUTABLE=<that python>.")
  endif()
endif()
