// build/opgym: the C++ command-line tool.
//   opgym check FILE...        run gym-format case files: kernel vs golden, [PRECISION_PASS] per case
//   opgym explain SHAPE DTYPE  print the tile plan and instruction set a call would use
//   opgym info                 version, CPU features, ISA and threads in use
#include <CLI/CLI.hpp>

#include <iostream>
#include <string>
#include <vector>

#include "cases/runner.hpp"
#include "opgym/opgym.hpp"

namespace {

// "1,4096,2048", "[1, 4096, 2048]" or "1x4096x2048".
std::vector<int64_t> parse_shape(const std::string& text) {
  std::vector<int64_t> dims;
  std::string cur;
  auto flush = [&] {
    if (cur.empty()) return;
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(cur, &used);
    } catch (const std::exception&) {
    }
    if (used != cur.size() || v < 0) throw opgym::Error("SHAPE", "SHAPE: '" + cur + "' is not a dim >= 0 (e.g. 1,4096,2048)");
    dims.push_back(v);
    cur.clear();
  };
  for (char ch : text) {
    if (ch == ',' || ch == 'x' || ch == ' ' || ch == '[' || ch == ']' || ch == '(' || ch == ')') flush();
    else cur += ch;
  }
  flush();
  if (dims.empty() || dims.size() > static_cast<size_t>(opgym::kMaxRank))
    throw opgym::Error("SHAPE", "SHAPE: expected 1 to 8 dims such as 1,4096,2048, got '" + text + "'");
  return dims;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"opgym: fused transformer operators (C++ tool)"};
  app.require_subcommand(1);

  auto* check = app.add_subcommand("check", "Run gym-format case files through the kernels and compare with the golden");
  std::vector<std::string> files;
  std::string mode = "hf", isa, max_memory;
  int threads = 0;
  int64_t max_mib = 0;
  check->add_option("FILE", files, "case files (PyPTO-Gym format)")->required()->check(CLI::ExistingFile);
  check->add_option("--mode", mode, "numeric mode: hf (HF eager bits) or fp32")->check(CLI::IsMember({"hf", "fp32"}));
  check->add_option("--isa", isa, "force an instruction set: scalar, avx2, avx512")->check(CLI::IsMember({"scalar", "avx2", "avx512"}));
  check->add_option("--threads", threads, "worker threads (default: OPGYM_NUM_THREADS or all cores)")->check(CLI::Range(1, 1024));
  check->add_option("--max-memory", max_mib, "refuse cases needing more MiB (default: a quarter of RAM)")->check(CLI::PositiveNumber);

  auto* explain = app.add_subcommand("explain", "Print the tile plan for a shape and dtype");
  std::string shape_text, dtype_text, weight_dtype_text;
  explain->add_option("SHAPE", shape_text, "e.g. 1,4096,2048")->required();
  explain->add_option("DTYPE", dtype_text, "float32 | float16 | bfloat16")->required();
  explain->add_option("--weight-dtype", weight_dtype_text, "weight dtype (default: DTYPE)");
  explain->add_option("--isa", isa, "force an instruction set")->check(CLI::IsMember({"scalar", "avx2", "avx512"}));
  explain->add_option("--threads", threads, "threads available")->check(CLI::Range(1, 1024));

  auto* info = app.add_subcommand("info", "Version, CPU features, instruction set and threads");

  CLI11_PARSE(app, argc, argv);
  try {
    if (*check) {
      opgym::cases::RunOptions opt;
      opt.mode = opgym::parse_mode(mode);
      if (!isa.empty()) opt.isa = opgym::parse_isa(isa);
      opt.threads = threads;
      opt.max_bytes = max_mib << 20;
      const auto s = opgym::cases::run_files(files, opt, std::cout);
      return s.failed == 0 && s.passed > 0 ? 0 : 1;
    }
    if (*explain) {
      if (!isa.empty()) opgym::set_cpu_isa(opgym::parse_isa(isa));
      const auto shape = parse_shape(shape_text);
      const auto dt = opgym::parse_dtype(dtype_text, "DTYPE");
      const auto wdt = weight_dtype_text.empty() ? dt : opgym::parse_dtype(weight_dtype_text, "--weight-dtype");
      const auto x = opgym::TensorView::contiguous(nullptr, dt, shape.data(), static_cast<int>(shape.size()));
      std::cout << "x " << x.shape_str() << " " << opgym::dtype_name(dt) << "\n"
                << opgym::plan_rms_norm(x, wdt, threads).describe()
                << "  cpu features  " << opgym::cpu_features() << "\n";
      return 0;
    }
    if (*info) {
      std::cout << "opgym " << opgym::kVersion << "\n"
                << "cpu features  " << opgym::cpu_features() << "\n"
                << "isa           " << opgym::isa_name(opgym::active_cpu_isa()) << " (best "
                << opgym::isa_name(opgym::best_cpu_isa()) << ")\n"
                << "threads       " << opgym::default_executor().max_threads() << "\n";
      return 0;
    }
  } catch (const opgym::Error& e) {
    std::cerr << "opgym: error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
