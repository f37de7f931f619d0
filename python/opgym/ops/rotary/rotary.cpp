// opgym::rotary's CPU kernels on torch's stable ABI (built into opgym/_stable.so; src/ops/rotary is the
// core). Schemas, fake kernels and autograd rules: meta.py beside this file. CUDA kernels: rotary_cuda.cpp
// (opgym/_stable_cuda.so); both run the checks of rotary_stable.hpp.
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
#include "ops/rotary/rotary_stable.hpp"

namespace {

using namespace opgym_stable;  // NOLINT(google-build-using-namespace): the shared helpers
using Section = RotarySection;

std::tuple<Tensor, Tensor> rotary_cpu(Tensor q, Tensor k, Tensor cos, Tensor sin, int64_t unsqueeze_dim,
                                      std::string mode, Section mrope_section, std::string pairs, bool pair_table,
                                      bool contiguous) {
  check_rotary(q, k, cos, sin, mode, mrope_section, pairs, "rotary");
  Tensor qo = rotary_output(q, contiguous), ko = rotary_output(k, contiguous);
  translate_errors("rotary", [&] {
    opgym::rotary(view_of(q), view_of(k), view_of(cos), view_of(sin), view_of(qo), view_of(ko),
                  rotary_options(unsqueeze_dim, mode, mrope_section, pairs, pair_table), &executor());
  });
  return {qo, ko};
}

void rotary_inplace_cpu(Tensor q, Tensor k, Tensor cos, Tensor sin, int64_t unsqueeze_dim, std::string mode,
                        Section mrope_section, std::string pairs, bool pair_table) {
  check_rotary(q, k, cos, sin, mode, mrope_section, pairs, "rotary_");
  translate_errors("rotary_", [&] {
    opgym::rotary(view_of(q), view_of(k), view_of(cos), view_of(sin), view_of(q), view_of(k),
                  rotary_options(unsqueeze_dim, mode, mrope_section, pairs, pair_table), &executor());
  });
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(opgym, CPU, m) {
  m.impl("rotary", TORCH_BOX(&rotary_cpu));
  m.impl("rotary_", TORCH_BOX(&rotary_inplace_cpu));
}
