# cmake -DCTEST=<ctest> -DBUILD_DIR=<build folder> -P timing_env_check.cmake
#
# Reads CTest's own description of the timing-mode tests (ctest --show-only=json-v1) and
# fails unless each mode has tests, each of them labelled "timing" and run with
# FERRY_CPU_TIMING=<its mode>. Until this check, a list-valued LABELS property made
# Catch.cmake drop the ENVIRONMENT, and the "instant" and "slow" runs ran the default
# timing without anyone seeing it.
cmake_minimum_required(VERSION 3.20)
foreach(mode instant slow)
  execute_process(COMMAND "${CTEST}" --show-only=json-v1 -R "^host\\.${mode}\\."
                  WORKING_DIRECTORY "${BUILD_DIR}" OUTPUT_VARIABLE json RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "ctest --show-only=json-v1 failed (${rc}) in ${BUILD_DIR}")
  endif()
  string(JSON tests GET "${json}" tests)
  string(JSON count LENGTH "${tests}")
  if(count EQUAL 0)
    message(FATAL_ERROR "no host.${mode}.* tests: the ${mode} timing mode runs nothing")
  endif()
  # Count the ENVIRONMENT and LABELS properties (not names, which may mention the variable).
  set(ws "[ \t\r\n]*")
  string(REGEX MATCHALL "\"name\"${ws}:${ws}\"ENVIRONMENT\"${ws},${ws}\"value\"${ws}:${ws}\\[${ws}\"FERRY_CPU_TIMING=${mode}\"${ws}\\]"
         with_env "${json}")
  list(LENGTH with_env env_count)
  string(REGEX MATCHALL "\"name\"${ws}:${ws}\"LABELS\"${ws},${ws}\"value\"${ws}:${ws}\\[${ws}\"timing\"${ws}\\]"
         with_label "${json}")
  list(LENGTH with_label label_count)
  if(NOT env_count EQUAL count OR NOT label_count EQUAL count)
    message(FATAL_ERROR "${mode}: ${count} tests, ${env_count} with FERRY_CPU_TIMING=${mode}, "
                        "${label_count} labelled timing (each must have both)")
  endif()
  message(STATUS "${mode}: ${count} tests, each labelled timing with FERRY_CPU_TIMING=${mode}")
endforeach()
