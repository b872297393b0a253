// Work formulas for fbgemm_gpu's ops that a torchrec training step runs:
// table-batched embedding (TBE) lookups, their backward with the optimizer
// fused in, and the sparse-data shuffles around them.
//
// Inputs are the op's tensor arguments in schema order; the device passes an
// undefined tensor argument of a non-ATen op as an empty one, so positions
// follow the schema (an optional argument that is None is still left out).
// Every count comes from shapes: L = indices.numel() is the real number of
// lookups, T = D_offsets.numel() - 1 the features, and a pooled output or its
// gradient [B, total_D] gives the batch and the total width. A lookup gathers
// one row of its feature's table: D = total_D / T elements on average (exact
// when the tables of one TBE share a width, as torchrec groups them).
// A variable-batch (VBE) lookup's output, or its gradient, is one flat row of
// every bag's pooled row, each feature with its own batch: D = its elements
// divided by the bags, offsets.numel() - 1 (exact likewise).
//
// Traffic, as for ATen's embedding_bag (op_formulas.cpp): rows read or
// written at random addresses are gathered_bytes, priced at the preset's
// embedding_random_access efficiency; index tensors and pooled outputs stream.

#include <string>
#include <utility>
#include <vector>

#include "op_formula_helpers.h"

namespace zion::sim {

namespace {

// Where a TBE op's tensors sit among its inputs (schema order).
struct TbeLayout {
  size_t first_weights;  // host_weights; dev, uvm and lxu-cache weights follow
  size_t weights_count;
  size_t d_offsets;      // unused where `nobag`
  size_t indices;        // offsets follow
  size_t momentum = 0;   // a fused backward's momentum1_host (dev and uvm follow)
  // A sequence (no-bag) lookup: its output, or the gradient, is [L, D], one
  // row per lookup, and its tables share the width D.
  bool nobag = false;
  // A variable-batch lookup: its output, or the gradient, is flat (above).
  bool vbe = false;
};

// The split_embedding_codegen_forward_*_pt2_wrapper ops.
constexpr TbeLayout kForwardLayout{0, 4, 6, 8};
// The split_embedding_backward_codegen_*_pt2_wrapper ops; grad_output is inputs[0].
constexpr TbeLayout kBackwardLayout{1, 4, 7, 9, 13};
// The no-bag (sequence) forward and backward: no D_offsets (an int D), no indice_weights.
constexpr TbeLayout kNobagForwardLayout{0, 4, 0, 7, 0, true};
constexpr TbeLayout kNobagBackwardLayout{1, 4, 0, 8, 11, true};
// dense_embedding_codegen_lookup_function: dev_weights only.
constexpr TbeLayout kDenseForwardLayout{0, 1, 2, 4};
// split_embedding_backward_codegen_dense_cpu; grad_output is inputs[0].
constexpr TbeLayout kDenseBackwardLayout{1, 1, 3, 5};
// split_embedding_codegen_grad_indice_weights_pt2_wrapper; grad_output is inputs[0].
constexpr TbeLayout kGradIndiceWeightsLayout{1, 4, 7, 8};
// The variable-batch (_vbe_pt2_wrapper) ops: the same tensors first; the
// backward's VBE metadata (B_offsets, row output offsets, b_t map, B offsets
// per rank and feature) comes before the optimizer state.
constexpr TbeLayout kVbeForwardLayout{0, 4, 6, 8, 0, false, true};
constexpr TbeLayout kVbeBackwardLayout{1, 4, 7, 9, 17, false, true};
constexpr TbeLayout kVbeGradIndiceWeightsLayout{1, 4, 7, 8, 0, false, true};

struct Lookups {
  double count = 0;        // L
  double row_elements = 0; // D
  int weight_element_size = 4;
  double index_bytes = 0;  // indices and offsets, read once
};

Lookups read_lookups(const OpCall& call, const TbeLayout& layout, const TensorDesc& pooled, const char* expected) {
  if (call.inputs.size() < layout.indices + 2 || pooled.sizes.size() != (layout.vbe ? 1u : 2u)) {
    bad_call(call, expected);
  }
  Lookups l;
  l.count = static_cast<double>(call.inputs[layout.indices].numel());
  if (layout.vbe) {
    const double bags = static_cast<double>(call.inputs[layout.indices + 1].numel()) - 1;
    if (bags < 0) bad_call(call, expected);
    l.row_elements = bags > 0 ? static_cast<double>(pooled.numel()) / bags : 0;
  } else {
    const double features = layout.nobag ? 1 : static_cast<double>(call.inputs[layout.d_offsets].numel()) - 1;
    if (features < 1) bad_call(call, expected);
    l.row_elements = static_cast<double>(pooled.sizes[1]) / features;
  }
  for (size_t i = layout.first_weights; i < layout.first_weights + layout.weights_count; ++i) {
    if (call.inputs[i].numel() > 0) l.weight_element_size = call.inputs[i].element_size;
  }
  l.index_bytes = call.inputs[layout.indices].bytes() + call.inputs[layout.indices + 1].bytes();
  return l;
}

// Forward: L rows gathered, one add per gathered element into the pooled
// output, which is written once. A no-bag lookup copies each row to its own
// output row: no adds.
WorkFormula tbe_forward(TbeLayout layout) {
  return [layout](const OpCall& call) {
    const char* expected = layout.nobag ? "the no-bag TBE forward's schema inputs (weights, ..., indices, offsets) "
                                          "and an output [L, D]"
                           : layout.vbe ? "the variable-batch TBE forward's schema inputs (weights, ..., D_offsets, "
                                          "..., indices, offsets, ...) and a flat pooled output"
                                        : "the TBE forward's schema inputs (weights, ..., D_offsets, ..., indices, "
                                          "offsets) and a pooled output [B, total_D]";
    if (call.outputs.empty()) bad_call(call, expected);
    const TensorDesc& pooled = call.outputs[0];
    const Lookups l = read_lookups(call, layout, pooled, expected);
    const double gathered = l.count * l.row_elements;
    return make_work(OpClass::kEmbeddingBag, layout.nobag ? 0 : gathered, l.index_bytes + pooled.bytes(),
                     gathered * l.weight_element_size);
  };
}

// What a fused optimizer keeps per row of a table: its state elements.
enum class RowState { kNone, kPerElement, kPerRow };

// Backward with the optimizer fused in: grad_output [B, total_D] streams in;
// each lookup's row is read and written back updated, with its optimizer
// state (SGD: none; Adagrad: one momentum per element; row-wise Adagrad: one
// per row). L counts lookups, not distinct rows: fbgemm merges repeats of a
// row within a batch, so this is an upper bound when indices repeat.
// `flops_per_element`: the update's arithmetic per element of a row.
WorkFormula tbe_backward_fused(RowState state, double flops_per_element, TbeLayout layout = kBackwardLayout) {
  return [state, flops_per_element, layout](const OpCall& call) {
    const char* expected = layout.nobag ? "the no-bag TBE backward's schema inputs (grad_output [L, D], weights, ..., "
                                          "indices, offsets, ..., optimizer state)"
                           : layout.vbe ? "the variable-batch TBE backward's schema inputs (a flat grad_output, "
                                          "weights, ..., D_offsets, ..., indices, offsets, ..., VBE metadata, "
                                          "optimizer state)"
                                        : "the TBE backward's schema inputs (grad_output [B, total_D], weights, ..., "
                                          "D_offsets, ..., indices, offsets, ..., optimizer state)";
    if (call.inputs.empty()) bad_call(call, expected);
    const TensorDesc& grad = call.inputs[0];
    const Lookups l = read_lookups(call, layout, grad, expected);
    // The state tensors follow lxu_cache_locations: momentum1 host, dev, uvm.
    int state_element_size = 4;
    const size_t momentum = layout.momentum;
    for (size_t i = momentum; i < momentum + 3 && i < call.inputs.size(); ++i) {
      if (call.inputs[i].numel() > 0) state_element_size = call.inputs[i].element_size;
    }
    const double state_elements = state == RowState::kPerElement ? l.row_elements
                                  : state == RowState::kPerRow   ? 1
                                                                 : 0;
    const double row_bytes = l.row_elements * l.weight_element_size + state_elements * state_element_size;
    return make_work(OpClass::kEmbeddingBag, flops_per_element * l.count * l.row_elements,
                     grad.bytes() + l.index_bytes, 2 * l.count * row_bytes);
  };
}

// DENSE backward: grad_weights, the size of the whole table, is zeroed (a
// stream) and each lookup adds its gradient row into a random row of it (a
// read-modify-write); grad_output and the indices stream in.
OpWork tbe_dense_backward(const OpCall& call) {
  const char* expected = "inputs (grad_output [B, total_D], host_weights, weights_offsets, D_offsets, "
                         "hash_size_cumsum, indices, offsets, ...), output grad_weights";
  if (call.inputs.empty() || call.outputs.empty()) bad_call(call, expected);
  const TensorDesc& grad = call.inputs[0];
  const Lookups l = read_lookups(call, kDenseBackwardLayout, grad, expected);
  const double added = l.count * l.row_elements;
  return make_work(OpClass::kEmbeddingBag, added, grad.bytes() + l.index_bytes + call.outputs[0].bytes(),
                   2 * added * call.outputs[0].element_size);
}

// The gradient of weighted features' per-sample weights: for each lookup,
// the dot product of its row (gathered) with its bag's gradient; the
// gradient [B, total_D] and the indices stream in, one value per lookup out.
WorkFormula tbe_grad_indice_weights(TbeLayout layout) {
  return [layout](const OpCall& call) {
    const char* expected = layout.vbe ? "inputs (a flat grad_output, weights, ..., D_offsets, indices, offsets, ...) "
                                        "and one output"
                                      : "inputs (grad_output [B, total_D], weights, ..., D_offsets, indices, offsets, "
                                        "...) and one output";
    if (call.inputs.empty() || call.outputs.empty()) bad_call(call, expected);
    const TensorDesc& grad = call.inputs[0];
    const Lookups l = read_lookups(call, layout, grad, expected);
    const double gathered = l.count * l.row_elements;
    return make_work(OpClass::kEmbeddingBag, 2 * gathered, grad.bytes() + l.index_bytes + call.outputs[0].bytes(),
                     gathered * l.weight_element_size);
  };
}

// batch_index_select_dim0 (torchrec expands a variable-batch lookup's pooled
// rows to the full batch with it): each output element is gathered from a
// row of the flat input; the indices stream in, the output and the small
// integer outputs stream out.
OpWork batch_index_select_forward(const OpCall& call) {
  if (call.inputs.size() < 2 || call.outputs.empty()) {
    bad_call(call, "inputs (inputs, indices) and outputs (the selected rows, ...)");
  }
  return make_work(OpClass::kEmbeddingBag, 0, call.inputs[1].bytes() + sum_bytes(call.outputs),
                   call.outputs[0].bytes());
}

// Its backward: the input-sized gradient is zeroed (a stream) and each
// gradient element is added into a row of it (a read-modify-write at random
// rows); the gradient and the index tensors stream in.
OpWork batch_index_select_backward(const OpCall& call) {
  if (call.inputs.empty() || call.outputs.empty()) {
    bad_call(call, "inputs (grad_output, indices, ...) and one output (the inputs' gradient)");
  }
  const double added = static_cast<double>(call.inputs[0].numel());
  return make_work(OpClass::kEmbeddingBag, added, sum_bytes(call.inputs) + call.outputs[0].bytes(),
                   2 * added * call.outputs[0].element_size);
}

// Index and length shuffles (permute, bucketize, cumsum, bounds checks, the
// variable-batch metadata, sums of length segments): one pass, each input
// read once and each output written once.
OpWork sparse_data_pass(const OpCall& call) { return make_work(OpClass::kElementwise, 0, io_bytes(call)); }

}  // namespace

std::vector<std::pair<std::string, WorkFormula>> fbgemm_op_formulas() {
  std::vector<std::pair<std::string, WorkFormula>> table;
  auto add = [&table](const std::string& name, WorkFormula f) { table.emplace_back("fbgemm::" + name, std::move(f)); };

  add("split_embedding_codegen_grad_indice_weights_pt2_wrapper", tbe_grad_indice_weights(kGradIndiceWeightsLayout));
  add("split_embedding_codegen_grad_indice_weights_vbe_pt2_wrapper",
      tbe_grad_indice_weights(kVbeGradIndiceWeightsLayout));
  for (const char* weighting : {"unweighted", "weighted"}) {
    add(std::string("split_embedding_codegen_forward_") + weighting + "_pt2_wrapper", tbe_forward(kForwardLayout));
    add(std::string("split_embedding_codegen_forward_") + weighting + "_vbe_pt2_wrapper",
        tbe_forward(kVbeForwardLayout));
    const std::string backward = std::string("split_embedding_backward_codegen_");
    const std::string suffix = std::string("_") + weighting + "_pt2_wrapper";
    const std::string vbe_suffix = std::string("_") + weighting + "_vbe_pt2_wrapper";
    // SGD: w -= lr * g (mul, sub).
    add(backward + "sgd" + suffix, tbe_backward_fused(RowState::kNone, 2));
    add(backward + "sgd" + vbe_suffix, tbe_backward_fused(RowState::kNone, 2, kVbeBackwardLayout));
    // Adagrad: m += g * g; w -= lr * g / (sqrt(m) + eps): mul, add, sqrt, add, div, mul, sub.
    // (fbgemm has no variable-batch Adagrad.)
    add(backward + "adagrad" + suffix, tbe_backward_fused(RowState::kPerElement, 7));
    // Row-wise Adagrad: m += mean(g * g) over the row (mul, add per element),
    // then w -= (lr / (sqrt(m) + eps)) * g (mul, sub per element).
    add(backward + "rowwise_adagrad" + suffix, tbe_backward_fused(RowState::kPerRow, 4));
    add(backward + "rowwise_adagrad" + vbe_suffix, tbe_backward_fused(RowState::kPerRow, 4, kVbeBackwardLayout));
  }
  // Sequence embeddings (torchrec's EmbeddingCollection): the same per row, one output row per lookup.
  add("split_embedding_nobag_codegen_forward_unweighted_pt2_wrapper", tbe_forward(kNobagForwardLayout));
  const std::string nobag = "split_embedding_nobag_backward_codegen_";
  add(nobag + "sgd_unweighted_pt2_wrapper", tbe_backward_fused(RowState::kNone, 2, kNobagBackwardLayout));
  add(nobag + "adagrad_unweighted_pt2_wrapper", tbe_backward_fused(RowState::kPerElement, 7, kNobagBackwardLayout));
  add(nobag + "rowwise_adagrad_unweighted_pt2_wrapper",
      tbe_backward_fused(RowState::kPerRow, 4, kNobagBackwardLayout));
  add("dense_embedding_codegen_lookup_function", tbe_forward(kDenseForwardLayout));
  add("split_embedding_backward_codegen_dense_cpu", tbe_dense_backward);
  add("batch_index_select_dim0_forward_cpu_impl", batch_index_select_forward);
  add("batch_index_select_dim0_backward_cpu_impl", batch_index_select_backward);

  for (const char* name : {"permute_2D_sparse_data", "permute_1D_sparse_data", "block_bucketize_sparse_features",
                           "asynchronous_complete_cumsum", "asynchronous_exclusive_cumsum",
                           "asynchronous_inclusive_cumsum", "bounds_check_indices", "permute_pooled_embs",
                           "permute_pooled_embs_auto_grad", "permute_pooled_embs_split",
                           "permute_duplicate_pooled_embs_split", "get_infos_metadata", "generate_vbe_metadata",
                           "segment_sum_csr"}) {
    add(name, sparse_data_pass);
  }
  return table;
}

}  // namespace zion::sim
