#pragma once
// Memory of the zion device: one pool per OAM with the platform's HBM
// capacity. Backing is host memory; the pools only account for it, so an
// allocation past capacity fails exactly as it would on the modeled machine
// (torch.OutOfMemoryError naming the device, the request, the use and the
// capacity) and nothing already allocated is touched.

#include <c10/core/CachingDeviceAllocator.h>

#include <mutex>
#include <vector>

#include "sim/platform.h"

namespace zion::device {

class HbmAllocator final : public c10::DeviceAllocator {
 public:
  void configure(const sim::Platform& platform);
  size_t bytes_in_use() const;

  c10::DataPtr allocate(size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t mempool_id = {0, 0}) override {}
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override;

  // Takes bytes some other allocator made (a CPU kernel's fresh output) into
  // the pool of `device` without copying them; out of capacity they are
  // freed and OutOfMemoryError raised.
  c10::DataPtr adopt(c10::DeviceIndex device, c10::DataPtr&& bytes, size_t nbytes);
  // Releases one allocation (called by the DataPtr deleter).
  void release(c10::DeviceIndex device, void* ptr, size_t nbytes);
  int64_t capacity(c10::DeviceIndex device) const;
  // A run resumed from a checkpoint keeps the peaks it had reached: raises
  // the peak of allocated (and reserved, active, requested) bytes to at least
  // `peak_bytes`, the peak allocation count to at least `peak_allocations`,
  // and sets the OOM count. Current use is what the live tensors hold.
  void restore_peaks(c10::DeviceIndex device, int64_t peak_bytes, int64_t peak_allocations, int64_t num_ooms);

 private:
  struct Pool {
    int64_t capacity = 0;
    c10::CachingDeviceAllocator::DeviceStats stats;
  };
  Pool& pool(c10::DeviceIndex device);
  void reserve(c10::DeviceIndex device, size_t nbytes);  // accounts, or raises OutOfMemoryError

  mutable std::mutex mutex_;
  std::vector<Pool> pools_;
};

HbmAllocator& allocator();

}  // namespace zion::device
