# CMake before 3.26 does not know nvcc's C++20 flag, so a CUDA target that needs
# C++20 (every target linking ferry::ferry: it requires cxx_std_20, which CMake also
# applies to CUDA sources) fails to generate with
#   "requires the language dialect CUDA20 ... CMake does not know the flags".
# nvcc 12 and newer (and clang in CUDA mode) take -std=c++20; tell CMake so. Included by
# ferry's own build and by the installed ferryConfig.cmake, in the scope of the calling
# project. It works whether CUDA is enabled before or after find_package(ferry), since
# CMake's own CUDA setup before 3.26 never sets these variables.
if(CMAKE_VERSION VERSION_LESS 3.26 AND NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
