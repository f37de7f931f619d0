// CUDA kernels for opgym's torch operators (schemas and CPU/Meta kernels: torch_ops.cpp). Each call
// runs opgym::cuda::rms_norm on torch's current stream of x's device: no host synchronization, no
// allocation but the functional form's output (from torch's caching allocator, so CUDA graph capture
// and torch.compile(mode="reduce-overhead") work), no host-device copies. Argument checks and their
// messages are the CPU kernels'; errors from the core (opgym::Error) become ValueError.
//
// Built into opgym/_C.so only when the core has CUDA and torch was built with it (python/CMakeLists.txt).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cmath>
#include <exception>
#include <string>

#include "opgym/cuda.hpp"
#include "opgym/opgym.hpp"

namespace {

// ---- the checks of torch_ops.cpp (same messages; that file keeps its helpers private) -----------

opgym::DType to_opgym_dtype(at::ScalarType t, const char* name) {
  switch (t) {
    case at::kFloat: return opgym::DType::float32;
    case at::kHalf: return opgym::DType::float16;
    case at::kBFloat16: return opgym::DType::bfloat16;
    default:
      TORCH_CHECK_VALUE(false, "opgym::rms_norm: ", name, " has dtype ", t,
                        "; expected torch.float32, torch.float16 or torch.bfloat16");
  }
  return opgym::DType::float32;  // not reached
}

at::ScalarType to_aten_dtype(opgym::DType t) {
  switch (t) {
    case opgym::DType::float16: return at::kHalf;
    case opgym::DType::bfloat16: return at::kBFloat16;
    default: return at::kFloat;
  }
}

at::ScalarType check_common(const at::Tensor& x, const at::Tensor& weight, double eps, c10::string_view mode) {
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

void check_device(const at::Tensor& t, const char* name, const at::Device& want) {
  TORCH_CHECK(t.device() == want, "opgym::rms_norm: ", name, " is on ", t.device(), " but x is on ", want,
              "; every tensor must be on one device");
}

opgym::TensorView view_of(const at::Tensor& t) {
  return opgym::TensorView::strided(t.data_ptr(), to_opgym_dtype(t.scalar_type(), "tensor"), t.sizes().data(),
                                    t.strides().data(), static_cast<int>(t.dim()));
}

// Enqueues the kernel on the current stream of x's device. opgym::Error becomes a ValueError; a
// failed launch a RuntimeError naming the CUDA error.
void run_cuda(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& out, double eps, c10::string_view mode,
              bool weight_offset) {
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
  try {
    opgym::RmsNormOptions o;
    o.eps = eps;
    o.mode = opgym::parse_mode(std::string_view(mode.data(), mode.size()));
    o.weight_offset = weight_offset;
    opgym::cuda::rms_norm(view_of(x), view_of(weight), view_of(out), o, stream);
  } catch (const opgym::Error& e) {
    TORCH_CHECK_VALUE(false, "opgym::", e.what(), " [argument: ", e.argument(), "]");
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "opgym::rms_norm (cuda): ", e.what());
  }
}

// ---- CUDA ---------------------------------------------------------------------------------------

at::Tensor rms_norm_cuda(const at::Tensor& x, const at::Tensor& weight, double eps, c10::string_view mode,
                         bool weight_offset) {
  const at::ScalarType out_dtype = check_common(x, weight, eps, mode);
  check_device(weight, "weight", x.device());
  const c10::cuda::CUDAGuard guard(x.device());  // allocate on x's device
  at::Tensor out = at::empty(x.sizes(), x.options().dtype(out_dtype).memory_format(at::MemoryFormat::Contiguous));
  run_cuda(x, weight, out, eps, mode, weight_offset);
  return out;
}

at::Tensor& rms_norm_out_cuda(const at::Tensor& x, const at::Tensor& weight, double eps, c10::string_view mode,
                              bool weight_offset, at::Tensor& out) {
  const at::ScalarType out_dtype = check_common(x, weight, eps, mode);
  check_device(weight, "weight", x.device());
  check_device(out, "out", x.device());
  TORCH_CHECK_VALUE(out.scalar_type() == out_dtype, "opgym::rms_norm_out: out must have dtype ", out_dtype,
                    " (torch's promotion of weight ", weight.scalar_type(), " and x ", x.scalar_type(), "), got ",
                    out.scalar_type());
  TORCH_CHECK_VALUE(out.sizes() == x.sizes(), "opgym::rms_norm_out: out must have the shape of x ", x.sizes(), ", got ",
                    out.sizes());
  run_cuda(x, weight, out, eps, mode, weight_offset);
  return out;
}

at::Tensor& rms_norm_inplace_cuda(at::Tensor& x, const at::Tensor& weight, double eps, c10::string_view mode,
                                  bool weight_offset) {
  const at::ScalarType out_dtype = check_common(x, weight, eps, mode);
  check_device(weight, "weight", x.device());
  TORCH_CHECK_VALUE(out_dtype == x.scalar_type(), "opgym::rms_norm_: in place needs an output dtype equal to x's ",
                    x.scalar_type(), ", but weight ", weight.scalar_type(), " promotes it to ", out_dtype,
                    "; use opgym::rms_norm or rms_norm_out");
  run_cuda(x, weight, x, eps, mode, weight_offset);
  return x;
}

}  // namespace

TORCH_LIBRARY_IMPL(opgym, CUDA, m) {
  m.impl("rms_norm", &rms_norm_cuda);
  m.impl("rms_norm_out", &rms_norm_out_cuda);
  m.impl("rms_norm_", &rms_norm_inplace_cuda);
}
