// add_rms_norm's case runner: which inputs play which role in a gym-format case, and how a case passes.
//   x         the first tensor input not named residual/weight/gamma ("x" or "hidden_states")
//   residual  the tensor input named "residual"
//   weight    the tensor input named "weight" or "gamma"
//   eps       a number or {"value": number}
// Two declared outputs: the one whose name holds "residual" or "sum" is the sum (x's dtype), the
// other the normalized output (torch's promotion of weight and x). A case passes when both are
// declared with x's shape and those dtypes, and both of the kernel's outputs are allclose (case
// rtol/atol) to the golden's; the figures printed are over both outputs together.
#include <string>

#include "cases/inputs.hpp"
#include "cases/runner.hpp"
#include "opgym/add_rms_norm.hpp"
#include "opgym/error.hpp"

namespace opgym {


cases::CaseResult run_add_rms_norm_case(const cases::Case& c, const cases::CaseFile& file, const cases::RunOptions& opt) {
  using namespace cases;
  const TensorSpec* w = c.input("weight");
  if (!w) w = c.input("gamma");
  const TensorSpec* res = c.input("residual");
  const TensorSpec* x = nullptr;
  int xi = -1, ri = -1, wi = -1;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (&c.inputs[i] == w) wi = static_cast<int>(i);
    else if (&c.inputs[i] == res) ri = static_cast<int>(i);
    else if (!x) { x = &c.inputs[i]; xi = static_cast<int>(i); }
  }
  if (!x) case_error(file, c, "no input tensor for x (e.g. 'hidden_states')");
  if (!res) case_error(file, c, "no input tensor named 'residual'");
  if (!w) case_error(file, c, "no input tensor named 'weight' or 'gamma'");
  const double eps = c.number_param("eps", file.path);
  if (c.outputs.size() != 2)
    case_error(file, c, "expected two output tensors (the normalized output and the sum), found " + std::to_string(c.outputs.size()));
  const TensorSpec* sum_decl = nullptr;
  const TensorSpec* out_decl = nullptr;
  for (const TensorSpec& o : c.outputs)
    (o.name.find("residual") != std::string::npos || o.name.find("sum") != std::string::npos ? sum_decl : out_decl) = &o;
  if (!sum_decl || !out_decl) case_error(file, c, "one output must be named like 'residual' or 'sum' and the other not");

  CaseResult r;
  r.id = c.id;
  r.shape = x->shape_str();
  r.dtype = std::string(dtype_name(x->dtype)) + (w->dtype != x->dtype ? "/w:" + std::string(dtype_name(w->dtype)) : "");
  const DType out_dtype = rms_norm_out_dtype(x->dtype, w->dtype);
  const int64_t n = x->numel();
  check_budget(n * static_cast<int64_t>(2 * dtype_size(x->dtype) + 2 * dtype_size(out_dtype) + 2 * dtype_size(x->dtype) + 16) +
                   w->numel() * 8,
               file, c, opt);

  Buffer xb = make_normal(*x, c.seed, xi);
  Buffer rb = make_normal(*res, c.seed, ri);
  Buffer wb = make_normal(*w, c.seed, wi);
  Buffer got = make_buffer(x->shape, out_dtype), want = make_buffer(x->shape, out_dtype);
  Buffer got_sum = make_buffer(x->shape, x->dtype), want_sum = make_buffer(x->shape, x->dtype);
  RmsNormOptions o;
  o.eps = eps;
  o.mode = opt.mode;
  // Raises the named error for a residual of another shape or dtype (the case then fails with it).
  add_rms_norm(xb.view(), rb.view(), wb.view(), got.view(), got_sum.view(), o, opt.executor);
  reference::add_rms_norm_basic_ops(xb.view(), rb.view(), wb.view(), want.view(), want_sum.view(), o);
  r.metrics = merge(compare(got, want, c.rtol, c.atol), compare(got_sum, want_sum, c.rtol, c.atol));

  r.pass = r.metrics.allclose();
  auto declared_ok = [&](const TensorSpec& d, DType dt, const char* what) {
    if (d.shape != x->shape) {
      r.note = std::string("declared ") + what + " shape " + d.shape_str() + " != " + x->shape_str();
      return false;
    }
    if (d.dtype != dt) {
      r.note = std::string("declared ") + what + " dtype " + dtype_name(d.dtype) + " != " + dtype_name(dt);
      return false;
    }
    return true;
  };
  if (!declared_ok(*out_decl, out_dtype, "output") || !declared_ok(*sum_decl, x->dtype, "sum")) {
    r.pass = false;
  } else if (!r.pass) {
    r.note = std::to_string(r.metrics.not_close) + " elements outside rtol " + std::to_string(c.rtol) + ", atol " +
             std::to_string(c.atol);
  }
  return r;
}

}  // namespace opgym
