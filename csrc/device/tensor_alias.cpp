#include "device/tensor_alias.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/TensorImpl.h>

#include "device/allocator.h"
#include "device/sparse.h"

namespace zion::device {
namespace {

void release_storage_ref(void* context) { delete static_cast<c10::Storage*>(context); }

// A resizable CPU storage over the bytes of a zion storage.
c10::Storage alias_storage(const c10::Storage& zion) {
  c10::DataPtr view(zion.mutable_data(), new c10::Storage(zion), &release_storage_ref, c10::Device(c10::DeviceType::CPU));
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), zion.nbytes(),
                                                            std::move(view), c10::GetCPUAllocator(), true));
}

at::Tensor tensor_over(c10::Storage storage, c10::DispatchKey key, const at::Tensor& like) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(key), like.dtype());
  impl->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  impl->_set_conj(like.is_conj());
  impl->_set_neg(like.is_neg());
  return at::Tensor(std::move(impl));
}

// Moves the bytes of a CPU storage into a zion pool; the CPU storage is left empty.
c10::DataPtr take_bytes(c10::StorageImpl* cpu, c10::DeviceIndex device) {
  size_t nbytes = cpu->nbytes();
  c10::DataPtr bytes = cpu->set_data_ptr(c10::DataPtr(nullptr, cpu->device()));
  return allocator().adopt(device, std::move(bytes), nbytes);
}

}  // namespace

at::Tensor AliasSet::alias(const at::Tensor& t) {
  c10::StorageImpl* zion = t.storage().unsafeGetStorageImpl();
  auto it = alias_of_.find(zion);
  if (it == alias_of_.end()) {
    c10::Storage a = alias_storage(t.storage());
    zion_of_.emplace(a.unsafeGetStorageImpl(), t.storage());
    it = alias_of_.emplace(zion, std::move(a)).first;
  }
  return tensor_over(it->second, c10::DispatchKey::CPU, t);
}

void AliasSet::commit() {
  for (auto& [alias, zion] : zion_of_) {
    if (alias->data() == zion.data() && alias->nbytes() == zion.nbytes()) continue;
    // The kernel grew the alias: its new bytes become the zion storage's.
    size_t nbytes = alias->nbytes();
    zion.unsafeGetStorageImpl()->set_data_ptr_noswap(take_bytes(alias, device_));
    zion.unsafeGetStorageImpl()->set_nbytes(nbytes);
  }
}

at::Tensor AliasSet::to_zion(const at::Tensor& out) {
  if (!out.defined() || !out.device().is_cpu()) return out;
  if (out.is_sparse()) return sparse_to_zion(out, *this, device_);
  TORCH_CHECK(out.has_storage(), "zion: a CPU kernel returned a ", out.layout(),
              " tensor without storage; this op is not supported on zion yet");
  c10::StorageImpl* storage = out.storage().unsafeGetStorageImpl();
  if (auto it = zion_of_.find(storage); it != zion_of_.end()) {
    return tensor_over(it->second, c10::DispatchKey::PrivateUse1, out);  // a view of an argument
  }
  auto it = adopted_.find(storage);
  if (it == adopted_.end()) {
    size_t nbytes = storage->nbytes();
    c10::Storage zion(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes,
                                                            take_bytes(storage, device_), &allocator(), true));
    it = adopted_.emplace(storage, std::move(zion)).first;
  }
  return tensor_over(it->second, c10::DispatchKey::PrivateUse1, out);
}

at::Tensor cpu_alias(const at::Tensor& t) {
  return tensor_over(alias_storage(t.storage()), c10::DispatchKey::CPU, t);
}

void sync_metadata(const at::Tensor& from, const at::Tensor& to) {
  if (from.sizes().equals(to.sizes()) && from.strides().equals(to.strides()) &&
      from.storage_offset() == to.storage_offset()) {
    return;
  }
  to.unsafeGetTensorImpl()->set_sizes_and_strides(from.sizes(), from.strides(), from.storage_offset());
}

}  // namespace zion::device
