#!/usr/bin/env bash
# Installs what ferry's build, tests and benchmarks need, and nothing when all is there.
#   Debian packages: cmake ninja-build g++ pkg-config catch2 libbenchmark-dev
#                    liburing-dev libcli11-dev nlohmann-json3-dev fio python3-pip doxygen
#                    gnuplot-nox (ferry-bench's plots)
#   PyPI:            conan (for the Conan test_package check)
# The CUDA toolkit is not installed here: when /usr/local/cuda (or nvcc on PATH) is
# present, ferry's CUDA parts are built; otherwise they are skipped.
set -euo pipefail

packages=(cmake ninja-build g++ pkg-config catch2 libbenchmark-dev liburing-dev libcli11-dev
          nlohmann-json3-dev fio python3-pip doxygen gnuplot-nox)
missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# python3-pip is only needed when pip itself is missing (e.g. a pyenv python has its own).
if python3 -m pip --version >/dev/null 2>&1; then
  missing=("${missing[@]/python3-pip/}")
fi
missing=($(printf '%s\n' "${missing[@]}" | sed '/^$/d'))

sudo=""
if [[ $(id -u) -ne 0 ]]; then
  sudo="sudo"
fi
if ((${#missing[@]} > 0)); then
  echo "deps: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v conan >/dev/null 2>&1; then
  echo "deps: installing conan (pip)"
  python3 -m pip install --quiet --disable-pip-version-check conan 2>/dev/null ||
    python3 -m pip install --quiet --disable-pip-version-check --break-system-packages conan
fi

# CMake 3.25 or newer is required (CMakePresets v6, workflow presets).
version=$(cmake --version | sed -n 's/^cmake version \([0-9]*\.[0-9]*\).*/\1/p')
if [[ $(printf '%s\n3.25\n' "$version" | sort -V | head -n1) != 3.25 ]]; then
  echo "deps: cmake $version is older than 3.25" >&2
  exit 1
fi
echo "deps: all present (cmake $version, $(g++ --version | head -n1), conan $(conan --version | awk '{print $3}'))"
