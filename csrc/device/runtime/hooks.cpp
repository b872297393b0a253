// PrivateUse1 hooks: what ATen asks a backend (availability, devices,
// generators, pinned memory, resizing storage).

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CPUAllocator.h>

#include <cstring>

#include "device/runtime/allocator.h"
#include "device/runtime/generator.h"
#include "device/runtime/host_memory.h"
#include "device/runtime/runtime.h"

namespace zion::device {
namespace {

struct Hooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override {
    return default_generator(device_index < 0 ? current_device() : device_index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override {
    if (device_index >= 0) check_device(device_index);
    return at::make_generator<Generator>(device_index < 0 ? current_device() : device_index);
  }
  at::Device getDeviceFromPtr(void* /*data*/) const override {
    return {c10::DeviceType::PrivateUse1, current_device()};
  }
  bool isPinnedPtr(const void* data) const override { return pinned_allocator().is_pinned(data); }
  c10::Allocator* getPinnedMemoryAllocator() const override {
    runtime();  // socket pools are sized by the platform
    return &pinned_allocator();
  }
  bool hasPrimaryContext(c10::DeviceIndex /*device_index*/) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return device_count(); }
  void setCurrentDevice(c10::DeviceIndex device) const override { set_current_device(device); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    auto old = current_device();
    set_current_device(device);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override { return exchangeDevice(device); }

  // Storage of a zion tensor grows: new bytes from the same pool, old ones copied.
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    auto* impl = storage.unsafeGetStorageImpl();
    c10::DeviceIndex device = storage.device().index();
    auto previous = current_device();
    set_current_device(device);
    c10::DataPtr fresh;
    const bool storage_less = is_storage_less(impl);
    try {
      fresh = storage_less ? allocator().allocate_storage_less(device, newsize) : allocator().allocate(newsize);
    } catch (...) {
      restore_current_device(previous);
      throw;
    }
    restore_current_device(previous);
    size_t keep = std::min(newsize, impl->nbytes());
    if (keep && !storage_less) std::memcpy(fresh.get(), impl->data(), keep);
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(newsize);
  }
};

struct Registration {
  Registration() { at::RegisterPrivateUse1HooksInterface(new Hooks()); }
};
const Registration registration;

}  // namespace
}  // namespace zion::device
