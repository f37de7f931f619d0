// What the patch_embed front hands its per-ISA kernels: one validated call, the packed weight's values, and
// a block of up to 32 rows of x already packed position-major in a scratch buffer (pack_rows in the front):
//   bf16 forms on the CPU's own instructions: uint16 [32][positions][icp]  (icp = in_channels rounded up to
//                                              even, the pad channels 0)
//   every other path:                         float  [32][positions][icx]  (icx = icp for the bf16 forms,
//                                              in_channels for fma_chain)
// A kernel computes, for each 32-channel output block b in [b0, b1), the fp32 accumulators of the 32 rows
// (acc[32][32], row-major, before bias and rounding; rows >= nr are whatever the zero rows give) and hands
// them to `sink(b, acc)`, which adds the bias, rounds and stores (the front's epilogue).
#pragma once
#include <cstdint>

#include "opgym/parallel.hpp"
#include "opgym/patch_embed.hpp"

namespace opgym::detail {

constexpr int kPeRows = 32;      // rows per block (two AMX tiles of 16)
constexpr int kPeOcBlock = 32;   // output channels per block (two AMX tiles / two 16-lane vectors)
constexpr int kPeMaxAmxIc = 32;  // amx_tile: K per position fits one tile row (64 bytes of bf16)

struct PatchEmbedJob {
  PatchEmbedForm form = PatchEmbedForm::fma_chain;
  DType dtype = DType::float32;
  int64_t P = 0, OC = 0, IC = 0, NPOS = 0;
  int64_t ICP = 0;      // in_channels rounded up to even (bf16 forms), = IC for fma_chain
  int64_t OCB = 0;      // output blocks of 32 (OC rounded up)
  const void* w = nullptr;  // packed values: bf16 [OCB*2][NPOS][ICP/2][16][2] or fp32 [OCB*2][NPOS][IC][16]
  const char* x = nullptr;
  int64_t x_row = 0;    // elements between rows of x
  const char* bias = nullptr;
  char* out = nullptr;
  int64_t out_row = 0;
  bool hardware = true;  // issue the CPU's AMX / AVX512-BF16 instructions where they exist
};

// The checks of patch_embed_pack and patch_embed for an unpacked weight, plus out disjoint from weight (the
// golden's and patch_embed_unpacked's); false when there is nothing to compute.
bool check_patch_embed_unpacked(const TensorView& x, const TensorView& weight, int64_t in_channels,
                                const TensorView* bias, const TensorView& out, PatchEmbedForm form);

using PeSink = FunctionRef<void(int64_t block, const float* acc)>;

// fp32-scratch kernels (fma_chain on every ISA; amx_tile and dot_pairs emulated with FMAs under DAZ/FTZ).
void patch_embed_rows_scalar(const PatchEmbedJob& job, const float* xs, int nr, int64_t b0, int64_t b1, float* acc,
                             PeSink sink);
void patch_embed_rows_avx2(const PatchEmbedJob& job, const float* xs, int nr, int64_t b0, int64_t b1, float* acc,
                           PeSink sink);
void patch_embed_rows_avx512(const PatchEmbedJob& job, const float* xs, int nr, int64_t b0, int64_t b1, float* acc,
                             PeSink sink);
// bf16-scratch kernels on the CPU's own instructions: dot_pairs with VDPBF16PS (AVX512-BF16), amx_tile with
// TDPBF16PS (the caller has checked patch_embed_amx_usable()).
void patch_embed_rows_dpbf16(const PatchEmbedJob& job, const uint16_t* xs, int nr, int64_t b0, int64_t b1,
                             float* acc, PeSink sink);
void patch_embed_rows_amx(const PatchEmbedJob& job, const uint16_t* xs, int nr, int64_t b0, int64_t b1, float* acc,
                          PeSink sink);

// For the benchmark only: a plain bf16 GEMM on AMX tiles with 32-deep K steps (the hardware's floor for this
// product; not the conv's bits). a [M][Kp] bf16, b [N/16][Kp/2][16][2] bf16, c [M][N] fp32; row blocks of 32
// [m0, m1). Only where patch_embed_amx_usable().
void patch_embed_floor_gemm_amx(const uint16_t* a, const uint16_t* b, float* c, int64_t M, int64_t N, int64_t Kp,
                                int64_t m0, int64_t m1);

}  // namespace opgym::detail
