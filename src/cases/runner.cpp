#include "cases/runner.hpp"

#include <unistd.h>

#include <cstdio>
#include <ostream>
#include <string>

#include "opgym/error.hpp"

namespace opgym::cases {

namespace {
std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}
}  // namespace

void case_error(const CaseFile& file, const Case& c, const std::string& what) {
  throw Error(file.path, file.path + ": case '" + c.id + "': " + what);
}

OpRunner find_runner(const std::string& op) {
  for (const RunnerEntry& e : runners())
    if (op == e.op) return e.run;
  return nullptr;
}

std::string resolve_op(const CaseFile& file) {
  // The longest runner name N with `name` starting "N_": "swiglu_mlp_001" is swiglu_mlp's, not swiglu's.
  auto prefixed = [](const std::string& name) -> std::string {
    std::string best;
    for (const RunnerEntry& e : runners()) {
      const std::string op = e.op;
      if (op.size() > best.size() && name.size() > op.size() && name.compare(0, op.size(), op) == 0 &&
          name[op.size()] == '_')
        best = op;
    }
    return best;
  };
  if (find_runner(file.op_name)) return file.op_name;
  // A file named after the op ("rms_norm_qwen_cases.json"), or cases whose ids are ("rms_norm_001").
  std::string op = prefixed(file.op_name);
  if (op.empty() && !file.cases.empty()) op = prefixed(file.cases.front().id);
  return op.empty() ? file.op_name : op;
}

int64_t default_max_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return int64_t{4} << 30;
  return static_cast<int64_t>(pages) * page / 4;
}

void check_budget(int64_t bytes, const CaseFile& file, const Case& c, const RunOptions& opt) {
  const int64_t limit = opt.max_bytes > 0 ? opt.max_bytes : default_max_bytes();
  if (bytes > limit || bytes < 0)
    throw Error(file.path, file.path + ": case '" + c.id + "': needs about " + std::to_string(bytes >> 20) +
                               " MiB, over the limit of " + std::to_string(limit >> 20) + " MiB (--max-memory)");
}

Summary run_files(const std::vector<std::string>& paths, RunOptions opt, std::ostream& out) {
  Summary s;
  std::unique_ptr<Executor> pool;
  if (opt.threads > 0) {
    pool = make_thread_pool(opt.threads);
    opt.executor = pool.get();
  }
  if (opt.isa) set_cpu_isa(*opt.isa);
  for (const std::string& path : paths) {
    CaseFile file;
    try {
      file = load_case_file(path);
    } catch (const Error& e) {
      out << "[PRECISION_FAIL] " << e.what() << "\n";
      ++s.failed;
      continue;
    }
    file.op_name = resolve_op(file);
    const OpRunner run = find_runner(file.op_name);
    if (!run) {
      out << "[PRECISION_FAIL] " << path << ": no runner for op '" << file.op_name << "' (have:";
      for (const RunnerEntry& e : runners()) out << " " << e.op;
      out << ")\n";
      ++s.failed;
      continue;
    }
    out << "== " << path << " (" << file.op_name << ", " << file.cases.size() << " cases, mode "
        << mode_name(opt.mode) << ", isa " << isa_name(active_cpu_isa()) << ")\n";
    for (const Case& c : file.cases) {
      CaseResult r;
      try {
        r = run(c, file, opt);
      } catch (const Error& e) {
        r.id = c.id;
        r.pass = false;
        r.note = e.what();
      }
      out << (r.pass ? "[PRECISION_PASS] " : "[PRECISION_FAIL] ") << r.id << "  shape " << r.shape << "  " << r.dtype
          << "  max_abs " << fmt("%.3g", r.metrics.max_abs) << "  max_rel " << fmt("%.3g", r.metrics.max_rel)
          << "  max_ulp " << r.metrics.max_ulp << "  identical " << fmt("%.4f%%", 100.0 * r.metrics.identical)
          << (r.note.empty() ? "" : "  -- " + r.note) << "\n";
      (r.pass ? s.passed : s.failed)++;
    }
  }
  out << s.passed << " passed, " << s.failed << " failed\n";
  return s;
}

}  // namespace opgym::cases
