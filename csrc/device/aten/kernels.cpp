// Kernels that must be native to zion: tensor creation, storage and view
// metadata, copies between devices, reading a scalar back to the host, and
// addr_, whose CPU kernel tells in place from out= by its arguments' C++
// identity. Everything else runs through the fallback (fallback.cpp).

#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/native/transformers/sdp_utils_cpp.h>
#include <ATen/ops/_fused_sdp_choice_ops.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/addr.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include "device/runtime/allocator.h"
#include "device/aten/copy.h"
#include "device/runtime/runtime.h"
#include "device/aten/tensor_alias.h"
#include "device/aten/timing.h"

namespace zion::device {
namespace {

constexpr auto kZionKeys = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);

// Allocations go to the pool of the requested device.
struct DeviceScope {
  c10::DeviceIndex previous;
  explicit DeviceScope(std::optional<c10::Device> device) : previous(current_device()) {
    if (device && device->has_index()) set_current_device(device->index());
  }
  ~DeviceScope() { restore_current_device(previous); }
};

// What torch.empty on CUDA refuses too: pinning is for CPU tensors.
void check_not_pinned(std::optional<bool> pin_memory) {
  TORCH_CHECK(!pin_memory.value_or(false), "zion: only CPU tensors can be pinned; pin_memory=True was given for a ",
              "zion tensor (pin the CPU tensor it is copied from instead)");
}

// In timing-only mode floating-point tensors (and integer ones past the
// limit) are storage-less; see timing.h.
c10::Allocator& allocator_for(c10::ScalarType dtype, size_t nbytes) {
  if (timing_only() && !stays_real(dtype, nbytes)) return storage_less_allocator();
  return allocator();
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  TORCH_CHECK(!layout || *layout == c10::Layout::Strided, "zion: empty supports strided tensors here, not ", *layout);
  check_not_pinned(pin_memory);
  at::detail::check_size_nonnegative(size);
  DeviceScope scope(device);
  const c10::ScalarType type = c10::dtype_or_default(dtype);
  const size_t nbytes = at::detail::computeStorageNbytesContiguous(size, c10::elementSize(type));
  return at::detail::empty_generic(size, &allocator_for(type, nbytes), kZionKeys, type, memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  TORCH_CHECK(!layout || *layout == c10::Layout::Strided, "zion: empty_strided supports strided tensors, not ", *layout);
  check_not_pinned(pin_memory);
  at::detail::check_size_nonnegative(size);
  DeviceScope scope(device);
  const c10::ScalarType type = c10::dtype_or_default(dtype);
  const size_t nbytes = at::detail::computeStorageNbytes(size, stride, c10::elementSize(type));
  return at::detail::empty_strided_generic(size, stride, &allocator_for(type, nbytes), kZionKeys, type);
}

// A tensor of zeros that owns no memory (autograd's zero gradients): the
// ZeroTensor key makes every op see zeros. The CPU kernel would give it the
// CPU key, so zion makes its own.
at::Tensor efficient_zero_tensor(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                                 std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                                 std::optional<bool> pin_memory) {
  c10::Device zion = device.value_or(c10::Device(c10::DeviceType::PrivateUse1, current_device()));
  if (!zion.has_index()) zion = c10::Device(c10::DeviceType::PrivateUse1, current_device());
  at::native::ZeroTensorAllocator zeros(zion);
  return at::detail::empty_generic(size, &zeros, kZionKeys | c10::DispatchKeySet(c10::DispatchKey::ZeroTensor),
                                   c10::dtype_or_default(dtype), std::nullopt);
}

// Grows the storage if the new shape needs more bytes; never shrinks it.
void ensure_storage(const at::Tensor& self, int64_t bytes_needed) {
  auto* storage = self.storage().unsafeGetStorageImpl();
  if (bytes_needed <= static_cast<int64_t>(storage->nbytes())) return;
  TORCH_CHECK(storage->resizable(), "zion: trying to resize storage that is not resizable");
  DeviceScope scope(self.device());
  at::detail::getPrivateUse1Hooks().resizePrivateUse1Bytes(self.storage(), static_cast<size_t>(bytes_needed));
}

// The new sizes (and strides, else contiguous) from the tensor's storage
// offset, the storage grown to hold them: what the CPU's resize_impl_cpu_
// does, which leaves a tensor whose sizes and strides are already these as
// it is (a non-contiguous tensor resized to its own shape keeps its strides).
// If the storage cannot grow (out of HBM), the tensor keeps its sizes and
// strides: the CPU's and CUDA's resize_ leave the new sizes on the old
// storage, a tensor whose reads would run past its bytes.
void resize_impl(const at::Tensor& self, c10::IntArrayRef size, at::OptionalIntArrayRef stride) {
  auto* impl = self.unsafeGetTensorImpl();
  if (impl->sizes() == size && (!stride || impl->strides() == *stride)) return;
  const std::vector<int64_t> old_sizes = impl->sizes().vec();
  const std::vector<int64_t> old_strides = impl->strides().vec();
  const auto itemsize = static_cast<size_t>(self.element_size());
  const size_t offset = static_cast<size_t>(impl->storage_offset());
  size_t nbytes = 0;
  if (stride) {
    impl->set_sizes_and_strides(size, *stride);
    nbytes = at::detail::computeStorageNbytes(size, *stride, itemsize, offset);
  } else {
    impl->set_sizes_contiguous(size);
    nbytes = at::detail::computeStorageNbytesContiguous(size, itemsize, offset);
  }
  if (impl->numel() == 0) return;
  try {
    ensure_storage(self, static_cast<int64_t>(nbytes));
  } catch (...) {
    impl->set_sizes_and_strides(old_sizes, old_strides);
    throw;
  }
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size, std::optional<c10::MemoryFormat> format) {
  at::detail::check_size_nonnegative(size);
  resize_impl(self, size, std::nullopt);
  if (format) {
    TORCH_CHECK(*format != c10::MemoryFormat::Preserve, "Unsupported memory format", *format);
    self.unsafeGetTensorImpl()->empty_tensor_restride(*format);
  }
  return self;
}

// set_(storage, offset, size, stride) as the CPU's: the offset, the sizes'
// and strides' lengths and the storage's device are checked, and a storage
// too small for the view is grown (a non-resizable one is refused).
at::Tensor& set_storage(at::Tensor& self, c10::Storage source, int64_t offset, c10::IntArrayRef size,
                        c10::IntArrayRef stride) {
  TORCH_CHECK(source.device().is_privateuseone(), "zion: set_ expects zion storage, got storage on ", source.device());
  TORCH_CHECK(self.is_privateuseone(), "zion: set_ cannot give a ", self.device(), " tensor the storage of ",
              source.device(), " (the devices must match)");
  auto* impl = self.unsafeGetTensorImpl();
  const c10::Storage old_storage = impl->storage();
  const int64_t old_offset = impl->storage_offset();
  at::native::checkSetStorage(self, std::move(source), offset, size, stride);
  impl->set_storage_offset(offset);
  try {
    resize_impl(self, size, stride.data() != nullptr ? at::OptionalIntArrayRef(stride) : std::nullopt);
  } catch (...) {  // out of HBM growing the storage: the tensor stays as it was
    impl->set_storage_keep_dtype(old_storage);
    impl->set_storage_offset(old_offset);
    throw;
  }
  return self;
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  int64_t numel = static_cast<int64_t>(source.nbytes()) / static_cast<int64_t>(self.element_size());
  std::vector<int64_t> size{numel}, stride{1};
  return set_storage(self, std::move(source), 0, size, stride);
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.is_same(source)) return self;
  return set_storage(self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  DeviceScope scope(self.device());
  c10::Storage empty(c10::Storage::use_byte_size_t(), 0, &allocator_for(self.scalar_type(), 0), true);
  std::vector<int64_t> size{0}, stride{1};
  return set_storage(self, std::move(empty), 0, size, stride);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  // The host reads a device value: it waits for the device first.
  runtime().timeline.wait_device(self.device().index());
  if (is_storage_less(self)) return placeholder_scalar(self, "item()");
  return at::_local_scalar_dense(cpu_alias(self));
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  copy_between(self, dst, non_blocking);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (!dst.sizes().equals(self.sizes())) {
    if (dst.device().is_privateuseone()) {
      resize_(dst, self.sizes(), std::nullopt);
    } else {
      at::native::resize_(dst, self.sizes());
    }
  }
  copy_between(self, dst, false);
  return dst;
}

// Tensor.record_stream (torch.nn.parallel's Scatter calls it): nothing to
// do. A CUDA caching allocator must not hand a block to new work before the
// streams that still use it are done. A zion op has read and written its
// bytes when it returns (only its time is on the virtual streams), so memory
// freed and reused at once can corrupt no pending work.
void record_stream(at::Tensor& self, c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == c10::DeviceType::PrivateUse1, "zion: record_stream takes a zion stream, got ",
              stream);
}

// Tensor.addr_: ATen's in-place addr calls addr_out(self, self, ...), whose
// CPU kernel checks self's shape without broadcasting it only when its self
// and result are the same C++ object. Through the fallback they arrive as two
// (one boxed argument each), so the kernel would broadcast a 1-D or [1, n]
// self and resize it to the outer product's shape where the CPU refuses. The
// CPU's own checks, in its order and words, then the out= form.
at::Tensor& addr_(at::Tensor& self, const at::Tensor& vec1, const at::Tensor& vec2, const at::Scalar& beta,
                  const at::Scalar& alpha) {
  if (vec1.dim() == 1 && vec2.dim() == 1) {  // addr_out names a vector of another rank
    TORCH_CHECK(self.dim() == 2, "2D tensor expected, got ", self.dim(), "D tensor for input");
    TORCH_CHECK(self.size(0) == vec1.size(0) && self.size(1) == vec2.size(0), "size mismatch, input: ",
                self.sizes(), ", v1: ", vec1.sizes(), ", v2: ", vec2.sizes());
  }
  return at::addr_out(self, self, vec1, vec2, beta, alpha);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", &empty_memory_format);
  m.impl("empty_strided", &empty_strided);
  m.impl("_efficientzerotensor", &efficient_zero_tensor);
  m.impl("as_strided", &at::native::as_strided_tensorimpl);
  m.impl("view", &at::native::view);
  m.impl("_reshape_alias", &at::native::_reshape_alias);
  m.impl("resize_", &resize_);
  m.impl("set_.source_Storage_storage_offset", &set_storage);
  m.impl("set_.source_Storage", &set_source_storage);
  m.impl("set_.source_Tensor", &set_source_tensor);
  m.impl("set_", &set_empty);
  m.impl("_local_scalar_dense", &local_scalar_dense);
  m.impl("_copy_from", &copy_from);
  m.impl("_copy_from_and_resize", &copy_from_and_resize);
  m.impl("record_stream", &record_stream);
  m.impl("addr_", &addr_);
}

// scaled_dot_product_attention chooses its kernel through this stub, for
// the query's device type; a device that has none gets the math path (a
// chain of small ops). zion chooses what the CPU chooses for the same
// tensors, so 4-D inputs run the CPU's fused kernel
// (_scaled_dot_product_flash_attention_for_cpu, through the fallback) and
// results equal the CPU's bit for bit.
int64_t fused_sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                         const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa) {
  // The CPU's choice reads sizes, strides and dtypes only: it gets CPU
  // tensors of that metadata and no bytes (the arguments may be fake
  // tensors, under torch.compile's tracing). Symbolic shapes keep the math
  // path, the one a device without a fused kernel takes.
  const at::Tensor* args[] = {&query, &key, &value, attn_mask ? &*attn_mask : nullptr};
  for (const at::Tensor* t : args) {
    if (t && t->defined() && t->unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
      return static_cast<int64_t>(sdp::SDPBackend::math);
    }
  }
  auto cpu = [](const at::Tensor& t) {
    c10::Storage none(c10::Storage::use_byte_size_t(), 0, c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU)),
                      nullptr, false);
    auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(none), c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
    impl->set_sizes_and_strides(t.sizes(), t.strides());
    return at::Tensor(std::move(impl));
  };
  std::optional<at::Tensor> mask;
  if (attn_mask && attn_mask->defined()) mask = cpu(*attn_mask);
  // Straight to the CPU kernel: under tracing a fake-tensor mode would take the call.
  return at::_ops::_fused_sdp_choice::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), cpu(query), cpu(key),
                                                 cpu(value), mask, dropout_p, is_causal, scale, enable_gqa);
}

}  // namespace zion::device

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &zion::device::fused_sdp_choice)
}  // namespace at::native

// A conjugate or negative bit rides along into the copy (the CPU copy_ on the
// aliases resolves it); without this the math-bit fallback would resolve it
// first by calling copy_ again, forever.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
