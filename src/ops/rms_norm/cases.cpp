// RMSNorm's case runner: which inputs play which role in a gym-format case, and how a case passes.
//   x      the first tensor input not named weight/gamma (PyPTO-Gym calls it hidden_states)
//   weight the tensor input named "weight" or "gamma"
//   eps    a number or {"value": number}
// A case passes when the declared output has exactly the shape of x and torch's promoted dtype, and
// the kernel's output is allclose (case rtol/atol) to the golden: the basic-op reference (same mode).
#include <string>

#include "cases/inputs.hpp"
#include "cases/runner.hpp"
#include "opgym/error.hpp"
#include "opgym/rms_norm.hpp"

namespace opgym {

cases::CaseResult run_rms_norm_case(const cases::Case& c, const cases::CaseFile& file, const cases::RunOptions& opt) {
  using namespace cases;
  const TensorSpec* w = c.input("weight");
  if (!w) w = c.input("gamma");
  const TensorSpec* x = nullptr;
  int x_index = -1, w_index = -1;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (&c.inputs[i] == w) w_index = static_cast<int>(i);
    else if (!x) { x = &c.inputs[i]; x_index = static_cast<int>(i); }
  }
  if (!x) case_error(file, c, "no input tensor for x (e.g. 'hidden_states')");
  if (!w) case_error(file, c, "no input tensor named 'weight' or 'gamma'");
  const double eps = c.number_param("eps", file.path);

  CaseResult r;
  r.id = c.id;
  r.shape = x->shape_str();
  r.dtype = std::string(dtype_name(x->dtype)) + (w->dtype != x->dtype ? "/w:" + std::string(dtype_name(w->dtype)) : "");
  if (c.outputs.size() != 1) case_error(file, c, "expected exactly one output tensor, found " + std::to_string(c.outputs.size()));
  const TensorSpec& declared = c.outputs[0];
  const DType out_dtype = rms_norm_out_dtype(x->dtype, w->dtype);

  const int64_t n = x->numel();
  check_budget(n * static_cast<int64_t>(dtype_size(x->dtype) + 2 * dtype_size(out_dtype) + 16) + w->numel() * 8, file, c, opt);

  Buffer xb = make_normal(*x, c.seed, x_index);
  Buffer wb = make_normal(*w, c.seed, w_index);
  Buffer got = make_buffer(x->shape, out_dtype), want = make_buffer(x->shape, out_dtype);
  RmsNormOptions o;
  o.eps = eps;
  o.mode = opt.mode;
  rms_norm(xb.view(), wb.view(), got.view(), o, opt.executor);
  reference::rms_norm_basic_ops(xb.view(), wb.view(), want.view(), o);
  r.metrics = compare(got, want, c.rtol, c.atol);

  r.pass = r.metrics.allclose();
  if (declared.shape != x->shape) {
    r.pass = false;
    r.note = "declared output shape " + declared.shape_str() + " != " + x->shape_str();
  } else if (declared.dtype != out_dtype) {
    r.pass = false;
    r.note = std::string("declared output dtype ") + dtype_name(declared.dtype) + " != " + dtype_name(out_dtype) +
             " (torch's promotion of weight and x)";
  } else if (!r.pass) {
    r.note = std::to_string(r.metrics.not_close) + " elements outside rtol " + std::to_string(c.rtol) + ", atol " +
             std::to_string(c.atol);
  }
  return r;
}

}  // namespace opgym
