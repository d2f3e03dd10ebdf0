# How ferry finds its optional parts (CUDA, liburing) and turns them into
# compile definitions and link libraries. Used by the build tree; the installed
# package does the same in ferryConfig.cmake for the components a consumer asks for.

# ferry_resolve_cuda(): sets, in the caller's scope,
#   FERRY_HAS_CUDA           ON when the CUDA toolkit's runtime and CCCL are found
#   FERRY_HAS_CUDA_COMPILER  ON when, in addition, nvcc is found and the CUDA language
#                            is enabled (needed only for ferry's own GPU tests,
#                            benchmarks and the .cuh header checks)
# AUTO turns CUDA on when the toolkit is found; ON fails without it. Installing needs
# only the toolkit's libraries, never nvcc: the compiler is looked for only when
# tests, benchmarks or examples are built.
macro(ferry_resolve_cuda)
  set(FERRY_HAS_CUDA OFF)
  set(FERRY_HAS_CUDA_COMPILER OFF)
  if(NOT FERRY_ENABLE_CUDA STREQUAL "OFF")
    find_package(CUDAToolkit QUIET)
    if(CUDAToolkit_FOUND)
      find_package(CCCL CONFIG QUIET HINTS "${CUDAToolkit_LIBRARY_DIR}/cmake")
    endif()
    if(CUDAToolkit_FOUND AND TARGET CCCL::CCCL)
      set(FERRY_HAS_CUDA ON)
    elseif(FERRY_ENABLE_CUDA STREQUAL "ON")
      message(FATAL_ERROR "FERRY_ENABLE_CUDA=ON but the CUDA toolkit (runtime and CCCL) was not found "
                          "(set CUDAToolkit_ROOT, or put nvcc on PATH)")
    endif()
    if(FERRY_HAS_CUDA AND (FERRY_BUILD_TESTS OR FERRY_BUILD_BENCHMARKS OR FERRY_BUILD_EXAMPLES))
      include(CheckLanguage)
      check_language(CUDA)
      if(CMAKE_CUDA_COMPILER)
        if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED ENV{CUDAARCHS})
          # ferry's own tests and tools target Hopper (H100/H200) unless told otherwise.
          set(CMAKE_CUDA_ARCHITECTURES 90)
        endif()
        enable_language(CUDA)
        include(ferryCudaDialect)
        set(FERRY_HAS_CUDA_COMPILER ON)
      elseif(FERRY_ENABLE_CUDA STREQUAL "ON")
        message(FATAL_ERROR "FERRY_ENABLE_CUDA=ON with tests, benchmarks or examples needs nvcc, which was "
                            "not found (set CMAKE_CUDA_COMPILER, or turn those off)")
      else()
        message(STATUS "ferry: no CUDA compiler; GPU tests and kernels are not built")
      endif()
    endif()
  endif()
endmacro()

# ferry_resolve_uring(): sets FERRY_HAS_URING to ON or OFF in the caller's scope.
macro(ferry_resolve_uring)
  set(FERRY_HAS_URING OFF)
  if(NOT FERRY_ENABLE_URING STREQUAL "OFF")
    find_package(PkgConfig QUIET)
    if(PkgConfig_FOUND)
      pkg_check_modules(FERRY_LIBURING QUIET IMPORTED_TARGET GLOBAL liburing)
    endif()
    if(TARGET PkgConfig::FERRY_LIBURING)
      set(FERRY_HAS_URING ON)
    elseif(FERRY_ENABLE_URING STREQUAL "ON")
      message(FATAL_ERROR "FERRY_ENABLE_URING=ON but liburing was not found through "
                          "pkg-config (install liburing-dev, or set PKG_CONFIG_PATH)")
    endif()
  endif()
endmacro()

# ferry_link_features(<target>): in the build tree only, adds the definitions and
# libraries of the enabled features. The exported target carries none of them; the
# installed ferryConfig.cmake adds them per requested component.
function(ferry_link_features target)
  if(FERRY_HAS_CUDA)
    target_compile_definitions(${target} INTERFACE $<BUILD_INTERFACE:FERRY_HAS_CUDA=1>)
    if(FERRY_STATIC_DEPENDENCIES)
      target_link_libraries(${target} INTERFACE $<BUILD_INTERFACE:CUDA::cudart_static> $<BUILD_INTERFACE:CCCL::CCCL>)
    else()
      target_link_libraries(${target} INTERFACE $<BUILD_INTERFACE:CUDA::cudart> $<BUILD_INTERFACE:CCCL::CCCL>)
    endif()
  else()
    target_compile_definitions(${target} INTERFACE $<BUILD_INTERFACE:FERRY_HAS_CUDA=0>)
  endif()
  if(FERRY_HAS_URING)
    target_compile_definitions(${target} INTERFACE $<BUILD_INTERFACE:FERRY_HAS_URING=1>)
    if(FERRY_STATIC_DEPENDENCIES)
      # liburing's archive, from the folder pkg-config names (Debian's liburing-dev has it).
      find_library(FERRY_LIBURING_ARCHIVE NAMES liburing.a HINTS ${FERRY_LIBURING_LIBRARY_DIRS} NO_CACHE)
      if(NOT FERRY_LIBURING_ARCHIVE)
        message(FATAL_ERROR "FERRY_STATIC_DEPENDENCIES=ON needs liburing.a (looked in ${FERRY_LIBURING_LIBRARY_DIRS})")
      endif()
      target_include_directories(${target} SYSTEM INTERFACE $<BUILD_INTERFACE:${FERRY_LIBURING_INCLUDE_DIRS}>)
      target_link_libraries(${target} INTERFACE $<BUILD_INTERFACE:${FERRY_LIBURING_ARCHIVE}>)
    else()
      target_link_libraries(${target} INTERFACE $<BUILD_INTERFACE:PkgConfig::FERRY_LIBURING>)
    endif()
  else()
    target_compile_definitions(${target} INTERFACE $<BUILD_INTERFACE:FERRY_HAS_URING=0>)
  endif()
endfunction()

# ferry_static_runtime(): with FERRY_STATIC_DEPENDENCIES, every executable of this build
# links libstdc++ and libgcc statically and the CUDA runtime statically (nvcc links CUDA
# targets with the host compiler too). The binaries then need only
# glibc (2.36 or newer), the CUDA driver and, where they use it, cuBLAS.
macro(ferry_static_runtime)
  if(FERRY_STATIC_DEPENDENCIES)
    set(CMAKE_CUDA_RUNTIME_LIBRARY Static)
    add_link_options(-static-libstdc++ -static-libgcc)
  endif()
endmacro()

# ferry_verify_cuda_headers(<target> <header>...): CMake's VERIFY_INTERFACE_HEADER_SETS
# compiles headers as C++ only, so every `.cuh` gets a generated `.cu` translation unit
# that includes it alone, built with nvcc into `<target>_verify_cuda_headers`
# (part of `all`, like CMake's own verification targets).
function(ferry_verify_cuda_headers target)
  set(sources "")
  foreach(header IN LISTS ARGN)
    string(REGEX REPLACE "^include/" "" rel "${header}")
    string(MAKE_C_IDENTIFIER "${rel}" id)
    set(src "${CMAKE_CURRENT_BINARY_DIR}/verify_cuda_headers/${id}.cu")
    file(CONFIGURE OUTPUT "${src}" CONTENT "#include <${rel}>\n" @ONLY)
    list(APPEND sources "${src}")
  endforeach()
  if(sources)
    add_library(${target}_verify_cuda_headers OBJECT ${sources})
    target_link_libraries(${target}_verify_cuda_headers PRIVATE ${target})
    set_target_properties(${target}_verify_cuda_headers PROPERTIES
      CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON CUDA_EXTENSIONS OFF)
  endif()
endfunction()
