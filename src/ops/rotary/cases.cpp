// rotary's case runner, for two schemas read unchanged:
//   PyPTO-Gym's MRoPE (mrope_test_cases.json): inputs q, k, cos, sin [3, ...] and params mrope_section,
//     unsqueeze_dim; output {"q_shape", "k_shape", "dtype"} (no tensors); HF's text rounding (mode hf).
//   opgym's own (cases/<model>/rotary.json): inputs q, k, cos, sin and params mode ("hf" text, "fp32"
//     vision), unsqueeze_dim, optional mrope_section, pairs ("half" by default, "interleaved",
//     "deinterleave") and pair_table (false by default); outputs q_out and k_out tensors. A rotary dim
//     below the head dim is cos's shape (its last dim, or twice it with pair_table).
// A case passes when the declared outputs have q's and k's shapes and dtype, and both of the kernel's
// outputs are allclose (case rtol/atol) to the golden's; the figures are over both outputs together.
#include <string>

#include "cases/inputs.hpp"
#include "cases/runner.hpp"
#include "opgym/error.hpp"
#include "opgym/rotary.hpp"

namespace opgym {

cases::CaseResult run_rotary_case(const cases::Case& c, const cases::CaseFile& file, const cases::RunOptions& opt) {
  using namespace cases;
  const TensorSpec* spec[4] = {c.input("q"), c.input("k"), c.input("cos"), c.input("sin")};
  const char* names[4] = {"q", "k", "cos", "sin"};
  int index[4] = {};
  for (int i = 0; i < 4; ++i) {
    if (!spec[i]) case_error(file, c, std::string("no input tensor named '") + names[i] + "'");
    for (size_t j = 0; j < c.inputs.size(); ++j)
      if (&c.inputs[j] == spec[i]) index[i] = static_cast<int>(j);
  }
  RotaryOptions o;
  try {
    if (c.params.contains("mode")) o.mode = parse_rotary_mode(c.params.at("mode").get<std::string>());
    if (c.params.contains("unsqueeze_dim")) {
      if (!c.params.at("unsqueeze_dim").is_number_integer()) case_error(file, c, "unsqueeze_dim must be an integer");
      o.unsqueeze_dim = c.params.at("unsqueeze_dim").get<int>();
    }
    if (c.params.contains("mrope_section")) {
      if (!is_integer_list(c.params.at("mrope_section")))
        case_error(file, c, "mrope_section must be a list of three integers");
      const auto sec = c.params.at("mrope_section").get<std::vector<int64_t>>();
      if (sec.size() != 3) case_error(file, c, "mrope_section must hold three lengths");
      for (int i = 0; i < 3; ++i) o.mrope_section[i] = sec[i];
    }
    if (c.params.contains("pairs")) o.pairs = parse_rotary_pairs(c.params.at("pairs").get<std::string>());
    if (c.params.contains("pair_table")) o.pair_table = c.params.at("pair_table").get<bool>();
  } catch (const Json::exception& e) {
    case_error(file, c, std::string("bad mode, unsqueeze_dim, mrope_section, pairs or pair_table: ") + e.what());
  } catch (const Error& e) {
    case_error(file, c, e.what());
  }
  const TensorSpec &q = *spec[0], &k = *spec[1];
  // The declared outputs: tensors named like q*/k*, or MRoPE's q_shape / k_shape / dtype.
  std::vector<int64_t> q_decl, k_decl;
  DType q_dt = q.dtype, k_dt = k.dtype;
  bool declared = false;
  for (const TensorSpec& t : c.outputs) {
    if (t.name.rfind("q", 0) == 0) q_decl = t.shape, q_dt = t.dtype, declared = true;
    else if (t.name.rfind("k", 0) == 0) k_decl = t.shape, k_dt = t.dtype, declared = true;
  }
  try {
    for (const char* key : {"q_shape", "k_shape"})
      if (c.output_params.contains(key) && !is_integer_list(c.output_params.at(key)))
        case_error(file, c, std::string(key) + " must be a list of integers");
    if (c.output_params.contains("q_shape")) q_decl = c.output_params.at("q_shape").get<std::vector<int64_t>>(), declared = true;
    if (c.output_params.contains("k_shape")) k_decl = c.output_params.at("k_shape").get<std::vector<int64_t>>(), declared = true;
    if (c.output_params.contains("dtype"))
      q_dt = k_dt = parse_dtype(c.output_params.at("dtype").get<std::string>(), "dtype");
  } catch (const Json::exception& e) {
    case_error(file, c, std::string("bad q_shape, k_shape or dtype in output: ") + e.what());
  } catch (const Error& e) {
    case_error(file, c, e.what());
  }
  if (!declared) case_error(file, c, "no declared output (q_out/k_out tensors, or q_shape/k_shape)");

  CaseResult r;
  r.id = c.id;
  r.shape = "q " + q.shape_str() + " k " + k.shape_str();
  r.dtype = std::string(dtype_name(q.dtype)) + "/" + rotary_mode_name(o.mode) + (o.mrope() ? "/mrope" : "") +
            (o.pairs != RotaryPairs::half ? std::string("/") + rotary_pairs_name(o.pairs) : "") +
            (o.pair_table ? "/pair_table" : "");
  int64_t bytes = 0;
  for (const TensorSpec* t : spec) bytes += t->numel() * static_cast<int64_t>(dtype_size(t->dtype) + 8);
  check_budget(2 * bytes, file, c, opt);

  Buffer b[4];
  for (int i = 0; i < 4; ++i) b[i] = make_normal(*spec[i], c.seed, index[i]);
  Buffer gq = make_buffer(q.shape, q.dtype), gk = make_buffer(k.shape, k.dtype);
  Buffer wq = make_buffer(q.shape, q.dtype), wk = make_buffer(k.shape, k.dtype);
  rotary(b[0].view(), b[1].view(), b[2].view(), b[3].view(), gq.view(), gk.view(), o, opt.executor);
  reference::rotary_basic_ops(b[0].view(), b[1].view(), b[2].view(), b[3].view(), wq.view(), wk.view(), o);
  const Metrics mq = compare(gq, wq, c.rtol, c.atol), mk = compare(gk, wk, c.rtol, c.atol);
  r.metrics = merge(mq, mk);
  const Metrics& m = r.metrics;
  r.pass = m.allclose();
  if ((!q_decl.empty() && q_decl != q.shape) || (!k_decl.empty() && k_decl != k.shape)) {
    r.pass = false;
    r.note = "declared output shapes do not match q " + q.shape_str() + " / k " + k.shape_str();
  } else if (q_dt != q.dtype || k_dt != k.dtype) {
    r.pass = false;
    r.note = std::string("declared output dtype is not q's ") + dtype_name(q.dtype);
  } else if (!r.pass) {
    r.note = std::to_string(m.not_close) + " elements outside rtol " + std::to_string(c.rtol) + ", atol " +
             std::to_string(c.atol);
  }
  return r;
}

}  // namespace opgym
