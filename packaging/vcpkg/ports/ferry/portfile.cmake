# vcpkg port of ferry (header-only). Use it as an overlay port:
#   vcpkg install ferry[uring,cuda] --overlay-ports=<ferry>/packaging/vcpkg/ports
# To package a release instead of the local checkout, replace the source step with
# vcpkg_from_git / vcpkg_from_github pointing at the release tag.
set(VCPKG_BUILD_TYPE release)  # header-only: one configuration is enough

# The port lives in <ferry>/packaging/vcpkg/ports/ferry: the source tree is four levels up.
get_filename_component(SOURCE_PATH "${CMAKE_CURRENT_LIST_DIR}/../../../.." ABSOLUTE)
if(NOT EXISTS "${SOURCE_PATH}/include/ferry/ferry.hpp")
  message(FATAL_ERROR "ferry's sources were not found at ${SOURCE_PATH}")
endif()

# ON/OFF from the features. Installing never needs nvcc (the headers are copied); the
# choice sets what `find_package(ferry)` turns on when no components are named.
set(FERRY_CUDA OFF)
set(FERRY_URING OFF)
if("cuda" IN_LIST FEATURES)
  set(FERRY_CUDA ON)
endif()
if("uring" IN_LIST FEATURES)
  set(FERRY_URING ON)
endif()

vcpkg_cmake_configure(
  SOURCE_PATH "${SOURCE_PATH}"
  OPTIONS
    -DFERRY_BUILD_TESTS=OFF
    -DFERRY_BUILD_BENCHMARKS=OFF
    -DFERRY_BUILD_EXAMPLES=OFF
    -DFERRY_ENABLE_CUDA=${FERRY_CUDA}
    -DFERRY_ENABLE_URING=${FERRY_URING}
    -DFERRY_INSTALL_CMAKEDIR=share/ferry)
vcpkg_cmake_install()
vcpkg_cmake_config_fixup(PACKAGE_NAME ferry CONFIG_PATH share/ferry)

file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}/debug" "${CURRENT_PACKAGES_DIR}/lib")
file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
