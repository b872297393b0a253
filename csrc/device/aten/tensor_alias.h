#pragma once
// Zero-copy bridges between zion tensors and CPU tensors.
//
// A CPU alias of a zion tensor is a CPU tensor over a CPU storage that
// points at the zion storage's bytes (and keeps that storage alive): same
// memory, nothing copied. CPU view kernels make CPU views of it; a CPU
// kernel that must grow it (an out= argument of the wrong size) gets fresh
// bytes, which then move into the zion storage's pool without a copy.
//
// A zion tensor made from a CPU result is either a view of an argument
// (its storage is one of the aliases') or a fresh buffer adopted into the
// device's HBM pool without copying.

#include <ATen/Tensor.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/util/SmallVector.h>

#include <utility>
#include <vector>

namespace zion::device {

class AliasSet {
 public:
  // `device` receives adopted buffers; unset until the caller knows it (set_device).
  AliasSet() = default;
  explicit AliasSet(c10::DeviceIndex device) : device_(device) {}
  // Aliases that nothing else holds any more go back to this thread's spare
  // aliases (their TensorImpl and StorageImpl, emptied), for the next call.
  ~AliasSet();
  AliasSet(const AliasSet&) = delete;
  AliasSet& operator=(const AliasSet&) = delete;

  void set_device(c10::DeviceIndex device) { device_ = device; }
  // The CPU alias of a zion tensor.
  at::Tensor alias(const at::Tensor& zion_tensor);
  // After the CPU kernel: storages it grew move back into their zion storages.
  void commit();
  // A CPU result as a zion tensor (view of an argument, or adopted).
  at::Tensor to_zion(const at::Tensor& cpu_result);
  // The same for a result the caller hands over: a fresh buffer that nothing
  // else refers to becomes the zion tensor in place (its TensorImpl and
  // StorageImpl are kept, their bytes adopted, their device made zion's)
  // rather than being wrapped anew.
  at::Tensor to_zion(at::Tensor&& cpu_result);
  // After the CPU kernel wrote `alias` (in place, out=): the zion tensor it
  // stands for takes its new sizes, strides and offset, and its storage if
  // the kernel gave it another one (set_).
  void write_back(const at::Tensor& alias, const at::Tensor& zion_tensor);

 private:
  // An op touches a handful of storages: a linear search in place beats a
  // hash map, and nothing is allocated for up to eight of each.
  using StorageMap = c10::SmallVector<std::pair<c10::StorageImpl*, c10::Storage>, 8>;
  static c10::Storage* find(StorageMap& map, const c10::StorageImpl* key);

  c10::DeviceIndex device_ = -1;
  // This thread's spare aliases, looked up at the first alias() (and not again on the way out).
  std::vector<c10::intrusive_ptr<c10::TensorImpl>>* spares_ = nullptr;
  bool reuse_spares_ = false;  // outside inference mode, read with spares_ (an op does not change the mode)
  StorageMap alias_of_;  // zion storage -> alias storage
  StorageMap zion_of_;   // alias storage -> zion storage
  StorageMap adopted_;   // fresh CPU storage -> zion storage
  c10::SmallVector<at::Tensor, 8> made_;  // the aliases alias() made over a fresh alias storage (an embedding bag's backward: 7)
};

// One alias, for kernels that read a zion tensor once (copies, scalars).
// With `storage_less_ok`, a storage-less tensor's alias has a null data
// pointer: for glue code that only reads metadata and hands the alias back
// to zion (zion_emu.torchrec); any kernel that touched its data would crash.
at::Tensor cpu_alias(const at::Tensor& zion_tensor, bool storage_less_ok = false);

// The zion tensor a CPU tensor made by cpu_alias (or a CPU view of one)
// stands for: same storage, sizes, strides and offset. Undefined if `cpu`
// holds no alias's bytes. Lets code that runs a library's CPU glue on
// aliases (zion_emu.torchrec) hand the tensors it gets back to zion.
at::Tensor zion_tensor_of_alias(const at::Tensor& cpu);

// Whether `t`, a tensor this backend made for one call and is done with, is
// still as it was made and held only by `t`: one owner, no weak reference,
// `fresh_keys`, no Python object, no autograd metadata, an unshared version
// counter at 0, no backend metadata, not inference, not a wrapped number,
// metadata changes allowed, no symbolic shape. Such a tensor may be kept and
// reused as a fresh one (spare aliases, spare sparse stand-ins).
bool unchanged_and_unshared(const at::Tensor& t, const c10::DispatchKeySet& fresh_keys);

// Copies sizes, strides, offset and the conj and neg bits of `from` onto `to`
// (a mutated argument).
void sync_metadata(const at::Tensor& from, const at::Tensor& to);

}  // namespace zion::device
