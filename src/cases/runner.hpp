// The precision runner: every case of every file, kernel vs golden, one line per case, then
// "N passed, N failed". Each op contributes a runner (src/ops/<op>/cases.cpp), declared with the
// names it answers to in its src/ops/<op>/CMakeLists.txt (opgym_add_op RUNNERS); the table is generated.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cases/case_file.hpp"
#include "cases/compare.hpp"
#include "opgym/cpu.hpp"
#include "opgym/parallel.hpp"
#include "opgym/rms_norm.hpp"

namespace opgym::cases {

struct RunOptions {
  NormMode mode = NormMode::hf;
  std::optional<CpuIsa> isa;   // default: the active ISA
  int threads = 0;             // 0: the default executor
  int64_t max_bytes = 0;       // refuse cases needing more; 0: default_max_bytes()
  Executor* executor = nullptr;  // set by run_files from `threads`
};

struct CaseResult {
  std::string id, shape, dtype;
  Metrics metrics;
  bool pass = false;
  std::string note;  // why it failed, or what was checked besides allclose
};

using OpRunner = CaseResult (*)(const Case&, const CaseFile&, const RunOptions&);

// What a runner raises for a case it cannot read (a missing input, a bad parameter): an opgym::Error
// naming the file and the case, which the runner's loop counts as that case's failure.
[[noreturn]] void case_error(const CaseFile& file, const Case& c, const std::string& what);

struct RunnerEntry {
  const char* op;
  OpRunner run;
};
// Every registered runner, sorted by name (generated from the ops' declarations: runner_table.cpp.in).
const std::vector<RunnerEntry>& runners();

// The runner for an exact op name, or nullptr.
OpRunner find_runner(const std::string& op_name);
// The op a file's cases are for: its op_name when a runner has that exact name, else the longest
// runner name that is a whole prefix ("<name>_...") of the file-derived name, else of the first case
// id ("rms_norm_qwen_cases.json", "swiglu_mlp_001"). Independent of the table's order.
std::string resolve_op(const CaseFile& file);
// A quarter of physical memory.
int64_t default_max_bytes();
// Throws opgym::Error naming the file and case if `bytes` exceeds the limit.
void check_budget(int64_t bytes, const CaseFile& file, const Case& c, const RunOptions& opt);

struct Summary {
  int passed = 0, failed = 0;
};
// Runs every case of every file, printing as it goes. A file that cannot be read or has no runner
// counts as one failure, with its error printed; the other files still run.
Summary run_files(const std::vector<std::string>& paths, RunOptions opt, std::ostream& out);

}  // namespace opgym::cases
