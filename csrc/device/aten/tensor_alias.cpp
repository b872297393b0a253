#include "device/aten/tensor_alias.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/TensorOptions.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/intrusive_ptr.h>

#include "device/runtime/allocator.h"
#include "device/aten/sparse.h"

namespace zion::device {
namespace {

// The alias's bytes belong to the zion storage, which the alias keeps alive
// by holding a reference on it (no extra allocation per alias).
void release_storage_ref(void* context) {
  c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(context));
}

// The bytes of a zion storage, for a CPU storage: they keep the zion storage alive.
c10::DataPtr alias_bytes(const c10::Storage& zion, bool storage_less_ok) {
  c10::StorageImpl* impl = zion.unsafeGetStorageImpl();
  // A storage-less tensor (timing-only mode) has no bytes to alias: a kernel
  // that reaches here would read or write address zero.
  const bool storage_less = is_storage_less(impl);
  TORCH_CHECK(!storage_less || storage_less_ok, "zion timing-only: a kernel needs the bytes of a storage-less tensor (",
              impl->nbytes(), " bytes), which timing-only mode does not keep; this op has no timing-only rule");
  c10::raw::intrusive_ptr::incref(impl);
  return c10::DataPtr(storage_less ? nullptr : zion.mutable_data(), impl, &release_storage_ref,
                      c10::Device(c10::DeviceType::CPU));
}

// A resizable CPU storage over the bytes of a zion storage.
c10::Storage alias_storage(const c10::Storage& zion, bool storage_less_ok = false) {
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), zion.nbytes(),
                                                            alias_bytes(zion, storage_less_ok), c10::GetCPUAllocator(),
                                                            true));
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

// The dispatch keys of a fresh dense tensor of `type` outside inference mode.
c10::DispatchKeySet fresh_keys(c10::DeviceType type) {
  c10::InferenceMode normal(false);
  return c10::make_intrusive<c10::TensorImpl>(c10::DispatchKeySet(c10::computeDispatchKey(std::nullopt, std::nullopt,
                                                                                          c10::Device(type, 0))),
                                              caffe2::TypeMeta::Make<float>(), c10::Device(type, 0))
      ->key_set();
}


// Spare aliases: an op's CPU aliases are made and dropped on every call (a
// TensorImpl, a StorageImpl and a version counter each), so an alias that
// nothing holds after its call is kept, emptied, and made the next alias on
// this thread. What it is then is exactly what a fresh alias would be: the
// same storage bytes, nbytes, allocator and resizability, dtype, sizes,
// strides, offset, conj and neg bits, and keys; an alias that anything could
// have changed otherwise (a Python object, autograd metadata, a shared or
// bumped version counter, other keys, backend metadata, its bytes replaced) is dropped.
constexpr size_t kMaxSpareAliases = 8;

using SpareAliases = std::vector<c10::intrusive_ptr<c10::TensorImpl>>;

SpareAliases& spare_aliases() {
  thread_local SpareAliases spares;
  return spares;
}

// The keys of a fresh alias: a CPU tensor's, outside inference mode.
const c10::DispatchKeySet& alias_keys() {
  static const c10::DispatchKeySet keys = fresh_keys(c10::DeviceType::CPU);
  return keys;
}

// `alias` (the last owner of it but the AliasSet's map of storages) as a spare in `spares`, or dropped.
void keep_spare(at::Tensor&& alias, SpareAliases& spares) {
  c10::TensorImpl* impl = alias.unsafeGetTensorImpl();
  if (!unchanged_and_unshared(alias, alias_keys()) || !impl->has_storage()) return;
  c10::StorageImpl* storage = impl->storage().unsafeGetStorageImpl();
  // Two owners: this alias and the AliasSet's map; no view of it outlives the call.
  auto owner = c10::intrusive_ptr<c10::StorageImpl>::reclaim(storage);  // looked at, not taken
  const bool unique = owner.use_count() == 2 && owner.weak_use_count() == 1;
  owner.release();
  if (!unique || storage->data_ptr().get_deleter() != &release_storage_ref || !storage->resizable() ||
      storage->pyobj_slot()->load_pyobj() != nullptr || storage->device_type() != c10::DeviceType::CPU) {
    return;
  }
  if (spares.size() >= kMaxSpareAliases) return;
  storage->set_data_ptr_noswap(c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU)));  // lets the zion storage go
  storage->set_nbytes(0);
  spares.push_back(alias.getIntrusivePtr());
}

// A spare alias from `spares` made the alias of `zion_tensor`, or undefined if
// there is none. Not in inference mode: a fresh alias there has other keys.
at::Tensor reuse_spare(const at::Tensor& zion_tensor, SpareAliases& spares) {
  if (spares.empty()) return at::Tensor();
  at::Tensor alias(std::move(spares.back()));
  spares.pop_back();
  c10::TensorImpl* impl = alias.unsafeGetTensorImpl();
  c10::StorageImpl* storage = impl->storage().unsafeGetStorageImpl();
  const c10::Storage& zion = zion_tensor.storage();
  storage->set_data_ptr_noswap(alias_bytes(zion, false));
  storage->set_nbytes(zion.nbytes());
  storage->set_allocator(c10::GetCPUAllocator());
  // A spare keeps the dtype and shape of its last alias: an op called again
  // on tensors of the same shape finds them already set.
  if (impl->dtype() != zion_tensor.dtype()) impl->set_storage_and_dtype(impl->storage(), zion_tensor.dtype());
  sync_metadata(zion_tensor, alias);  // and the conj and neg bits
  return alias;
}

}  // namespace

c10::Storage* AliasSet::find(StorageMap& map, const c10::StorageImpl* key) {
  for (auto& [k, v] : map) {
    if (k == key) return &v;
  }
  return nullptr;
}

at::Tensor AliasSet::alias(const at::Tensor& t) {
  c10::StorageImpl* zion = t.storage().unsafeGetStorageImpl();
  c10::Storage* a = find(alias_of_, zion);
  if (!a) {
    if (!spares_) {
      spares_ = &spare_aliases();
      reuse_spares_ = !c10::InferenceMode::is_enabled();
    }
    at::Tensor spare = reuse_spares_ ? reuse_spare(t, *spares_) : at::Tensor();
    c10::Storage fresh = spare.defined() ? spare.storage() : alias_storage(t.storage());
    zion_of_.emplace_back(fresh.unsafeGetStorageImpl(), t.storage());
    alias_of_.emplace_back(zion, std::move(fresh));
    at::Tensor alias = spare.defined() ? std::move(spare) : tensor_over(alias_of_.back().second, c10::DispatchKey::CPU, t);
    made_.push_back(alias);
    return alias;
  }
  return tensor_over(*a, c10::DispatchKey::CPU, t);
}

AliasSet::~AliasSet() {
  for (at::Tensor& alias : made_) keep_spare(std::move(alias), *spares_);
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
  if (out.layout() != c10::kStrided) refuse_layout(out.layout(), "an op's result");
  TORCH_CHECK_NOT_IMPLEMENTED(!out.is_quantized(), "zion: an op's result is a quantized tensor (", out.scalar_type(),
                              "), and zion has no quantized tensors. Quantize on the CPU: tensor.cpu(), then "
                              "torch.quantize_per_tensor and the quantized ops there.");
  TORCH_CHECK(out.has_storage(), "zion: a CPU kernel returned a strided tensor without storage (",
              out.unsafeGetTensorImpl()->device_type(), " ", out.key_set(), "); zion cannot adopt it");
  c10::StorageImpl* storage = out.storage().unsafeGetStorageImpl();
  if (c10::Storage* zion = find(zion_of_, storage)) {
    return tensor_over(*zion, c10::DispatchKey::PrivateUse1, out);  // a view of an argument
  }
  c10::Storage* zion = find(adopted_, storage);
  if (!zion) {
    size_t nbytes = storage->nbytes();
    adopted_.emplace_back(storage, c10::Storage(c10::make_intrusive<c10::StorageImpl>(
                                       c10::StorageImpl::use_byte_size_t(), nbytes, take_bytes(storage, device_),
                                       &allocator(), true)));
    zion = &adopted_.back().second;
  }
  return tensor_over(*zion, c10::DispatchKey::PrivateUse1, out);
}

namespace {

// Whether `t` (a CPU kernel's result) is a plain fresh buffer that nothing
// else refers to: its TensorImpl and StorageImpl have no other owner, no
// weak reference, no Python object, and the keys of a fresh CPU tensor.
bool uniquely_owned_fresh(const at::Tensor& t) {
  static const c10::DispatchKeySet cpu_keys = fresh_keys(c10::DeviceType::CPU);
  if (t.use_count() != 1 || t.weak_use_count() != 1 || t.key_set() != cpu_keys || !t.has_storage()) return false;
  if (t.unsafeGetTensorImpl()->pyobj_slot()->load_pyobj() != nullptr || t._version() != 0) return false;
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  auto owner = c10::intrusive_ptr<c10::StorageImpl>::reclaim(storage);  // looked at, not taken
  const bool unique = owner.use_count() == 1 && owner.weak_use_count() == 1;
  owner.release();
  return unique && storage->resizable() && storage->pyobj_slot()->load_pyobj() == nullptr &&
         storage->device_type() == c10::DeviceType::CPU;
}

}  // namespace

at::Tensor AliasSet::to_zion(at::Tensor&& out) {
  if (out.defined() && out.device().is_cpu() && out.is_sparse()) return sparse_to_zion(std::move(out), *this, device_);
  if (!out.defined() || !out.device().is_cpu() || out.layout() != c10::kStrided ||
      !uniquely_owned_fresh(out)) {
    return to_zion(static_cast<const at::Tensor&>(out));
  }
  c10::StorageImpl* storage = out.storage().unsafeGetStorageImpl();
  if (find(zion_of_, storage) || find(adopted_, storage)) return to_zion(static_cast<const at::Tensor&>(out));
  static const c10::DispatchKeySet zion_keys = fresh_keys(c10::DeviceType::PrivateUse1);
  // As to_zion(const&) does, without a new StorageImpl and TensorImpl: the
  // bytes join the pool, the storage is zion's, the tensor's keys and device too.
  storage->set_data_ptr_noswap(take_bytes(storage, device_));
  storage->set_allocator(&allocator());
  c10::TensorImpl* impl = out.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(out.storage());  // reads the storage's new device
  impl->_change_backend_component_keys(storage->device());
  TORCH_INTERNAL_ASSERT(impl->key_set() == zion_keys, "zion: an adopted result has keys ", impl->key_set(),
                        ", not those of a fresh zion tensor ", zion_keys);
  return std::move(out);
}

void AliasSet::write_back(const at::Tensor& alias, const at::Tensor& zion) {
  const c10::Storage* own = find(alias_of_, zion.storage().unsafeGetStorageImpl());
  if (!own || own->unsafeGetStorageImpl() != alias.storage().unsafeGetStorageImpl()) {
    zion.unsafeGetTensorImpl()->set_storage_keep_dtype(to_zion(alias).storage());
  }
  sync_metadata(alias, zion);
}

bool unchanged_and_unshared(const at::Tensor& t, const c10::DispatchKeySet& fresh_keys) {
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();  // pyobj_slot() and version_counter() are non-const
  return t.use_count() == 1 && t.weak_use_count() == 1 && impl->key_set() == fresh_keys && !impl->is_inference() &&
         impl->version_counter().unique() && impl->version_counter().current_version() == 0 &&
         impl->autograd_meta() == nullptr && impl->pyobj_slot()->load_pyobj() == nullptr && !impl->is_wrapped_number() &&
         impl->allow_tensor_metadata_change() && impl->get_backend_meta() == nullptr &&
         !impl->has_symbolic_sizes_strides();
}

at::Tensor cpu_alias(const at::Tensor& t, bool storage_less_ok) {
  return tensor_over(alias_storage(t.storage(), storage_less_ok), c10::DispatchKey::CPU, t);
}

at::Tensor zion_tensor_of_alias(const at::Tensor& cpu) {
  if (!cpu.defined() || !cpu.device().is_cpu() || !cpu.has_storage()) return at::Tensor();
  const c10::DataPtr& bytes = cpu.storage().data_ptr();
  // An alias's bytes are released by release_storage_ref, whose context is
  // the zion storage (alias_storage above).
  if (bytes.get_deleter() != &release_storage_ref) return at::Tensor();
  auto* zion = static_cast<c10::StorageImpl*>(bytes.get_context());
  return tensor_over(c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(zion)),
                     c10::DispatchKey::PrivateUse1, cpu);
}

void sync_metadata(const at::Tensor& from, const at::Tensor& to) {
  c10::TensorImpl* impl = to.unsafeGetTensorImpl();
  // An out= kernel may leave its output conjugated or negated (linalg's
  // solves with left=False write the conjugate and set the bit).
  if (impl->is_conj() != from.is_conj()) impl->_set_conj(from.is_conj());
  if (impl->is_neg() != from.is_neg()) impl->_set_neg(from.is_neg());
  if (from.sizes().equals(to.sizes()) && from.strides().equals(to.strides()) &&
      from.storage_offset() == to.storage_offset()) {
    return;
  }
  impl->set_sizes_and_strides(from.sizes(), from.strides(), from.storage_offset());
}

}  // namespace zion::device
