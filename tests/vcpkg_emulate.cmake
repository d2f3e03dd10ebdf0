# Runs ferry's vcpkg port (packaging/vcpkg/ports/ferry/portfile.cmake) with vcpkg's
# helper functions emulated, since vcpkg itself is not available on ferry's build
# machines. The port's own logic — source location, feature mapping, the configure
# options, the config path, usage and copyright — runs for real.
#   cmake -DSOURCE_DIR=... -DWORK_DIR=... -DCMAKE_EXE=... -DGENERATOR=... -DFEATURES="core;uring"
#         -P vcpkg_emulate.cmake
cmake_minimum_required(VERSION 3.25)
set(CURRENT_PACKAGES_DIR "${WORK_DIR}/packages/ferry_x64-linux")
set(PORT ferry)

function(vcpkg_cmake_configure)
  cmake_parse_arguments(PARSE_ARGV 0 A "" "SOURCE_PATH" "OPTIONS")
  execute_process(COMMAND "${CMAKE_EXE}" -S "${A_SOURCE_PATH}" -B "${WORK_DIR}/build" -G "${GENERATOR}"
                          "-DCMAKE_INSTALL_PREFIX=${CURRENT_PACKAGES_DIR}" -DCMAKE_BUILD_TYPE=Release ${A_OPTIONS}
                  RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "vcpkg_cmake_configure failed (${rc})")
  endif()
endfunction()

function(vcpkg_cmake_install)
  execute_process(COMMAND "${CMAKE_EXE}" --build "${WORK_DIR}/build" RESULT_VARIABLE rc1)
  execute_process(COMMAND "${CMAKE_EXE}" --install "${WORK_DIR}/build" RESULT_VARIABLE rc2)
  if(rc1 OR rc2)
    message(FATAL_ERROR "vcpkg_cmake_install failed (${rc1}, ${rc2})")
  endif()
endfunction()

function(vcpkg_cmake_config_fixup)
  cmake_parse_arguments(PARSE_ARGV 0 A "" "PACKAGE_NAME;CONFIG_PATH" "")
  # vcpkg moves CONFIG_PATH to share/<PACKAGE_NAME>; the port installs it there already.
  if(NOT A_CONFIG_PATH STREQUAL "share/${A_PACKAGE_NAME}")
    message(FATAL_ERROR "the port's CONFIG_PATH '${A_CONFIG_PATH}' is not share/${A_PACKAGE_NAME}")
  endif()
  if(NOT EXISTS "${CURRENT_PACKAGES_DIR}/${A_CONFIG_PATH}/${A_PACKAGE_NAME}Config.cmake")
    message(FATAL_ERROR "no ${A_PACKAGE_NAME}Config.cmake in ${A_CONFIG_PATH}")
  endif()
endfunction()

function(vcpkg_install_copyright)
  cmake_parse_arguments(PARSE_ARGV 0 A "" "" "FILE_LIST")
  file(READ ${A_FILE_LIST} text)
  file(WRITE "${CURRENT_PACKAGES_DIR}/share/${PORT}/copyright" "${text}")
endfunction()

include("${SOURCE_DIR}/packaging/vcpkg/ports/ferry/portfile.cmake")
