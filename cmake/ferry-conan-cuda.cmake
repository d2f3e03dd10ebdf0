# Conan build module of ferry's `with_cuda` option (conanfile.py): the CUDA toolkit is a
# system dependency that Conan does not package, so it is found here, with CMake's
# FindCUDAToolkit and CCCL's own config, and linked into ferry::ferry.
include("${CMAKE_CURRENT_LIST_DIR}/ferryCudaDialect.cmake")
find_package(CUDAToolkit REQUIRED)
find_package(CCCL CONFIG REQUIRED HINTS "${CUDAToolkit_LIBRARY_DIR}/cmake")
if(TARGET ferry::ferry)
  target_link_libraries(ferry::ferry INTERFACE CUDA::cudart CCCL::CCCL)
endif()
