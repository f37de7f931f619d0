// What every op's stable-ABI binding shares (python/opgym/ops/<op>/<op>.cpp, the CPU kernels built into
// opgym/_stable.so, and <op>_cuda.cpp, the CUDA kernels built into opgym/_stable_cuda.so with
// csrc/stable_cuda.hpp), against torch's stable C API only: torch/csrc/stable, torch/headeronly; no ATen,
// no c10 symbols, so one compile loads in every torch from OPGYM_TORCH_FLOOR on. Dtype mapping, argument
// checks with messages that name the argument, error translation (std::invalid_argument is a ValueError
// in Python, std::runtime_error a RuntimeError), TensorView from a Tensor, a torch operator called through
// the dispatcher; for the CPU kernels torch's pool as the core's Executor and pooled outputs. Schemas,
// fake kernels and autograd rules are Python (python/opgym/ops/<op>/meta.py): the stable C API registers
// kernels, not those.
#pragma once
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "opgym/opgym.hpp"

// torch's headers from 2.13 on define it (for a target below 2.13 as TORCH_ERROR_CODE_CHECK); 2.11's and
// 2.12's lack it: the same definition, so the libraries also build against the floor's own headers.
#ifndef STABLE_TORCH_ERROR_CODE_CHECK
#define STABLE_TORCH_ERROR_CODE_CHECK(call) TORCH_ERROR_CODE_CHECK(call)
#endif

namespace opgym_stable {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

// Sizes printed as torch prints them: [2, 3].
struct Sizes {
  torch::headeronly::IntHeaderOnlyArrayRef s;
};
inline std::ostream& operator<<(std::ostream& o, Sizes v) {
  o << '[';
  for (size_t i = 0; i < v.s.size(); ++i) o << (i ? ", " : "") << v.s[i];
  return o << ']';
}
inline Sizes sizes_of(const Tensor& t) { return {t.sizes()}; }

template <class... A>
std::string cat(const A&... a) {
  std::ostringstream s;
  (s << ... << a);
  return s.str();
}
// A bad value: ValueError in Python.
template <class... A>
[[noreturn]] void value_error(const A&... a) {
  throw std::invalid_argument(cat(a...));
}
// Anything else (a device mismatch, a missing kernel): RuntimeError in Python.
template <class... A>
[[noreturn]] void runtime_error(const A&... a) {
  throw std::runtime_error(cat(a...));
}
#define OPGYM_CHECK_VALUE(cond, ...) \
  do {                               \
    if (!(cond)) ::opgym_stable::value_error(__VA_ARGS__); \
  } while (0)
#define OPGYM_CHECK(cond, ...) \
  do {                         \
    if (!(cond)) ::opgym_stable::runtime_error(__VA_ARGS__); \
  } while (0)

inline const char* dtype_name(ScalarType t) { return torch::headeronly::toString(t); }

inline opgym::DType to_opgym_dtype(ScalarType t, const char* name, const char* op) {
  switch (t) {
    case ScalarType::Float: return opgym::DType::float32;
    case ScalarType::Half: return opgym::DType::float16;
    case ScalarType::BFloat16: return opgym::DType::bfloat16;
    default:
      value_error("opgym::", op, ": ", name, " has dtype ", dtype_name(t),
                  "; expected torch.float32, torch.float16 or torch.bfloat16");
  }
}

inline ScalarType to_torch_dtype(opgym::DType t) {
  switch (t) {
    case opgym::DType::float16: return ScalarType::Half;
    case opgym::DType::bfloat16: return ScalarType::BFloat16;
    default: return ScalarType::Float;
  }
}

// Runs the core's row blocks on torch's intra-op pool, so torch.set_num_threads governs opgym too.
class StableExecutor final : public opgym::Executor {
 public:
  int max_threads() const override { return static_cast<int>(torch::stable::get_num_threads()); }
  void parallel_for(int64_t n, int64_t grain, opgym::FunctionRef<void(int64_t, int64_t)> fn) override {
    torch::stable::parallel_for(0, n, grain, [&](int64_t b, int64_t e) { fn(b, e); });
  }
};
inline StableExecutor& executor() {
  static StableExecutor ex;
  return ex;
}

// Runs fn (a core call); opgym::Error (which names the argument) becomes a ValueError, anything else
// a RuntimeError naming the op.
template <class Fn>
void translate_errors(const char* op, Fn&& fn) {
  try {
    fn();
  } catch (const opgym::Error& e) {
    value_error("opgym::", e.what(), " [argument: ", e.argument(), "]");
  } catch (const std::invalid_argument&) {
    throw;
  } catch (const std::runtime_error&) {
    throw;
  } catch (const std::exception& e) {
    runtime_error("opgym::", op, ": ", e.what());
  }
}

// Tensor arguments every operator takes: defined, strided, one of opgym's dtypes.
inline opgym::DType check_tensor_arg(const Tensor& t, const char* name, const char* op) {
  OPGYM_CHECK_VALUE(t.defined(), "opgym::", op, ": ", name, " is undefined");
  OPGYM_CHECK_VALUE(t.layout() == torch::headeronly::Layout::Strided, "opgym::", op, ": ", name,
                    " must be a strided (dense) tensor");
  return to_opgym_dtype(t.scalar_type(), name, op);
}

inline std::string device_name(const Tensor& t) {
  if (t.is_cpu()) return "cpu";
  if (t.is_cuda()) return cat("cuda:", static_cast<int>(t.get_device_index()));
  return cat("device type ", static_cast<int>(t.device().type()));
}

// `t` (named `name`) is on the device of `ref` (named `ref_name`, the op's first tensor argument).
inline void check_device(const Tensor& t, const char* name, const Tensor& ref, const char* ref_name, const char* op) {
  const bool same = t.device().type() == ref.device().type() && t.get_device_index() == ref.get_device_index();
  OPGYM_CHECK(same, "opgym::", op, ": ", name, " is on ", device_name(t), " but ", ref_name, " is on ", device_name(ref),
              "; every tensor must be on one device");
}

// `t` (named `name`) has the sizes of `ref` (named `ref_name`).
inline void check_same_shape(const Tensor& t, const char* name, const Tensor& ref, const char* ref_name, const char* op) {
  const auto a = t.sizes(), b = ref.sizes();
  bool same = a.size() == b.size();
  for (size_t i = 0; same && i < a.size(); ++i) same = a[i] == b[i];
  OPGYM_CHECK_VALUE(same, "opgym::", op, ": ", name, " must have the shape of ", ref_name, " ", Sizes{b}, ", got ",
                    Sizes{a});
}

// A view of `t`, whose dtype its op has checked already.
inline opgym::TensorView view_of(const Tensor& t) {
  const auto sizes = t.sizes(), strides = t.strides();
  return opgym::TensorView::strided(t.data_ptr(), to_opgym_dtype(t.scalar_type(), "tensor", "view_of"), sizes.data(),
                                    strides.data(), static_cast<int>(t.dim()));
}

// One call of a torch operator through the dispatcher (its first return).
template <class... A>
Tensor call_op(const char* name, const char* overload, A... args) {
  std::array<StableIValue, std::max<size_t>(sizeof...(A), 1)> stack{torch::stable::detail::from(args)...};
  STABLE_TORCH_ERROR_CODE_CHECK(torch_call_dispatcher(name, overload, stack.data(), TORCH_ABI_VERSION));
  return torch::stable::detail::to<Tensor>(stack[0]);
}

// A contiguous CPU tensor for a functional operator's output, its storage a pooled block
// (block_pool.hpp; from_blob storage: it cannot be resized past its size).
Tensor empty_output(torch::headeronly::IntHeaderOnlyArrayRef sizes, ScalarType dtype);

}  // namespace opgym_stable
