# CMake before 3.26 does not know nvcc's C++20 flag, so a CUDA target that needs
# C++20 (every target linking ferry::ferry: it requires cxx_std_20, which CMake also
# applies to CUDA sources) fails to generate with
#   "requires the language dialect CUDA20 ... CMake does not know the flags".
# nvcc 12 and newer accept -std=c++20; tell CMake so. Included by ferry's own build
# and by the installed ferryConfig.cmake, in the scope of the project enabling CUDA.
if(CMAKE_CUDA_COMPILER_LOADED AND CMAKE_CUDA_COMPILER_ID STREQUAL "NVIDIA"
   AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0
   AND NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  if(NOT "cuda_std_20" IN_LIST CMAKE_CUDA_COMPILE_FEATURES)
    list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
  endif()
endif()
