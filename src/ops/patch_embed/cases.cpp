// patch_embed's case runner (op name "patch_embed"), gym schema:
//   input  x      {shape [P, K], dtype}   pixel rows (HF's view [P, C, T, H, W] flattened), N(0, 1)
//          weight {shape [OC, K], dtype}  the Conv3d's weight flattened, N(0, 0.02^2)
//          bias?  {shape [OC], dtype}     N(0, 0.02^2)
//          in_channels  int               C (K = C * kernel positions)
//          form?  "amx_tile" | "dot_pairs" | "fma_chain"   default: amx_tile for bfloat16, fma_chain otherwise
//   output out {shape [P, OC], dtype}
// Kernel (the path the active ISA gives: the CPU's AMX / VDPBF16PS on avx512) vs golden, bit for bit (opgym's
// files set rtol = atol = 0). Rows are independent (no P enters an output's arithmetic), so above 32 rows both
// run on every s-th row only (s = ceil(P / 32); the note says so): the scalar golden of a 1024-patch page
// would take seconds per case.
#include <algorithm>
#include <string>
#include <vector>

#include "cases/inputs.hpp"
#include "cases/runner.hpp"
#include "opgym/error.hpp"
#include "opgym/patch_embed.hpp"

namespace opgym {

cases::CaseResult run_patch_embed_case(const cases::Case& c, const cases::CaseFile& file, const cases::RunOptions& opt) {
  using namespace cases;
  const TensorSpec* xs = c.input("x");
  const TensorSpec* ws = c.input("weight");
  const TensorSpec* bs = c.input("bias");
  if (!xs || !ws) case_error(file, c, "needs inputs x and weight");
  if (xs->shape.size() != 2 || ws->shape.size() != 2) case_error(file, c, "x must be [P, K] and weight [OC, K]");
  int64_t ic = 0;
  PatchEmbedForm form = xs->dtype == DType::bfloat16 ? PatchEmbedForm::amx_tile : PatchEmbedForm::fma_chain;
  try {
    ic = static_cast<int64_t>(c.number_param("in_channels", file.path));
    if (c.params.contains("form")) form = parse_patch_embed_form(c.params.at("form").get<std::string>());
  } catch (const Json::exception& e) {
    case_error(file, c, std::string("bad param: ") + e.what());
  }
  const int64_t P = xs->shape[0], K = xs->shape[1], OC = ws->shape[0];
  CaseResult r;
  r.id = c.id;
  r.shape = "x " + xs->shape_str() + " weight " + ws->shape_str() + (bs ? " bias" : "") + " in_channels " +
            std::to_string(ic) + " " + patch_embed_form_name(form);
  r.dtype = dtype_name(xs->dtype);
  check_budget((P * K + OC * K * 3 + 2 * P * OC) * static_cast<int64_t>(dtype_size(xs->dtype)) + OC * K * 4, file, c,
               opt);

  Buffer x = make_normal(*xs, c.seed, 0, 0.0, 1.0), w = make_normal(*ws, c.seed, 1, 0.0, 0.02);
  Buffer b = bs ? make_normal(*bs, c.seed, 2, 0.0, 0.02) : Buffer{};
  const int64_t step = std::max<int64_t>(1, (P + 31) / 32), rows = (P + step - 1) / step;
  const int64_t xshape[2] = {rows, K}, xstride[2] = {step * K, 1};
  const TensorView xv = TensorView::strided(x.bytes.data(), x.dtype, xshape, xstride, 2);
  TensorView bv;
  if (bs) bv = b.view();
  Buffer got = make_buffer({rows, OC}, xs->dtype), want = make_buffer({rows, OC}, xs->dtype);
  patch_embed_unpacked(xv, w.view(), ic, bs ? &bv : nullptr, got.view(), form, {}, opt.executor);
  reference::patch_embed_basic_ops(xv, w.view(), ic, bs ? &bv : nullptr, want.view(), form);
  r.metrics = compare(got, want, c.rtol, c.atol);
  r.pass = r.metrics.allclose();
  const TensorSpec* declared = c.outputs.empty() ? nullptr : &c.outputs.front();
  if (declared && (declared->shape != std::vector<int64_t>{P, OC} || declared->dtype != xs->dtype)) {
    r.pass = false;
    r.note = "declared output " + declared->shape_str() + " " + dtype_name(declared->dtype) + " is not [" +
             std::to_string(P) + ", " + std::to_string(OC) + "] " + dtype_name(xs->dtype);
  } else if (!r.pass) {
    r.note = std::to_string(r.metrics.not_close) + " outputs outside rtol " + std::to_string(c.rtol) + ", atol " +
             std::to_string(c.atol);
  } else if (step > 1) {
    r.note = "rows 0, " + std::to_string(step) + ", 2*" + std::to_string(step) + ", ... (" + std::to_string(rows) +
             " of " + std::to_string(P) + "; rows are independent)";
  }
  return r;
}

}  // namespace opgym
