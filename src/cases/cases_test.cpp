// The gym-format loader on the peer files (read unchanged), its errors, the input generator, the
// comparison figures, and the precision runner end to end (library and CLI).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cases/case_file.hpp"
#include "cases/compare.hpp"
#include "cases/inputs.hpp"
#include "cases/runner.hpp"
#include "opgym/error.hpp"

namespace opgym::cases {
namespace {

const std::string kPeer = std::string(OPGYM_SOURCE_DIR) + "/../shared/peer-cases/";

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

std::string error_of(const std::string& path) {
  try {
    load_case_file(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CaseFile, ReadsEveryPeerFileUnchanged) {
  const CaseFile rms = load_case_file(kPeer + "rms_norm_test_cases.json");
  EXPECT_EQ(rms.op_name, "rms_norm");
  ASSERT_EQ(rms.cases.size(), 2u);
  const Case& c = rms.cases[0];
  EXPECT_EQ(c.id, "rms_norm_001");
  EXPECT_EQ(c.seed, 42u);
  ASSERT_EQ(c.inputs.size(), 2u);
  EXPECT_EQ(c.inputs[0].name, "hidden_states");
  EXPECT_EQ(c.inputs[0].shape, (std::vector<int64_t>{1, 1, 2048}));
  EXPECT_EQ(c.inputs[0].dtype, DType::float16);
  EXPECT_DOUBLE_EQ(c.number_param("eps", rms.path), 1e-6);
  ASSERT_EQ(c.outputs.size(), 1u);
  EXPECT_EQ(c.outputs[0].shape, (std::vector<int64_t>{1, 1, 2048}));
  EXPECT_DOUBLE_EQ(c.rtol, 1e-2);

  const CaseFile swiglu = load_case_file(kPeer + "swiglu_mlp_test_cases.json");
  EXPECT_EQ(swiglu.op_name, "swiglu_mlp");
  EXPECT_EQ(swiglu.cases.at(0).input("gate_weight")->shape, (std::vector<int64_t>{2048, 11008}));
  const CaseFile mrope = load_case_file(kPeer + "mrope_test_cases.json");
  EXPECT_EQ(mrope.op_name, "mrope");
  EXPECT_EQ(mrope.cases.at(0).params.at("mrope_section").size(), 3u);
  EXPECT_EQ(mrope.cases.at(0).input("cos")->shape, (std::vector<int64_t>{3, 1, 31, 128}));
}

TEST(CaseFile, AcceptsTheOtherSpellings) {
  const auto path = write_temp("spellings.json", R"({"op_name": "rms_norm", "extra": 1, "test_cases": [
    {"id": "a", "seed": 1, "input": {"x": {"shape": [3, 5], "dtype": "bfloat16"}, "gamma": {"shape": [5], "dtype": "bfloat16"},
     "eps": 1e-5, "unknown": [1]}, "output": {"shape": [3, 5], "dtype": "bfloat16"}, "rtol": 0, "atol": 0, "note": "x"}]})");
  const CaseFile f = load_case_file(path);
  EXPECT_EQ(f.op_name, "rms_norm");
  EXPECT_DOUBLE_EQ(f.cases[0].number_param("eps", path), 1e-5);
  EXPECT_EQ(f.cases[0].outputs.at(0).name, "output");
  EXPECT_NE(f.cases[0].input("gamma"), nullptr);
}

TEST(CaseFile, ErrorsNameTheFileAndTheCase) {
  const auto not_json = write_temp("bad.json", "{ not json");
  EXPECT_NE(error_of(not_json).find("bad.json: not valid JSON"), std::string::npos);
  const auto missing = write_temp("missing.json", R"({"test_cases": [{"id": "c7", "input": {}, "output": {}, "rtol": 0, "atol": 0}]})");
  const std::string m = error_of(missing);
  EXPECT_NE(m.find("missing.json: case 'c7': missing field 'seed'"), std::string::npos) << m;
  const auto dtype = write_temp("dtype.json", R"({"test_cases": [{"id": "d1", "seed": 0,
    "input": {"x": {"shape": [2], "dtype": "int4"}}, "output": {}, "rtol": 0, "atol": 0}]})");
  const std::string d = error_of(dtype);
  EXPECT_NE(d.find("dtype.json: case 'd1'"), std::string::npos) << d;
  EXPECT_NE(d.find("int4"), std::string::npos) << d;
  EXPECT_NE(error_of(::testing::TempDir() + "absent.json").find("cannot open"), std::string::npos);
}

TEST(Inputs, SeededNormalAndDeterministic) {
  const TensorSpec spec{"x", {4096}, DType::float32};
  const Buffer a = make_normal(spec, 42, 0), b = make_normal(spec, 42, 0), c = make_normal(spec, 42, 1);
  EXPECT_EQ(a.bytes, b.bytes);
  EXPECT_NE(a.bytes, c.bytes);
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < a.numel(); ++i) sum += a.at(i), sq += a.at(i) * a.at(i);
  EXPECT_NEAR(sum / 4096, 0.0, 0.06);
  EXPECT_NEAR(sq / 4096, 1.0, 0.08);
  const Buffer w = make_normal(TensorSpec{"weight", {2048}, DType::float16}, 42, 1);
  int ones = 0;
  for (int64_t i = 0; i < w.numel(); ++i) ones += w.at(i) == 1.0;
  EXPECT_LT(ones, 10);
}

TEST(Compare, FiguresAndNanHandling) {
  Buffer a = make_buffer({4}, DType::float32), b = a;
  float* pa = reinterpret_cast<float*>(a.bytes.data());
  float* pb = reinterpret_cast<float*>(b.bytes.data());
  pa[0] = 1.0f, pb[0] = 1.0f;
  pa[1] = 2.0f, pb[1] = std::nextafter(2.0f, 3.0f);
  pa[2] = NAN, pb[2] = NAN;
  pa[3] = -0.0f, pb[3] = 0.0f;
  Metrics m = compare(a, b, 0, 0);
  EXPECT_EQ(m.max_ulp, 1);
  EXPECT_DOUBLE_EQ(m.identical, 0.75);
  EXPECT_EQ(m.not_close, 1);
  EXPECT_TRUE(compare(a, b, 1e-6, 0).allclose());
  pa[2] = 1.0f;  // NaN against a number never passes
  EXPECT_FALSE(compare(a, b, 1, 1).allclose());
  EXPECT_EQ(ulp_distance(DType::bfloat16, 0x3f80, 0x3f82), 2);
  EXPECT_EQ(ulp_distance(DType::float16, 0x8001, 0x0001), 2);
}

TEST(Runner, PeerRmsNormCasesPassAndPrintTheGymMarker) {
  std::ostringstream out;
  const Summary s = run_files({kPeer + "rms_norm_test_cases.json"}, RunOptions{}, out);
  EXPECT_EQ(s.passed, 2) << out.str();
  EXPECT_EQ(s.failed, 0) << out.str();
  EXPECT_NE(out.str().find("[PRECISION_PASS] rms_norm_001"), std::string::npos);
  EXPECT_NE(out.str().find("identical 100.0000%"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("2 passed, 0 failed"), std::string::npos);
}

TEST(Runner, WrongDeclaredOutputFailsAndUnknownOpIsReported) {
  const auto path = write_temp("rms_norm_decl.json", R"({"test_cases": [
    {"id": "ok", "seed": 1, "input": {"hidden_states": {"shape": [2, 64], "dtype": "bfloat16"},
      "weight": {"shape": [64], "dtype": "float32"}, "eps": {"value": 1e-6}},
     "output": {"output": {"shape": [2, 64], "dtype": "float32"}}, "rtol": 0, "atol": 0},
    {"id": "bad_dtype", "seed": 1, "input": {"hidden_states": {"shape": [2, 64], "dtype": "bfloat16"},
      "weight": {"shape": [64], "dtype": "float32"}, "eps": {"value": 1e-6}},
     "output": {"output": {"shape": [2, 64], "dtype": "bfloat16"}}, "rtol": 1, "atol": 1},
    {"id": "no_eps", "seed": 1, "input": {"hidden_states": {"shape": [2, 64], "dtype": "bfloat16"},
      "weight": {"shape": [64], "dtype": "bfloat16"}},
     "output": {"output": {"shape": [2, 64], "dtype": "bfloat16"}}, "rtol": 1, "atol": 1}]})");
  const auto unknown = write_temp("layer_norm_cases.json", R"({"op_name": "layer_norm", "test_cases": [
    {"id": "ln_1", "seed": 1, "input": {"x": {"shape": [2, 8], "dtype": "bfloat16"}},
     "output": {"output": {"shape": [2, 8], "dtype": "bfloat16"}}, "rtol": 0, "atol": 0}]})");
  std::ostringstream out;
  const Summary s = run_files({path, unknown}, RunOptions{}, out);
  EXPECT_EQ(s.passed, 1) << out.str();
  EXPECT_EQ(s.failed, 3) << out.str();
  EXPECT_NE(out.str().find("[PRECISION_FAIL] bad_dtype"), std::string::npos);
  EXPECT_NE(out.str().find("torch's promotion"), std::string::npos);
  EXPECT_NE(out.str().find("case 'no_eps': missing input 'eps'"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("no runner for op 'layer_norm'"), std::string::npos) << out.str();
}

TEST(Runner, TableIsSortedUniqueAndResolvesTheLongestWholePrefix) {
  // The generated table: sorted by name, no name twice, every entry callable.
  const std::vector<RunnerEntry>& table = runners();
  ASSERT_FALSE(table.empty());
  for (size_t i = 0; i < table.size(); ++i) {
    EXPECT_NE(table[i].run, nullptr) << table[i].op;
    if (i > 0) EXPECT_LT(std::string(table[i - 1].op), std::string(table[i].op));
  }
  ASSERT_NE(find_runner("swiglu"), nullptr);
  ASSERT_NE(find_runner("swiglu_mlp"), nullptr);
  EXPECT_EQ(find_runner("swiglu_m"), nullptr);  // exact names only
  auto resolve = [](const std::string& op_name, const std::string& first_id) {
    CaseFile f;
    f.op_name = op_name;
    Case c;
    c.id = first_id;
    f.cases.push_back(c);
    return resolve_op(f);
  };
  EXPECT_EQ(resolve("swiglu_mlp", "x"), "swiglu_mlp");         // exact
  EXPECT_EQ(resolve("swiglu_mlp_qwen", "x"), "swiglu_mlp");    // longest whole prefix, whatever the order
  EXPECT_EQ(resolve("swiglu_qwen", "x"), "swiglu");
  EXPECT_EQ(resolve("add_rms_norm_qwen", "x"), "add_rms_norm");
  EXPECT_EQ(resolve("peer", "swiglu_mlp_001"), "swiglu_mlp");  // from the first case id
  EXPECT_EQ(resolve("peer", "mrope_001"), "mrope");
  EXPECT_EQ(resolve("swiglumlp", "swiglu"), "swiglumlp");      // no whole prefix: left as it was
}

TEST(Runner, OversizedCaseIsRefusedBeforeAllocating) {
  const auto path = write_temp("rms_norm_huge.json", R"({"test_cases": [
    {"id": "huge", "seed": 1, "input": {"x": {"shape": [1000000, 1000000], "dtype": "bfloat16"},
      "weight": {"shape": [1000000], "dtype": "bfloat16"}, "eps": 1e-6},
     "output": {"shape": [1000000, 1000000], "dtype": "bfloat16"}, "rtol": 0, "atol": 0}]})");
  std::ostringstream out;
  RunOptions opt;
  opt.max_bytes = int64_t{1} << 30;
  const Summary s = run_files({path}, opt, out);
  EXPECT_EQ(s.failed, 1);
  EXPECT_NE(out.str().find("over the limit of 1024 MiB"), std::string::npos) << out.str();
}

TEST(Cli, CheckExplainAndErrors) {
  const std::string cli = OPGYM_CLI;
  if (cli.empty()) GTEST_SKIP() << "tool not built";
  const std::string log = ::testing::TempDir() + "cli.log";
  auto run = [&](const std::string& args) {
    const int rc = std::system((cli + " " + args + " > " + log + " 2>&1").c_str());
    std::ifstream in(log);
    std::stringstream ss;
    ss << in.rdbuf();
    return std::make_pair(WEXITSTATUS(rc), ss.str());
  };
  auto [rc, text] = run("check --isa scalar --threads 2 " + kPeer + "rms_norm_test_cases.json");
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("2 passed, 0 failed"), std::string::npos) << text;
  std::tie(rc, text) = run("check " + write_temp("bad2.json", "[]"));
  EXPECT_EQ(rc, 1) << text;
  EXPECT_NE(text.find("0 passed, 1 failed"), std::string::npos) << text;
  std::tie(rc, text) = run("explain 1,4096,2048 bf16 --threads 2");
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("rows          4096"), std::string::npos) << text;
  EXPECT_NE(text.find("threads       2"), std::string::npos) << text;
  std::tie(rc, text) = run("explain 1,abc bf16");
  EXPECT_EQ(rc, 2) << text;
  EXPECT_NE(text.find("SHAPE"), std::string::npos) << text;
}

}  // namespace
}  // namespace opgym::cases
