#include "device/aten/timing.h"

#include <ATen/EmptyTensor.h>
#include <ATen/ExpandUtils.h>
#include <ATen/ops/clamp_min_ops.h>
#include <ATen/ops/count_nonzero.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/isfinite_native.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/TensorImpl.h>
#include <torch/library.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>

#include "device/aten/op_pricing.h"
#include "device/aten/operator_facts.h"
#include "device/aten/tensor_alias.h"
#include "device/runtime/allocator.h"
#include "device/runtime/runtime.h"

namespace zion::device {
namespace {

bool holds_storage_less(const c10::IValue& v) {
  if (v.isTensor()) return is_storage_less(v.toTensor());
  if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) if (is_storage_less(t)) return true;
    return false;
  }
  if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) if (e.isTensor() && is_storage_less(e.toTensor())) return true;
  }
  return false;
}

constexpr auto kZionKeys = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);

c10::Storage meta_storage(size_t nbytes) {
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes,
                                                            c10::DataPtr(nullptr, c10::Device(c10::kMeta)),
                                                            c10::GetAllocator(c10::kMeta), true));
}

at::Tensor over(c10::Storage storage, c10::DispatchKey key, const at::Tensor& like) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(key), like.dtype());
  impl->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  return at::Tensor(std::move(impl));
}

c10::Storage new_storage_less(c10::DeviceIndex device, size_t nbytes) {
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes,
                                                            allocator().allocate_storage_less(device, nbytes),
                                                            &storage_less_allocator(), true));
}

struct MetaCall {
  const c10::OperatorHandle& op;
  c10::DeviceIndex device = -1;
  c10::SmallVector<std::pair<c10::StorageImpl*, c10::Storage>, 4> meta_of;  // zion storage -> meta storage
  c10::SmallVector<std::pair<c10::StorageImpl*, c10::Storage>, 4> zion_of;  // meta storage -> zion storage
  c10::SmallVector<std::pair<c10::TensorImpl*, at::Tensor>, 4> arg_of;      // meta alias -> zion argument
  std::vector<at::Tensor> inputs;

  at::Tensor to_meta(const at::Tensor& t) {
    if (!t.defined()) return t;
    if (t.device().is_privateuseone()) {
      TORCH_CHECK_NOT_IMPLEMENTED(!t.is_sparse(), "zion timing-only: ", op.schema().operator_name(),
                                  " with a sparse zion argument has no storage-less rule yet");
      if (device < 0) device = t.device().index();
      c10::StorageImpl* z = t.storage().unsafeGetStorageImpl();
      c10::Storage* m = nullptr;
      for (auto& [k, v] : meta_of) if (k == z) m = &v;
      if (!m) {
        meta_of.emplace_back(z, meta_storage(z->nbytes()));
        m = &meta_of.back().second;
        zion_of.emplace_back(m->unsafeGetStorageImpl(), t.storage());
      }
      at::Tensor a = over(*m, c10::DispatchKey::Meta, t);
      a.unsafeGetTensorImpl()->_set_conj(t.is_conj());
      a.unsafeGetTensorImpl()->_set_neg(t.is_neg());
      arg_of.emplace_back(a.unsafeGetTensorImpl(), t);
      inputs.push_back(a);
      return a;
    }
    if (t.device().is_cpu() && t.dim() > 0) {
      return over(meta_storage(t.storage().nbytes()), c10::DispatchKey::Meta, t);  // an index tensor on the host
    }
    return t;
  }

  c10::IValue convert(c10::IValue&& v) {
    if (v.isTensor()) {
      // As the fallback prices a non-ATen op's undefined argument: an empty
      // tensor, so its formula finds the others where the schema puts them.
      if (!v.toTensor().defined() && op.schema().name().rfind("aten::", 0) != 0) {
        static const at::Tensor empty = at::empty({0});
        inputs.push_back(empty);
      }
      return to_meta(v.toTensor());
    }
    if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorList()) out.push_back(to_meta(t));
      return out;
    }
    if (v.isList()) {
      auto list = v.toList();
      bool has = false;
      for (const c10::IValue& e : list) has = has || e.isTensor();
      if (!has) return std::move(v);
      c10::List<std::optional<at::Tensor>> out;
      for (const c10::IValue& e : list) out.push_back(e.isTensor() ? std::optional<at::Tensor>(to_meta(e.toTensor())) : std::nullopt);
      return out;
    }
    if (v.isDevice() && v.toDevice().is_privateuseone()) {
      if (device < 0 && v.toDevice().has_index()) device = v.toDevice().index();
      return c10::Device(c10::kMeta);
    }
    return std::move(v);
  }

  // The zion storage behind a meta storage, grown (storage-less) if the kernel
  // resized it. A real one grown so (an out= result that a composite op made
  // empty, as logical_not, median and kthvalue do: bool and integer results
  // stay real) takes values computed from storage-less ones: it is storage-less too.
  const c10::Storage* zion_storage(c10::StorageImpl* m) {
    for (auto& [k, z] : zion_of) {
      if (k != m) continue;
      if (m->nbytes() > z.nbytes()) {
        z.unsafeGetStorageImpl()->set_data_ptr_noswap(allocator().allocate_storage_less(device, m->nbytes()));
        z.unsafeGetStorageImpl()->set_nbytes(m->nbytes());
      }
      return &z;
    }
    return nullptr;
  }

  at::Tensor result(const at::Tensor& t) {
    if (!t.defined() || !t.device().is_meta()) return t;
    for (auto& [a, z] : arg_of) {
      if (a == t.unsafeGetTensorImpl()) {
        sync_metadata(t, z);
        return z;
      }
    }
    if (const c10::Storage* z = zion_storage(t.storage().unsafeGetStorageImpl())) {
      return over(*z, c10::DispatchKey::PrivateUse1, t);  // a view of an argument
    }
    // Fresh: one storage-less zion storage per fresh meta storage.
    c10::StorageImpl* m = t.storage().unsafeGetStorageImpl();
    c10::Storage z = new_storage_less(device, m->nbytes());
    zion_of.emplace_back(m, z);
    return over(z, c10::DispatchKey::PrivateUse1, t);
  }

  c10::IValue convert_result(c10::IValue&& v) {
    if (v.isTensor()) return result(v.toTensor());
    if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorList()) out.push_back(result(t));
      return out;
    }
    return std::move(v);
  }
};

// Arguments whose values select elements: a storage-less integer tensor there
// is an index computed from storage-less floats, which has no real value.
bool is_index_argument(const std::string& name) {
  return name == "index" || name == "indices" || name == "offsets" || name == "lengths" || name == "repeats";
}

bool is_mask(const at::Tensor& t) { return t.scalar_type() == c10::kBool || t.scalar_type() == c10::kByte; }
bool is_float(const at::Tensor& t) { return c10::isFloatingType(t.scalar_type()) || c10::isComplexType(t.scalar_type()); }

// Whether every tensor argument of the op other than its indices is
// floating-point: then an index computed from storage-less floats only says
// where unknown values go or come from (the backward of max, topk, sort and
// max pooling scatters gradients by such indices), and the results' shapes
// and price do not depend on it.
bool indexes_only_floats(const c10::FunctionSchema& schema, const torch::jit::Stack* stack,
                         c10::ArrayRef<int> index_args) {
  const size_t n = schema.arguments().size();
  for (size_t i = 0; i < n; ++i) {
    if (std::find(index_args.begin(), index_args.end(), static_cast<int>(i)) != index_args.end()) continue;
    const c10::IValue& v = (*stack)[stack->size() - n + i];
    if (v.isTensor() && v.toTensor().defined() && !is_float(v.toTensor())) return false;
    if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) if (!is_float(t)) return false;
    }
  }
  return true;
}

// `positions_only`: a storage-less integer index is accepted (see indexes_only_floats).
void check_no_storage_less_index(const c10::FunctionSchema& schema, const c10::IValue& v, const std::string& name,
                                 bool positions_only) {
  auto check = [&](const at::Tensor& t) {
    if (!is_storage_less(t) || is_float(t) || (positions_only && !is_mask(t))) return;
    TORCH_CHECK(false, "zion timing-only: ", schema.operator_name(), " uses a storage-less ", t.scalar_type(),
                " tensor as its '", name, "'; its values were computed from storage-less floats, so they are not "
                "known in timing-only mode, and ",
                is_mask(t) ? "which elements a mask selects" : "an index into integer or bool tensors",
                " needs real values. Compute indices and masks from integer tensors (which stay real), or run in "
                "real mode");
  };
  if (v.isTensor()) {
    check(v.toTensor());
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (e.isTensor()) check(e.toTensor());
    }
  }
}

// A real mask (bool or uint8) on the host or on zion, as a CPU tensor that
// reads its bytes; undefined for anything else.
at::Tensor real_mask(const c10::IValue& v) {
  if (!v.isTensor()) return at::Tensor();
  const at::Tensor& t = v.toTensor();
  if (!t.defined() || !is_mask(t) || is_storage_less(t)) return at::Tensor();
  return t.device().is_privateuseone() ? cpu_alias(t) : t;
}

// index.Tensor of a storage-less tensor by real masks: as the CPU kernel
// does, each mask of k dimensions stands for the k index vectors of its
// nonzero elements, whose length is the number of its true elements; the
// Meta kernel, which cannot count them, gets those (as meta tensors). The
// op is priced with the masks, as real mode prices it. `converted` is the
// argument after MetaCall::convert; `masks` the real masks by position.
c10::IValue indices_for_masks(const c10::IValue& converted, const std::vector<at::Tensor>& masks) {
  c10::List<std::optional<at::Tensor>> out;
  const auto list = converted.toList();
  for (size_t i = 0; i < list.size(); ++i) {
    if (i < masks.size() && masks[i].defined()) {
      const int64_t count = masks[i].count_nonzero().item<int64_t>();
      for (int64_t d = 0; d < masks[i].dim(); ++d) {
        out.push_back(at::empty({count}, at::TensorOptions().device(c10::kMeta).dtype(c10::kLong)));
      }
    } else {
      const c10::IValue e = list.get(i);
      out.push_back(e.isTensor() ? std::optional<at::Tensor>(e.toTensor()) : std::nullopt);
    }
  }
  return out;
}

at::Tensor first_storage_less_argument(const c10::OperatorHandle& op, const torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  for (auto it = stack->end() - static_cast<std::ptrdiff_t>(n); it != stack->end(); ++it) {
    if (it->isTensor() && is_storage_less(it->toTensor())) return it->toTensor();
    if (it->isTensorList()) {
      for (const at::Tensor& t : it->toTensorList()) if (is_storage_less(t)) return t;
    }
    if (it->isList()) {
      for (const c10::IValue& e : it->toListRef()) if (e.isTensor() && is_storage_less(e.toTensor())) return e.toTensor();
    }
  }
  return at::Tensor();
}

// Ops whose results' shapes depend on their inputs' values: no Meta kernel
// can give them for a storage-less input.
bool is_data_dependent(const std::string& name) {
  static const char* const kNames[] = {
      "aten::nonzero", "aten::argwhere", "aten::masked_select", "aten::unique_consecutive", "aten::unique_dim",
      "aten::_unique", "aten::_unique2", "aten::unique_dim_consecutive", "aten::repeat_interleave",
      "aten::bincount", "aten::nonzero_numpy", "aten::_local_scalar_dense"};
  for (const char* n : kNames) {
    if (name == n) return true;
  }
  return false;
}

// Placeholder reads: where the script read a storage-less value, and how often.
struct PlaceholderRegistry {
  std::mutex mutex;
  std::vector<PlaceholderRead> reads;
  std::string (*call_site)() = nullptr;
};

PlaceholderRegistry& placeholders() {
  static PlaceholderRegistry registry;
  return registry;
}

// Counts a read; true the first time at this call site.
bool count_placeholder(const std::string& site, const char* what, const at::Tensor& t) {
  PlaceholderRegistry& r = placeholders();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (PlaceholderRead& read : r.reads) {
    if (read.site == site && read.what == what) {
      read.count += 1;
      return false;
    }
  }
  r.reads.push_back({site, what, std::string(c10::toString(t.scalar_type())), 1});
  return true;
}

// fbgemm's table-batched embedding (TBE) wrappers have CPU and CUDA kernels
// and no Meta kernel; torchrec's sharded tables call them. The shape rules
// of their CPU kernels, for timing-only mode: the pooled forward returns
// [B, total_D] in output_dtype (B = offsets / tables), and a backward with
// the optimizer fused returns nothing (it updates the weights in place).
// Arguments as in the ops' schemas.

// A forward's output dtype, from fbgemm's SparseType code: FP32 0, FP16 1, BF16 5.
c10::ScalarType tbe_output_dtype(const c10::FunctionSchema& schema, int64_t code) {
  TORCH_CHECK(code == 0 || code == 1 || code == 5, "zion timing-only: ", schema.operator_name(),
              " with output_dtype ", code, " has no shape rule (FP32 0, FP16 1 and BF16 5 have)");
  return code == 1 ? c10::kHalf : code == 5 ? c10::kBFloat16 : c10::kFloat;
}

void tbe_forward_meta(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size();
  auto arg = [&](const char* name) -> const c10::IValue& {
    return (*stack)[stack->size() - n + *schema.argumentIndexWithName(name)];
  };
  if (auto b = schema.argumentIndexWithName("B_offsets")) {
    TORCH_CHECK((*stack)[stack->size() - n + *b].isNone(), "zion timing-only: ", schema.operator_name(),
                " with variable batch sizes per feature (B_offsets) has no shape rule");
  }
  const int64_t tables = arg("D_offsets").toTensor().numel() - 1;
  const int64_t batch = tables > 0 ? (arg("offsets").toTensor().numel() - 1) / tables : 0;
  const int64_t total_d = arg("total_D").toInt();
  const c10::ScalarType dtype = tbe_output_dtype(schema, arg("output_dtype").toInt());
  at::Tensor out = at::empty({batch, total_d}, at::TensorOptions().device(c10::kMeta).dtype(dtype));
  torch::jit::drop(*stack, n);
  stack->emplace_back(std::move(out));
}

// The no-bag (sequence) forward returns one row of D per lookup: [L, D].
void tbe_nobag_forward_meta(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size();
  auto arg = [&](const char* name) -> const c10::IValue& {
    return (*stack)[stack->size() - n + *schema.argumentIndexWithName(name)];
  };
  const int64_t lookups = arg("indices").toTensor().numel();
  const int64_t d = arg("D").toInt();
  const c10::ScalarType dtype = tbe_output_dtype(schema, arg("output_dtype").toInt());
  at::Tensor out = at::empty({lookups, d}, at::TensorOptions().device(c10::kMeta).dtype(dtype));
  torch::jit::drop(*stack, n);
  stack->emplace_back(std::move(out));
}

// A variable-batch (VBE) forward returns every bag's pooled row in one flat
// tensor of vbe_output_size elements. Given a vbe_output to write into, the
// CPU kernel returns that tensor; timing-only mode has no rule for the alias.
void tbe_vbe_forward_meta(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size();
  auto arg = [&](const char* name) -> const c10::IValue& {
    return (*stack)[stack->size() - n + *schema.argumentIndexWithName(name)];
  };
  TORCH_CHECK(arg("vbe_output").isNone(), "zion timing-only: ", schema.operator_name(),
              " given a vbe_output to write into has no shape rule (without one it has)");
  const c10::ScalarType dtype = tbe_output_dtype(schema, arg("output_dtype").toInt());
  at::Tensor out =
      at::empty({arg("vbe_output_size").toInt()}, at::TensorOptions().device(c10::kMeta).dtype(dtype));
  torch::jit::drop(*stack, n);
  stack->emplace_back(std::move(out));
}

// The dense (data-parallel) table's backward returns the gradient of all its weights.
void tbe_dense_backward_meta(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size();
  const at::Tensor& weights = (*stack)[stack->size() - n + *schema.argumentIndexWithName("host_weights")].toTensor();
  at::Tensor grad = at::empty(weights.sizes(), weights.options().device(c10::kMeta));
  torch::jit::drop(*stack, n);
  stack->emplace_back(std::move(grad));
}

// The gradient of weighted features' per-sample weights: one per lookup, in
// the gradient's dtype (the CPU kernel's zeros_like(indices) of that dtype).
void tbe_grad_indice_weights_meta(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size();
  auto arg = [&](const char* name) -> const at::Tensor& {
    return (*stack)[stack->size() - n + *schema.argumentIndexWithName(name)].toTensor();
  };
  at::Tensor grad = at::empty(arg("indices").sizes(), arg("grad_output").options().device(c10::kMeta));
  torch::jit::drop(*stack, n);
  stack->emplace_back(std::move(grad));
}

void tbe_fused_backward_meta(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  torch::jit::drop(*stack, op.schema().arguments().size());
  stack->emplace_back(at::Tensor());
}

TORCH_LIBRARY_IMPL(fbgemm, Meta, m) {
  // The registrations keep the names' pointers: they live as long as the library.
  static const std::vector<std::pair<std::string, bool>> ops = [] {
    std::vector<std::pair<std::string, bool>> out;  // name, is_forward
    for (const char* weighting : {"unweighted", "weighted"}) {
      out.emplace_back(std::string("split_embedding_codegen_forward_") + weighting + "_pt2_wrapper", true);
      for (const char* optimizer : {"sgd", "adagrad", "rowwise_adagrad", "adam", "lamb", "partial_rowwise_adam",
                                    "partial_rowwise_lamb", "lars_sgd"}) {
        out.emplace_back(std::string("split_embedding_backward_codegen_") + optimizer + "_" + weighting + "_pt2_wrapper",
                         false);
      }
    }
    // Variable-batch lookups' backward (fbgemm has them for SGD and row-wise Adagrad).
    for (const char* weighting : {"unweighted", "weighted"}) {
      for (const char* optimizer : {"sgd", "rowwise_adagrad"}) {
        out.emplace_back(std::string("split_embedding_backward_codegen_") + optimizer + "_" + weighting +
                             "_vbe_pt2_wrapper",
                         false);
      }
    }
    // Sequence embeddings' backward (unweighted only: fbgemm has no weighted no-bag lookup).
    for (const char* optimizer : {"sgd", "adagrad", "rowwise_adagrad"}) {
      out.emplace_back(std::string("split_embedding_nobag_backward_codegen_") + optimizer + "_unweighted_pt2_wrapper",
                       false);
    }
    return out;
  }();
  m.impl("dense_embedding_codegen_lookup_function", torch::CppFunction::makeFromBoxedFunction<&tbe_forward_meta>());
  m.impl("split_embedding_nobag_codegen_forward_unweighted_pt2_wrapper",
         torch::CppFunction::makeFromBoxedFunction<&tbe_nobag_forward_meta>());
  m.impl("split_embedding_backward_codegen_dense_cpu",
         torch::CppFunction::makeFromBoxedFunction<&tbe_dense_backward_meta>());
  m.impl("split_embedding_codegen_grad_indice_weights_pt2_wrapper",
         torch::CppFunction::makeFromBoxedFunction<&tbe_grad_indice_weights_meta>());
  m.impl("split_embedding_codegen_grad_indice_weights_vbe_pt2_wrapper",
         torch::CppFunction::makeFromBoxedFunction<&tbe_grad_indice_weights_meta>());
  for (const char* name : {"split_embedding_codegen_forward_unweighted_vbe_pt2_wrapper",
                           "split_embedding_codegen_forward_weighted_vbe_pt2_wrapper"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&tbe_vbe_forward_meta>());
  }
  for (const auto& [name, forward] : ops) {
    if (forward) {
      m.impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&tbe_forward_meta>());
    } else {
      m.impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&tbe_fused_backward_meta>());
    }
  }
}

}  // namespace

bool is_storage_less(const at::Tensor& t) {
  if (!t.defined() || !t.device().is_privateuseone()) return false;
  if (t.is_sparse()) return is_storage_less(t._values().storage()) || is_storage_less(t._indices().storage());
  return t.has_storage() && is_storage_less(t.storage());
}

bool covers_storage(const at::Tensor& t) {
  return t.has_storage() && !t.is_sparse() && t.is_non_overlapping_and_dense() && t.storage_offset() == 0 &&
         static_cast<size_t>(t.numel()) * t.element_size() == t.storage().nbytes();
}

void make_storage_less(const at::Tensor& t) {
  c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  if (is_storage_less(impl)) return;
  // The real bytes leave the pool as the storage-less ones enter it.
  const size_t nbytes = impl->nbytes();
  c10::DataPtr real = impl->set_data_ptr(c10::DataPtr(nullptr, impl->device()));
  real.clear();
  impl->set_data_ptr_noswap(allocator().allocate_storage_less(t.device().index(), nbytes));
}

bool stays_real(c10::ScalarType dtype, size_t nbytes) {
  if (c10::isFloatingType(dtype) || c10::isComplexType(dtype)) return false;
  return nbytes <= kRealIntegerLimitBytes;
}

at::Tensor empty_storage_less(c10::IntArrayRef size, c10::ScalarType dtype, c10::DeviceIndex device) {
  const c10::DeviceIndex previous = current_device();
  if (previous != device) set_current_device(device);
  at::Tensor t = at::detail::empty_generic(size, &storage_less_allocator(), kZionKeys, dtype, std::nullopt);
  if (previous != device) set_current_device(previous);
  return t;
}

at::Tensor storage_less_result(const at::Tensor& cpu, int64_t d, int64_t width, c10::DeviceIndex device) {
  std::vector<int64_t> sizes(cpu.sizes().begin(), cpu.sizes().end());
  const bool narrowed = d > width && !sizes.empty() && sizes.back() == width;
  if (narrowed) sizes.back() = d;
  if (!cpu.has_storage() || !cpu.is_contiguous()) return empty_storage_less(sizes, cpu.scalar_type(), device);
  // The same share of a storage as large as the CPU kernel's (it may have
  // allocated more than the result uses, as coalesce does): the pool
  // accounts what real mode's adopted storage would hold.
  size_t nbytes = cpu.storage().nbytes();
  int64_t offset = cpu.storage_offset();
  if (narrowed) {
    nbytes = nbytes / static_cast<size_t>(width) * static_cast<size_t>(d);
    offset = offset / width * d;
  }
  const c10::DeviceIndex previous = current_device();
  if (previous != device) set_current_device(device);
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, &storage_less_allocator(), true);
  if (previous != device) set_current_device(previous);
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage), kZionKeys, cpu.dtype());
  impl->set_sizes_contiguous(sizes);
  impl->set_storage_offset(offset);
  return at::Tensor(std::move(impl));
}

bool has_storage_less_argument(const c10::OperatorHandle& op, const torch::jit::Stack* stack) {
  if (!timing_only()) return false;
  const size_t n = op.schema().arguments().size();
  for (auto it = stack->end() - static_cast<std::ptrdiff_t>(n); it != stack->end(); ++it) {
    if (holds_storage_less(*it)) return true;
  }
  return false;
}

// Ops of a training step whose Meta kernels are Python (torch._refs and
// torch._decomp, 50-100 us a call, several times the op's own pricing; and
// their results need not be laid out as the CPU kernel's are), with the CPU
// kernels' own shape rules in C++ instead. The arguments are already meta
// tensors; true if a rule ran.
enum class ShapeRule : uint8_t { kNone, kRelu, kLogSigmoidForward, kBinaryCrossEntropy, kBinaryCrossEntropyBackward };

ShapeRule shape_rule_of(const c10::FunctionSchema& schema) {
  if (!schema.overload_name().empty()) return ShapeRule::kNone;
  const std::string& name = schema.name();
  if (name == "aten::relu") return ShapeRule::kRelu;
  if (name == "aten::log_sigmoid_forward") return ShapeRule::kLogSigmoidForward;
  if (name == "aten::binary_cross_entropy") return ShapeRule::kBinaryCrossEntropy;
  if (name == "aten::binary_cross_entropy_backward") return ShapeRule::kBinaryCrossEntropyBackward;
  return ShapeRule::kNone;
}

bool run_cpu_shape_rule(ShapeRule rule, size_t num_args, torch::jit::Stack* stack) {
  if (rule == ShapeRule::kNone) return false;
  auto args = stack->end() - static_cast<std::ptrdiff_t>(num_args);
  std::vector<at::Tensor> out;
  if (rule == ShapeRule::kRelu) {
    // The CPU kernel is clamp_min(self, 0), whose Meta kernel is C++.
    out.push_back(at::_ops::clamp_min::redispatch(c10::DispatchKeySet(c10::DispatchKey::Meta), args[0].toTensor(), 0));
  } else if (rule == ShapeRule::kLogSigmoidForward) {
    // binary_cross_entropy_with_logits calls it: the CPU kernel returns the
    // result and its buffer contiguous, each of self's shape.
    const at::Tensor& self = args[0].toTensor();
    for (int i = 0; i < 2; ++i) out.push_back(at::empty(self.sizes(), self.options()));
  } else if (rule == ShapeRule::kBinaryCrossEntropy) {
    // (self, target, weight, reduction): the CPU kernel writes the loss of
    // each element into empty_like(self) and, reduced, resizes it to a scalar
    // in the same storage.
    at::Tensor loss = at::empty_like(args[0].toTensor());
    if (args[3].toInt() != 0) loss.resize_({});
    out.push_back(std::move(loss));
  } else {
    // (grad_output, self, target, weight, reduction): the CPU kernel's gradient is empty_like(self).
    out.push_back(at::empty_like(args[1].toTensor()));
  }
  torch::jit::drop(*stack, num_args);
  for (at::Tensor& t : out) stack->emplace_back(std::move(t));
  return true;
}

// What an operator's schema tells timing_fallback, read on its first call
// (its name and its arguments' names, compared once, not on every call).
struct TimingFacts {
  bool embedding_bag = false;
  bool data_dependent = false;
  ShapeRule shape_rule = ShapeRule::kNone;
  // native_batch_norm's `training` argument (5), or -2 for
  // _native_batch_norm_legit_no_training; -1 for any other op.
  int batch_norm_training_arg = -1;
  int pin_memory_arg = -1;
  c10::SmallVector<int, 2> index_args;
  // Whether its indices may be storage-less integers where the op's other
  // tensors are floats (an aten op, not sparse, whose only index arguments
  // are 'index' or 'indices'; see indexes_only_floats).
  bool positions_only_index = false;
  // index.Tensor (and its out= form): real masks among the indices;
  // masked_select: a real mask.
  enum class Mask : uint8_t { kNone, kIndex, kMaskedSelect } mask = Mask::kNone;
  // The arguments it writes (in place, out=).
  c10::SmallVector<int, 2> written_args;
  // The float argument for which zeros may stand in (see storage_less_only_in).
  const char* zeros_for = nullptr;
  // Whether the CPU has a kernel for it (its own or a generic one): real mode
  // refuses an op it has none for, and so must this mode.
  bool runs_on_cpu = true;
};

TimingFacts read_timing_facts(const c10::OperatorHandle& op) {
  const c10::FunctionSchema& schema = op.schema();
  TimingFacts f;
  f.embedding_bag = is_embedding_bag_family(schema.name());
  f.data_dependent = is_data_dependent(schema.name());
  f.shape_rule = shape_rule_of(schema);
  f.runs_on_cpu = op.hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
                  op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
                  op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional) ||
                  op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
  if (schema.name() == "aten::native_batch_norm" && schema.overload_name().empty()) f.batch_norm_training_arg = 5;
  if (schema.name() == "aten::_native_batch_norm_legit_no_training" && schema.overload_name().empty()) {
    f.batch_norm_training_arg = -2;
  }
  if (schema.name() == "aten::index" && (schema.overload_name() == "Tensor" || schema.overload_name() == "Tensor_out")) {
    f.mask = TimingFacts::Mask::kIndex;
  }
  if (schema.name() == "aten::masked_select" && schema.overload_name().empty()) f.mask = TimingFacts::Mask::kMaskedSelect;
  const auto& arguments = schema.arguments();
  f.positions_only_index = schema.name().rfind("aten::", 0) == 0 && schema.name().find("sparse") == std::string::npos;
  for (size_t i = 0; i < arguments.size(); ++i) {
    const std::string& name = arguments[i].name();
    if (name == "pin_memory") f.pin_memory_arg = static_cast<int>(i);
    if (is_index_argument(name)) {
      f.index_args.push_back(static_cast<int>(i));
      if (name != "index" && name != "indices") f.positions_only_index = false;
    }
    if (arguments[i].alias_info() && arguments[i].alias_info()->isWrite()) f.written_args.push_back(static_cast<int>(i));
    if (name == "weights" && schema.name().rfind("fbgemm::", 0) == 0) f.zeros_for = "weights";
  }
  if (schema.name() == "fbgemm::batch_index_select_dim0_forward_cpu_impl") f.zeros_for = "inputs";
  if (schema.name() == "fbgemm::batch_index_select_dim0_backward_cpu_impl") f.zeros_for = "grad_output";
  return f;
}

// fbgemm ops whose integer results depend on their integer arguments alone:
// the sparse-feature ops (permute_2D_sparse_data,
// block_bucketize_sparse_features, ...) carry per-sample `weights` beside the
// lengths and indices they reorder, and batch_index_select_dim0 (torchrec
// expands a variable-batch lookup's rows with it) returns the sizes its
// backward reads beside the rows it selects. Such an op, whose only
// storage-less argument is that float one, runs its CPU kernel with zeros
// standing in for it, so its integer results are real mode's (and a shape
// that depends on them); its float results are storage-less. The zeros take
// host memory of that argument's size for the call.
bool storage_less_only_in(const char* name, const c10::FunctionSchema& schema, const torch::jit::Stack* stack) {
  const size_t n = schema.arguments().size();
  bool found = false;
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = (*stack)[stack->size() - n + i];
    if (!v.isTensor() || !is_storage_less(v.toTensor())) continue;
    if (schema.arguments()[i].name() != name || !is_float(v.toTensor())) return false;
    found = true;
  }
  return found;
}

at::Tensor result_on_zion(const at::Tensor& t, AliasSet& aliases, c10::DeviceIndex device) {
  return is_float(t) ? storage_less_result(t, -1, 0, device) : aliases.to_zion(t);
}

void run_on_zeros(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size();
  auto args = stack->end() - static_cast<std::ptrdiff_t>(n);
  std::vector<at::Tensor> inputs;
  c10::DeviceIndex device = -1;
  AliasSet aliases;
  for (size_t i = 0; i < n; ++i) {
    c10::IValue& v = args[static_cast<std::ptrdiff_t>(i)];
    if (!v.isTensor() || !v.toTensor().defined() || !v.toTensor().device().is_privateuseone()) continue;
    const at::Tensor t = v.toTensor();
    if (device < 0) device = t.device().index();
    inputs.push_back(t);
    v = is_storage_less(t) ? c10::IValue(at::zeros(t.sizes(), t.options().device(c10::kCPU))) : c10::IValue(aliases.alias(t));
  }
  aliases.set_device(device);
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  aliases.commit();
  std::vector<at::Tensor> outputs;
  for (auto it = stack->end() - static_cast<std::ptrdiff_t>(schema.returns().size()); it != stack->end(); ++it) {
    if (it->isTensorList()) {
      c10::List<at::Tensor> list;
      for (const at::Tensor& t : it->toTensorList()) list.push_back(result_on_zion(t, aliases, device));
      for (const at::Tensor& t : list) outputs.push_back(t);
      *it = list;
      continue;
    }
    if (!it->isTensor() || !it->toTensor().defined()) continue;
    *it = result_on_zion(it->toTensor(), aliases, device);
    outputs.push_back(it->toTensor());
  }
  charge_op(op, device, inputs, outputs);
}

void timing_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const TimingFacts& facts = facts_per_operator(op, &read_timing_facts);
  if (facts.embedding_bag) {
    embedding_bag_without_bytes(op, stack);
    return;
  }
  if (facts.zeros_for != nullptr && storage_less_only_in(facts.zeros_for, schema, stack)) {
    run_on_zeros(op, stack);
    return;
  }
  if (!facts.runs_on_cpu) refuse_op_without_cpu_kernel(schema.operator_name());
  const size_t num_args = schema.arguments().size();
  auto args = stack->end() - static_cast<std::ptrdiff_t>(num_args);
  // masked_select by a real mask: its result's length is the mask's count
  // over the broadcast shape, as the CPU kernel selects.
  int64_t selected = -1;
  if (facts.mask == TimingFacts::Mask::kMaskedSelect) {
    const at::Tensor mask = real_mask(args[1]);
    if (mask.defined()) {
      const at::Tensor& self = args[0].toTensor();
      selected = mask.expand(at::infer_size(self.sizes(), mask.sizes())).count_nonzero().item<int64_t>();
    }
  }
  std::vector<at::Tensor> masks;
  if (facts.mask == TimingFacts::Mask::kIndex) {
    bool any = false;
    for (const c10::IValue& e : args[1].toListRef()) {
      masks.push_back(real_mask(e));
      any = any || (masks.back().defined() && masks.back().dim() > 0);
      if (masks.back().defined() && masks.back().dim() == 0) masks.back() = at::Tensor();  // the Meta kernel's own case
    }
    if (!any) masks.clear();
  }
  TORCH_CHECK(!facts.data_dependent || selected >= 0, "zion timing-only: ", schema.operator_name(),
              " needs the values of a storage-less tensor (the shape of its result depends on them), which "
              "timing-only mode does not keep. Integer and bool tensors made from real data (indices, offsets, "
              "lengths, masks) stay real; this one was computed from storage-less floats");
  MetaCall call{op};
  if (!facts.index_args.empty()) {
    const bool positions_only = facts.positions_only_index && indexes_only_floats(schema, stack, facts.index_args);
    for (int i : facts.index_args) {
      check_no_storage_less_index(schema, args[i], schema.arguments()[static_cast<size_t>(i)].name(), positions_only);
    }
  }
  // Real zion tensors the op writes: their new values are computed from storage-less ones (below).
  c10::SmallVector<at::Tensor, 2> written;
  for (int i : facts.written_args) {
    auto add = [&](const at::Tensor& t) {
      if (t.defined() && t.device().is_privateuseone() && !is_storage_less(t)) written.push_back(t);
    };
    if (args[i].isTensor()) add(args[i].toTensor());
    if (args[i].isTensorList()) for (const at::Tensor& t : args[i].toTensorList()) add(t);
  }
  const at::Tensor unknown = written.empty() ? at::Tensor() : first_storage_less_argument(op, stack);
  if (facts.pin_memory_arg >= 0) args[facts.pin_memory_arg] = c10::IValue();
  const bool batch_norm_eval = facts.batch_norm_training_arg == -2 ||
                               (facts.batch_norm_training_arg >= 0 && !args[facts.batch_norm_training_arg].toBool());
  for (size_t i = 0; i < num_args; ++i) {
    if (static_cast<int>(i) == facts.pin_memory_arg) continue;
    c10::IValue& v = args[static_cast<std::ptrdiff_t>(i)];
    v = call.convert(std::move(v));
  }
  if (call.device < 0) call.device = current_device();
  if (!masks.empty()) args[1] = indices_for_masks(args[1], masks);
  if (selected >= 0) {
    const c10::ScalarType dtype = args[0].toTensor().scalar_type();
    torch::jit::drop(*stack, num_args);
    stack->emplace_back(at::empty({selected}, at::TensorOptions().device(c10::kMeta).dtype(dtype)));
  } else if (!run_cpu_shape_rule(facts.shape_rule, num_args, stack)) {
    try {
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), stack);
    } catch (const c10::NotImplementedError& e) {
      TORCH_CHECK_NOT_IMPLEMENTED(false, "zion timing-only: ", schema.operator_name(),
                                  " read a storage-less tensor and has no Meta kernel to give its results' shapes, "
                                  "so timing-only mode cannot run it (", e.what_without_backtrace(), ")");
    }
  }
  if (batch_norm_eval) {
    // Out of training the CPU kernel saves no mean and inverse deviation: it
    // returns them empty, where the Meta kernel gives one of each per channel.
    for (auto it = stack->end() - 2; it != stack->end(); ++it) *it = at::empty({0}, it->toTensor().options());
  }
  // Written arguments take the new metadata the kernel gave their aliases.
  for (auto& [a, z] : call.arg_of) {
    at::Tensor alias(c10::intrusive_ptr<c10::TensorImpl>::reclaim_copy(a));
    call.zion_storage(alias.storage().unsafeGetStorageImpl());
    sync_metadata(alias, z);
  }
  // A real tensor written with values computed from storage-less ones has
  // unknown values too: a whole one becomes storage-less; into part of one,
  // zeros stand in for what the op writes, counted as a copy into part of a
  // real tensor is.
  for (const at::Tensor& w : written) {
    if (is_storage_less(w)) continue;  // grown by the kernel (see MetaCall::zion_storage)
    if (covers_storage(w)) {
      make_storage_less(w);
    } else {
      record_placeholder_read(unknown, "an op writing into part of a real zion tensor");
      cpu_alias(w).zero_();
    }
  }
  std::vector<at::Tensor> outputs;
  const size_t num_returns = schema.returns().size();
  for (auto it = stack->end() - static_cast<std::ptrdiff_t>(num_returns); it != stack->end(); ++it) {
    *it = call.convert_result(std::move(*it));
    if (it->isTensor() && it->toTensor().defined()) outputs.push_back(it->toTensor());
    if (it->isTensorList()) {  // priced as in real mode (fallback.cpp)
      for (const at::Tensor& t : it->toTensorList()) outputs.push_back(t);
    }
  }
  charge_op(op, call.device, call.inputs, outputs);
}

void refuse_op_without_cpu_kernel(const c10::OperatorName& name) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "zion: operator ", name,
                              " is not supported on zion: zion runs each op through its CPU kernel, and this op "
                              "has none (it exists only for other backends, such as CUDA). Use an op with a CPU "
                              "kernel, or move the tensors to a device that has this one.");
}

at::Scalar placeholder_scalar(const at::Tensor& t, const char* what) {
  record_placeholder_read(t, what);
  if (c10::isFloatingType(t.scalar_type())) return at::Scalar(0.0);
  if (c10::isComplexType(t.scalar_type())) return at::Scalar(c10::complex<double>(0.0, 0.0));
  if (t.scalar_type() == c10::kBool) return at::Scalar(false);
  return at::Scalar(int64_t{0});
}

void record_placeholder_read(const at::Tensor& t, const char* what) {
  std::string (*call_site)() = placeholders().call_site;
  const std::string site = call_site ? call_site() : std::string();
  if (count_placeholder(site, what, t)) {
    TORCH_WARN("zion timing-only: ", what, " read the value of a storage-less ", t.scalar_type(), " tensor of shape ",
               t.sizes(), (site.empty() ? "" : " at "), site,
               "; timing-only mode keeps no float values, so 0 stands in for it. The run's report lists every "
               "placeholder read; this warning is shown once per call site");
  }
}

std::vector<PlaceholderRead> placeholder_reads() {
  PlaceholderRegistry& r = placeholders();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.reads;
}

void reset_placeholder_reads() {
  PlaceholderRegistry& r = placeholders();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.reads.clear();
}

void set_call_site_reader(std::string (*reader)()) { placeholders().call_site = reader; }

namespace {

// The host reads a storage-less float as 0, and 0 is finite: isfinite() of
// storage-less values reads true, as it does on the placeholder (and on the
// values of a run that has not diverged), so a loop that steps only on a
// finite loss steps in timing-only mode too. The op is torch's composite as
// everywhere (the same ops, priced as in real mode); in timing-only mode its
// storage-less bool result then becomes a real one, all true, counted as a
// placeholder read at the call site. isnan() and isinf() read false, as on 0,
// without this. A result too large to stay real stays storage-less.
at::Tensor isfinite(const at::Tensor& self) {
  at::Tensor out = at::native::isfinite(self);
  if (!timing_only() || !is_storage_less(self) || !is_storage_less(out) || !covers_storage(out)) return out;
  c10::StorageImpl* impl = out.storage().unsafeGetStorageImpl();
  const size_t nbytes = impl->nbytes();
  if (!stays_real(c10::kBool, nbytes)) return out;
  record_placeholder_read(self, "isfinite()");
  c10::DeviceGuard guard(out.device());
  impl->set_data_ptr(c10::DataPtr(nullptr, impl->device())).clear();  // the storage-less block leaves the pool first
  c10::DataPtr real = allocator().allocate(nbytes);
  std::memset(real.get(), 1, nbytes);  // true
  impl->set_data_ptr_noswap(std::move(real));
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("isfinite", &isfinite); }
TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) { m.impl("isfinite", &isfinite); }

}  // namespace zion::device
