// Work formulas for ATen operators: FLOPs and bytes from tensor shapes.
//
// Counting rules, for every formula below:
//   - bytes are the compulsory traffic of a roofline: each input read once,
//     each output written once (see the OpCall contract in op_cost.h);
//   - matmul and convolution FLOPs follow torch.utils.flop_counter (PyTorch
//     v2.13.0, torch/utils/flop_counter.py): 2 per multiply-add, bias adds not
//     counted, so totals compare one to one with FlopCounterMode;
//   - elementwise and reduction FLOPs are elements x a per-op factor: one FLOP
//     per arithmetic or transcendental operation per element in the op's
//     textbook formula (counted in the comment next to it). These ops are
//     memory-bound on every preset (a few FLOPs per element against ridge
//     points of tens to hundreds of FLOPs per byte), so a factor rarely moves
//     the time; it matters for FLOP totals in reports.

#include <algorithm>
#include <stdexcept>
#include <string>

#include "op_cost.h"
#include "op_formula_helpers.h"

namespace zion::sim {

namespace {

double sum_numel(const std::vector<TensorDesc>& tensors) {
  double n = 0;
  for (const TensorDesc& t : tensors) n += static_cast<double>(t.numel());
  return n;
}

double max_numel(const std::vector<TensorDesc>& tensors) {
  double n = 0;
  for (const TensorDesc& t : tensors) n = std::max(n, static_cast<double>(t.numel()));
  return n;
}

int64_t int_arg(const OpCall& call, size_t i, int64_t fallback) {
  return i < call.int_args.size() ? call.int_args[i] : fallback;
}

// ---- matmul family --------------------------------------------------------

// torch.matmul(a, b) with its broadcasting: a [..., m, k] or [k], b [..., k, n]
// or [k]; covers mm, bmm, mv, dot and batched broadcasts in one rule.
double matmul_flops(const TensorDesc& a, const TensorDesc& b) {
  const size_t da = a.sizes.size(), db = b.sizes.size();
  const double k = static_cast<double>(a.sizes.back());
  const double m = da >= 2 ? static_cast<double>(a.sizes[da - 2]) : 1;
  const double n = db >= 2 ? static_cast<double>(b.sizes[db - 1]) : 1;
  const size_t batch_a = da > 2 ? da - 2 : 0, batch_b = db > 2 ? db - 2 : 0;
  double batch = 1;
  for (size_t i = 0; i < std::max(batch_a, batch_b); ++i) {
    const int64_t sa = i < batch_a ? a.sizes[batch_a - 1 - i] : 1;
    const int64_t sb = i < batch_b ? b.sizes[batch_b - 1 - i] : 1;
    batch *= static_cast<double>(sa == 1 ? sb : sa);
  }
  return 2 * batch * m * k * n;
}

// Ops whose two matrix operands are inputs[first], inputs[first + 1]:
// mm(self, mat2) first = 0; addmm(self, mat1, mat2) first = 1.
WorkFormula matmul_operands(size_t first, const char* expected) {
  return [first, expected](const OpCall& call) {
    if (call.inputs.size() < first + 2 || call.inputs[first].sizes.empty() ||
        call.inputs[first + 1].sizes.empty()) {
      bad_call(call, expected);
    }
    return make_work(OpClass::kMatmul, matmul_flops(call.inputs[first], call.inputs[first + 1]), io_bytes(call));
  };
}

// linear(input [..., in], weight [out, in], bias?): input @ weight.T.
OpWork linear(const OpCall& call) {
  if (call.inputs.size() < 2 || call.inputs[0].sizes.empty() || call.inputs[1].sizes.empty()) {
    bad_call(call, "(input [..., in], weight [out, in], bias?)");
  }
  const TensorDesc& weight = call.inputs[1];
  const double out_features = weight.sizes.size() >= 2 ? static_cast<double>(weight.sizes[0]) : 1;
  return make_work(OpClass::kMatmul, 2 * static_cast<double>(call.inputs[0].numel()) * out_features, io_bytes(call));
}

// ---- convolution ----------------------------------------------------------

// torch.utils.flop_counter.conv_flop_count: 2 x batch x positions x
// weight.numel(), positions being the output's spatial positions, or the
// input's for a transposed convolution. weight.numel() = C_out x C_in/groups x
// prod(kernel), so groups need no argument. An unbatched input (one dim fewer
// than the weight) has batch 1.
double conv_flops(const OpCall& call, const TensorDesc& input, const TensorDesc& weight, const TensorDesc& output,
                  bool transposed) {
  const size_t rank = weight.sizes.size();
  const TensorDesc& positions = transposed ? input : output;
  if (rank < 3 || input.sizes.size() + 1 < rank || positions.sizes.size() < rank - 2) {
    bad_call(call, "input [N, C_in, *spatial], weight [C_out, C_in/groups, *kernel], output [N, C_out, *spatial]");
  }
  const double batch = input.sizes.size() == rank ? static_cast<double>(input.sizes[0]) : 1;
  double spatial = 1;
  for (size_t d = positions.sizes.size() - (rank - 2); d < positions.sizes.size(); ++d) {
    spatial *= static_cast<double>(positions.sizes[d]);
  }
  return 2 * batch * spatial * static_cast<double>(weight.numel());
}

// Forward: inputs (input, weight, bias?), outputs (output).
// int_args[0] = transposed (0 or 1) when `transposed` is kFromIntArgs
// (aten::convolution, _convolution, convolution_overrideable); absent = 0.
constexpr int kFromIntArgs = -1;
WorkFormula convolution(int transposed) {
  return [transposed](const OpCall& call) {
    if (call.inputs.size() < 2 || call.outputs.empty()) bad_call(call, "inputs (input, weight, bias?), outputs (output)");
    const bool t = transposed == kFromIntArgs ? int_arg(call, 0, 0) != 0 : transposed != 0;
    return make_work(OpClass::kConvolution, conv_flops(call, call.inputs[0], call.inputs[1], call.outputs[0], t),
                     io_bytes(call));
  };
}

// convolution_backward(grad_output, input, weight, ...): grad_input and
// grad_weight each cost one forward convolution (flop_counter's
// conv_backward_flop), so both requested = 2x forward. int_args:
// [transposed, output_mask[0] (grad_input), output_mask[1] (grad_weight),
// output_mask[2] (grad_bias)]; absent = [0, 1, 1, 1], i.e. a training step.
// The bias gradient's sum over grad_output is not counted, as in flop_counter.
OpWork convolution_backward(const OpCall& call) {
  if (call.inputs.size() < 3) bad_call(call, "inputs (grad_output, input, weight)");
  const bool transposed = int_arg(call, 0, 0) != 0;
  const double forward = conv_flops(call, call.inputs[1], call.inputs[2], call.inputs[0], transposed);
  const double grads = (int_arg(call, 1, 1) != 0 ? 1 : 0) + (int_arg(call, 2, 1) != 0 ? 1 : 0);
  return make_work(OpClass::kConvolution, grads * forward, io_bytes(call));
}

// ---- elementwise and data movement ----------------------------------------

// One pass: flops_per_element per output element (all outputs, so tensor-list
// ops such as _foreach_add count every tensor); bytes = inputs + outputs.
WorkFormula elementwise(double flops_per_element) {
  return [flops_per_element](const OpCall& call) {
    const double elements = call.outputs.empty() ? max_numel(call.inputs) : sum_numel(call.outputs);
    return make_work(OpClass::kElementwise, flops_per_element * elements, io_bytes(call));
  };
}

// fill_, zero_, in-place random fills: self is written, never read.
WorkFormula write_only(double flops_per_element) {
  return [flops_per_element](const OpCall& call) {
    const std::vector<TensorDesc>& written = call.outputs.empty() ? call.inputs : call.outputs;
    return make_work(OpClass::kElementwise, flops_per_element * sum_numel(written), sum_bytes(written));
  };
}

// copy_(self, src) within one device: src is read, self written, not read.
OpWork copy_within_device(const OpCall& call) {
  if (call.inputs.size() < 2) bad_call(call, "inputs (self, src)");
  const double written = call.outputs.empty() ? call.inputs[0].bytes() : sum_bytes(call.outputs);
  return make_work(OpClass::kElementwise, 0, sum_bytes(call.inputs, 1) + written);
}

// Views and metadata-only ops move no data and launch no kernel.
OpWork metadata(const OpCall&) { return make_work(OpClass::kOther, 0, 0); }

// ---- reductions -----------------------------------------------------------

// flops_per_element per element of the reduced tensor, inputs[0].
WorkFormula reduction(double flops_per_element) {
  return [flops_per_element](const OpCall& call) {
    if (call.inputs.empty()) bad_call(call, "at least one input (the tensor reduced)");
    return make_work(OpClass::kReduction, flops_per_element * static_cast<double>(call.inputs[0].numel()),
                     io_bytes(call));
  };
}

// nll_loss(self [N, C] or [C], target [N] or [], weight? [C]): one element of
// self (and of weight) per target is read, not all of self; one add per
// target, plus a multiply when weighted.
OpWork nll_loss(const OpCall& call) {
  if (call.inputs.size() < 2) bad_call(call, "inputs (self, target, weight?)");
  const double targets = static_cast<double>(call.inputs[1].numel());
  const bool weighted = call.inputs.size() >= 3;
  double bytes = call.inputs[1].bytes() + targets * call.inputs[0].element_size + sum_bytes(call.outputs);
  if (weighted) bytes += targets * call.inputs[2].element_size;
  return make_work(OpClass::kReduction, targets * (weighted ? 2 : 1), bytes);
}

// ---- embeddings -----------------------------------------------------------

double row_elements(const TensorDesc& table) {
  if (table.sizes.empty() || table.sizes[0] == 0) return 0;
  return static_cast<double>(table.numel()) / static_cast<double>(table.sizes[0]);
}

// embedding_bag / _embedding_bag / _embedding_bag_forward_only:
// inputs (weight [num_rows, dim], indices, offsets, per_sample_weights?).
// Every index gathers one row of weight at a random address; the rest streams.
// Pooling is one add per gathered element (sum, mean; max is one compare),
// plus a multiply with per_sample_weights.
OpWork embedding_bag(const OpCall& call) {
  if (call.inputs.size() < 2) bad_call(call, "inputs (weight, indices, offsets, per_sample_weights?)");
  const TensorDesc& weight = call.inputs[0];
  const double elements = static_cast<double>(call.inputs[1].numel()) * row_elements(weight);
  const bool weighted = call.inputs.size() >= 4;
  return make_work(OpClass::kEmbeddingBag, elements * (weighted ? 2 : 1),
                   sum_bytes(call.inputs, 1) + sum_bytes(call.outputs), elements * weight.element_size);
}

// embedding(weight, indices): the gather alone.
OpWork embedding(const OpCall& call) {
  if (call.inputs.size() < 2) bad_call(call, "inputs (weight, indices)");
  const TensorDesc& weight = call.inputs[0];
  const double elements = static_cast<double>(call.inputs[1].numel()) * row_elements(weight);
  return make_work(OpClass::kEmbeddingBag, 0, sum_bytes(call.inputs, 1) + sum_bytes(call.outputs),
                   elements * weight.element_size);
}

// Dense embedding backward: inputs (grad [..., dim], indices, ...), output
// grad_weight [num_rows, dim]. Each index adds one grad row into a random row
// of grad_weight: a read-modify-write, so the touched rows count twice in
// gathered_bytes. The whole grad_weight is also written (zeroed) once, which
// is streaming traffic, as is reading grad and the index tensors.
OpWork embedding_dense_backward(const OpCall& call) {
  if (call.inputs.size() < 2 || call.inputs[0].sizes.empty()) bad_call(call, "inputs (grad [..., dim], indices, ...)");
  const TensorDesc& grad = call.inputs[0];
  const double elements = static_cast<double>(call.inputs[1].numel()) * static_cast<double>(grad.sizes.back());
  const int element_size = call.outputs.empty() ? grad.element_size : call.outputs[0].element_size;
  return make_work(OpClass::kEmbeddingBag, elements, io_bytes(call), 2 * elements * element_size);
}

// Sparse embedding backward: inputs (grad [..., dim], indices, ...); the
// result's values hold one grad row per index, written in index order, so
// everything streams.
OpWork embedding_sparse_backward(const OpCall& call) {
  if (call.inputs.size() < 2 || call.inputs[0].sizes.empty()) bad_call(call, "inputs (grad [..., dim], indices, ...)");
  const double elements =
      static_cast<double>(call.inputs[1].numel()) * static_cast<double>(call.inputs[0].sizes.back());
  return make_work(OpClass::kEmbeddingBag, elements, io_bytes(call));
}

// embedding_backward and _embedding_bag_backward are composite: the device
// sees the op they call, the dense or the sparse backward; whoever prices
// them gets that op's work, by the result's layout (a sparse COO gradient
// for sparse=True).
OpWork embedding_backward(const OpCall& call) {
  if (!call.outputs.empty() && call.outputs[0].is_sparse()) return embedding_sparse_backward(call);
  return embedding_dense_backward(call);
}

// Whether an ATen name is an in-place op's ("aten::add_.Tensor").
bool in_place(const std::string& name) {
  const size_t ns = name.find("::");
  const size_t from = ns == std::string::npos ? 0 : ns + 2;
  const size_t dot = name.find('.', from);
  const size_t end = dot == std::string::npos ? name.size() : dot;
  return end > from && name[end - 1] == '_';
}

// add / sub with a sparse COO `other` into a dense `self`, as an optimizer's
// update with a sparse gradient does: each stored value lands on its element
// of self, a read-modify-write at random rows (2 x the values' elements in
// self's dtype, gathered), one FLOP each; the values and indices stream in.
// Out of place, self is first copied into the result: one more pass (read
// self, write the result). Any other mix of layouts is the dense formula's.
WorkFormula dense_plus_sparse(WorkFormula dense) {
  return [dense](const OpCall& call) {
    if (call.inputs.size() < 2 || call.inputs[0].is_sparse() || !call.inputs[1].is_sparse() || call.outputs.empty() ||
        call.outputs[0].is_sparse()) {
      return dense(call);
    }
    const TensorDesc& self = call.inputs[0];
    const TensorDesc& values = call.inputs[1];
    const double landed = static_cast<double>(values.numel()) * self.element_size;
    const double copied = in_place(call.name) ? 0.0 : self.bytes() + call.outputs[0].bytes();
    return make_work(OpClass::kEmbeddingBag, static_cast<double>(values.numel()), values.bytes() + copied, 2 * landed);
  };
}

// A dense tensor met by a sparse COO one, with a sparse result: dense *
// sparse (mul), and sparse_mask(dense, mask), which the CPU computes as dense
// times a template of ones on the mask's indices (Adagrad's sparse step
// calls it on every table). Only the rows the sparse tensor holds are read
// from the dense one, at random rows: the result's values, in the dense
// one's dtype, gathered. The sparse tensor's indices (and its values, when
// `reads_values`) stream in, the result streams out; flops_per_value per
// value of the result. Any other mix of layouts is the dense formula's.
WorkFormula dense_at_sparse(WorkFormula dense, double flops_per_value, bool reads_values) {
  return [dense, flops_per_value, reads_values](const OpCall& call) {
    if (call.inputs.size() < 2 || call.outputs.empty() || !call.outputs[0].is_sparse() ||
        call.inputs[0].is_sparse() == call.inputs[1].is_sparse()) {
      return dense(call);
    }
    const TensorDesc& dense_in = call.inputs[0].is_sparse() ? call.inputs[1] : call.inputs[0];
    const TensorDesc& sparse_in = call.inputs[0].is_sparse() ? call.inputs[0] : call.inputs[1];
    const double values = static_cast<double>(call.outputs[0].numel());
    const double read = reads_values ? sparse_in.bytes() : static_cast<double>(sparse_in.sparse_index_elements) * 8;
    return make_work(OpClass::kEmbeddingBag, flops_per_value * values, read + sum_bytes(call.outputs),
                     values * dense_in.element_size);
  };
}

// _coalesce(self sparse): the indices sorted and the values of equal indices
// summed, one add per stored value; the compulsory traffic is reading what
// self stores and writing the result.
OpWork coalesce(const OpCall& call) {
  if (call.inputs.empty()) bad_call(call, "inputs (self, a sparse COO tensor)");
  return make_work(OpClass::kElementwise, static_cast<double>(call.inputs[0].numel()), io_bytes(call));
}

// index_select(self, dim, index): each output element is read from self at a
// row chosen by index, like an embedding lookup.
OpWork index_select(const OpCall& call) {
  if (call.inputs.size() < 2 || call.outputs.empty()) bad_call(call, "inputs (self, index), outputs (result)");
  return make_work(OpClass::kEmbeddingBag, 0, call.inputs[1].bytes() + sum_bytes(call.outputs),
                   sum_bytes(call.outputs));
}

// index.Tensor(self, indices...): each output element is read from self at
// an indexed position, a gather; the index tensors stream in (those on the
// CPU, which zion accepts for indexing as CUDA does, are not its inputs).
OpWork advanced_index(const OpCall& call) {
  if (call.inputs.empty() || call.outputs.empty()) bad_call(call, "inputs (self, indices...), outputs (result)");
  return make_work(OpClass::kEmbeddingBag, 0, sum_bytes(call.inputs, 1) + sum_bytes(call.outputs),
                   sum_bytes(call.outputs));
}

// _index_put_impl_ and index_put(self, indices..., values): each element of
// values lands in self at an indexed position. Priced as accumulate=True, a
// read-modify-write of each landing element (the backward of indexing, where
// a training step meets this op, accumulates); values and the index tensors
// on the device stream in. Out of place (index_put), self is first copied
// into the result: one more pass.
OpWork advanced_index_put(const OpCall& call) {
  if (call.inputs.size() < 2) bad_call(call, "inputs (self, indices..., values)");
  const TensorDesc& values = call.inputs.back();
  const double copied =
      in_place(call.name) || call.outputs.empty() ? 0.0 : call.inputs[0].bytes() + call.outputs[0].bytes();
  return make_work(OpClass::kEmbeddingBag, static_cast<double>(values.numel()), sum_bytes(call.inputs, 1) + copied,
                   2 * values.bytes());
}

// index_add(self, dim, index, source): each element of source lands on its
// element of self, a read-modify-write at random rows (2 x source's elements
// in self's dtype, gathered), one FLOP each; index and source stream in. Out
// of place, self is first copied into the result: one more pass.
OpWork index_accumulate(const OpCall& call) {
  if (call.inputs.size() < 3 || call.outputs.empty()) bad_call(call, "inputs (self, index, source), outputs (result)");
  const TensorDesc& self = call.inputs[0];
  const TensorDesc& source = call.inputs[2];
  const double landed = static_cast<double>(source.numel()) * self.element_size;
  const double copied = in_place(call.name) ? 0.0 : self.bytes() + call.outputs[0].bytes();
  return make_work(OpClass::kEmbeddingBag, static_cast<double>(source.numel()),
                   call.inputs[1].bytes() + source.bytes() + copied, 2 * landed);
}

// ---- attention -------------------------------------------------------------

// torch.utils.flop_counter's sdpa_flop_count and sdpa_backward_flop_count for
// query [B, H, L, E], key [B, H, S, E], value [B, H, S, Ev]: the forward is the
// two products Q K^T and P V, 2 B H L S (E + Ev); the backward recomputes Q K^T
// and runs four more (dP, dV, dQ, dK), 2 B H L S (3 E + 2 Ev). A causal mask
// is not subtracted, as flop_counter does not. `first` is the query's input.
WorkFormula attention(size_t first, bool backward) {
  return [first, backward](const OpCall& call) {
    if (call.inputs.size() < first + 3 || call.inputs[first].sizes.size() != 4 ||
        call.inputs[first + 1].sizes.size() != 4 || call.inputs[first + 2].sizes.size() != 4) {
      bad_call(call, backward ? "inputs (grad_out, query [B, H, L, E], key [B, H, S, E], value [B, H, S, Ev], ...)"
                              : "inputs (query [B, H, L, E], key [B, H, S, E], value [B, H, S, Ev], ...)");
    }
    const auto& q = call.inputs[first].sizes;
    const double bh = static_cast<double>(q[0]) * static_cast<double>(q[1]), l = static_cast<double>(q[2]);
    const double e = static_cast<double>(q[3]), s = static_cast<double>(call.inputs[first + 1].sizes[2]);
    const double ev = static_cast<double>(call.inputs[first + 2].sizes[3]);
    const double flops = 2 * bh * l * s * (backward ? 3 * e + 2 * ev : e + ev);
    return make_work(OpClass::kMatmul, flops, io_bytes(call));
  };
}

}  // namespace

std::vector<std::pair<std::string, WorkFormula>> builtin_op_formulas() {
  std::vector<std::pair<std::string, WorkFormula>> table;
  auto add = [&table](const char* name, WorkFormula f) { table.emplace_back(std::string("aten::") + name, std::move(f)); };
  auto add_all = [&add](std::initializer_list<const char*> names, const WorkFormula& f) {
    for (const char* name : names) add(name, f);
  };

  // Matmul family.
  add_all({"mm", "bmm", "matmul", "mv", "dot", "vdot"}, matmul_operands(0, "inputs (a, b) of a matrix product"));
  add_all({"addmm", "_addmm_activation", "baddbmm", "addbmm", "addmv"},
          matmul_operands(1, "inputs (self, a, b) of a matrix product plus self"));
  add("linear", linear);
  // The CPU's fused attention, which zion runs wherever the CPU would (4-D inputs).
  add("_scaled_dot_product_flash_attention_for_cpu", attention(0, false));
  add("_scaled_dot_product_flash_attention_for_cpu_backward", attention(1, true));

  // Convolution.
  add_all({"convolution", "_convolution", "convolution_overrideable"}, convolution(kFromIntArgs));
  add_all({"conv1d", "conv2d", "conv3d"}, convolution(0));
  add_all({"conv_transpose1d", "conv_transpose2d", "conv_transpose3d"}, convolution(1));
  add_all({"convolution_backward", "convolution_backward_overrideable"}, convolution_backward);

  // Elementwise, one FLOP per element; a sparse gradient added into a dense
  // tensor touches only its rows.
  add_all({"add", "sub"}, dense_plus_sparse(elementwise(1)));
  add("mul", dense_at_sparse(elementwise(1), 1, true));
  add("sparse_mask", dense_at_sparse(elementwise(0), 0, false));
  add("_coalesce", coalesce);
  add_all({"rsub", "div", "neg", "abs", "exp", "exp2", "log", "log2", "log1p", "expm1", "sqrt",
           "rsqrt", "reciprocal", "pow", "relu", "sigmoid", "tanh", "gelu", "silu", "elu", "leaky_relu", "hardtanh",
           "hardsigmoid", "hardswish", "threshold", "threshold_backward", "sigmoid_backward", "tanh_backward",
           "gelu_backward", "silu_backward", "leaky_relu_backward", "hardtanh_backward", "clamp", "clamp_min",
           "clamp_max", "maximum", "minimum", "max.other", "min.other", "max.out", "min.out", "eq", "ne", "lt", "le",
           "gt", "ge", "logical_and", "logical_or", "logical_xor", "logical_not", "bitwise_and", "bitwise_or",
           "bitwise_xor", "bitwise_not", "where", "masked_fill", "sign", "floor", "ceil", "round", "trunc", "frac",
           "sin", "cos", "erf", "native_dropout", "native_dropout_backward", "nll_loss_backward", "scatter_add",
           "_foreach_add", "_foreach_sub", "_foreach_mul", "_foreach_div", "_foreach_sqrt",
           "_foreach_neg"},
          elementwise(1));
  add_all({"addcmul", "addcdiv", "lerp", "_foreach_addcmul", "_foreach_addcdiv", "_foreach_lerp"},
          elementwise(2));                          // a mul or div, then an add
  add("mse_loss_backward", elementwise(3));         // 2 * (x - t) * grad / N: sub, mul, mul
  add("binary_cross_entropy_backward", elementwise(5));  // grad * (x - t) / (x * (1 - x)): sub, sub, mul, div, mul
  // log_sigmoid_forward writes (output, buffer): min(x, 0) - log1p(exp(-|x|))
  // is abs, neg, exp, log1p, min, sub per element, 3 per output element.
  add("log_sigmoid_forward", elementwise(3));

  // Data movement: bytes only.
  add_all({"clone", "_to_copy", "contiguous", "cat", "stack", "repeat", "flip", "roll", "constant_pad_nd", "gather",
           "scatter", "tril", "triu"},
          elementwise(0));
  add_all({"fill_", "zero_"}, write_only(0));
  add_all({"uniform_", "normal_", "bernoulli_", "random_", "exponential_"}, write_only(1));
  add("copy_", copy_within_device);

  // Views and metadata.
  add_all({"view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "alias", "detach", "t", "transpose",
           "permute", "expand", "expand_as", "view_as", "squeeze", "unsqueeze", "slice", "select", "narrow", "unbind",
           "split", "split_with_sizes", "chunk", "unfold", "diagonal", "view_as_real", "view_as_complex", "lift_fresh",
           "empty", "empty_strided", "resize_", "set_"},
          metadata);

  // Reductions, per element of the reduced tensor.
  add_all({"sum", "nansum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "prod", "all", "any", "cumsum",
           "cumprod"},
          reduction(1));
  add_all({"norm", "linalg_vector_norm"}, reduction(2));  // square, add
  add("aminmax", reduction(2));                           // two compares
  add_all({"var", "std", "var_mean", "std_mean"}, reduction(3));  // sub, square, add
  add("mse_loss", reduction(3));                                  // sub, square, add
  add("logsumexp", reduction(4));                                 // max, sub, exp, add
  // softmax: max, sub, exp, add, div; log_softmax: max, sub, exp, add, sub.
  add_all({"softmax", "_softmax", "log_softmax", "_log_softmax"}, reduction(5));
  // softmax backward y * (g - sum(g * y)): mul, add, sub, mul;
  // log_softmax backward g - exp(y) * sum(g): exp, mul, add, sub.
  add_all({"_softmax_backward_data", "_log_softmax_backward_data"}, reduction(4));
  // -(t log x + (1 - t) log(1 - x)) then the mean: sub, log, sub, log, mul,
  // mul, add, neg, add.
  add("binary_cross_entropy", reduction(9));
  // (1 - t) x - log_sigmoid(x) (aten/src/ATen/native/Loss.cpp), log_sigmoid
  // as min(x, 0) - log1p(exp(-|x|)), then the mean: sub, mul, min, abs, neg,
  // exp, log1p, sub, sub, add.
  add("binary_cross_entropy_with_logits", reduction(10));
  // mean, variance (sub, square, add), normalize (sub, mul), affine (mul, add).
  add_all({"native_layer_norm", "native_batch_norm", "_native_batch_norm_legit"}, reduction(8));
  add_all({"nll_loss", "nll_loss_forward", "nll_loss2d_forward"}, nll_loss);

  // Embeddings.
  add_all({"embedding_bag", "_embedding_bag", "_embedding_bag_forward_only"}, embedding_bag);
  add("embedding", embedding);
  add_all({"embedding_dense_backward", "_embedding_bag_dense_backward"}, embedding_dense_backward);
  add_all({"embedding_backward", "_embedding_bag_backward"}, embedding_backward);
  add_all({"embedding_sparse_backward", "_embedding_bag_sparse_backward"}, embedding_sparse_backward);
  add("index_select", index_select);
  add("index.Tensor", advanced_index);
  add_all({"_index_put_impl_", "index_put"}, advanced_index_put);
  add("index_add", index_accumulate);

  for (auto& entry : fbgemm_op_formulas()) table.push_back(std::move(entry));
  return table;
}

}  // namespace zion::sim
