# CUDA backend (OPGYM_CUDA=auto|on|off), included right after the core `opgym` target, once every op
# has declared its CUDA files and CUDA gtests (cmake/opgym_ops.cmake).
#
# auto: built when a CUDA compiler is found (CUDACXX, PATH, /usr/local/cuda); on: required; off: never.
# The kernels live in the object library `opgym_cuda`, compiled by nvcc for sm_80 and sm_90 (SASS)
# plus compute_90 PTX, and their objects are added to `opgym` itself: one library to link, and the
# core's C++ flags (-Wall, -ffp-contract=off, ...), which nvcc would not take, never reach nvcc.
# `opgym` then links the shared CUDA runtime (the one torch loads too) and defines OPGYM_HAVE_CUDA=1
# for everything that links it. No GPU is needed to build: the tests skip without one.
set(OPGYM_HAVE_CUDA OFF)
string(TOLOWER "${OPGYM_CUDA}" _opgym_cuda_mode)
if(NOT _opgym_cuda_mode MATCHES "^(auto|on|off)$")
  message(FATAL_ERROR "OPGYM_CUDA must be auto, on or off, got '${OPGYM_CUDA}'")
endif()

if(_opgym_cuda_mode STREQUAL "auto" AND OPGYM_SANITIZE)
  # nvcc does not take -fsanitize; the sanitizer build is the CPU build.
  message(STATUS "opgym: CUDA backend off (OPGYM_SANITIZE)")
elseif(NOT _opgym_cuda_mode STREQUAL "off")
  include(CheckLanguage)
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    if(_opgym_cuda_mode STREQUAL "on")
      message(FATAL_ERROR "OPGYM_CUDA=on but no CUDA compiler was found (set CUDACXX or put nvcc on PATH)")
    endif()
    message(STATUS "opgym: CUDA backend off (no nvcc found)")
  else()
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # Ampere and Hopper SASS, and Hopper PTX for anything newer (JIT-compiled by the driver).
      set(CMAKE_CUDA_ARCHITECTURES "80-real;90-real;90-virtual")
    endif()
    if(NOT DEFINED CMAKE_CUDA_HOST_COMPILER)
      set(CMAKE_CUDA_HOST_COMPILER "${CMAKE_CXX_COMPILER}")
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(OPGYM_HAVE_CUDA ON)
    message(STATUS "opgym: CUDA backend on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES})")

    # Every op's CUDA files (opgym_add_op CUDA in src/ops/<op>/CMakeLists.txt).
    opgym_op_files(_opgym_cuda_sources CUDA)
    add_library(opgym_cuda OBJECT src/core/cuda_device.cu ${_opgym_cuda_sources})
    set_target_properties(opgym_cuda PROPERTIES
      CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON POSITION_INDEPENDENT_CODE ON)
    target_include_directories(opgym_cuda PRIVATE
      ${CMAKE_CURRENT_SOURCE_DIR}/include ${CMAKE_CURRENT_SOURCE_DIR}/src)
    # Bit-exactness: no multiply-add contraction on the device (the kernels also use explicit
    # __fmul_rn/__fadd_rn) nor in host code; IEEE division and sqrt.
    target_compile_options(opgym_cuda PRIVATE
      $<$<COMPILE_LANGUAGE:CUDA>:-fmad=false --prec-div=true --prec-sqrt=true --ftz=false
        -Xcompiler=-ffp-contract=off,-fno-fast-math,-Wall>)
    target_compile_definitions(opgym_cuda PRIVATE OPGYM_HAVE_CUDA=1)

    target_sources(opgym PRIVATE $<TARGET_OBJECTS:opgym_cuda>)
    # `opgym` was created before CUDA was enabled, so its CUDA_ARCHITECTURES property started empty;
    # the Makefiles generator refuses a target holding CUDA objects without one (Ninja did not ask).
    set_target_properties(opgym PROPERTIES CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}")
    target_compile_definitions(opgym PUBLIC OPGYM_HAVE_CUDA=1)
    # The shared runtime: the torch extension then shares torch's libcudart. Installed consumers get
    # the library by path, so the exported package needs no find_dependency(CUDAToolkit).
    target_link_libraries(opgym PUBLIC
      $<BUILD_INTERFACE:CUDA::cudart> $<INSTALL_INTERFACE:${CUDA_cudart_LIBRARY}>)

    opgym_op_files(_opgym_cuda_tests CUDA_TESTS)
    if(OPGYM_BUILD_TESTS AND _opgym_cuda_tests)
      enable_testing()
      find_package(GTest REQUIRED)
      include(GoogleTest)
      # Plain C++ against the runtime API: only the kernels go through nvcc.
      add_executable(opgym_cuda_tests ${_opgym_cuda_tests})
      target_compile_options(opgym_cuda_tests PRIVATE ${OPGYM_FP_FLAGS})
      # opgym_cases (inputs, buffers) is defined after this file; CMake resolves the name at the end.
      target_link_libraries(opgym_cuda_tests PRIVATE opgym_cases CUDA::cudart GTest::gtest GTest::gtest_main)
      target_include_directories(opgym_cuda_tests PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
      # Listing the tests needs no GPU; each test skips with the reason when there is none.
      gtest_discover_tests(opgym_cuda_tests DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600)
    endif()
  endif()
endif()
