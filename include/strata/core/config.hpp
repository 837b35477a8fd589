#pragma once
/// Build-time feature switches. The CMake target defines them; a build that includes strata
/// without CMake gets the portable defaults (no CUDA, no io_uring).

#ifndef STRATA_HAS_CUDA
#define STRATA_HAS_CUDA 0
#endif

#ifndef STRATA_HAS_URING
#define STRATA_HAS_URING 0
#endif

#if defined(__CUDACC__)
#define STRATA_HOST_DEVICE __host__ __device__
#else
#define STRATA_HOST_DEVICE
#endif
