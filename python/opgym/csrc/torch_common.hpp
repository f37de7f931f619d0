// What opgym's CPU and CUDA torch kernels share: dtype mapping, the checks that need no data (the
// Meta kernels use them too, so fake tensors raise what real ones do), and TensorView from a Tensor.
#pragma once
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <exception>
#include <initializer_list>
#include <string_view>

#include "opgym/opgym.hpp"

namespace opgym_torch {

inline opgym::DType to_opgym_dtype(at::ScalarType t, const char* name, const char* op = "rms_norm") {
  switch (t) {
    case at::kFloat: return opgym::DType::float32;
    case at::kHalf: return opgym::DType::float16;
    case at::kBFloat16: return opgym::DType::bfloat16;
    default:
      TORCH_CHECK_VALUE(false, "opgym::", op, ": ", name, " has dtype ", t,
                        "; expected torch.float32, torch.float16 or torch.bfloat16");
  }
  return opgym::DType::float32;  // not reached
}

// Runs the core's row blocks on torch's intra-op pool, so torch.set_num_threads governs opgym too
// and a call made from inside a torch parallel region stays on its thread.
class AtenExecutor final : public opgym::Executor {
 public:
  int max_threads() const override { return at::in_parallel_region() ? 1 : at::get_num_threads(); }
  void parallel_for(int64_t n, int64_t grain, opgym::FunctionRef<void(int64_t, int64_t)> fn) override {
    at::parallel_for(0, n, grain, [&](int64_t b, int64_t e) { fn(b, e); });
  }
};

inline AtenExecutor& aten_executor() {
  static AtenExecutor ex;
  return ex;
}

// Runs fn (a core call); opgym::Error (which names the argument) becomes a ValueError, anything else
// a RuntimeError naming the op. Every operator's kernels go through it.
template <class Fn>
void translate_errors(const char* op, Fn&& fn) {
  try {
    fn();
  } catch (const opgym::Error& e) {
    TORCH_CHECK_VALUE(false, "opgym::", e.what(), " [argument: ", e.argument(), "]");
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "opgym::", op, ": ", e.what());
  }
}

// Tensor arguments every operator takes: defined, strided, one of opgym's dtypes.
inline opgym::DType check_tensor_arg(const at::Tensor& t, const char* name, const char* op) {
  TORCH_CHECK_VALUE(t.defined(), "opgym::", op, ": ", name, " is undefined");
  TORCH_CHECK_VALUE(t.layout() == at::kStrided, "opgym::", op, ": ", name, " must be a strided (dense) tensor, got layout ",
                    t.layout());
  return to_opgym_dtype(t.scalar_type(), name, op);
}

// Whether autograd would need a gradient through any of ts (grad mode on and one requires grad).
inline bool grad_needed(std::initializer_list<const at::Tensor*> ts) {
  if (!at::GradMode::is_enabled()) return false;
  for (const at::Tensor* t : ts)
    if (t->requires_grad()) return true;
  return false;
}

// A size check that is a ValueError on concrete sizes and a symbolic check (no guard) under
// torch.compile's symbolic shapes.
#define OPGYM_SYM_CHECK_VALUE(cond, ...)                          \
  do {                                                            \
    const c10::SymBool opgym_eq_ = (cond);                        \
    if (const auto opgym_known_ = opgym_eq_.maybe_as_bool()) {   \
      TORCH_CHECK_VALUE(*opgym_known_, __VA_ARGS__);              \
    } else {                                                      \
      TORCH_SYM_CHECK(opgym_eq_, __VA_ARGS__);                    \
    }                                                             \
  } while (0)

// `t` has the sizes of x (rank and every size).
inline void check_same_shape(const at::Tensor& x, const at::Tensor& t, const char* name, const char* op) {
  TORCH_CHECK_VALUE(t.dim() == x.dim(), "opgym::", op, ": ", name, " must have the shape of x ", x.sym_sizes(), ", got ",
                    t.sym_sizes());
  for (int64_t d = 0; d < x.dim(); ++d)
    OPGYM_SYM_CHECK_VALUE(t.sym_size(d).sym_eq(x.sym_size(d)), "opgym::", op, ": ", name, " must have the shape of x ",
                          x.sym_sizes(), ", got ", t.sym_sizes());
}

inline at::ScalarType to_aten_dtype(opgym::DType t) {
  switch (t) {
    case opgym::DType::float16: return at::kHalf;
    case opgym::DType::bfloat16: return at::kBFloat16;
    default: return at::kFloat;
  }
}

// Checks that need no data: layout, dtype, rank, weight's shape. Shared by the CPU and Meta kernels
// so fake tensors raise what real ones do. Returns the output dtype.
inline at::ScalarType check_common(const at::Tensor& x, const at::Tensor& weight, double eps, c10::string_view mode) {
  TORCH_CHECK_VALUE(x.defined(), "opgym::rms_norm: x is undefined");
  TORCH_CHECK_VALUE(weight.defined(), "opgym::rms_norm: weight is undefined");
  TORCH_CHECK_VALUE(x.layout() == at::kStrided, "opgym::rms_norm: x must be a strided (dense) tensor, got layout ", x.layout());
  TORCH_CHECK_VALUE(weight.layout() == at::kStrided, "opgym::rms_norm: weight must be a strided (dense) tensor, got layout ",
                    weight.layout());
  const opgym::DType xd = to_opgym_dtype(x.scalar_type(), "x");
  const opgym::DType wd = to_opgym_dtype(weight.scalar_type(), "weight");
  TORCH_CHECK_VALUE(x.dim() >= 1 && x.dim() <= opgym::kMaxRank, "opgym::rms_norm: x must have 1 to ", opgym::kMaxRank,
                    " dims, got ", x.dim());
  TORCH_CHECK_VALUE(weight.dim() == 1, "opgym::rms_norm: weight must be 1-D of size ", x.sym_size(-1),
                    " (the last dim of x), got shape ", weight.sym_sizes());
  TORCH_SYM_CHECK(weight.sym_size(0).sym_eq(x.sym_size(-1)), "opgym::rms_norm: weight must have shape [", x.sym_size(-1),
                  "] (the last dim of x), got ", weight.sym_sizes());
  TORCH_CHECK_VALUE(mode == "hf" || mode == "fp32", "opgym::rms_norm: mode must be 'hf' or 'fp32', got '", mode, "'");
  TORCH_CHECK_VALUE(std::isfinite(eps) && eps >= 0, "opgym::rms_norm: eps must be a finite number >= 0, got ", eps);
  return to_aten_dtype(opgym::rms_norm_out_dtype(xd, wd));
}

inline void check_device(const at::Tensor& t, const char* name, const at::Device& want, const char* op = "rms_norm") {
  TORCH_CHECK(t.device() == want, "opgym::", op, ": ", name, " is on ", t.device(), " but x is on ", want,
              "; every tensor must be on one device");
}

inline opgym::TensorView view_of(const at::Tensor& t) {
  const int64_t rank = t.dim();
  return opgym::TensorView::strided(t.data_ptr(), to_opgym_dtype(t.scalar_type(), "tensor"), t.sizes().data(),
                                    t.strides().data(), static_cast<int>(rank));
}

// The out form's checks beyond check_common (real and Meta kernels): device, the promoted dtype, x's shape.
inline void check_out(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& out, at::ScalarType out_dtype) {
  check_device(weight, "weight", x.device());
  check_device(out, "out", x.device());
  TORCH_CHECK_VALUE(out.scalar_type() == out_dtype, "opgym::rms_norm_out: out must have dtype ", out_dtype,
                    " (torch's promotion of weight ", weight.scalar_type(), " and x ", x.scalar_type(), "), got ",
                    out.scalar_type());
  check_same_shape(x, out, "out", "rms_norm_out");
}

// The in-place form's (real and Meta kernels): the output dtype must be x's own.
inline void check_in_place(const at::Tensor& x, const at::Tensor& weight, at::ScalarType out_dtype) {
  check_device(weight, "weight", x.device());
  TORCH_CHECK_VALUE(out_dtype == x.scalar_type(), "opgym::rms_norm_: in place needs an output dtype equal to x's ",
                    x.scalar_type(), ", but weight ", weight.scalar_type(), " promotes it to ", out_dtype,
                    "; use opgym::rms_norm or rms_norm_out");
}

}  // namespace opgym_torch
