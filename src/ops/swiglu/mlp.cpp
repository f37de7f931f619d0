// swiglu_mlp: the SwiGLU MLP in the torch-free core. The GEMMs are oneDNN's matmul (bf16 and fp32
// operands as they are, fp16 widened to fp32; fp32 accumulation and an fp32 result, as torch's CPU
// Linear, which is oneDNN too; where the system's oneDNN has no bf16 matmul for the CPU, bf16 is widened
// to fp32 like fp16), each
// Linear's bias added to the fp32 result and one rounding to the dtype; the activation is swiglu's
// kernel on the rounded gate and up (torch's roundings). A merged gate|up weight (w_up the second half
// of w_gate's buffer) is one GEMM of 2 * I columns.
// The golden (reference::swiglu_mlp_basic_ops) runs separate fp32 matmuls on widened inputs and the
// golden activation: the same math by another path (its GEMM sums in another order, so the two agree
// within a few ulp, which the case files' tolerances hold).
#include <algorithm>
#include <string>
#include <vector>

#include "core/checks.hpp"
#include "core/storage.hpp"
#include "opgym/swiglu.hpp"
#include "ops/swiglu/kernel.hpp"

#if OPGYM_HAVE_BLAS
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace opgym {

namespace {
constexpr const char* kOp = "swiglu_mlp";

Error err(const char* arg, const std::string& what) { return Error(arg, std::string(kOp) + ": " + what); }

// A 2-D [rows, cols] view with contiguous rows; its row stride (elements).
int64_t matrix_ld(const TensorView& t, const char* name, int64_t rows, int64_t cols, const char* what) {
  if (t.rank != 2 || t.shape[0] != rows || t.shape[1] != cols)
    throw err(name, std::string(name) + " must be " + what + " [" + std::to_string(rows) + ", " + std::to_string(cols) +
                        "], got " + t.shape_str());
  if (rows > 1 && t.strides[0] < cols)
    throw err(name, std::string(name) + "'s rows must not overlap (row stride >= " + std::to_string(cols) + "), got " +
                        std::to_string(t.strides[0]));
  return rows <= 1 ? cols : t.strides[0];
}

struct Checked {
  int64_t T = 0, H = 0, I = 0, H_out = 0;
  int64_t ldx = 0, ldo = 0, ldg = 0, ldu = 0, ldd = 0;
  bool merged = false;
};

Checked check_mlp(const TensorView& x, const TensorView& w_gate, const TensorView& w_up, const TensorView& w_down,
                  const TensorView& out, const SwigluMlpBiases& b) {
  for (auto [t, n] : {std::pair{&x, "x"}, {&w_gate, "w_gate"}, {&w_up, "w_up"}, {&w_down, "w_down"}, {&out, "out"}})
    detail::check_view(*t, n, kOp);
  Checked c;
  c.H = x.last_dim();
  c.T = x.rows();
  const DType dt = x.dtype;
  for (auto [t, n] : {std::pair{&w_gate, "w_gate"}, {&w_up, "w_up"}, {&w_down, "w_down"}, {&out, "out"}})
    if (t->dtype != dt)
      throw err(n, std::string(n) + " must have x's dtype " + dtype_name(dt) + ", got " + dtype_name(t->dtype));
  if (w_gate.rank != 2) throw err("w_gate", "w_gate must be [I, H] (2-D), got " + w_gate.shape_str());
  c.I = w_gate.shape[0];
  if (w_gate.shape[1] != c.H)
    throw err("w_gate", "w_gate's in-features must equal x's last dim " + std::to_string(c.H) + ", got " +
                            w_gate.shape_str());
  c.ldg = matrix_ld(w_gate, "w_gate", c.I, c.H, "[I, H]");
  c.ldu = matrix_ld(w_up, "w_up", c.I, c.H, "w_gate's shape");
  if (w_down.rank != 2 || w_down.shape[1] != c.I)
    throw err("w_down", "w_down's in-features must equal I = " + std::to_string(c.I) + " (w_gate's rows), got " +
                            w_down.shape_str());
  c.H_out = w_down.shape[0];
  c.ldd = matrix_ld(w_down, "w_down", c.H_out, c.I, "[H_out, I]");
  TensorView expect = x;
  expect.shape[x.rank - 1] = c.H_out;
  if (out.rank != x.rank || !std::equal(expect.shape.begin(), expect.shape.begin() + x.rank, out.shape.begin()))
    throw err("out", "out must have the shape " + expect.shape_str() + " (x's with w_down's out-features), got " +
                         out.shape_str());
  auto bias = [&](const TensorView* t, const char* n, int64_t len) {
    if (!t) return;
    detail::check_view(*t, n, kOp);
    if (t->rank != 1 || t->shape[0] != len)
      throw err(n, std::string(n) + " must be [" + std::to_string(len) + "], got " + t->shape_str());
    if (t->dtype != dt)
      throw err(n, std::string(n) + " must have x's dtype " + dtype_name(dt) + ", got " + dtype_name(t->dtype));
  };
  bias(b.gate, "b_gate", c.I);
  bias(b.up, "b_up", c.I);
  bias(b.down, "b_down", c.H_out);
  // A GEMM's rows: the leading dims must collapse to one row stride, at least a row long.
  if (!detail::leading_collapse(x, c.ldx) || (c.T > 1 && c.ldx < c.H))
    throw err("x", "x's rows must be one stride >= its last dim apart (a GEMM's rows), got " + x.shape_str());
  if (!detail::leading_collapse(out, c.ldo) || (c.T > 1 && c.ldo < c.H_out))
    throw err("out", "out's rows must be one stride >= its last dim apart (a GEMM's rows), got " + out.shape_str());
  detail::check_no_self_overlap(out, "out", kOp);
  for (auto [t, n] : {std::pair{&x, "x"}, {&w_gate, "w_gate"}, {&w_up, "w_up"}, {&w_down, "w_down"}})
    detail::check_disjoint(*t, n, out, "out", kOp);
  for (auto [t, n] : {std::pair{b.gate, "b_gate"}, {b.up, "b_up"}, {b.down, "b_down"}})
    if (t) detail::check_disjoint(*t, n, out, "out", kOp);
  const int64_t es = static_cast<int64_t>(dtype_size(dt));
  c.merged = c.ldg == c.ldu && static_cast<const char*>(w_up.data) == static_cast<const char*>(w_gate.data) + c.I * c.ldg * es;
  const bool merged_bias = !b.gate == !b.up && (!b.gate || static_cast<const char*>(b.up->data) ==
                                                              static_cast<const char*>(b.gate->data) + c.I * es);
  c.merged = c.merged && merged_bias;
  return c;
}

#if OPGYM_HAVE_BLAS
// rows x cols of `src` (row stride ld) widened to a contiguous fp32 matrix.
std::vector<float> widen(DType t, const void* src, int64_t rows, int64_t cols, int64_t ld) {
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) w[r * cols + j] = load_as_f32(t, src, r * ld + j);
  return w;
}

// C[T, N] (fp32, contiguous) = A[T, K] B[N, K]^T, A and B of dtype t with row strides lda, ldb.
// `widened`: fp32 operands always (the golden's path); fp16 is always widened.
void gemm(DType t, const void* a, int64_t lda, const void* b, int64_t ldb, int64_t T, int64_t N, int64_t K, float* c,
          bool widened) {
  if (T == 0 || N == 0) return;
  using dt = dnnl::memory::data_type;
  std::vector<float> wa, wb;
  if (t == DType::float16 || (widened && t != DType::float32)) {
    wa = widen(t, a, T, K, lda), wb = widen(t, b, N, K, ldb);
    a = wa.data(), b = wb.data(), lda = K, ldb = K;
    t = DType::float32;
  }
  const dt in = t == DType::bfloat16 ? dt::bf16 : dt::f32;
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const dnnl::memory::desc a_md({T, K}, in, {lda, 1}), b_md({K, N}, in, {1, ldb}), c_md({T, N}, dt::f32, {N, 1});
  dnnl::matmul::primitive_desc pd;
  try {
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), engine);
  } catch (const dnnl::error&) {
    // The system's oneDNN has no bf16 matmul for this CPU (Debian's 2.6 needs AVX-512 for it): the same
    // products in fp32 (a bf16 times a bf16 is exact in fp32), summed in the fp32 kernel's order.
    if (in != dt::bf16) throw;
    gemm(t, a, lda, b, ldb, T, N, K, c, true);
    return;
  }
  dnnl::memory am(a_md, engine, const_cast<void*>(a)), bm(b_md, engine, const_cast<void*>(b)), cm(c_md, engine, c);
  dnnl::matmul(pd).execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
  stream.wait();
}
#endif

// dst[r * ldd + j] = round(c[r * N + j] + bias[j]) for j in [0, n): a Linear's epilogue.
void epilogue(DType t, const float* c, int64_t N, int64_t rows, int64_t n, const TensorView* bias, void* dst,
              int64_t ldd) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) {
      float v = c[r * N + j];
      if (bias) v += load_as_f32(t, bias->data, j);
      store_from_f32(t, dst, r * ldd + j, v);
    }
}

void mlp(const TensorView& x, const TensorView& w_gate, const TensorView& w_up, const TensorView& w_down,
         const TensorView& out, const SwigluMlpBiases& b, const SwigluOptions& opt, Executor* executor, bool golden) {
#if !OPGYM_HAVE_BLAS
  (void)x, (void)w_gate, (void)w_up, (void)w_down, (void)out, (void)b, (void)opt, (void)executor, (void)golden;
  throw Error("blas", "swiglu_mlp: opgym was built without oneDNN (install libdnnl-dev and rebuild)");
#else
  const Checked c = check_mlp(x, w_gate, w_up, w_down, out, b);
  if (c.T == 0 || c.H_out == 0) return;
  const DType dt = x.dtype;
  const int64_t es = static_cast<int64_t>(dtype_size(dt)), T = c.T, I = c.I;
  // gate | up, rounded to the dtype as HF's two Linear outputs: [T, 2I] of dtype.
  std::vector<unsigned char> gu(static_cast<size_t>(T * 2 * I * es));
  std::vector<float> acc;
  if (c.merged && !golden) {
    acc.resize(static_cast<size_t>(T * 2 * I));
    gemm(dt, x.data, c.ldx, w_gate.data, c.ldg, T, 2 * I, c.H, acc.data(), false);
    epilogue(dt, acc.data(), 2 * I, T, I, b.gate, gu.data(), 2 * I);
    epilogue(dt, acc.data() + I, 2 * I, T, I, b.up, gu.data() + I * es, 2 * I);
  } else {
    acc.resize(static_cast<size_t>(T * I));
    gemm(dt, x.data, c.ldx, w_gate.data, c.ldg, T, I, c.H, acc.data(), golden);
    epilogue(dt, acc.data(), I, T, I, b.gate, gu.data(), 2 * I);
    gemm(dt, x.data, c.ldx, w_up.data, c.ldu, T, I, c.H, acc.data(), golden);
    epilogue(dt, acc.data(), I, T, I, b.up, gu.data() + I * es, 2 * I);
  }
  std::vector<unsigned char> act(static_cast<size_t>(T * I * es));
  const int64_t gu_shape[2] = {T, 2 * I}, act_shape[2] = {T, I};
  const TensorView gate_up = TensorView::contiguous(gu.data(), dt, gu_shape, 2);
  const TensorView a = TensorView::contiguous(act.data(), dt, act_shape, 2);
  if (golden) {
    TensorView g, u;
    detail::split_gate_up(gate_up, a, g, u);
    reference::swiglu_basic_ops(g, u, a, opt);
  } else {
    swiglu_merged(gate_up, a, opt, executor);
  }
  acc.assign(static_cast<size_t>(T * c.H_out), 0.0f);
  gemm(dt, act.data(), I, w_down.data, c.ldd, T, c.H_out, I, acc.data(), golden);
  epilogue(dt, acc.data(), c.H_out, T, c.H_out, b.down, out.data, c.ldo);
#endif
}
}  // namespace

bool blas_available() { return OPGYM_HAVE_BLAS != 0; }

void swiglu_mlp(const TensorView& x, const TensorView& w_gate, const TensorView& w_up, const TensorView& w_down,
                const TensorView& out, const SwigluMlpBiases& biases, const SwigluOptions& options, Executor* executor) {
  mlp(x, w_gate, w_up, w_down, out, biases, options, executor, false);
}

namespace reference {
void swiglu_mlp_basic_ops(const TensorView& x, const TensorView& w_gate, const TensorView& w_up,
                          const TensorView& w_down, const TensorView& out, const SwigluMlpBiases& biases,
                          const SwigluOptions& options) {
  mlp(x, w_gate, w_up, w_down, out, biases, options, nullptr, true);
}
}  // namespace reference

}  // namespace opgym
