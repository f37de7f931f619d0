// libFuzzer target: the gym-format case-file loader on arbitrary bytes (seeded from every case file
// opgym ships and PyPTO-Gym's). Any input either loads or throws opgym::Error naming the file; a
// loaded file's cases are then run through their op's runner when small (the runner's own checks on
// roles, params and declared outputs), which must also end in a result or an opgym::Error.
#include <fuzzer/FuzzedDataProvider.h>

#include <string>

#include "cases/case_file.hpp"
#include "cases/runner.hpp"
#include "opgym/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace opgym::cases;
  const Json j = Json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  CaseFile file;
  try {
    file = parse_case_file(j, "fuzz.json");
  } catch (const opgym::Error&) {
    return 0;
  }
  file.op_name = resolve_op(file);
  const OpRunner run = find_runner(file.op_name);
  if (!run) return 0;
  RunOptions opt;
  opt.max_bytes = 1 << 20;  // the budget check refuses anything larger, as --max-memory would
  for (const Case& c : file.cases) {
    try {
      run(c, file, opt);
    } catch (const opgym::Error&) {
    }
  }
  return 0;
}
