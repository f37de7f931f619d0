// patch_embed's amx_tile form on the CPU's own AMX tiles (compiled with -mamx-tile -mamx-bf16 besides the
// AVX-512 flags: src/ops/patch_embed/CMakeLists.txt). One TDPBF16PS per kernel position with K = ICP (the
// channels padded to even), the fp32 accumulators in four 16x16 tiles (2 row tiles x 2 channel tiles), as
// oneDNN's brgconv issues it. The front calls this only when patch_embed_amx_usable() (CPU, OS and the
// process's permission to use the tile data).
#include <immintrin.h>

#include <cstring>

#include "ops/patch_embed/kernel.hpp"

namespace opgym::detail {
namespace {
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
}  // namespace

// xs: bf16 [32][NPOS][ICP]; w: bf16 [2*b+h][NPOS][ICP/2][16][2] (the B tile of one position: ICP/2 rows of
// 16 channel pairs, 64 bytes each).
void patch_embed_rows_amx(const PatchEmbedJob& j, const uint16_t* xs, int nr, int64_t b0, int64_t b1, float* acc,
                          PeSink sink) {
  (void)nr;  // the tiles always run 32 rows (the scratch rows past nr are zeros)
  const int64_t npos = j.NPOS, icp = j.ICP;
  TileConfig cfg;
  for (int t = 0; t < 4; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;                          // C: 16 x 16 fp32
  for (int t = 4; t < 6; ++t) cfg.colsb[t] = static_cast<uint16_t>(icp * 2), cfg.rows[t] = 16;  // A: 16 x ICP bf16
  for (int t = 6; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = static_cast<uint8_t>(icp / 2);   // B: ICP/2 x 16 pairs
  _tile_loadconfig(&cfg);
  const int64_t half = npos * icp * 16, xr = npos * icp;
  const uint16_t* a0 = xs;
  const uint16_t* a1 = xs + 16 * xr;
  const long astride = static_cast<long>(xr * 2);
  for (int64_t b = b0; b < b1; ++b) {
    const uint16_t* w0 = static_cast<const uint16_t*>(j.w) + 2 * b * half;
    const uint16_t* w1 = w0 + half;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t p = 0; p < npos; ++p) {
      _tile_loadd(4, a0 + p * icp, astride);
      _tile_loadd(5, a1 + p * icp, astride);
      _tile_loadd(6, w0 + p * icp * 16, 64);
      _tile_loadd(7, w1 + p * icp * 16, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, acc, kPeOcBlock * 4);
    _tile_stored(1, acc + 16, kPeOcBlock * 4);
    _tile_stored(2, acc + 16 * kPeOcBlock, kPeOcBlock * 4);
    _tile_stored(3, acc + 16 * kPeOcBlock + 16, kPeOcBlock * 4);
    sink(b, acc);
  }
  _tile_release();
}
}  // namespace opgym::detail

namespace opgym::detail {
// The benchmark's floor (patch_embed_bench.cpp): the same product as a plain bf16 GEMM on the same tiles, 32 K
// elements per TDPBF16PS (K padded to a multiple of 32). Not the conv's bits; what AMX can do with this shape.
// a: bf16 [M][Kp] (M a multiple of 32), b: bf16 [N/16][Kp/2][16][2] (N a multiple of 32), c: fp32 [M][N].
void patch_embed_floor_gemm_amx(const uint16_t* a, const uint16_t* b, float* c, int64_t M, int64_t N, int64_t Kp,
                                int64_t m0, int64_t m1) {
  TileConfig cfg;
  for (int t = 0; t < 4; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  for (int t = 4; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  _tile_loadconfig(&cfg);
  (void)M;
  for (int64_t mb = m0; mb < m1; ++mb)
    for (int64_t nb = 0; nb < N / 32; ++nb) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      const uint16_t* a0 = a + mb * 32 * Kp;
      const uint16_t* b0 = b + (2 * nb) * Kp * 16;
      for (int64_t k = 0; k < Kp; k += 32) {
        _tile_loadd(4, a0 + k, Kp * 2);
        _tile_loadd(5, a0 + 16 * Kp + k, Kp * 2);
        _tile_loadd(6, b0 + k * 16, 64);
        _tile_loadd(7, b0 + Kp * 16 + k * 16, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      float* o = c + mb * 32 * N + nb * 32;
      _tile_stored(0, o, N * 4);
      _tile_stored(1, o + 16, N * 4);
      _tile_stored(2, o + 16 * N, N * 4);
      _tile_stored(3, o + 16 * N + 16, N * 4);
    }
  _tile_release();
}
}  // namespace opgym::detail
