#!/usr/bin/env bash
# Checks of ferry as a package, run by CTest (tests/CMakeLists.txt) with one step:
#   install        configure a fresh ferry (CUDA off, nvcc off PATH), install it into a prefix
#   consumer-host  build and run tests/consumer against that prefix, COMPONENTS core
#   consumer-cuda  the same with COMPONENTS cuda and a .cu file including ferry/ferry.cuh
#   versions       version.hpp, CMake, the vcpkg port and the Conan recipe agree
#   vcpkg          the vcpkg port's portfile.cmake run with vcpkg's helpers emulated,
#                  then a consumer built against the package it made
#   conan          `conan create` with packaging/conan/test_package (exit 77 = skipped
#                  when conan is not installed)
# Environment (set by CTest): FERRY_SOURCE_DIR, FERRY_WORK_DIR, FERRY_GENERATOR,
# FERRY_CMAKE, FERRY_CXX_COMPILER, FERRY_CUDA_COMPILER, FERRY_CUDA_ARCHITECTURES,
# FERRY_ENABLE_URING.
set -euo pipefail

step=${1:?usage: package_check.sh install|consumer-host|consumer-cuda|versions|vcpkg|conan}
src=${FERRY_SOURCE_DIR:?}
work=${FERRY_WORK_DIR:?}
cmake=${FERRY_CMAKE:-cmake}
generator=${FERRY_GENERATOR:-Ninja}
prefix="$work/prefix"

fail() { echo "package_check $step: FAILED: $*" >&2; exit 1; }

version_from_header() {
  local h="$src/include/ferry/core/version.hpp" major minor patch
  major=$(sed -n 's/^#define FERRY_VERSION_MAJOR \([0-9]*\)$/\1/p' "$h")
  minor=$(sed -n 's/^#define FERRY_VERSION_MINOR \([0-9]*\)$/\1/p' "$h")
  patch=$(sed -n 's/^#define FERRY_VERSION_PATCH \([0-9]*\)$/\1/p' "$h")
  [[ -n $major && -n $minor && -n $patch ]] || fail "cannot read the version from $h"
  echo "$major.$minor.$patch"
}

case "$step" in
install)
  rm -rf "$work/build-install" "$prefix"
  mkdir -p "$work"
  # No nvcc on PATH and CUDA off: installing ferry must not need a CUDA compiler.
  env -u CUDACXX -u CUDA_PATH PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    "$cmake" -S "$src" -B "$work/build-install" -G "$generator" \
      -DCMAKE_CXX_COMPILER="$FERRY_CXX_COMPILER" \
      -DCMAKE_INSTALL_PREFIX="$prefix" \
      -DFERRY_ENABLE_CUDA=OFF -DFERRY_ENABLE_URING="${FERRY_ENABLE_URING:-AUTO}" \
      -DFERRY_BUILD_TESTS=OFF -DFERRY_BUILD_BENCHMARKS=OFF -DFERRY_BUILD_EXAMPLES=OFF
  "$cmake" --build "$work/build-install"
  "$cmake" --install "$work/build-install"
  for f in include/ferry/ferry.hpp include/ferry/ferry.cuh include/ferry/cuda/stream.hpp \
           share/ferry/cmake/ferryConfig.cmake share/ferry/cmake/ferryConfigVersion.cmake \
           share/ferry/cmake/ferryTargets.cmake share/doc/ferry/LICENSE; do
    [[ -f "$prefix/$f" ]] || fail "the install lacks $f"
  done
  # Version file semantics, exercised: SameMajorVersion, and ARCH_INDEPENDENT (a
  # 32-bit project may use the header-only package installed by a 64-bit build).
  version_probe="$work/version_probe.cmake"
  cat >"$version_probe" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)  # policies as in a project (CMP0012: if(TRUE))
set(CMAKE_SIZEOF_VOID_P 4)
set(PACKAGE_FIND_VERSION_COUNT 2)
foreach(case IN ITEMS "0.1;TRUE" "0.0;TRUE" "1.0;FALSE" "0.2;FALSE")
  list(GET case 0 want)
  list(GET case 1 expected)
  unset(PACKAGE_VERSION_COMPATIBLE)
  unset(PACKAGE_VERSION_UNSUITABLE)
  set(PACKAGE_FIND_VERSION ${want})
  string(REPLACE "." ";" parts ${want})
  list(GET parts 0 PACKAGE_FIND_VERSION_MAJOR)
  list(GET parts 1 PACKAGE_FIND_VERSION_MINOR)
  include(${VERSION_FILE})
  if(PACKAGE_VERSION_UNSUITABLE)
    message(FATAL_ERROR "the package is unsuitable for a 32-bit project (ARCH_INDEPENDENT missing)")
  endif()
  if(NOT "${PACKAGE_VERSION_COMPATIBLE}" STREQUAL "${expected}")
    message(FATAL_ERROR "asking for ${want}: compatible is '${PACKAGE_VERSION_COMPATIBLE}', expected ${expected}")
  endif()
endforeach()
message(STATUS "ferryConfigVersion.cmake: SameMajorVersion and ARCH_INDEPENDENT hold")
CMAKE
  "$cmake" -DVERSION_FILE="$prefix/share/ferry/cmake/ferryConfigVersion.cmake" -P "$version_probe"
  echo "package_check install: ferry installed into $prefix"
  ;;
consumer-host | consumer-cuda)
  [[ -f "$prefix/share/ferry/cmake/ferryConfig.cmake" ]] || fail "run the install step first"
  with_cuda=OFF
  extra=()
  if [[ $step == consumer-cuda ]]; then
    with_cuda=ON
    extra+=(-DCMAKE_CUDA_COMPILER="${FERRY_CUDA_COMPILER:?no CUDA compiler}")
    extra+=(-DCMAKE_CUDA_ARCHITECTURES="${FERRY_CUDA_ARCHITECTURES:-90}")
  fi
  build="$work/$step"
  rm -rf "$build"
  "$cmake" -S "$src/tests/consumer" -B "$build" -G "$generator" \
    -DCMAKE_CXX_COMPILER="$FERRY_CXX_COMPILER" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCONSUMER_WITH_CUDA=$with_cuda "${extra[@]}"
  "$cmake" --build "$build"
  out=$("$build/ferry_consumer")
  echo "$out"
  grep -q "^ferry $(version_from_header) " <<<"$out" || fail "the consumer did not report ferry's version"
  if [[ $with_cuda == ON ]]; then
    grep -q "cuda=1" <<<"$out" || fail "the CUDA consumer does not see FERRY_HAS_CUDA=1"
  else
    grep -q "cuda=0" <<<"$out" || fail "the host-only consumer sees FERRY_HAS_CUDA=1"
  fi
  ;;
versions)
  v=$(version_from_header)
  cmake_v=$(sed -n 's/^  VERSION \([0-9.]*\)$/\1/p' "$src/CMakeLists.txt")
  vcpkg_v=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["version"])' \
    "$src/packaging/vcpkg/ports/ferry/vcpkg.json")
  echo "version.hpp $v, CMakeLists.txt $cmake_v, vcpkg.json $vcpkg_v (conanfile.py reads version.hpp)"
  [[ $v == "$cmake_v" && $v == "$vcpkg_v" ]] || fail "versions disagree"
  grep -q 'include/ferry/core/version.hpp' "$src/conanfile.py" || fail "conanfile.py does not read version.hpp"
  grep -q "version_string = \"$v\"" "$src/include/ferry/core/version.hpp" || fail "ferry::version_string is not $v"
  ;;
vcpkg)
  # vcpkg is not on this machine (it is not a Debian or PyPI package), so the port is
  # run with its vcpkg helpers emulated: the real portfile.cmake, the real configure
  # and install of ferry, then a consumer built against the resulting package folder.
  pkgdir="$work/vcpkg/packages/ferry_x64-linux"
  rm -rf "$work/vcpkg"
  mkdir -p "$work/vcpkg"
  "$cmake" -DSOURCE_DIR="$src" -DWORK_DIR="$work/vcpkg" -DCMAKE_EXE="$cmake" -DGENERATOR="$generator" \
    -DFEATURES="core;uring" -P "$src/tests/vcpkg_emulate.cmake"
  for f in include/ferry/ferry.hpp share/ferry/ferryConfig.cmake share/ferry/ferryConfigVersion.cmake \
           share/ferry/usage share/ferry/copyright; do
    [[ -f "$pkgdir/$f" ]] || fail "the vcpkg package lacks $f"
  done
  [[ ! -e "$pkgdir/lib" && ! -e "$pkgdir/debug" ]] || fail "a header-only package must not have lib/ or debug/"
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert set(d["features"]) == {"cuda", "uring"}' \
    "$src/packaging/vcpkg/ports/ferry/vcpkg.json" || fail "vcpkg.json must have the features cuda and uring"
  # The port was installed with the uring feature: a plain find_package(ferry) turns it on.
  "$cmake" -S "$src/tests/consumer" -B "$work/vcpkg/consumer" -G "$generator" \
    -DCMAKE_CXX_COMPILER="$FERRY_CXX_COMPILER" -DCMAKE_PREFIX_PATH="$pkgdir" -DCONSUMER_WITH_CUDA=OFF \
    -DCONSUMER_COMPONENTS=default
  "$cmake" --build "$work/vcpkg/consumer"
  "$work/vcpkg/consumer/ferry_consumer" | tee "$work/vcpkg/consumer.out"
  if pkg-config --exists liburing 2>/dev/null; then
    grep -q "uring=1" "$work/vcpkg/consumer.out" || fail "find_package(ferry) did not turn on the uring feature"
  fi
  ;;
conan)
  if ! command -v conan >/dev/null 2>&1; then
    echo "conan is not installed (pip install conan); skipping"
    exit 77
  fi
  export CONAN_HOME="$work/conan-home"
  rm -rf "$CONAN_HOME"
  mkdir -p "$CONAN_HOME"
  conan profile detect --exist-ok >/dev/null
  # No remote is needed: the recipe has no requirements.
  conan remote disable '*' >/dev/null 2>&1 || true
  log="$work/conan-create.log"
  cd "$src"
  conan create "$src" --test-folder=packaging/conan/test_package -s build_type=Release -s compiler.cppstd=20 \
    -c tools.cmake.cmaketoolchain:generator="$generator" 2>&1 | tee "$log"
  v=$(version_from_header)
  grep -q "ferry/$v" "$log" || fail "conan did not create ferry/$v"
  grep -q "^ferry $v cuda=0 uring=0" "$log" || fail "the Conan test_package did not run (default options)"
  # The options: with_uring links the system liburing; with_cuda finds the system CUDA
  # toolkit through the package's CMake build module.
  opts=(-o "ferry/*:with_uring=True")
  expect="uring=1"
  if [[ -n "${FERRY_CUDA_COMPILER:-}" ]]; then
    opts+=(-o "ferry/*:with_cuda=True")
    expect="cuda=1 uring=1"
  fi
  conan test packaging/conan/test_package "ferry/$v" -s build_type=Release -s compiler.cppstd=20 "${opts[@]}" \
    -c tools.cmake.cmaketoolchain:generator="$generator" 2>&1 | tee "$log.options"
  grep -q "^ferry $v .*$expect" "$log.options" || fail "the Conan options did not reach the consumer ($expect)"
  ;;
*)
  fail "unknown step"
  ;;
esac
