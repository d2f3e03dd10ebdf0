#!/usr/bin/env bash
# The Python environment of ferry's PyTorch package (python/): a virtual environment with
# torch, numpy and pytest from PyPI, made once per machine and kept (PyPI's torch brings its
# CUDA libraries, about 3 GB; it runs on CPU tensors without a GPU), and ferry-torch built
# from this checkout on every call into the checkout's build/python-site (`pip install
# --target`, with the build's requirements from the environment: nanobind,
# scikit-build-core, cmake and ninja from PyPI), not into the shared environment, so that
# two checkouts never test each other's package.
#   scripts/python-env.sh        prints the environment's python, then the folder to put on
#                                PYTHONPATH, on its last two lines
# Environment: FERRY_PYTHON_ENV, the environment's folder (default
# ~/.cache/ferry-python/venv, beside ccache's cache, so that CI runs reuse it).
set -euo pipefail
cd "$(dirname "$0")/.."

env_dir=${FERRY_PYTHON_ENV:-$HOME/.cache/ferry-python/venv}
py="$env_dir/bin/python"
if [[ ! -x $py ]]; then
  echo "python-env: making $env_dir" >&2
  mkdir -p "$(dirname "$env_dir")"
  python3 -m venv "$env_dir" >&2 || {
    # Debian's python3 without ensurepip: the venv package, then again.
    sudo=""; [[ $(id -u) -ne 0 ]] && sudo="sudo"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
    rm -rf "$env_dir"
    python3 -m venv "$env_dir" >&2
  }
fi
if ! "$py" -c 'import torch, numpy, pytest' >/dev/null 2>&1; then
  echo "python-env: installing torch, numpy and pytest from PyPI into $env_dir (once per machine)" >&2
  "$py" -m pip install -q --upgrade pip >&2
  "$py" -m pip install -q torch numpy pytest >&2
fi
# The build's own requirements (pyproject.toml's [build-system], and the cmake >= 3.26 and
# ninja scikit-build-core asks for where the system's are older) live in the environment
# too, and the build uses them there (--no-build-isolation) rather than in a new folder of
# pip's each time: their headers then have one path, so that ccache (when installed;
# FERRY_USE_CCACHE=0 turns it off) finds the last build's objects, as it does for the
# C++ builds (the extension took about 2.5 minutes of each CI run before).
# (pip asks PyPI only for what the environment does not satisfy, an older nanobind included.)
"$py" -m pip install -q "nanobind>=2.4" "scikit-build-core>=0.10" "cmake>=3.26" ninja >&2
launch=()
if [[ "${FERRY_USE_CCACHE:-1}" != 0 ]] && command -v ccache >/dev/null 2>&1; then
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(pwd)} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
  launch=(-C cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache -C cmake.define.CMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
site="$(pwd)/build/python-site"
echo "python-env: building ferry-torch from python/ into $site" >&2
rm -rf "$site"
# A build folder of this script's own (build/python-build, not pyproject.toml's
# python/build, which a user's build-isolated `pip install ./python` configures with
# another cmake): kept between calls, so a rebuild compiles only what changed.
"$py" -m pip install -q --no-deps --no-build-isolation --target "$site" -C build-dir="$(pwd)/build/python-build" \
  "${launch[@]}" ./python >&2
PYTHONPATH="$site" "$py" -c 'import ferry, ferry.torch, torch; print("python-env: ferry-torch", ferry.__version__, "from", ferry.__file__, "with torch", torch.__version__, "(CUDA build:", ferry.has_cuda, ")")' >&2
echo "$py"
echo "$site"
