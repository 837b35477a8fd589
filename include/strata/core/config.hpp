#pragma once
/// Build-time feature switches. The CMake target defines them; a build that includes strata
/// without CMake gets the portable defaults (no CUDA, no io_uring, no S3 tier).

#ifndef STRATA_HAS_CUDA
#define STRATA_HAS_CUDA 0
#endif

#ifndef STRATA_HAS_URING
#define STRATA_HAS_URING 0
#endif

#ifndef STRATA_HAS_S3
#define STRATA_HAS_S3 0
#endif

/// 1: the most common instantiations (the AdamW CPU kernels, offloaded_adamw's step on
/// host_executor<>) are declared `extern template`, so a translation unit that uses them does not
/// compile them again; one translation unit of the program must then define them (strata's own
/// tests, examples and benchmarks link cmake/strata_instances.cpp). 0 (the default): header-only.
#ifndef STRATA_EXTERN_TEMPLATES
#define STRATA_EXTERN_TEMPLATES 0
#endif

#if defined(__CUDACC__)
#define STRATA_HOST_DEVICE __host__ __device__
#else
#define STRATA_HOST_DEVICE
#endif
