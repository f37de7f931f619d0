# Run at the end of the top-level project() call when the Python package is built (pyproject.toml sets
# CMAKE_PROJECT_opgym_INCLUDE to this file), before cmake/cuda.cmake reads OPGYM_CUDA.
# OPGYM_CUDA=torch (the package default) becomes `auto` when the torch being built against has CUDA
# and `off` otherwise, so a CPU torch never gets a CUDA core it could not call.
if(OPGYM_CUDA STREQUAL "torch")
  find_package(Python COMPONENTS Interpreter REQUIRED)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c "import torch, sys; sys.stdout.write(str(int(torch.backends.cuda.is_built())))"
    OUTPUT_VARIABLE _opgym_torch_cuda RESULT_VARIABLE _opgym_rc)
  if(_opgym_rc EQUAL 0 AND _opgym_torch_cuda STREQUAL "1")
    set(OPGYM_CUDA "auto" CACHE STRING "Build the CUDA backend: auto (when nvcc is found), on, off" FORCE)
  else()
    set(OPGYM_CUDA "off" CACHE STRING "Build the CUDA backend: auto (when nvcc is found), on, off" FORCE)
  endif()
  message(STATUS "opgym: OPGYM_CUDA=${OPGYM_CUDA} (torch built with CUDA: ${_opgym_torch_cuda})")
endif()
