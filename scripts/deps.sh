#!/usr/bin/env bash
# Installs what ferry's build, tests and benchmarks need, and nothing when all is there.
#   Debian packages: cmake ninja-build g++ pkg-config catch2 libbenchmark-dev
#                    liburing-dev libcli11-dev nlohmann-json3-dev fio python3-pip doxygen
#                    gnuplot-nox (ferry-bench's plots) ccache (compiles, carried over between CI runs)
#   PyPI:            conan (for the Conan test_package check), nvidia-cuda-sanitizer-api
#                    (compute-sanitizer 13.0, for the GPU check's dry run; with the CUDA toolkit)
# The CUDA toolkit is not installed here: when /usr/local/cuda (or nvcc on PATH) is
# present, ferry's CUDA parts are built; otherwise they are skipped.
set -euo pipefail

packages=(cmake ninja-build g++ pkg-config catch2 libbenchmark-dev liburing-dev libcli11-dev
          nlohmann-json3-dev fio python3-pip doxygen gnuplot-nox ccache)
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

# compute-sanitizer of CUDA 13.0 (PyPI's nvidia-cuda-sanitizer-api, the same version as
# the GPU machine's): without a GPU it cannot check anything, but the dry run of
# scripts/gpu-check.sh runs it, so a wrong option fails here and not on the GPU machine.
if command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  if ! python3 -c 'import site, os, sys; sys.exit(not any(os.path.exists(os.path.join(p, "nvidia/cu13/bin/compute-sanitizer")) for p in site.getsitepackages()))' 2>/dev/null; then
    echo "deps: installing compute-sanitizer (pip: nvidia-cuda-sanitizer-api 13.0)"
    python3 -m pip install --quiet --disable-pip-version-check "nvidia-cuda-sanitizer-api==13.0.*" 2>/dev/null ||
      python3 -m pip install --quiet --disable-pip-version-check --break-system-packages "nvidia-cuda-sanitizer-api==13.0.*"
  fi
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
