# Install rules and the CMake package, so that find_package(strata CONFIG) works.
include_guard(GLOBAL)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

if(NOT STRATA_INSTALL)
  return()
endif()

set(STRATA_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/strata" CACHE STRING
    "Where strata's CMake package files are installed, relative to the prefix")

install(TARGETS strata EXPORT strataTargets)
install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/strata" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
install(EXPORT strataTargets NAMESPACE strata:: DESTINATION "${STRATA_INSTALL_CMAKEDIR}")

configure_package_config_file(
  "${PROJECT_SOURCE_DIR}/cmake/strataConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/strataConfig.cmake"
  INSTALL_DESTINATION "${STRATA_INSTALL_CMAKEDIR}")
write_basic_package_version_file(
  "${PROJECT_BINARY_DIR}/strataConfigVersion.cmake"
  VERSION "${PROJECT_VERSION}"
  COMPATIBILITY SameMinorVersion)
install(FILES
  "${PROJECT_BINARY_DIR}/strataConfig.cmake"
  "${PROJECT_BINARY_DIR}/strataConfigVersion.cmake"
  DESTINATION "${STRATA_INSTALL_CMAKEDIR}")
install(FILES "${PROJECT_SOURCE_DIR}/LICENSE" DESTINATION "${CMAKE_INSTALL_DATADIR}/doc/strata")
