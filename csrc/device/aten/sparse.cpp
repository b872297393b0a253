// Sparse COO tensors on zion (SparsePrivateUse1), because
// nn.EmbeddingBag(sparse=True) makes them: a sparse zion tensor is indices
// and values, two dense zion tensors. Constructors and accessors are native;
// every other sparse op runs the CPU kernel on a CPU sparse tensor built over
// zero-copy aliases of the indices and values, and sparse results come back
// the same way.

#include <ATen/SparseTensorImpl.h>
#include <ATen/native/SparseTensorUtils.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_coalesced_native.h>
#include <ATen/ops/_indices_native.h>
#include <ATen/ops/_nnz_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_and_tensors_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_native.h>
#include <ATen/ops/_to_copy_native.h>
#include <ATen/ops/_values_native.h>
#include <ATen/ops/dense_dim_native.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_native.h>
#include <ATen/ops/indices_native.h>
#include <ATen/ops/is_coalesced_native.h>
#include <ATen/ops/sparse_dim_native.h>
#include <ATen/ops/values_native.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <optional>
#include <set>
#include <string>

#include "device/aten/op_pricing.h"
#include "device/aten/operator_facts.h"
#include "device/runtime/runtime.h"
#include "device/aten/sparse.h"
#include "device/aten/tensor_alias.h"
#include "device/aten/timing.h"
#include "device/runtime/allocator.h"

namespace zion::device {
namespace {

// The native sparse constructors give the new tensor the current device's
// index; in-tree backends' generated wrappers first set a guard from the
// `device` argument, and these do the same, so zion:1 stays zion:1.
c10::OptionalDeviceGuard guard_for(std::optional<c10::Device> device) {
  if (device && device->is_privateuseone() && device->has_index()) return c10::OptionalDeviceGuard(*device);
  return c10::OptionalDeviceGuard();
}

at::Tensor new_sparse_with_tensors(int64_t sparse_dim, int64_t dense_dim, c10::SymIntArrayRef size, const at::Tensor& indices,
                                   const at::Tensor& values, std::optional<c10::ScalarType> dtype,
                                   std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                                   std::optional<bool> pin_memory, std::optional<bool> is_coalesced) {
  auto guard = guard_for(device);
  return at::native::new_with_dims_and_tensor_sparse_symint(sparse_dim, dense_dim, size, indices, values, dtype, layout,
                                                            device, pin_memory, is_coalesced);
}

at::Tensor new_sparse_with_dims(int64_t sparse_dim, int64_t dense_dim, c10::IntArrayRef size,
                                std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                                std::optional<c10::Device> device, std::optional<bool> pin_memory) {
  auto guard = guard_for(device);
  return at::native::new_with_dims_sparse(sparse_dim, dense_dim, size, dtype, layout, device, pin_memory);
}

// Timing-only mode: a sparse op with storage-less values (an embedding
// gradient, an optimizer's sparse state). Indices are real, so the CPU kernel
// runs on them with narrow zero stand-ins for the storage-less floats: the
// last (dense) dimension D of the sparse values, and of every storage-less
// tensor ending in D, becomes min(D, 4). Its integer results (indices, nnz)
// are then real mode's, and its float results come back storage-less with D
// put back. An op that writes a storage-less dense argument and returns only
// it (dense.add_(sparse)) changes no metadata: it is priced and not run.
// Prices come from the zion tensors' full shapes, as in real mode.
struct SparseTiming {
  static constexpr int64_t kWidth = 4;
  int64_t d = -1;  // D of the storage-less sparse values; -1: nothing narrowed
  c10::DeviceIndex device = -1;

  bool narrows(const at::Tensor& t) const { return d > kWidth && t.dim() >= 1 && t.size(-1) == d; }
  std::vector<int64_t> narrowed(c10::IntArrayRef sizes, bool narrow) const {
    std::vector<int64_t> shape(sizes.begin(), sizes.end());
    if (narrow) shape.back() = kWidth;
    return shape;
  }
  std::vector<int64_t> restored(c10::IntArrayRef sizes) const {
    std::vector<int64_t> shape(sizes.begin(), sizes.end());
    if (d > kWidth && !shape.empty() && shape.back() == kWidth) shape.back() = d;
    return shape;
  }
  // A dense CPU stand-in of zeros; large ones are one broadcast zero (read-only).
  at::Tensor zeros_for(const at::Tensor& t) const {
    std::vector<int64_t> shape = narrowed(t.sizes(), narrows(t));
    int64_t numel = 1;
    for (int64_t extent : shape) numel *= extent;
    auto options = t.options().device(c10::kCPU).layout(c10::kStrided);
    return numel > (int64_t{1} << 20) ? at::zeros({1}, options).expand(shape) : at::zeros(shape, options);
  }
  at::Tensor storage_less_like(const at::Tensor& cpu) const { return storage_less_result(cpu, d, kWidth, device); }
};

// Spare CPU stand-ins. A sparse zion argument's CPU stand-in is made and
// dropped on every call (PyTorch's constructor makes a SparseTensorImpl and
// two empty tensors that the aliases then replace), so one that nothing holds
// after its call is kept with its indices and values let go, and made the
// next stand-in of its dtype on this thread. What it is then is exactly what
// a fresh one would be: dims, sizes, indices, values and coalesced flag are
// all set anew, and one that anything could have changed otherwise (a Python
// object, autograd metadata, a shared or bumped version counter, other keys,
// backend metadata) is dropped.
constexpr size_t kMaxSpareStandIns = 4;

using SpareStandIns = std::vector<c10::intrusive_ptr<c10::TensorImpl>>;

SpareStandIns& spare_stand_ins() {
  thread_local SpareStandIns spares;
  return spares;
}

at::Tensor fresh_stand_in(int64_t sparse_dim, int64_t dense_dim, c10::IntArrayRef sizes, const at::Tensor& indices,
                          const at::Tensor& values, bool coalesced) {
  return new_sparse_with_tensors(sparse_dim, dense_dim, c10::fromIntArrayRefSlow(sizes), indices, values,
                                 values.scalar_type(), c10::Layout::Sparse, c10::Device(c10::DeviceType::CPU),
                                 std::nullopt, coalesced);
}

// The keys of a fresh CPU stand-in, outside inference mode.
const c10::DispatchKeySet& stand_in_keys() {
  static const c10::DispatchKeySet keys = [] {
    c10::InferenceMode normal(false);
    return fresh_stand_in(1, 0, {0}, at::empty({1, 0}, at::kLong), at::empty({0}), false).key_set();
  }();
  return keys;
}

// A CPU sparse tensor over `indices` and `values` (CPU aliases): a spare if one of its dtype is kept.
at::Tensor stand_in(int64_t sparse_dim, int64_t dense_dim, c10::IntArrayRef sizes, const at::Tensor& indices,
                    const at::Tensor& values, bool coalesced) {
  SpareStandIns& spares = spare_stand_ins();
  if (!c10::InferenceMode::is_enabled()) {
    for (auto it = spares.begin(); it != spares.end(); ++it) {
      if ((*it)->dtype() != values.dtype()) continue;
      at::Tensor t(std::move(*it));
      spares.erase(it);
      at::SparseTensorImpl* impl = at::sparse::get_sparse_impl(t);
      impl->raw_resize_(sparse_dim, dense_dim, sizes);
      impl->set_indices_and_values_unsafe(indices, values);
      impl->set_coalesced(coalesced);
      return t;
    }
  }
  return fresh_stand_in(sparse_dim, dense_dim, sizes, indices, values, coalesced);
}

// `t` (a stand-in after its call) as a spare, or dropped.
void keep_stand_in(at::Tensor&& t) {
  if (!unchanged_and_unshared(t, stand_in_keys())) return;
  SpareStandIns& spares = spare_stand_ins();
  if (spares.size() >= kMaxSpareStandIns) return;
  t.unsafeGetTensorImpl()->release_resources();  // lets go of its indices and values, aliases of zion tensors
  spares.push_back(t.getIntrusivePtr());
}

struct SparseCall {
  const c10::OperatorHandle& op;
  c10::DeviceIndex device = -1;
  std::optional<AliasSet> aliases;
  // Small vectors, searched linearly: an op has a handful of tensor arguments.
  c10::SmallVector<at::Tensor, 2> stand_ins;  // the CPU stand-ins of sparse arguments, kept as spares at the end
  c10::SmallVector<std::pair<c10::TensorImpl*, at::Tensor>, 4> zion_of;  // CPU stand-in -> zion argument
  c10::SmallVector<at::Tensor, 4> inputs;
  std::optional<SparseTiming> timing;  // storage-less arguments (timing-only mode)

  SparseCall(const c10::OperatorHandle& op) : op(op) {}
  SparseCall(const SparseCall&) = delete;
  SparseCall& operator=(const SparseCall&) = delete;
  // Before the aliases go: a stand-in kept as a spare first lets go of its aliases.
  ~SparseCall() {
    inputs.clear();
    for (at::Tensor& t : stand_ins) keep_stand_in(std::move(t));
  }

  AliasSet& set() {
    if (!aliases) aliases.emplace(device < 0 ? current_device() : device);
    return *aliases;
  }

  at::Tensor to_cpu(const at::Tensor& t) {
    if (!t.defined() || !t.device().is_privateuseone()) return t;
    if (device < 0) device = t.device().index();
    TORCH_CHECK(t.device().index() == device, "Expected all tensors to be on the same device, but found at least two devices, zion:",
                static_cast<int>(device), " and ", t.device(), "! (when checking arguments for ", op.schema().name(), ")");
    at::Tensor cpu;
    if (t.is_sparse()) {
      // The impl's own fields, as _values(), _indices(), sparse_dim() ... return them, without a dispatch each.
      const at::SparseTensorImpl* impl = at::sparse::get_sparse_impl(t);
      const at::Tensor& zion_values = impl->values();
      const at::Tensor& zion_indices = impl->indices();
      at::Tensor values = timing && is_storage_less(zion_values) ? timing->zeros_for(zion_values) : set().alias(zion_values);
      TORCH_CHECK(!is_storage_less(zion_indices), "zion timing-only: ", op.schema().operator_name(),
                  " needs the indices of a sparse tensor, and they were computed from storage-less floats");
      at::Tensor indices = set().alias(zion_indices);
      std::vector<int64_t> narrowed;  // timing-only mode: the sizes of the zero-filled values
      if (timing) narrowed = timing->narrowed(t.sizes(), timing->narrows(zion_values));
      const c10::IntArrayRef sizes = timing ? c10::IntArrayRef(narrowed) : t.sizes();
      cpu = stand_in(impl->sparse_dim(), impl->dense_dim(), sizes, indices, values, impl->coalesced());
      stand_ins.push_back(cpu);
    } else if (timing && is_storage_less(t)) {
      cpu = timing->zeros_for(t);
    } else {
      cpu = set().alias(t);
    }
    zion_of.emplace_back(cpu.unsafeGetTensorImpl(), t);
    inputs.push_back(timing ? t : cpu);  // timing-only mode prices the zion tensors' full shapes
    return cpu;
  }

  // The zion argument `cpu` stands for, or null.
  const at::Tensor* zion_argument(const c10::TensorImpl* cpu) const {
    for (const auto& [stand_in, zion] : zion_of) {
      if (stand_in == cpu) return &zion;
    }
    return nullptr;
  }

  // A result of a run on stand-ins: floats storage-less (D put back), integers real.
  at::Tensor timing_result(const at::Tensor& t) {
    if (t.is_sparse()) {
      at::Tensor values = t._values();
      values = c10::isFloatingType(values.scalar_type()) || c10::isComplexType(values.scalar_type())
                   ? timing->storage_less_like(values) : set().to_zion(values);
      return new_sparse_with_tensors(t.sparse_dim(), t.dense_dim(), c10::fromIntArrayRefSlow(timing->restored(t.sizes())),
                                     set().to_zion(t._indices()), values, t.scalar_type(), c10::Layout::Sparse,
                                     c10::Device(c10::DeviceType::PrivateUse1, device), std::nullopt, t.is_coalesced());
    }
    if (c10::isFloatingType(t.scalar_type()) || c10::isComplexType(t.scalar_type())) return timing->storage_less_like(t);
    return set().to_zion(t);
  }

  at::Tensor to_zion(const at::Tensor& t) {
    if (!t.defined() || !t.device().is_cpu()) return t;
    if (const at::Tensor* zion = zion_argument(t.unsafeGetTensorImpl())) {
      const at::Tensor& z = *zion;
      if (timing && z.is_sparse()) {
        at::Tensor fresh = timing_result(t);
        at::sparse::get_sparse_impl(z)->resize_(fresh.sparse_dim(), fresh.dense_dim(), fresh.sizes());
        at::sparse::get_sparse_impl(z)->set_indices_and_values_unsafe(fresh._indices(), fresh._values());
        at::sparse::get_sparse_impl(z)->set_coalesced(fresh.is_coalesced());
      } else if (timing && is_storage_less(z)) {
        // A written storage-less dense argument keeps its full shape.
      } else if (z.is_sparse()) {
        // The kernel may have given the argument new indices or values.
        at::sparse::get_sparse_impl(z)->resize_(t.sparse_dim(), t.dense_dim(), t.sizes());
        at::sparse::get_sparse_impl(z)->set_indices_and_values_unsafe(set().to_zion(t._indices()), set().to_zion(t._values()));
        at::sparse::get_sparse_impl(z)->set_coalesced(t.is_coalesced());
      } else {
        sync_metadata(t, z);
      }
      return z;
    }
    if (timing) return timing_result(t);
    return set().to_zion(t);  // sparse results included
  }
};

bool writes_only_a_storage_less_dense_argument(const c10::FunctionSchema& schema, const torch::jit::Stack* stack) {
  const size_t n = schema.arguments().size();
  auto args = stack->end() - static_cast<std::ptrdiff_t>(n);
  if (schema.returns().size() != 1) return false;
  for (size_t i = 0; i < n; ++i) {
    const auto* info = schema.arguments()[i].alias_info();
    if (!info || !info->isWrite()) continue;
    const c10::IValue& v = args[static_cast<std::ptrdiff_t>(i)];
    return v.isTensor() && !v.toTensor().is_sparse() && is_storage_less(v.toTensor()) &&
           schema.returns()[0].alias_info() && schema.returns()[0].alias_info()->isWrite();
  }
  return false;
}

// Prices, and does not run, an op whose one result is its written storage-less dense argument.
void price_in_place(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  auto args = stack->end() - static_cast<std::ptrdiff_t>(num_args);
  std::vector<at::Tensor> inputs;
  at::Tensor written;
  for (size_t i = 0; i < num_args; ++i) {
    const c10::IValue& v = args[static_cast<std::ptrdiff_t>(i)];
    if (!v.isTensor() || !v.toTensor().defined() || !v.toTensor().device().is_privateuseone()) continue;
    const auto* info = schema.arguments()[i].alias_info();
    if (info && info->isWrite()) written = v.toTensor();
    inputs.push_back(v.toTensor());
  }
  const c10::DeviceIndex device = written.device().index();
  torch::jit::drop(*stack, num_args);
  stack->emplace_back(written);
  charge_op(op, device, inputs, {written});
}

// The device of the op, and D of its storage-less sparse values, for a run on stand-ins.
SparseTiming sparse_timing_of(const c10::FunctionSchema& schema, const torch::jit::Stack* stack) {
  SparseTiming timing;
  const size_t n = schema.arguments().size();
  for (auto it = stack->end() - static_cast<std::ptrdiff_t>(n); it != stack->end(); ++it) {
    if (!it->isTensor() || !it->toTensor().defined()) continue;
    const at::Tensor& t = it->toTensor();
    if (timing.device < 0 && t.device().is_privateuseone()) timing.device = t.device().index();
    if (t.is_sparse() && t.dense_dim() >= 1 && is_storage_less(t._values()) && timing.d < 0) timing.d = t._values().size(-1);
  }
  if (timing.device < 0) timing.device = current_device();
  return timing;
}

void sparse_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const bool storage_less = has_storage_less_argument(op, stack);
  if (storage_less && writes_only_a_storage_less_dense_argument(schema, stack)) {
    price_in_place(op, stack);
    return;
  }
  const size_t num_args = schema.arguments().size();
  // The CPU kernel works for the device: its scratch is not a socket's DDR,
  // and its ops are not charged to a socket scope's track (sockets.cpp).
  KernelHostMemory::Scope kernel_memory;
  SparseCall call(op);
  if (storage_less) {
    call.timing = sparse_timing_of(schema, stack);
    call.device = call.timing->device;
  }
  auto args = stack->end() - static_cast<std::ptrdiff_t>(num_args);
  c10::SmallVector<std::pair<at::Tensor, at::Tensor>, 1> written;  // CPU stand-in, zion argument
  for (size_t i = 0; i < num_args; ++i) {
    c10::IValue& v = *(args + static_cast<std::ptrdiff_t>(i));
    if (v.isTensor()) {
      at::Tensor cpu = call.to_cpu(v.toTensor());
      const auto* info = schema.arguments()[i].alias_info();
      if (info && info->isWrite() && v.toTensor().device().is_privateuseone()) written.emplace_back(cpu, v.toTensor());
      v = cpu;
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorList()) out.push_back(call.to_cpu(t));
      v = out;
    } else if (v.isDevice() && v.toDevice().is_privateuseone()) {
      v = c10::Device(c10::DeviceType::CPU);
    }
  }
  if (call.device < 0) call.device = current_device();
  c10::impl::VirtualGuardImpl guard(c10::DeviceType::PrivateUse1);
  c10::Device previous = guard.exchangeDevice(c10::Device(c10::DeviceType::PrivateUse1, call.device));
  try {
    op.redispatchBoxed(c10::DispatchKeySet({c10::DispatchKey::CPU, c10::DispatchKey::SparseCPU}), stack);
    if (call.aliases) call.aliases->commit();
    for (auto& [cpu, zion] : written) call.to_zion(cpu);
    c10::SmallVector<at::Tensor, 2> outputs;
    const size_t num_returns = schema.returns().size();
    for (auto it = stack->end() - static_cast<std::ptrdiff_t>(num_returns); it != stack->end(); ++it) {
      if (it->isTensor()) {
        *it = call.to_zion(it->toTensor());
        outputs.push_back(it->toTensor());
      } else if (it->isTensorList()) {
        c10::List<at::Tensor> out;
        for (const at::Tensor& t : it->toTensorList()) out.push_back(call.to_zion(t));
        for (const at::Tensor& t : out) outputs.push_back(t);  // priced as the dense fallback prices a list
        *it = out;
      }
    }
    guard.exchangeDevice(previous);
    charge_op(op, call.device, call.inputs, outputs);
  } catch (...) {
    guard.exchangeDevice(previous);
    throw;
  }
}

// copy_ between sparse tensors where one is on zion (clone reaches it too).
// As the CPU's copy_sparse_: dst takes src's shape and fresh copies of its
// indices and values in dst's options; the copies are dense moves, so one
// between host and zion is charged to its link.
at::Tensor copy_from_sparse(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(src.is_sparse() && dst.is_sparse(), "copy_() between dense and sparse Tensors is not implemented! Found self type = ",
              dst.toString(), " and src type = ", src.toString());
  if (src.is_same(dst)) return dst;
  at::Tensor indices = src._indices().to(dst._indices().options(), non_blocking, /*copy=*/true);
  at::Tensor values = src._values().to(dst._values().options(), non_blocking, /*copy=*/true);
  auto* impl = at::sparse::get_sparse_impl(dst);
  impl->resize_(src.sparse_dim(), src.dense_dim(), src.sizes());
  impl->set_indices_and_values_unsafe(indices, values);
  impl->set_coalesced(src.is_coalesced());
  return dst;
}

at::Tensor empty_sparse(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                        std::optional<c10::Device> device, std::optional<bool> pin_memory,
                        std::optional<c10::MemoryFormat> memory_format) {
  auto guard = guard_for(device);
  return at::native::empty_sparse(size, dtype, layout, device, pin_memory, memory_format);
}

// Sparse compressed layouts are not modeled. Each way to make a compressed
// zion tensor is refused before the tensor exists: the factories and
// conversions below with zion arguments (at the autograd key, which they reach
// first), and a compressed CPU tensor's move to zion.
constexpr const char* kCompressedMakers[] = {
    "sparse_compressed_tensor.comp_plain_value", "sparse_compressed_tensor.comp_plain_value_size",
    "sparse_csr_tensor.crow_col_value",          "sparse_csr_tensor.crow_col_value_size",
    "sparse_csc_tensor.ccol_row_value",          "sparse_csc_tensor.ccol_row_value_size",
    "sparse_bsr_tensor.crow_col_value",          "sparse_bsr_tensor.crow_col_value_size",
    "sparse_bsc_tensor.ccol_row_value",          "sparse_bsc_tensor.ccol_row_value_size",
    "_sparse_compressed_tensor_unsafe",          "_sparse_compressed_tensor_with_dims",
    "_sparse_csr_tensor_unsafe",                 "_sparse_csc_tensor_unsafe",
    "_sparse_bsr_tensor_unsafe",                 "_sparse_bsc_tensor_unsafe",
    "to_sparse_csr",                             "to_sparse_csc",
    "to_sparse_bsr",                             "to_sparse_bsc",
    "_to_sparse_csr",                            "_to_sparse_csc",
    "_to_sparse_bsr",                            "_to_sparse_bsc",
};

c10::Layout layout_made_by(const std::string& name) {
  if (name.find("csc") != std::string::npos) return c10::kSparseCsc;
  if (name.find("bsr") != std::string::npos) return c10::kSparseBsr;
  if (name.find("bsc") != std::string::npos) return c10::kSparseBsc;
  return c10::kSparseCsr;
}

void refuse_compressed_maker(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  c10::Layout layout = layout_made_by(schema.name());
  if (auto index = schema.argumentIndexWithName("layout")) {
    const c10::IValue& v = *(stack->end() - static_cast<std::ptrdiff_t>(schema.arguments().size() - *index));
    if (!v.isNone()) layout = v.toLayout();
  }
  refuse_layout(layout, schema.name());
}

at::Tensor to_copy_compressed(const at::Tensor& self, std::optional<c10::ScalarType> dtype,
                              std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                              std::optional<bool> pin_memory, bool non_blocking,
                              std::optional<c10::MemoryFormat> memory_format) {
  if (device && device->is_privateuseone() && layout.value_or(self.layout()) != c10::kStrided) {
    refuse_layout(layout.value_or(self.layout()), "moving a tensor to zion");
  }
  return at::native::_to_copy(self, dtype, layout, device, pin_memory, non_blocking, memory_format);
}

}  // namespace

void refuse_layout(c10::Layout layout, const std::string& what) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "zion: ", what, " would make a ", layout,
                              " tensor on zion, and zion supports only the strided and sparse COO layouts "
                              "(torch.strided, torch.sparse_coo). Convert with .to_dense() or .to_sparse() first.");
}

at::Tensor sparse_to_zion(const at::Tensor& t, AliasSet& aliases, c10::DeviceIndex device) {
  const at::SparseTensorImpl* cpu = at::sparse::get_sparse_impl(t);
  at::Tensor indices = aliases.to_zion(cpu->indices());
  at::Tensor values = aliases.to_zion(cpu->values());
  // As _sparse_coo_tensor_with_dims_and_tensors makes it, without its resize
  // checks and detached copies: the indices and values are new tensors that
  // only this sparse tensor holds, and its sizes are the CPU result's.
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, device));
  at::Tensor z = at::detail::make_tensor<at::SparseTensorImpl>(c10::DispatchKeySet(c10::DispatchKey::SparsePrivateUse1),
                                                               t.dtype());
  at::SparseTensorImpl* impl = at::sparse::get_sparse_impl(z);
  impl->raw_resize_(cpu->sparse_dim(), cpu->dense_dim(), t.sizes());
  impl->set_indices_and_values_unsafe(indices, values);
  impl->set_coalesced(cpu->coalesced());
  return z;
}

at::Tensor sparse_to_zion(at::Tensor&& t, AliasSet& aliases, c10::DeviceIndex device) {
  static const c10::DispatchKeySet zion_keys = [] {
    c10::InferenceMode normal(false);
    return at::detail::make_tensor<at::SparseTensorImpl>(c10::DispatchKeySet(c10::DispatchKey::SparsePrivateUse1),
                                                         caffe2::TypeMeta::Make<float>())
        .key_set();
  }();
  if (!unchanged_and_unshared(t, stand_in_keys())) return sparse_to_zion(static_cast<const at::Tensor&>(t), aliases, device);
  // A fresh result that only `t` holds (an embedding bag's sparse gradient)
  // becomes the zion tensor itself, rather than being wrapped anew: its
  // indices and values move to zion as sparse_to_zion(const&) moves them,
  // and its device and keys become a fresh sparse zion tensor's. Its dims,
  // sizes and coalesced flag stay.
  at::SparseTensorImpl* impl = at::sparse::get_sparse_impl(t);
  at::Tensor indices = impl->indices();
  at::Tensor values = impl->values();
  const bool coalesced = impl->coalesced();
  const c10::Device zion(c10::DeviceType::PrivateUse1, device);
  // A sparse tensor has no storage, and TensorImpl takes a new device only
  // with one: a bytes-less zion storage hands it over and goes again.
  impl->set_storage_keep_dtype(c10::Storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), 0, c10::DataPtr(nullptr, zion), nullptr, false)));
  impl->release_resources();  // the placeholder storage, indices and values: ours are then their only owners
  impl->_change_backend_component_keys(zion);
  TORCH_INTERNAL_ASSERT(impl->key_set() == zion_keys && impl->device() == zion && !impl->has_storage(),
                        "zion: an adopted sparse result has keys ", impl->key_set(), " on ", impl->device(),
                        ", not those of a fresh sparse tensor on ", zion, ": ", zion_keys);
  impl->set_indices_and_values_unsafe(aliases.to_zion(std::move(indices)), aliases.to_zion(std::move(values)));
  impl->set_coalesced(coalesced);
  return std::move(t);
}

TORCH_LIBRARY_IMPL(aten, SparsePrivateUse1, m) {
  m.impl("_sparse_coo_tensor_with_dims_and_tensors", &new_sparse_with_tensors);
  m.impl("_sparse_coo_tensor_with_dims", &new_sparse_with_dims);
  m.impl("empty.memory_format", &empty_sparse);
  m.impl("_indices", &at::native::_indices_sparse);
  m.impl("_values", &at::native::_values_sparse);
  m.impl("indices", &at::native::indices_sparse);
  m.impl("values", &at::native::values_sparse);
  m.impl("_nnz", &at::native::_nnz_sparse);
  m.impl("sparse_dim", &at::native::sparse_dim_sparse);
  m.impl("dense_dim", &at::native::dense_dim_sparse);
  m.impl("is_coalesced", &at::native::is_coalesced_sparse);
  m.impl("_coalesced_", &at::native::_coalesced_sparse_);
  m.impl("_copy_from", &copy_from_sparse);
}

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  for (const char* name : kCompressedMakers) m.impl(name, torch::CppFunction::makeFromBoxedFunction<&refuse_compressed_maker>());
}

// A compressed CPU tensor moved to zion dispatches here: the target device
// joins the key set, and SparseCsr with zion's backend bit wins.
TORCH_LIBRARY_IMPL(aten, SparseCsrPrivateUse1, m) { m.impl("_to_copy", &to_copy_compressed); }

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&sparse_fallback>()); }

namespace {

// Quantized and nested tensors: torch's own error named a "Quantizedzion"
// or "NestedTensorzion" backend and a custom build.
void refuse_quantized(const c10::OperatorHandle& op, torch::jit::Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "zion: ", op.schema().name(), " would make or use a quantized tensor on zion, "
                              "and zion has no quantized tensors. Keep quantized tensors on the CPU (tensor.cpu()).");
}

void refuse_nested(const c10::OperatorHandle& op, torch::jit::Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "zion: ", op.schema().name(), " would make or use a nested tensor "
                              "(torch.nested) on zion, and zion has none: its layouts are strided and sparse COO. "
                              "Pad it first (torch.nested.to_padded_tensor) or keep it on the CPU.");
}

}  // namespace

TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&refuse_quantized>());
}

TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&refuse_nested>());
}

namespace {

// As CpuKernelsFirst (fallback.cpp) does for dense tensors: where the CPU
// has a sparse kernel of its own (SparseCPU) and zion would otherwise take
// the op's generic kernel (a CompositeExplicitAutograd one, written for
// dense tensors), zion runs the CPU's sparse kernel through the sparse
// fallback. The generic kernels are wrong for sparse tensors or fail on
// them: `sum` of a sparse tensor became `sum.dim_IntList` over no dims (the
// tensor itself), `permute`, `unsqueeze` and `mv` reached dense-only ops.
// Ops zion registers itself (above), and the ones whose generic kernel is
// how every backend copies, allocates or pins, keep their path.
class SparseCpuKernelsFirst {
 public:
  SparseCpuKernelsFirst()
      : library_(torch::Library::IMPL, "aten", c10::DispatchKey::SparsePrivateUse1, __FILE__, __LINE__) {
    static const std::set<std::string> kept = {"aten::copy_", "aten::empty_like", "aten::clone", "aten::_pin_memory",
                                               "aten::is_pinned", "aten::zeros.out"};
    for (const std::string& name :
         ops_with_their_own_cpu_kernel(c10::DispatchKey::SparseCPU, c10::DispatchKey::SparsePrivateUse1)) {
      if (kept.count(name)) continue;
      library_.impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&sparse_fallback>());
    }
  }

 private:
  torch::Library library_;
};

const SparseCpuKernelsFirst sparse_cpu_kernels_first;

}  // namespace

}  // namespace zion::device
