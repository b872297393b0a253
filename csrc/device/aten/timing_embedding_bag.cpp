// Timing-only mode's embedding-bag family (see timing.h): their integer
// results are real, computed from the real indices and offsets; their float
// results are storage-less.

#include <ATen/EmptyTensor.h>
#include <ATen/core/stack.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_and_tensors.h>
#include <ATen/ops/aminmax.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "device/aten/op_pricing.h"
#include "device/aten/tensor_alias.h"
#include "device/aten/timing.h"
#include "device/runtime/allocator.h"
#include "device/runtime/runtime.h"

namespace zion::device {
namespace {

// The embedding-bag family: their integer results (offset2bag, bag_size,
// max_indices in sum and mean modes, a sparse gradient's indices) depend on
// the real indices and offsets only, and the feature dimension D is carried
// along. The CPU kernel runs with each storage-less float argument replaced
// by a zero stand-in of width min(D, 4) (fbgemm's CPU path rebuilds its
// kernel on every call at widths 1 and 2); the float results, and max mode's
// max_indices, come back storage-less with D put back. The integer results
// are the CPU kernel's own, so they equal real mode's.
bool is_embedding_bag_forward(const std::string& name) {
  return name == "aten::_embedding_bag" || name == "aten::_embedding_bag_forward_only";
}

// The forward kernel's integer results (offset2bag, bag_size, and in sum and
// mean modes max_indices) depend on the offsets and on which indices are the
// padding row, not on which other rows are looked up. When every index is in
// range, the stand-in weight is one row (two with a padding row) and the
// indices are remapped onto it: a table of any size costs its batch's
// lookups only. Out of range, a full-size contiguous stand-in takes real
// mode's path, so the kernel raises real mode's error. Arguments as _embedding_bag's schema: (weight,
// indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights,
// include_last_offset, padding_idx).
void use_tiny_weight(torch::jit::Stack::iterator args, int64_t rows, int64_t width, bool unit_stride) {
  const at::Tensor& indices = args[1].toTensor();
  if (indices.numel() > 0) {
    auto [lowest, highest] = at::aminmax(indices);
    if (lowest.item<int64_t>() < 0 || highest.item<int64_t>() >= rows) {
      // The contiguous path that real mode's weight takes checks the indices, with its message.
      args[0] = at::zeros({rows, width}, args[0].toTensor().options());
      return;
    }
  }
  const at::Tensor& weight = args[0].toTensor();
  // The kernel's fast path needs rows of unit stride (`unit_stride`, of the
  // real weight): a weight without them gets a stand-in without them, so
  // that the kernel takes the same path.
  auto stand_in = [&](int64_t k) {
    return unit_stride ? at::zeros({k, width}, weight.options())
                       : at::zeros({k, 2 * width}, weight.options()).slice(1, 0, 2 * width, 2);
  };
  const int64_t padding = args[8].isInt() ? args[8].toInt() : -1;
  if (padding >= 0 && padding < rows) {
    args[1] = indices.eq(padding).to(indices.scalar_type());
    args[8] = int64_t{1};
    args[0] = stand_in(2);
  } else {
    args[1] = at::zeros_like(indices);
    args[0] = stand_in(1);
  }
}


// A sparse gradient of the sum or mean modes, without a stand-in. Its values
// are rows of the incoming gradient (index_select by offset2bag, divided by
// the bag sizes in mean mode, times per_sample_weights): all storage-less.
// Its indices are the lookups' indices, those of the padding row left out,
// as the CPU kernel (_embedding_bag_sparse_backward, then
// embedding_sparse_backward) makes them, and it is coalesced when it has
// fewer than two, as PyTorch's sparse constructor decides. Only the common
// case is taken: indices and offsets of one index dtype, contiguous, a valid
// offset2bag; anything else (and the errors the kernel raises) goes through
// the stand-ins below. Returns whether it took the call.
// The arguments of an embedding-bag op that the paths below read, by name
// (the forward and the two backward ops order them differently).
struct EmbeddingBagArgs {
  const at::Tensor* weight = nullptr;
  const at::Tensor* grad = nullptr;
  const at::Tensor* indices = nullptr;
  const at::Tensor* offsets = nullptr;
  const at::Tensor* offset2bag = nullptr;
  const at::Tensor* per_sample_weights = nullptr;
  int64_t num_weights = -1, mode = -1, padding_idx = -1;
  bool scale_grad_by_freq = false, sparse = true, include_last_offset = false;
};

EmbeddingBagArgs read_args(const c10::FunctionSchema& schema, torch::jit::Stack::iterator args) {
  EmbeddingBagArgs out;
  const auto& arguments = schema.arguments();
  for (size_t i = 0; i < arguments.size(); ++i) {
    const std::string& name = arguments[i].name();
    const c10::IValue& v = args[static_cast<std::ptrdiff_t>(i)];
    if (v.isTensor()) {
      const at::Tensor* t = &v.toTensor();
      if (name == "weight") out.weight = t;
      else if (name == "grad") out.grad = t;
      else if (name == "indices") out.indices = t;
      else if (name == "offsets") out.offsets = t;
      else if (name == "offset2bag") out.offset2bag = t;
      else if (name == "per_sample_weights") out.per_sample_weights = t->defined() ? t : nullptr;
    } else if (v.isInt()) {
      if (name == "num_weights") out.num_weights = v.toInt();
      else if (name == "mode") out.mode = v.toInt();
      else if (name == "padding_idx") out.padding_idx = v.toInt();
    } else if (v.isBool()) {
      if (name == "scale_grad_by_freq") out.scale_grad_by_freq = v.toBool();
      else if (name == "sparse") out.sparse = v.toBool();
      else if (name == "include_last_offset") out.include_last_offset = v.toBool();
    }
  }
  return out;
}

// The zion tensors among an op's n arguments, in order: what charge_op prices.
std::vector<at::Tensor> zion_tensors(torch::jit::Stack::iterator args, size_t n) {
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = args[static_cast<std::ptrdiff_t>(i)];
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().device().is_privateuseone()) out.push_back(v.toTensor());
  }
  return out;
}

bool is_plain_index(const at::Tensor& t, c10::ScalarType dtype) {
  return t.defined() && t.device().is_privateuseone() && !is_storage_less(t) && t.layout() == c10::kStrided &&
         t.scalar_type() == dtype && t.dim() == 1 && t.is_contiguous();
}

bool sparse_backward_without_stand_ins(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  if (schema.name() != "aten::_embedding_bag_backward" && schema.name() != "aten::_embedding_bag_sparse_backward") {
    return false;
  }
  const size_t n = schema.arguments().size();
  auto args = stack->end() - static_cast<std::ptrdiff_t>(n);
  const EmbeddingBagArgs a = read_args(schema, args);
  if (!a.grad || !a.indices || !a.offsets || !a.offset2bag || a.num_weights < 0 || !a.sparse ||
      a.scale_grad_by_freq) {
    return false;
  }
  if (a.mode != 0 && a.mode != 1) return false;  // max mode, or a mode the kernel refuses
  if (a.per_sample_weights && a.mode != 0) return false;
  const at::Tensor& grad = *a.grad;
  if (!grad.device().is_privateuseone() || !is_storage_less(grad) || grad.dim() != 2 || grad.is_sparse()) return false;
  const c10::ScalarType index_type = a.indices->scalar_type();
  if (index_type != c10::kLong && index_type != c10::kInt) return false;
  if (!is_plain_index(*a.indices, index_type) || !is_plain_index(*a.offsets, index_type)) return false;
  const int64_t lookups = a.indices->numel();
  // offset2bag is read by the values only; the kernel checks it when given.
  const at::Tensor& o2b = *a.offset2bag;
  if (!(o2b.numel() == 0 || (is_plain_index(o2b, o2b.scalar_type()) &&
                             (o2b.scalar_type() == c10::kLong || o2b.scalar_type() == c10::kInt) &&
                             o2b.numel() == lookups))) {
    return false;
  }
  const c10::DeviceIndex device = grad.device().index();
  const int64_t d = grad.size(1);
  const std::vector<at::Tensor> inputs = zion_tensors(args, n);
  AliasSet aliases(device);
  at::Tensor index;  // [1, nnz] int64, on the host (an alias's view, or fresh)
  at::Tensor cpu_indices = aliases.alias(*a.indices);
  if (a.padding_idx != -1) cpu_indices = cpu_indices.index({cpu_indices.ne(a.padding_idx)});
  const int64_t nnz = cpu_indices.numel();
  if (nnz * d == 0) {
    index = at::empty({1, 0}, cpu_indices.options().dtype(c10::kLong));  // the kernel's "all padding" result
  } else {
    index = cpu_indices.reshape({1, -1}).to(c10::kLong);
  }
  at::Tensor zion_index = aliases.to_zion(index);
  at::Tensor values = empty_storage_less({nnz * d == 0 ? 0 : nnz, d}, grad.scalar_type(), device);
  at::Tensor result = at::_sparse_coo_tensor_with_dims_and_tensors(
      1, 1, {a.num_weights, d}, zion_index, values, grad.options().layout(c10::kSparse), nnz * d == 0 || nnz < 2);
  torch::jit::drop(*stack, n);
  stack->emplace_back(result);
  charge_op(op, device, inputs, {result});
  return true;
}

// The kernel's checks of a sum-mode call, on the host: every index within
// the table's rows, offsets[0] = 0, offsets that never decrease, and the
// last within the indices. Plain loops over contiguous data, without early
// exits, so that the compiler vectorizes them; each is built for AVX-512,
// AVX2 and the baseline, and the loader picks the one the CPU runs
// (target_clones). The indices' check takes the largest index read as
// unsigned (a negative one reads as above the index type's maximum).
// Measured on 20,480 int64 indices in cache: 0.07 ns an index against
// 0.20 for four running maxima in scalar registers and 0.6 for one chain.
#define ZION_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

template <typename Unsigned>
ZION_VECTOR_CLONES Unsigned highest_unsigned(const Unsigned* values, int64_t n) {
  Unsigned highest = 0;
  for (int64_t i = 0; i < n; ++i) highest = values[i] > highest ? values[i] : highest;
  return highest;
}

// How many times a value is below the one before it.
template <typename Index>
ZION_VECTOR_CLONES int64_t descents(const Index* values, int64_t n) {
  int64_t count = 0;
  for (int64_t i = 1; i < n; ++i) count += values[i] < values[i - 1] ? 1 : 0;
  return count;
}

template <typename Index>
bool lookups_are_valid(const at::Tensor& indices, const at::Tensor& offsets, int64_t rows) {
  using Unsigned = std::make_unsigned_t<Index>;
  const int64_t lookups = indices.numel();
  const Unsigned highest = highest_unsigned(reinterpret_cast<const Unsigned*>(indices.const_data_ptr<Index>()), lookups);
  if (lookups > 0 && (highest > static_cast<Unsigned>(std::numeric_limits<Index>::max()) ||
                      static_cast<int64_t>(highest) >= rows)) {
    return false;
  }
  const Index* off = offsets.const_data_ptr<Index>();
  const int64_t n = offsets.numel();
  return off[0] == 0 && static_cast<int64_t>(off[n - 1]) <= lookups && descents(off, n) == 0;
}

// A real zion tensor of n zeros, made in the device's pool as the kernel's
// result would be adopted there, without a dispatched (and priced) op.
at::Tensor real_zeros(int64_t n, c10::ScalarType dtype, c10::DeviceIndex device) {
  const c10::DeviceIndex previous = current_device();
  if (previous != device) set_current_device(device);
  at::Tensor t = at::detail::empty_generic({n}, &allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           dtype, std::nullopt);
  if (previous != device) set_current_device(previous);
  if (n > 0) std::memset(t.data_ptr(), 0, static_cast<size_t>(n) * t.element_size());
  return t;
}

// The forward of sum mode on its fast path, without a stand-in. When the
// CPU kernel takes its fast path for sums (a float, half or bfloat16 weight
// with unit row stride, no padding row, per_sample_weights of unit stride:
// _embedding_bag_cpu_impl_out's is_fast_path), its integer results depend on
// the number of bags alone: offset2bag empty, bag_size and max_indices zeros
// of the index dtype, bag_size over a storage of one element per offset (the
// kernel narrows it when include_last_offset drops the last; the forward-only
// op leaves both at one element per offset). The kernel's
// checks are taken first: every index in the table, offsets[0] = 0, offsets
// that never decrease and end within the indices. A call that fails one,
// or any other case, goes through the stand-ins, which raise real mode's
// error. Returns whether it took the call.
bool sum_forward_without_stand_ins(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  if (!is_embedding_bag_forward(schema.name())) return false;
  const size_t n = schema.arguments().size();
  auto args = stack->end() - static_cast<std::ptrdiff_t>(n);
  const EmbeddingBagArgs a = read_args(schema, args);
  if (!a.weight || !a.indices || !a.offsets || a.mode != 0 || a.padding_idx >= 0) return false;
  const at::Tensor& weight = *a.weight;
  const c10::ScalarType wtype = weight.scalar_type();
  if (!weight.device().is_privateuseone() || !is_storage_less(weight) || weight.dim() != 2 || weight.is_sparse() ||
      weight.stride(1) != 1 || !(wtype == c10::kFloat || wtype == c10::kHalf || wtype == c10::kBFloat16)) {
    return false;
  }
  const c10::ScalarType index_type = a.indices->scalar_type();
  if (index_type != c10::kLong && index_type != c10::kInt) return false;
  if (!is_plain_index(*a.indices, index_type) || !is_plain_index(*a.offsets, index_type)) return false;
  const at::Tensor* psw = a.per_sample_weights;
  if (psw && (!psw->device().is_privateuseone() || psw->dim() != 1 || psw->scalar_type() != wtype ||
              psw->numel() != a.indices->numel() || psw->stride(0) != 1)) {
    return false;
  }
  const int64_t lookups = a.indices->numel(), num_offsets = a.offsets->numel();
  const int64_t bags = num_offsets - (a.include_last_offset ? 1 : 0);
  if (bags < 1) return false;
  const c10::DeviceIndex device = weight.device().index();
  // Real integer zion tensors: their bytes are host memory, read in place.
  const bool valid = index_type == c10::kLong
                         ? lookups_are_valid<int64_t>(*a.indices, *a.offsets, weight.size(0))
                         : lookups_are_valid<int32_t>(*a.indices, *a.offsets, weight.size(0));
  if (!valid) return false;

  const std::vector<at::Tensor> inputs = zion_tensors(args, n);
  // _embedding_bag narrows bag_size to the bags; _embedding_bag_forward_only
  // returns both it and max_indices with one element per offset.
  const bool forward_only = schema.name() == "aten::_embedding_bag_forward_only";
  at::Tensor bag_size = real_zeros(num_offsets, index_type, device);
  if (!forward_only) bag_size.unsafeGetTensorImpl()->set_sizes_contiguous({bags});
  std::array<at::Tensor, 4> outputs{
      empty_storage_less({bags, weight.size(1)}, wtype, device),
      real_zeros(0, index_type, device),
      std::move(bag_size),
      real_zeros(forward_only ? num_offsets : bags, index_type, device),
  };
  torch::jit::drop(*stack, n);
  for (const at::Tensor& t : outputs) stack->emplace_back(t);
  charge_op(op, device, inputs, outputs);
  return true;
}

void narrowed_embedding_bag(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  constexpr int64_t kStandInWidth = 4;
  // A stand-in of more elements than this is one zero broadcast (no bytes),
  // at the cost of the kernel's contiguous fast path.
  constexpr int64_t kContiguousStandIn = int64_t{1} << 22;
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size();
  auto args = stack->end() - static_cast<std::ptrdiff_t>(n);
  int64_t d = -1, mode = 0;
  c10::DeviceIndex device = -1;
  std::vector<at::Tensor> inputs;
  AliasSet aliases;
  for (size_t i = 0; i < n; ++i) {
    c10::IValue& v = args[static_cast<std::ptrdiff_t>(i)];
    if (schema.arguments()[i].name() == "mode" && v.isInt()) mode = v.toInt();
    if (!v.isTensor() || !v.toTensor().defined()) continue;
    at::Tensor t = v.toTensor();
    if (!t.device().is_privateuseone()) continue;
    if (device < 0) device = t.device().index();
    inputs.push_back(t);
    if (!is_storage_less(t)) {
      v = aliases.alias(t);
      continue;
    }
    // Max mode's maximum_indices come from the (unknown) maxima: they only
    // say which rows the unknown gradients go to, and zeros stand in for them.
    const bool maxima = schema.arguments()[i].name() == "maximum_indices";
    TORCH_CHECK(c10::isFloatingType(t.scalar_type()) || maxima, "zion timing-only: ", schema.operator_name(),
                " needs the values of its argument '", schema.arguments()[i].name(), "', a storage-less ",
                t.scalar_type(), " tensor (its values came from storage-less floats); indices and offsets must be real");
    std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
    if (shape.size() == 2) {
      d = shape[1];
      shape[1] = std::min(d, kStandInWidth);
    }
    int64_t numel = 1;
    for (int64_t extent : shape) numel *= extent;
    // A forward's weight is replaced by a tiny one below, if its indices allow.
    const bool broadcast = numel > kContiguousStandIn || (i == 0 && is_embedding_bag_forward(schema.name()));
    v = broadcast ? at::zeros({1}, t.options().device(c10::kCPU)).expand(shape)
                  : at::zeros(shape, t.options().device(c10::kCPU));
  }
  if (is_embedding_bag_forward(schema.name()) && is_storage_less(inputs.at(0))) {
    const at::Tensor& weight = inputs.at(0);
    use_tiny_weight(args, weight.size(0), d < 0 ? weight.size(-1) : std::min(d, kStandInWidth),
                    weight.dim() < 2 || weight.stride(1) == 1);
  }
  aliases.set_device(device);
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  aliases.commit();
  auto storage_less_like = [&](const at::Tensor& t) { return storage_less_result(t, d, kStandInWidth, device); };
  const size_t num_returns = schema.returns().size();
  std::vector<at::Tensor> outputs;
  for (auto it = stack->end() - static_cast<std::ptrdiff_t>(num_returns); it != stack->end(); ++it) {
    if (!it->isTensor()) continue;
    at::Tensor t = it->toTensor();
    if (!t.defined()) continue;
    if (t.is_sparse()) {
      // A sparse gradient: real indices, storage-less values [nnz, D].
      at::Tensor values = storage_less_like(t._values());
      std::vector<int64_t> size(t.sizes().begin(), t.sizes().end());
      if (size.size() == 2 && d >= 0) size[1] = d;
      *it = at::_sparse_coo_tensor_with_dims_and_tensors(
          t.sparse_dim(), t.dense_dim(), size, aliases.to_zion(t._indices()), values,
          t.options().device(c10::Device(c10::DeviceType::PrivateUse1, device)), t.is_coalesced());
    } else if (c10::isFloatingType(t.scalar_type()) || (mode == 2 && t.dim() == 2)) {
      *it = storage_less_like(t);  // max mode's max_indices [bags, D] point at the (unknown) maxima
    } else {
      *it = aliases.to_zion(t);
    }
    outputs.push_back(it->toTensor());
  }
  charge_op(op, device, inputs, outputs);
}

}  // namespace

bool is_embedding_bag_family(const std::string& name) {
  return name == "aten::_embedding_bag" || name == "aten::_embedding_bag_forward_only" ||
         name == "aten::_embedding_bag_backward" || name == "aten::_embedding_bag_dense_backward" ||
         name == "aten::_embedding_bag_sparse_backward" || name == "aten::embedding_dense_backward" ||
         name == "aten::_embedding_bag_per_sample_weights_backward";
}

void embedding_bag_without_bytes(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (sum_forward_without_stand_ins(op, stack) || sparse_backward_without_stand_ins(op, stack)) return;
  narrowed_embedding_bag(op, stack);
}

}  // namespace zion::device
