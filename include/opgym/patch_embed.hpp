// patch_embed: a vision patch embedding (a Conv3d whose kernel equals its stride, no padding) as the GEMM it
// is, out[p][oc] = sum over k of x[p][k] * w[oc][k] (+ bias[oc]), with the reduction order and roundings of
// the convolution kernel torch runs on the CPU, bit for bit.
//
// Layout: K = in_channels * positions, each row of x and w in the Conv3d's memory order: k = ic * positions
// + pos, pos the kernel position (kd, kh, kw) flattened. HF's Qwen2_5_VisionPatchEmbed views its pixel rows
// as [P, 3, 2, 14, 14]: in_channels 3, positions 392, K 1176.
//
// The reduction, per output, is one of three forms (`PatchEmbedForm`), each what one of oneDNN's convolution
// kernels computes (src/ops/patch_embed/README.md has the evidence). The fp32 accumulator c starts at +0 and
// runs over pos = 0 .. positions-1 in order:
//   amx_tile   (bf16) one AMX TDPBF16PS per kernel position, K = in_channels padded to even with zeros:
//              e = x[ic0]*w[ic0], e = fma(x[ic2], w[ic2], e), ... (even channels, in order),
//              o = x[ic1]*w[ic1], o = fma(x[ic3], w[ic3], o), ... (odd channels), c = c + (e + o);
//              inputs denormal -> 0 (DAZ), every fp32 result denormal -> 0 (FTZ). oneDNN's
//              brg_conv_fwd:avx10_1_512_amx (bf16 on an AMX CPU, P >= 12 there).
//   dot_pairs  (bf16) VDPBF16PS per channel pair: for each pair (ic 2j, 2j+1): c = fma(x[2j+1], w[2j+1], c),
//              then c = fma(x[2j], w[2j], c) (the odd element first; a missing odd channel adds nothing);
//              DAZ and FTZ as above. oneDNN's jit_bf16 kernels (bf16 on an AMX CPU at P <= 11, and every P
//              on an AVX512-BF16 CPU without AMX).
//   fma_chain  (fp32, fp16, bf16) c = fma(x[ic], w[ic], c) over ic = 0 .. in_channels-1 in order, no flush
//              (x and w converted to fp32 exactly). oneDNN's jit:avx512_core (fp32) and brg_conv_fwd (fp16).
// Then, with a bias: c = c + bias[oc] in fp32 (rounded; no flush). Finally c is rounded to the dtype by round
// to nearest even; for amx_tile and dot_pairs as VCVTNEPS2BF16 does (a denormal fp32 becomes a zero of its
// sign), for fma_chain as torch's conversions (subnormals kept). NaN outputs are NaN (payload not part of the
// contract).
//
// Output rows are independent and each output is one sequential chain: the bits depend on neither the
// thread count nor the instruction set. Where the CPU has the instruction (AMX-BF16 with the kernel's
// permission to use the tile registers; AVX512-BF16) the kernel issues it; elsewhere it emulates it with
// fp32 FMAs under DAZ/FTZ (the same bits, slower). `patch_embed_amx_usable()` says which.
//
// The weight is packed once per weight (`patch_embed_pack`, a byte buffer with a header that the call
// checks) and used by every call: the tile/pair layouts for the bf16 forms, fp32 for fma_chain.
//
// No CUDA backend: the point of this op is the CPU convolution's own reduction order (a GPU's conv sums in
// cuDNN's order, which no CPU form here reproduces, and a GPU's GEMM is fast already).
#pragma once
#include <cstdint>
#include <string_view>

#include "opgym/parallel.hpp"
#include "opgym/tensor.hpp"

namespace opgym {

enum class PatchEmbedForm { amx_tile = 0, dot_pairs = 1, fma_chain = 2 };

const char* patch_embed_form_name(PatchEmbedForm form);
// "amx_tile", "dot_pairs" or "fma_chain"; throws opgym::Error naming `form` otherwise.
PatchEmbedForm parse_patch_embed_form(std::string_view name);
// Whether `form` is defined for `dtype` (amx_tile and dot_pairs: bfloat16 only).
bool patch_embed_form_supports(PatchEmbedForm form, DType dtype);

struct PatchEmbedOptions {
  // Use the CPU's own AMX / AVX512-BF16 instructions for amx_tile / dot_pairs where it has them (and the
  // active ISA is avx512). false: always the FMA emulation (the same bits; for tests and benchmarks).
  bool hardware = true;
};

// Bytes of the packed weight for `form`: a 64-byte header, then the values (amx_tile, dot_pairs: bf16
// [ceil(OC/32)*2][positions][pairs][16][2]; fma_chain: fp32 [ceil(OC/32)*2][positions][in_channels][16]).
// weight: [OC, K] (K = in_channels * positions), any row stride, last dim contiguous.
int64_t patch_embed_packed_bytes(const TensorView& weight, int64_t in_channels, PatchEmbedForm form);
// Packs weight into `packed` (packed_bytes must be patch_embed_packed_bytes(...); any alignment).
void patch_embed_pack(const TensorView& weight, int64_t in_channels, PatchEmbedForm form, void* packed,
                      int64_t packed_bytes);

// The packed weight's shape, read from its header (throws opgym::Error naming `packed` when it is not one).
struct PatchEmbedPackedInfo {
  PatchEmbedForm form;
  DType dtype;
  int64_t out_channels, in_channels, positions;
};
PatchEmbedPackedInfo patch_embed_packed_info(const void* packed, int64_t packed_bytes);

// out [P, OC] = the patch embedding of x [P, K] with the packed weight (its form) and an optional bias [OC]
// (nullptr: none). x, bias and out: the packed weight's dtype; rows of x and out any stride, last dims
// contiguous; out must not overlap x, bias or the packed bytes. Throws opgym::Error naming the argument;
// nothing is written on error.
void patch_embed(const TensorView& x, const void* packed, int64_t packed_bytes, const TensorView* bias,
                 const TensorView& out, const PatchEmbedOptions& options = {}, Executor* executor = nullptr);

// The same from the unpacked weight [OC, K] (packs into a temporary on every call).
void patch_embed_unpacked(const TensorView& x, const TensorView& weight, int64_t in_channels, const TensorView* bias,
                          const TensorView& out, PatchEmbedForm form, const PatchEmbedOptions& options = {},
                          Executor* executor = nullptr);

// Whether this process can run AMX tiles: the CPU has AMX-TILE and AMX-BF16, the OS enables the tile state,
// and Linux granted the permission (arch_prctl ARCH_REQ_XCOMP_PERM, asked once per process on first use;
// a refusal is remembered, never an error). The AMX form is emulated where this is false.
bool patch_embed_amx_usable();
// Whether the CPU has AVX512-BF16 (VDPBF16PS), which dot_pairs issues where present.
bool patch_embed_dot_bf16_usable();
// What the calls run here, e.g. "amx_tile: amx (tiles granted); dot_pairs: avx512_bf16; fma_chain: avx512".
const char* patch_embed_paths();

namespace reference {
// Golden: the form's arithmetic as written above, one output at a time from the unpacked weight, with
// explicit DAZ/FTZ (no MXCSR), std::fma, single-threaded. Same checks as the front.
void patch_embed_basic_ops(const TensorView& x, const TensorView& weight, int64_t in_channels, const TensorView* bias,
                           const TensorView& out, PatchEmbedForm form);
}  // namespace reference

}  // namespace opgym
