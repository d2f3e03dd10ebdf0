"""Conan 2 recipe for ferry, a header-only C++20 library.

    conan create . --test-folder=packaging/conan/test_package

The version is read from include/ferry/core/version.hpp. Options add the optional parts
to the consumer's build: with_cuda (the CUDA toolkit must be installed on the system;
Conan does not package it) and with_uring (the system's liburing).
"""
import os
import re

from conan import ConanFile
from conan.tools.files import copy
from conan.tools.layout import basic_layout


def read_version(folder):
    with open(os.path.join(folder, "include", "ferry", "core", "version.hpp"), encoding="utf-8") as f:
        text = f.read()
    parts = [re.search(rf"#define FERRY_VERSION_{p} (\d+)", text).group(1) for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts)


class FerryConan(ConanFile):
    name = "ferry"
    description = ("Header-only C++20 offloading primitives for GPU programs whose working set "
                   "outgrows GPU memory: HBM <-> pinned DRAM <-> NVMe, overlapped with compute.")
    license = "Apache-2.0"
    topics = ("cuda", "offload", "io_uring", "nvme", "gpu", "header-only")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    options = {"with_cuda": [True, False], "with_uring": [True, False]}
    default_options = {"with_cuda": False, "with_uring": False}
    exports_sources = "include/*", "LICENSE", "cmake/ferryCudaDialect.cmake", "cmake/ferry-conan-cuda.cmake"
    no_copy_source = True

    def set_version(self):
        self.version = read_version(self.recipe_folder)

    def layout(self):
        basic_layout(self, src_folder=".")

    def package_id(self):
        # The headers do not depend on settings or options: one package for all.
        self.info.clear()

    def validate(self):
        from conan.tools.build import check_min_cppstd
        if self.settings.get_safe("compiler.cppstd"):
            check_min_cppstd(self, 20)

    def package(self):
        copy(self, "LICENSE", self.source_folder, os.path.join(self.package_folder, "licenses"))
        copy(self, "*.hpp", os.path.join(self.source_folder, "include"), os.path.join(self.package_folder, "include"))
        copy(self, "*.cuh", os.path.join(self.source_folder, "include"), os.path.join(self.package_folder, "include"))
        for module in ("ferryCudaDialect.cmake", "ferry-conan-cuda.cmake"):
            copy(self, module, os.path.join(self.source_folder, "cmake"),
                 os.path.join(self.package_folder, "lib", "cmake", "ferry"))

    def package_info(self):
        self.cpp_info.set_property("cmake_file_name", "ferry")
        self.cpp_info.set_property("cmake_target_name", "ferry::ferry")
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        self.cpp_info.system_libs = ["pthread"]
        self.cpp_info.defines = [
            f"FERRY_HAS_CUDA={1 if self.options.with_cuda else 0}",
            f"FERRY_HAS_URING={1 if self.options.with_uring else 0}",
        ]
        if self.options.with_uring:
            self.cpp_info.system_libs.append("uring")
        # CMake before 3.26 lacks nvcc's C++20 flag; with CUDA, also find the toolkit
        # (a system dependency Conan does not package) and link it into ferry::ferry.
        module = "ferry-conan-cuda.cmake" if self.options.with_cuda else "ferryCudaDialect.cmake"
        self.cpp_info.builddirs = [os.path.join("lib", "cmake", "ferry")]
        self.cpp_info.set_property("cmake_build_modules", [os.path.join("lib", "cmake", "ferry", module)])
