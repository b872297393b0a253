#pragma once
// Memory of the zion device: one pool per OAM with the platform's HBM
// capacity. Backing is host memory; the pools only account for it, so an
// allocation past capacity fails exactly as it would on the modeled machine
// (torch.OutOfMemoryError naming the device, the request, the use and the
// capacity) and nothing already allocated is touched.

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Storage.h>

#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "device/runtime/memory_history.h"
#include "sim/platform.h"

namespace zion::device {

class HbmAllocator final : public c10::DeviceAllocator {
 public:
  void configure(const sim::Platform& platform);
  size_t bytes_in_use() const;
  int64_t allocated_bytes(c10::DeviceIndex device);  // of one device's pool (0 for one it has not)
  // The pools' lock (BasicLockable): held across fork() (see runtime.h: fork
  // safety), and by set_platform, so that no block is counted between its
  // check that the pools are empty and their replacement. The *_locked
  // forms are for the holder.
  void lock() { mutex_.lock(); }
  void unlock() { mutex_.unlock(); }
  void configure_locked(const sim::Platform& platform);
  size_t bytes_in_use_locked() const;

  c10::DataPtr allocate(size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  bool initialized() override { return true; }
  // Pools keep no cache; the host blocks kept for CPU kernels are freed.
  void emptyCache(c10::MempoolId_t mempool_id = {0, 0}) override;
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override;

  // Takes bytes some other allocator made (a CPU kernel's fresh output) into
  // the pool of `device` without copying them; out of capacity they are
  // freed and OutOfMemoryError raised.
  c10::DataPtr adopt(c10::DeviceIndex device, c10::DataPtr&& bytes, size_t nbytes);
  // Timing-only mode: accounts `nbytes` in the pool of `device` exactly as
  // allocate() does, but backs them with no host bytes. The DataPtr's
  // address is one no process can read (storage_less_address): it names the
  // storage, as a device pointer does, for code that tells storages apart by
  // their data pointers (torch.save, FSDP2, safetensors).
  c10::DataPtr allocate_storage_less(c10::DeviceIndex device, size_t nbytes);
  // Releases one allocation (called by the DataPtr deleter): frees `ptr`
  // (our own bytes, or null) and keeps `bookkeeping` (the raw storage of the
  // deleter's context, already destroyed) for a later allocation, or frees it.
  void release(c10::DeviceIndex device, void* ptr, size_t nbytes, void* bookkeeping);
  int64_t capacity(c10::DeviceIndex device) const;
  // A run resumed from a checkpoint keeps the peaks it had reached: raises
  // the peak of allocated (and reserved, active, requested) bytes to at least
  // `peak_bytes`, the peak allocation count to at least `peak_allocations`,
  // and sets the OOM count. Current use is what the live tensors hold.
  void restore_peaks(c10::DeviceIndex device, int64_t peak_bytes, int64_t peak_allocations, int64_t num_ooms);
  // Allocated HBM of `device` over modeled time (HbmSeries), as it stands at `now`.
  HbmSeries hbm_series(c10::DeviceIndex device, double now) const;

 private:
  struct Pool {
    int64_t capacity = 0;
    // Allocated bytes and allocations only: getDeviceStats fills in the
    // reserved, active and requested bytes, segments and active blocks, which
    // equal them in a pool without a cache (allocator.cpp).
    c10::CachingDeviceAllocator::DeviceStats stats;
    // Reserved by allocate() while the host backs them: within the capacity,
    // not yet in the statistics (a request the host refuses leaves no trace).
    int64_t held = 0;
  };
  Pool& pool(c10::DeviceIndex device);
  // Real mode: raises a clear error (not the kernel's OOM killer later) if the
  // host cannot back `nbytes` more, while the modeled pool still has room.
  void check_host_backing(c10::DeviceIndex device, size_t nbytes);
  static constexpr size_t kHostCheckBytes = size_t{64} << 20;
  size_t unchecked_bytes_ = 0;  // allocated since the last host check (under mutex_)
  // Accounts `nbytes` in the statistics and the device's HbmSeries, or, with
  // `hold`, only holds them within the capacity until commit_held() or
  // release_held(); raises OutOfMemoryError past the capacity. Returns the
  // raw storage for the allocation's bookkeeping, a spare one or freshly
  // allocated, which the caller constructs its bookkeeping in.
  void* reserve(c10::DeviceIndex device, size_t nbytes, bool hold);
  // reserve, telling the memory history of an OOM.
  void* reserve_or_record_oom(c10::DeviceIndex device, size_t nbytes, bool hold);
  // Held bytes the host has backed: accounted as reserve() without `hold` does.
  void commit_held(c10::DeviceIndex device, size_t nbytes);
  // Held bytes the host refused: let go, with their bookkeeping; nothing is accounted.
  void release_held(c10::DeviceIndex device, size_t nbytes, void* bookkeeping);
  // Under mutex_: pool(device), giving `bookkeeping` back first if it raises.
  Pool& pool_or_give_back(c10::DeviceIndex device, void* bookkeeping);
  // Under mutex_: keeps `bookkeeping` as a spare, or frees it.
  void give_back_locked(void* bookkeeping);
  // Adds `delta` allocated bytes of `device` to its series at the modeled
  // host time, read under mutex_ (held): the events of concurrent threads
  // enter in the order of their times (an earlier time means a clock reset).
  void add_to_series_locked(c10::DeviceIndex device, int64_t delta);

  // One lock for the pools' statistics and the series: an allocation or a
  // free updates both under it.
  mutable std::mutex mutex_;
  std::vector<Pool> pools_;
  // Per device, grown as devices are used; always kept (the run report's HBM
  // chart), and not reset when configure() replaces the pools.
  std::vector<HbmSeries> series_;
  // Freed bookkeeping of allocations (under mutex_): an op's result is
  // allocated and freed on every call, and these are taken and given back
  // under the lock each of them takes anyway, instead of malloc and free.
  static constexpr size_t kSpareBookkeeping = 64;
  void* spare_bookkeeping_[kSpareBookkeeping] = {};
  size_t spare_count_ = 0;
};

HbmAllocator& allocator();

// Large host-backed allocations of every zion process on this host are
// checked and faulted in one at a time, under this lock (an flock on a file
// in /dev/shm): each check then sees the others' pages in MemAvailable, so
// ranks that build their tables at once cannot all pass the check and then
// overrun the host together. Without the file, no lock (and no wait).
class HostMemoryLock {
 public:
  HostMemoryLock();
  ~HostMemoryLock();
  HostMemoryLock(const HostMemoryLock&) = delete;
  HostMemoryLock& operator=(const HostMemoryLock&) = delete;

 private:
  int fd_ = -1;
};
// Writes one byte of every page, so the host backs them now.
void touch_pages(void* data, size_t nbytes);

// What this process can still take from the host: /proc/meminfo's
// MemAvailable less the bytes its HBM and socket pools hold untouched (not
// yet resident); -1 where /proc says nothing.
int64_t host_bytes_available();

// Timing-only mode (ZION_MODE=timing, read once): floating-point zion tensors
// have no host bytes.
bool timing_only();
// A storage whose bytes the pool accounts but no host memory backs.
bool is_storage_less(const c10::StorageImpl* storage);
inline bool is_storage_less(const c10::Storage& storage) { return is_storage_less(storage.unsafeGetStorageImpl()); }
// The address of a new storage-less block of `nbytes`: a range of its own
// for the life of the process (addresses are never handed out twice),
// 512-byte aligned as a CUDA block, and one that no load or store can reach:
// on x86-64 a non-canonical address (from 2^57, outside the user space of
// 4- and 5-level paging), elsewhere one with bit 55 set (on AArch64 the
// kernel's half, whatever the top byte). A kernel that read it by mistake
// would fault, as on the null pointer these blocks had before. Throws once
// the range is used up (2^62 bytes on x86-64, 2^55 elsewhere).
uintptr_t storage_less_address(size_t nbytes);
// The allocator of storage-less zion tensors (allocate_storage_less on the current device).
c10::Allocator& storage_less_allocator();

// Host bytes of the CPU kernels that run zion ops. Their outputs become zion
// tensors (adopted without copying), and a training step frees and asks for
// the same large sizes again at every step. From malloc each such block
// would be fresh pages: autograd runs zion's backward on a worker thread
// whose malloc arena returns freed memory to the kernel, so every step
// faulted its gradients in anew. Large blocks asked for while a zion op's
// CPU kernel runs are kept here when freed and handed out again by size, as
// a device's caching allocator would; every other CPU allocation goes to the
// allocator this one wraps, untouched. It is installed as the CPU allocator.
class KernelHostMemory final : public c10::Allocator {
 public:
  explicit KernelHostMemory(c10::Allocator* cpu) : cpu_(cpu) {}

  // Makes allocations on this thread come from the cache while it lives.
  class Scope {
   public:
    Scope();
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    bool previous_;
  };

  c10::DataPtr allocate(size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;
  // Frees the blocks kept for reuse (torch.zion.empty_cache).
  void release_cached();
  size_t cached_bytes() const;
  // Held across fork() (see runtime.h: fork safety).
  void lock_for_fork() { mutex_.lock(); }
  void unlock_after_fork() { mutex_.unlock(); }
  // Whether this thread is inside a zion op's CPU kernel (a Scope lives).
  static bool in_zion_kernel();

  // Blocks smaller than this come from malloc's bins, which reuse them without faults.
  static constexpr size_t kMinBytes = size_t{64} << 10;
  // At most this many freed bytes are kept; beyond it a freed block goes back at once.
  static constexpr size_t kMaxCachedBytes = size_t{512} << 20;

 private:
  static void free_block(void* ptr);
  void give_back(void* ptr);

  c10::Allocator* cpu_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, size_t> in_use_;                // block -> size
  std::unordered_map<size_t, std::vector<void*>> cached_;  // size -> freed blocks
  size_t cached_bytes_ = 0;
};

KernelHostMemory& kernel_host_memory();

// A byte count as torch.cuda's messages write one: bytes below 1 KiB, then
// KiB, MiB or GiB with two decimals.
std::string format_size(int64_t bytes);

}  // namespace zion::device
