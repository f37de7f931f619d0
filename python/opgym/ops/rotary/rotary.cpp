// opgym::rotary's CPU kernels on torch's stable ABI (built into opgym/_stable.so; src/ops/rotary is the
// core). Schemas, fake kernels and autograd rules: meta.py beside this file. CUDA kernels: rotary_cuda.cpp
// (per-torch library, its checks in rotary.hpp).
//
//   opgym::rotary(Tensor q, Tensor k, Tensor cos, Tensor sin, int unsqueeze_dim=1, str mode="hf",
//                 int[]? mrope_section=None, str pairs="half", bool pair_table=False,
//                 bool contiguous=False) -> (Tensor q_embed, Tensor k_embed)
//   opgym::rotary_(Tensor(a!) q, Tensor(b!) k, Tensor cos, Tensor sin, int unsqueeze_dim=1,
//                  str rotary_mode="hf", int[]? mrope_section=None, str pairs="half",
//                  bool pair_table=False) -> ()
//
// cos and sin are HF's tables before its unsqueeze ([B, S, R] for the text path with unsqueeze_dim 1,
// [S, R] for the vision path with -2; [3, ...] with mrope_section; R / 2 wide with pair_table); a
// rotary dim R below q's last dim rotates the first R dims and copies the rest. mode "hf" is
// apply_rotary_pos_emb's bf16/fp16 sequence, "fp32" the upcast of apply_rotary_pos_emb_vision and
// its kin; pairs "half" (rotate_half), "interleaved" (adjacent pairs), "deinterleave" (adjacent pairs
// in, halves out: DeepSeek-V3). The functional outputs have q's and k's layout where torch's
// elementwise ops would keep it (empty_like), or are contiguous with `contiguous` (what HF's
// torch.cat gives), so downstream ops see the strides HF's code gives them.
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "csrc/stable.hpp"
#include "opgym/opgym.hpp"

namespace {

using namespace opgym_stable;  // NOLINT(google-build-using-namespace): the shared helpers
using Section = std::optional<std::vector<int64_t>>;

std::string section_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

// Checks that need no data; the core checks the rest (broadcast, overlap) before writing anything.
void check_rotary(const Tensor& q, const Tensor& k, const Tensor& cos, const Tensor& sin, const std::string& mode,
                  const Section& mrope_section, const std::string& pairs, const char* op) {
  check_tensor_arg(q, "q", op);
  check_tensor_arg(k, "k", op);
  check_tensor_arg(cos, "cos", op);
  check_tensor_arg(sin, "sin", op);
  OPGYM_CHECK_VALUE(mode == "hf" || mode == "fp32", "opgym::", op, ": mode must be 'hf' or 'fp32', got '", mode, "'");
  OPGYM_CHECK_VALUE(pairs == "half" || pairs == "interleaved" || pairs == "deinterleave", "opgym::", op,
                    ": pairs must be 'half', 'interleaved' or 'deinterleave', got '", pairs, "'");
  OPGYM_CHECK_VALUE(k.scalar_type() == q.scalar_type(), "opgym::", op, ": k must have q's dtype ",
                    dtype_name(q.scalar_type()), ", got ", dtype_name(k.scalar_type()));
  OPGYM_CHECK_VALUE(q.dim() >= 2 && q.dim() <= opgym::kMaxRank && k.dim() == q.dim(), "opgym::", op,
                    ": q and k must have one rank from 2 to ", opgym::kMaxRank, ", got ", sizes_of(q), " and ",
                    sizes_of(k));
  if (mode == "hf")
    OPGYM_CHECK_VALUE(cos.scalar_type() == q.scalar_type() && sin.scalar_type() == q.scalar_type(), "opgym::", op,
                      ": mode hf computes in q's dtype: cos and sin must be ", dtype_name(q.scalar_type()), ", got ",
                      dtype_name(cos.scalar_type()), " and ", dtype_name(sin.scalar_type()));
  if (mrope_section.has_value())
    OPGYM_CHECK_VALUE(mrope_section->size() == 3, "opgym::", op, ": mrope_section must hold three lengths, got ",
                      section_text(*mrope_section));
  OPGYM_CHECK_VALUE(k.size(-1) == q.size(-1), "opgym::", op, ": k must have q's last dim ", q.size(-1), ", got ",
                    sizes_of(k));
  check_device(k, "k", q, "q", op);
  check_device(cos, "cos", q, "q", op);
  check_device(sin, "sin", q, "q", op);
}

opgym::RotaryOptions options(int64_t unsqueeze_dim, const std::string& mode, const Section& mrope_section,
                             const std::string& pairs, bool pair_table) {
  opgym::RotaryOptions o;
  o.mode = opgym::parse_rotary_mode(mode);
  o.pairs = opgym::parse_rotary_pairs(pairs);
  o.pair_table = pair_table;
  OPGYM_CHECK_VALUE(unsqueeze_dim >= -opgym::kMaxRank && unsqueeze_dim < opgym::kMaxRank,
                    "opgym::rotary: unsqueeze_dim out of range, got ", unsqueeze_dim);
  o.unsqueeze_dim = static_cast<int>(unsqueeze_dim);
  if (mrope_section.has_value())
    for (int i = 0; i < 3; ++i) o.mrope_section[i] = (*mrope_section)[i];
  return o;
}

// q's and k's own layout (empty_like: what HF's elementwise ops give), or fresh contiguous tensors
// (what HF's torch.cat gives: the partial and deinterleaving forms).
Tensor rotary_output(const Tensor& x, bool contiguous) {
  return contiguous ? torch::stable::empty(x.sizes(), x.scalar_type(), std::nullopt, x.device())
                    : torch::stable::empty_like(x);
}

std::tuple<Tensor, Tensor> rotary_cpu(Tensor q, Tensor k, Tensor cos, Tensor sin, int64_t unsqueeze_dim,
                                      std::string mode, Section mrope_section, std::string pairs, bool pair_table,
                                      bool contiguous) {
  check_rotary(q, k, cos, sin, mode, mrope_section, pairs, "rotary");
  Tensor qo = rotary_output(q, contiguous), ko = rotary_output(k, contiguous);
  translate_errors("rotary", [&] {
    opgym::rotary(view_of(q), view_of(k), view_of(cos), view_of(sin), view_of(qo), view_of(ko),
                  options(unsqueeze_dim, mode, mrope_section, pairs, pair_table), &executor());
  });
  return {qo, ko};
}

void rotary_inplace_cpu(Tensor q, Tensor k, Tensor cos, Tensor sin, int64_t unsqueeze_dim, std::string mode,
                        Section mrope_section, std::string pairs, bool pair_table) {
  check_rotary(q, k, cos, sin, mode, mrope_section, pairs, "rotary_");
  translate_errors("rotary_", [&] {
    opgym::rotary(view_of(q), view_of(k), view_of(cos), view_of(sin), view_of(q), view_of(k),
                  options(unsqueeze_dim, mode, mrope_section, pairs, pair_table), &executor());
  });
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(opgym, CPU, m) {
  m.impl("rotary", TORCH_BOX(&rotary_cpu));
  m.impl("rotary_", TORCH_BOX(&rotary_inplace_cpu));
}
