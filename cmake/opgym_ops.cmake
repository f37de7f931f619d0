# The op registry: each op folder (src/ops/<op>/CMakeLists.txt) calls opgym_add_op() once to declare
# everything of that op; the top-level CMakeLists.txt adds the op folders (its OPGYM_OPS list), then
# builds the shared targets from what they declared (opgym_op_files()):
#
#   opgym               the op's SOURCES and KERNELS (+ its CUDA files via cmake/cuda.cmake)
#   opgym_cases         its CASES; its RUNNERS go into the generated runner table (keyed by exact name)
#   opgym_tests         its TESTS             opgym_cuda_tests   its CUDA_TESTS
#   opgym_bench         its BENCH             fuzz_<x>           one per FUZZ file <x>_fuzz.cpp
#   opgym/_stable.so    its TORCH_STABLE files (torch's stable ABI: one compile for every torch release)
#   opgym/_stable_cuda.so its TORCH_CUDA files, when torch and the core have CUDA (the stable ABI too)
#
# opgym_add_op(<name>
#   SOURCES     files...          the front, the golden, ... (compiled into libopgym)
#   KERNELS     files...          per-ISA kernel files, named *_scalar.cpp, *_avx2.cpp, *_avx512.cpp:
#                                 each gets its instruction set's compile options (below)
#   CUDA        files...          .cu files (nvcc), built when the CUDA backend is on
#   CASES       files...          the case runner(s) (src/ops/<op>/cases.cpp)
#   RUNNERS     name function ... the runner names a case file may carry (its op_name, or the prefix
#                                 of its file name / case ids) and the C++ function serving each:
#                                 `opgym::cases::CaseResult function(const Case&, const CaseFile&,
#                                 const RunOptions&)` in namespace opgym
#   TESTS       files...          GoogleTest sources (opgym_tests)
#   CUDA_TESTS  files...          GoogleTest sources needing the CUDA runtime (opgym_cuda_tests)
#   BENCH       files...          Google Benchmark sources (opgym_bench)
#   FUZZ        files...          libFuzzer targets, each <x>_fuzz.cpp -> fuzz_<x> (OPGYM_FUZZ=ON;
#                                 listed in <build>/fuzz_targets.txt, which scripts/fuzz.sh runs)
#   TORCH_STABLE files...         the torch binding's kernels on the stable ABI (CPU kernels with
#                                 STABLE_TORCH_LIBRARY_IMPL; schemas, fake kernels and autograd rules
#                                 in the op's meta.py), paths relative to python/opgym/ops/<name>/
#   TORCH_CUDA  files...          its CUDA kernels on the stable ABI (STABLE_TORCH_LIBRARY_IMPL(opgym, CUDA);
#                                 csrc/stable_cuda.hpp), same folder
#   LIBRARIES   targets...        extra libraries the op builds itself (linked into opgym_cases, so the
#                                 runner, tests, bench and fuzz targets have them; installed and exported)
#   CORE_DEFINITIONS defs...      compile definitions for this op's SOURCES and KERNELS only
#   CORE_INCLUDE_DIRS dirs...     include directories for this op's SOURCES and KERNELS only
#   CORE_LIBRARIES libs...        libraries libopgym links privately because of this op
# )
# Relative paths are the op folder's (the caller's CMAKE_CURRENT_SOURCE_DIR), except TORCH*.
include_guard(GLOBAL)

# One translation unit per instruction set; the front picks one at run time. The AVX-512 one is
# scheduled for the Sapphire Rapids family it targets: generic tuning parks integers in vector
# registers, a port-0/5 move each on the ports the bf16 path is bound on (docs/PERF.md v28).
# (GCC 12 warns inside its own AVX-512 intrinsic headers; the warning is about their undefined-lane idiom.)
set(OPGYM_ISA_FLAGS_scalar "")
set(OPGYM_ISA_FLAGS_avx2 -mavx2 -mfma -mf16c)
set(OPGYM_ISA_FLAGS_avx512 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mavx2 -mfma -mf16c
    -mtune=sapphirerapids -Wno-maybe-uninitialized -Wno-uninitialized)

set(_OPGYM_OP_KINDS SOURCES KERNELS CUDA CASES TESTS CUDA_TESTS BENCH FUZZ TORCH_STABLE TORCH_CUDA LIBRARIES CORE_LIBRARIES)

function(_opgym_abs out base)
  set(files)
  foreach(f IN LISTS ARGN)
    if(NOT IS_ABSOLUTE "${f}")
      set(f "${base}/${f}")
    endif()
    if(NOT EXISTS "${f}")
      message(FATAL_ERROR "opgym_add_op(${_opgym_op}): no file ${f}")
    endif()
    list(APPEND files "${f}")
  endforeach()
  set(${out} "${files}" PARENT_SCOPE)
endfunction()

function(opgym_add_op name)
  set(multi ${_OPGYM_OP_KINDS} RUNNERS CORE_DEFINITIONS CORE_INCLUDE_DIRS)
  cmake_parse_arguments(PARSE_ARGV 1 OP "" "" "${multi}")
  set(_opgym_op "${name}")
  if(OP_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "opgym_add_op(${name}): unknown arguments ${OP_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT name MATCHES "^[a-z][a-z0-9_]*$")
    message(FATAL_ERROR "opgym_add_op(${name}): an op name is lower case letters, digits and _")
  endif()
  get_property(ops GLOBAL PROPERTY OPGYM_OPS)
  if(name IN_LIST ops)
    message(FATAL_ERROR "opgym_add_op(${name}): declared twice")
  endif()
  set_property(GLOBAL APPEND PROPERTY OPGYM_OPS "${name}")

  set(here "${CMAKE_CURRENT_SOURCE_DIR}")
  set(torch_dir "${PROJECT_SOURCE_DIR}/python/opgym/ops/${name}")
  foreach(kind SOURCES KERNELS CUDA CASES TESTS CUDA_TESTS BENCH FUZZ TORCH_STABLE TORCH_CUDA)
    if(kind MATCHES "^TORCH")
      _opgym_abs(files "${torch_dir}" ${OP_${kind}})
    else()
      _opgym_abs(files "${here}" ${OP_${kind}})
    endif()
    set(OP_${kind} "${files}")
    set_property(GLOBAL APPEND PROPERTY OPGYM_OP_${kind} ${files})
  endforeach()
  set_property(GLOBAL APPEND PROPERTY OPGYM_OP_LIBRARIES ${OP_LIBRARIES})
  set_property(GLOBAL APPEND PROPERTY OPGYM_OP_CORE_LIBRARIES ${OP_CORE_LIBRARIES})

  # Per-ISA options and the op's own definitions/include directories: source properties of the
  # top-level directory, where libopgym is created.
  foreach(f IN LISTS OP_KERNELS)
    if(f MATCHES "_(scalar|avx2|avx512)\\.cpp$")
      set(isa "${CMAKE_MATCH_1}")
    else()
      message(FATAL_ERROR "opgym_add_op(${name}): kernel file ${f} must end in _scalar.cpp, _avx2.cpp or _avx512.cpp")
    endif()
    if(OPGYM_ISA_FLAGS_${isa})
      set_source_files_properties("${f}" DIRECTORY "${PROJECT_SOURCE_DIR}"
        PROPERTIES COMPILE_OPTIONS "${OPGYM_ISA_FLAGS_${isa}}")
    endif()
  endforeach()
  if(OP_CORE_DEFINITIONS OR OP_CORE_INCLUDE_DIRS)
    set_property(SOURCE ${OP_SOURCES} ${OP_KERNELS} DIRECTORY "${PROJECT_SOURCE_DIR}"
      APPEND PROPERTY COMPILE_DEFINITIONS ${OP_CORE_DEFINITIONS})
    set_property(SOURCE ${OP_SOURCES} ${OP_KERNELS} DIRECTORY "${PROJECT_SOURCE_DIR}"
      APPEND PROPERTY INCLUDE_DIRECTORIES ${OP_CORE_INCLUDE_DIRS})
  endif()

  list(LENGTH OP_RUNNERS n)
  math(EXPR odd "${n} % 2")
  if(odd)
    message(FATAL_ERROR "opgym_add_op(${name}): RUNNERS takes pairs: a name and its function")
  endif()
  if(OP_RUNNERS AND NOT OP_CASES)
    message(FATAL_ERROR "opgym_add_op(${name}): RUNNERS without the CASES files defining them")
  endif()
  get_property(taken GLOBAL PROPERTY OPGYM_RUNNER_NAMES)
  while(OP_RUNNERS)
    list(POP_FRONT OP_RUNNERS runner fn)
    if(NOT runner MATCHES "^[A-Za-z0-9_]+$" OR NOT fn MATCHES "^[A-Za-z_][A-Za-z0-9_]*$")
      message(FATAL_ERROR "opgym_add_op(${name}): bad runner '${runner}' -> '${fn}'")
    endif()
    if(runner IN_LIST taken)
      message(FATAL_ERROR "opgym_add_op(${name}): runner name '${runner}' is already taken")
    endif()
    list(APPEND taken "${runner}")
    set_property(GLOBAL APPEND PROPERTY OPGYM_RUNNER_NAMES "${runner}")
    set_property(GLOBAL APPEND PROPERTY OPGYM_RUNNER_FUNCTIONS "${fn}")
  endwhile()
endfunction()

# opgym_op_files(<var> <kind>): every op's files (or libraries) of one kind, in declaration order.
function(opgym_op_files out kind)
  get_property(v GLOBAL PROPERTY OPGYM_OP_${kind})
  set(${out} "${v}" PARENT_SCOPE)
endfunction()

# A libFuzzer executable fuzz_<x> for each <x>_fuzz.cpp (linked with opgym_cases); their names, one a
# line, in <build>/fuzz_targets.txt (what scripts/fuzz.sh runs).
function(opgym_add_fuzz_targets)
  set(names)
  foreach(source IN LISTS ARGN)
    get_filename_component(stem "${source}" NAME_WE)
    if(NOT stem MATCHES "^(.+)_fuzz$")
      message(FATAL_ERROR "opgym: fuzz source ${source} must be named <target>_fuzz.cpp")
    endif()
    set(name "fuzz_${CMAKE_MATCH_1}")
    add_executable(${name} "${source}")
    set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})
    target_compile_options(${name} PRIVATE -fsanitize=fuzzer)
    target_link_options(${name} PRIVATE -fsanitize=fuzzer)
    target_link_libraries(${name} PRIVATE opgym_cases)
    list(APPEND names "${CMAKE_MATCH_1}")
  endforeach()
  list(JOIN names "\n" text)
  file(WRITE "${CMAKE_BINARY_DIR}/fuzz_targets.txt" "${text}\n")
  # `cmake --build <dir> --target fuzz_all`: every fuzz target and nothing else (make test's sanitizer build)
  list(TRANSFORM names PREPEND "fuzz_" OUTPUT_VARIABLE executables)
  add_custom_target(fuzz_all DEPENDS ${executables})
endfunction()

# The precision runner's table (src/cases/runner_table.cpp.in -> <build>/generated/runner_table.cpp):
# one declaration per runner function and one {name, function} entry per runner name, sorted by name.
function(opgym_generate_runner_table out)
  get_property(names GLOBAL PROPERTY OPGYM_RUNNER_NAMES)
  get_property(fns GLOBAL PROPERTY OPGYM_RUNNER_FUNCTIONS)
  set(sorted_names ${names})
  list(SORT sorted_names)
  set(OPGYM_RUNNER_DECLARATIONS "")
  set(OPGYM_RUNNER_ENTRIES "")
  set(declared)
  foreach(runner IN LISTS sorted_names)
    list(FIND names "${runner}" i)
    list(GET fns ${i} fn)
    if(NOT fn IN_LIST declared)
      list(APPEND declared "${fn}")
      string(APPEND OPGYM_RUNNER_DECLARATIONS
        "cases::CaseResult ${fn}(const cases::Case&, const cases::CaseFile&, const cases::RunOptions&);\n")
    endif()
    string(APPEND OPGYM_RUNNER_ENTRIES "    {\"${runner}\", &::opgym::${fn}},\n")
  endforeach()
  configure_file("${PROJECT_SOURCE_DIR}/src/cases/runner_table.cpp.in" "${out}" @ONLY)
endfunction()

# opgym_export_dependency(<find_package args>): a find_dependency() line for opgymConfig.cmake, for a
# package an op's installed library links (swiglu: `dnnl CONFIG` for opgym::mlp).
function(opgym_export_dependency)
  string(JOIN " " args ${ARGN})
  set_property(GLOBAL APPEND PROPERTY OPGYM_FIND_DEPENDENCIES "find_dependency(${args})")
endfunction()
