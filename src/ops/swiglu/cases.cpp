// swiglu's case runners, for two schemas:
//   swiglu_mlp: PyPTO-Gym's SwiGLU MLP (swiglu_mlp_test_cases.json), read unchanged: inputs x [T, H],
//     gate_weight / up_weight [H, I] and down_weight [I, H_out] in the gym's [in, out] layout (its golden
//     is x @ W + b), optional gate_bias / up_bias / down_bias, output `output`. The weights are
//     generated in that layout and handed to opgym transposed ([out, in], torch's Linear layout).
//     Kernel (OpenBLAS GEMMs + the fused activation) vs golden (fp32 sgemms + the activation op by op),
//     allclose at the case's rtol/atol.
//   swiglu: the activation alone (opgym's cases/<model>/swiglu.json): inputs gate and up, or gate_up
//     [..., 2I] (merged); output out; optional params torch_threads, activation ("silu", the default, or
//     "gelu_tanh": GeGLU) and gate_layout ("contiguous", the default, or "as_given": the halves of
//     gate_up as views, HF's chunk). The contract is bit for bit: the
//     case passes when allclose at its tolerances (opgym's files set 0) and reports max ulp.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cases/inputs.hpp"
#include "cases/runner.hpp"
#include "opgym/error.hpp"
#include "opgym/swiglu.hpp"
#include "ops/swiglu/kernel.hpp"

namespace opgym {

namespace {
const cases::TensorSpec* output_named(const cases::Case& c, const std::string& name) {
  for (const cases::TensorSpec& t : c.outputs)
    if (t.name == name) return &t;
  return c.outputs.empty() ? nullptr : &c.outputs.front();
}

int index_of(const cases::Case& c, const cases::TensorSpec* t) {
  for (size_t j = 0; j < c.inputs.size(); ++j)
    if (&c.inputs[j] == t) return static_cast<int>(j);
  return -1;
}

// [rows, cols] -> [cols, rows], contiguous.
cases::Buffer transposed(const cases::Buffer& b) {
  cases::Buffer t = cases::make_buffer({b.shape[1], b.shape[0]}, b.dtype);
  const size_t es = dtype_size(b.dtype);
  for (int64_t r = 0; r < b.shape[0]; ++r)
    for (int64_t c = 0; c < b.shape[1]; ++c)
      std::memcpy(t.bytes.data() + (c * b.shape[0] + r) * es, b.bytes.data() + (r * b.shape[1] + c) * es, es);
  return t;
}

SwigluOptions options_of(const cases::Case& c, const cases::CaseFile& file) {
  SwigluOptions o;
  try {
    if (c.params.contains("torch_threads")) {
      if (!c.params.at("torch_threads").is_number_integer()) case_error(file, c, "torch_threads must be an integer");
      o.torch_threads = c.params.at("torch_threads").get<int>();
    }
  } catch (const cases::Json::exception& e) {
    throw Error(file.path, file.path + ": case '" + c.id + "': bad torch_threads: " + e.what());
  }
  std::string act = "silu", layout = "contiguous";
  try {
    if (c.params.contains("activation")) act = c.params.at("activation").get<std::string>();
    if (c.params.contains("gate_layout")) layout = c.params.at("gate_layout").get<std::string>();
  } catch (const cases::Json::exception& e) {
    throw Error(file.path, file.path + ": case '" + c.id + "': bad activation or gate_layout: " + e.what());
  }
  if (act == "gelu_tanh") o.activation = GluActivation::gelu_tanh;
  else if (act != "silu")
    throw Error(file.path, file.path + ": case '" + c.id + "': activation must be silu or gelu_tanh, got " + act);
  if (layout == "as_given") o.gate_layout = GateLayout::as_given;
  else if (layout != "contiguous")
    throw Error(file.path, file.path + ": case '" + c.id + "': gate_layout must be contiguous or as_given, got " +
                               layout);
  return o;
}

void finish(cases::CaseResult& r, const cases::Case& c, const std::vector<int64_t>& shape, DType dt,
            const cases::TensorSpec* declared) {
  r.pass = r.metrics.allclose();
  if (declared && (declared->shape != shape || declared->dtype != dt)) {
    r.pass = false;
    r.note = "declared output " + declared->shape_str() + " " + dtype_name(declared->dtype) + " is not the op's " +
             dtype_name(dt);
  } else if (!r.pass) {
    r.note = std::to_string(r.metrics.not_close) + " elements outside rtol " + std::to_string(c.rtol) + ", atol " +
             std::to_string(c.atol);
  }
}
}  // namespace

cases::CaseResult run_swiglu_mlp_case(const cases::Case& c, const cases::CaseFile& file, const cases::RunOptions& opt) {
  using namespace cases;
  const TensorSpec* x = c.input("x");
  const TensorSpec* w[3] = {c.input("gate_weight"), c.input("up_weight"), c.input("down_weight")};
  const TensorSpec* b[3] = {c.input("gate_bias"), c.input("up_bias"), c.input("down_bias")};
  if (!x || !w[0] || !w[1] || !w[2]) case_error(file, c, "needs inputs x, gate_weight, up_weight and down_weight");
  for (const TensorSpec* t : w)
    if (t->shape.size() != 2) case_error(file, c, "weights must be 2-D [in, out], got " + t->shape_str());
  if (x->shape.empty()) case_error(file, c, "x must have a last dim");
  const int64_t H = x->shape.back(), I = w[0]->shape[1], H_out = w[2]->shape[1];
  if (w[0]->shape[0] != H || w[1]->shape != w[0]->shape || w[2]->shape[0] != I)
    case_error(file, c, "weights must chain in the gym's [in, out] layout: gate/up [" + std::to_string(H) + ", I], down [I, H_out]");
  std::vector<int64_t> out_shape = x->shape;
  out_shape.back() = H_out;
  const TensorSpec* declared = output_named(c, "output");

  CaseResult r;
  r.id = c.id;
  r.shape = "x " + x->shape_str() + " I " + std::to_string(I);
  r.dtype = dtype_name(x->dtype);
  int64_t bytes = 0;
  for (const TensorSpec* t : {x, w[0], w[1], w[2]}) bytes += t->numel() * static_cast<int64_t>(2 * dtype_size(t->dtype) + 8);
  check_budget(bytes + x->numel() / H * I * 32, file, c, opt);

  Buffer bx = make_normal(*x, c.seed, index_of(c, x));
  Buffer bw[3], bb[3];
  for (int i = 0; i < 3; ++i) {
    // Weights scaled as a Linear's initialization (std 1/sqrt(in)), so activations stay O(1).
    const double std = 1.0 / std::sqrt(static_cast<double>(w[i]->shape[0]));
    bw[i] = transposed(make_normal(*w[i], c.seed, index_of(c, w[i]), 0.0, std));
    if (b[i]) bb[i] = make_normal(*b[i], c.seed, index_of(c, b[i]), 0.0, 0.1);
  }
  TensorView bv[3];
  SwigluMlpBiases biases;
  for (int i = 0; i < 3; ++i) bv[i] = b[i] ? bb[i].view() : TensorView{};
  biases.gate = b[0] ? &bv[0] : nullptr;
  biases.up = b[1] ? &bv[1] : nullptr;
  biases.down = b[2] ? &bv[2] : nullptr;
  Buffer got = make_buffer(out_shape, x->dtype), want = make_buffer(out_shape, x->dtype);
  const SwigluOptions o = options_of(c, file);
  swiglu_mlp(bx.view(), bw[0].view(), bw[1].view(), bw[2].view(), got.view(), biases, o, opt.executor);
  reference::swiglu_mlp_basic_ops(bx.view(), bw[0].view(), bw[1].view(), bw[2].view(), want.view(), biases, o);
  r.metrics = compare(got, want, c.rtol, c.atol);
  finish(r, c, out_shape, x->dtype, declared);
  return r;
}

cases::CaseResult run_swiglu_case(const cases::Case& c, const cases::CaseFile& file, const cases::RunOptions& opt) {
  using namespace cases;
  if (c.input("x") && c.input("gate_weight")) return run_swiglu_mlp_case(c, file, opt);
  const TensorSpec* gu = c.input("gate_up");
  const TensorSpec* g = c.input("gate");
  const TensorSpec* u = c.input("up");
  if (!gu && (!g || !u)) case_error(file, c, "needs inputs gate and up, or gate_up");
  const TensorSpec& first = gu ? *gu : *g;
  if (first.shape.empty()) case_error(file, c, "gate must have a last dim");
  std::vector<int64_t> out_shape = first.shape;
  if (gu) out_shape.back() /= 2;
  const TensorSpec* declared = output_named(c, "out");

  CaseResult r;
  r.id = c.id;
  r.shape = gu ? "gate_up " + gu->shape_str() : "gate " + g->shape_str();
  r.dtype = dtype_name(first.dtype);
  check_budget(first.numel() * static_cast<int64_t>(4 * dtype_size(first.dtype) + 16), file, c, opt);
  const SwigluOptions o = options_of(c, file);
  Buffer got = make_buffer(out_shape, first.dtype), want = make_buffer(out_shape, first.dtype);
  if (gu) {
    Buffer b = make_normal(*gu, c.seed, index_of(c, gu), 0.0, 3.0);
    swiglu_merged(b.view(), got.view(), o, opt.executor);
    TensorView gv, uv;
    const TensorView wv = want.view();
    detail::split_gate_up(b.view(), wv, gv, uv);
    reference::swiglu_basic_ops(gv, uv, wv, o);
  } else {
    Buffer bg = make_normal(*g, c.seed, index_of(c, g), 0.0, 3.0), bu = make_normal(*u, c.seed, index_of(c, u));
    swiglu(bg.view(), bu.view(), got.view(), o, opt.executor);
    reference::swiglu_basic_ops(bg.view(), bu.view(), want.view(), o);
  }
  r.metrics = compare(got, want, c.rtol, c.atol);
  finish(r, c, out_shape, first.dtype, declared);
  return r;
}

}  // namespace opgym
