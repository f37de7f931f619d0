// What every op's torch binding shares (python/opgym/ops/<op>/<op>.cpp and <op>_cuda.cpp): dtype
// mapping, the checks that need no data (the Meta kernels use them too, so fake tensors raise what
// real ones do), error translation, torch's pool as the core's Executor, and TensorView from a Tensor.
// What one op's CPU and CUDA files share sits in that op's own header (python/opgym/ops/<op>/<op>.hpp).
#pragma once
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <exception>
#include <initializer_list>
#include <string_view>
#include <type_traits>
#include <vector>

#include "opgym/opgym.hpp"

namespace opgym_torch {

inline opgym::DType to_opgym_dtype(at::ScalarType t, const char* name, const char* op) {
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

// `t` (named `name`) has the sizes of `ref` (named `ref_name`): rank and every size.
inline void check_same_shape(const at::Tensor& t, const char* name, const at::Tensor& ref, const char* ref_name,
                             const char* op) {
  TORCH_CHECK_VALUE(t.dim() == ref.dim(), "opgym::", op, ": ", name, " must have the shape of ", ref_name, " ",
                    ref.sym_sizes(), ", got ", t.sym_sizes());
  for (int64_t d = 0; d < ref.dim(); ++d)
    OPGYM_SYM_CHECK_VALUE(t.sym_size(d).sym_eq(ref.sym_size(d)), "opgym::", op, ": ", name, " must have the shape of ",
                          ref_name, " ", ref.sym_sizes(), ", got ", t.sym_sizes());
}

// `t` (named `name`) is on the device of `ref` (named `ref_name`, the op's first tensor argument).
inline void check_device(const at::Tensor& t, const char* name, const at::Tensor& ref, const char* ref_name,
                         const char* op) {
  TORCH_CHECK(t.device() == ref.device(), "opgym::", op, ": ", name, " is on ", t.device(), " but ", ref_name, " is on ",
              ref.device(), "; every tensor must be on one device");
}

inline at::ScalarType to_aten_dtype(opgym::DType t) {
  switch (t) {
    case opgym::DType::float16: return at::kHalf;
    case opgym::DType::bfloat16: return at::kBFloat16;
    default: return at::kFloat;
  }
}

// A view of `t`, whose dtype its op has checked already.
inline opgym::TensorView view_of(const at::Tensor& t) {
  const int64_t rank = t.dim();
  return opgym::TensorView::strided(t.data_ptr(), to_opgym_dtype(t.scalar_type(), "tensor", "view_of"), t.sizes().data(),
                                    t.strides().data(), static_cast<int>(rank));
}

// Tags for an out= or in-place schema (`kind` "out" or "inplace"), pt2_compliant_tag included.
// at::Tag::out and at::Tag::inplace are missing from some torch releases (2.11 has neither): the
// tags are added where the enum has them, so one source builds against every supported torch.
template <class T, class = void>
struct HasOutTags : std::false_type {};
template <class T>
struct HasOutTags<T, std::void_t<decltype(T::out), decltype(T::inplace)>> : std::true_type {};

template <class T = at::Tag>
inline std::vector<at::Tag> tags_with(const char* kind) {
  std::vector<at::Tag> tags{T::pt2_compliant_tag};
  if constexpr (HasOutTags<T>::value) tags.push_back(std::string_view(kind) == "out" ? T::out : T::inplace);
  return tags;
}

}  // namespace opgym_torch
