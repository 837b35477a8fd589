#pragma once
/// strata's version. CMake reads the three numbers from here, so this is the single source of truth.

#define STRATA_VERSION_MAJOR 0
#define STRATA_VERSION_MINOR 1
#define STRATA_VERSION_PATCH 0

#define STRATA_DETAIL_STR(x) #x
#define STRATA_DETAIL_XSTR(x) STRATA_DETAIL_STR(x)

namespace strata {
/// The version as "major.minor.patch".
inline constexpr const char* version_string = STRATA_DETAIL_XSTR(STRATA_VERSION_MAJOR) "." STRATA_DETAIL_XSTR(
    STRATA_VERSION_MINOR) "." STRATA_DETAIL_XSTR(STRATA_VERSION_PATCH);
}  // namespace strata
