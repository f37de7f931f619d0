// attn_softmax's case runner (op name "attn_softmax"), gym schema:
//   input  scores {shape [..., Sq, Sk], dtype}   generated N(0, 3^2): attention logits before the scaling
//          mask?  {shape, dtype}                 HF's mask, broadcast to scores (e.g. [B, 1, Sq, Sk]); filled as
//                                                HF builds it: 0 where attended, finfo(dtype).min elsewhere,
//                                                causal with the queries at the end of the keys
//          scale  number                         HF's `scaling` (head_dim ** -0.5)
//          cu_seqlens? [0, ..., P]               the segmented form (vision windows): no mask allowed
//          block_diagonal? bool                  segments at their own columns (W = P) instead of packed
//          torch_isa? "avx512" | "avx2" | "scalar"  torch's build to reproduce (default: the active ISA)
//   output out {shape = scores', dtype}
// Kernel vs golden; opgym's files set rtol = atol = 0 (the contract is bit for bit; NaN == NaN).
#include <cstring>
#include <string>
#include <vector>

#include "cases/inputs.hpp"
#include "cases/runner.hpp"
#include "core/storage.hpp"
#include "opgym/attn_softmax.hpp"
#include "opgym/error.hpp"

namespace opgym {

cases::CaseResult run_attn_softmax_case(const cases::Case& c, const cases::CaseFile& file, const cases::RunOptions& opt) {
  using namespace cases;
  const TensorSpec* s = c.input("scores");
  const TensorSpec* m = c.input("mask");
  if (!s) case_error(file, c, "needs input scores");
  if (s->shape.empty()) case_error(file, c, "scores must have a last dim");

  AttnSoftmaxOptions o;
  std::vector<int64_t> cu;
  bool diag = false;
  try {
    o.scale = static_cast<float>(c.number_param("scale", file.path));
    if (c.params.contains("cu_seqlens")) {
      if (!is_integer_list(c.params.at("cu_seqlens"))) case_error(file, c, "cu_seqlens must be a list of integers");
      cu = c.params.at("cu_seqlens").get<std::vector<int64_t>>();
    }
    if (c.params.contains("block_diagonal")) diag = c.params.at("block_diagonal").get<bool>();
    if (c.params.contains("torch_isa")) o.torch_isa = parse_isa(c.params.at("torch_isa").get<std::string>());
  } catch (const Json::exception& e) {
    case_error(file, c, std::string("bad param: ") + e.what());
  }
  if (opt.isa && !o.torch_isa) o.torch_isa = *opt.isa;

  CaseResult r;
  r.id = c.id;
  r.shape = "scores " + s->shape_str() + (m ? " mask " + m->shape_str() : "") +
            (cu.empty() ? "" : " segments " + std::to_string(cu.size() - 1) + (diag ? " diagonal" : " packed"));
  r.dtype = dtype_name(s->dtype);
  check_budget(s->numel() * static_cast<int64_t>(3 * dtype_size(s->dtype) + 16), file, c, opt);

  Buffer bs = make_normal(*s, c.seed, 0, 0.0, 3.0), bm;
  TensorView mv;
  if (m) {
    if (m->shape.size() < 2) case_error(file, c, "mask must be [..., Sq, Sk]");
    bm = make_buffer(m->shape, m->dtype);
    const int64_t Sq = m->shape[m->shape.size() - 2], Sk = m->shape.back(), n = bm.numel();
    const float lowest = m->dtype == DType::bfloat16 ? bf16_to_f32(0xff7f)
                         : m->dtype == DType::float16 ? -65504.0f
                                                      : -3.4028234663852886e38f;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t q = i / Sk % Sq, k = i % Sk;
      store_from_f32(m->dtype, bm.bytes.data(), i, k > Sk - Sq + q ? lowest : 0.0f);
    }
    mv = bm.view();
    o.mask = &mv;
  }
  Buffer got = make_buffer(s->shape, s->dtype), want = make_buffer(s->shape, s->dtype);
  if (cu.empty()) {
    attn_softmax(bs.view(), got.view(), o, opt.executor);
    reference::attn_softmax_basic_ops(bs.view(), want.view(), o);
  } else {
    const int64_t segs = static_cast<int64_t>(cu.size()) - 1;
    attn_softmax_segments(bs.view(), got.view(), cu.data(), segs, diag, o, opt.executor);
    reference::attn_softmax_segments_basic_ops(bs.view(), want.view(), cu.data(), segs, diag, o);
  }
  r.metrics = compare(got, want, c.rtol, c.atol);
  r.pass = r.metrics.allclose();
  const TensorSpec* declared = c.outputs.empty() ? nullptr : &c.outputs.front();
  if (declared && (declared->shape != s->shape || declared->dtype != s->dtype)) {
    r.pass = false;
    r.note = "declared output " + declared->shape_str() + " " + dtype_name(declared->dtype) + " is not scores' " +
             s->shape_str() + " " + dtype_name(s->dtype);
  } else if (!r.pass) {
    r.note = std::to_string(r.metrics.not_close) + " elements outside rtol " + std::to_string(c.rtol) + ", atol " +
             std::to_string(c.atol);
  }
  return r;
}

}  // namespace opgym
