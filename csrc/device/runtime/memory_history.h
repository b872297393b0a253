#pragma once
// What torch.zion.memory._record_memory_history keeps: every HBM allocation,
// free and out-of-memory error, at the modeled host time it happened, with
// the Python stack that asked for it (torch.cuda.memory's history, for zion).
// The allocator reports here; nothing is kept while recording is off. Each
// device's allocated bytes over modeled time (HbmSeries) are always kept, by
// the allocator under its pools' lock.

#include <c10/core/Device.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace torch {
struct CapturedTraceback;
}  // namespace torch

namespace zion::device {

// torch.cuda's caching allocator serves requests of up to 1 MiB (its
// kSmallSize) from its small pool and larger ones from its large pool. zion
// has one pool per OAM; its statistics (the allocator) and its snapshots'
// segment types split by this rule, as CUDA's would.
constexpr size_t kSmallPoolMaxBytes = size_t{1} << 20;

struct MemoryEvent {
  enum class Action { kAlloc, kFree, kOom };
  Action action;
  c10::DeviceIndex device;
  uintptr_t address;     // 0 for an OOM
  size_t nbytes;         // requested (an OOM: what was asked for)
  double time_s;         // modeled host clock
  int64_t device_free;   // an OOM: HBM bytes free when it happened
  std::shared_ptr<torch::CapturedTraceback> stack;  // null without stacks
};

struct MemoryBlock {  // a live allocation when the snapshot is taken
  c10::DeviceIndex device;
  uintptr_t address;
  size_t nbytes;
  std::shared_ptr<torch::CapturedTraceback> stack;
};

// One device's allocated HBM bytes over the modeled host clock, a step
// function changing at each allocation and free (the run report's HBM chart).
// A bin holds the events whose times fall into one interval of `bin_s`
// seconds: `time_s`, its first event's time; `max_bytes`, the most allocated
// after any of its events (so from `time_s` until the next bin's `time_s`,
// allocated bytes never exceed it); `end_bytes`, allocated after its last.
// The width starts at 1 ns, so events further apart are each their own bin,
// exact; past kMaxBins bins the width doubles and neighbours merge, so a run
// of any length keeps at most kMaxBins per device. `peak_bytes` is the most
// allocated since the series began, first reached at `peak_s`.
struct HbmBin {
  double time_s;
  int64_t max_bytes;
  int64_t end_bytes;
};

struct HbmSeries {
  static constexpr double kFirstBinS = 1e-9;
  static constexpr size_t kMaxBins = 1024;
  double bin_s = kFirstBinS;
  double start_s = 0.0;     // where the series begins (time zero, or the last clock reset)
  int64_t start_bytes = 0;  // allocated then
  int64_t current_bytes = 0;
  int64_t peak_bytes = 0;
  double peak_s = 0.0;
  std::vector<HbmBin> bins;

  // Allocated bytes changed by `delta` at modeled time `t`. An event earlier
  // than the last bin's means the clock was reset: the series begins again.
  void add(double t, int64_t delta);
  // The series as it stands at modeled time `now`: if the clock was reset
  // after its last event, an empty series that begins at `now`.
  HbmSeries at(double now) const;

 private:
  void coarsen();
  // floor(bins.back().time_s / bin_s), the last bin's index, while bins is not empty.
  double last_bin_ = 0.0;
};

class MemoryHistory {
 public:
  // Starts (max_entries > 0) or stops recording; `stacks`: capture Python stacks.
  void configure(bool enabled, size_t max_entries, bool stacks);
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }

  // While recording is off (and no block recorded before is alive), an
  // allocation or free takes no lock and reads no clock here.
  void allocated(c10::DeviceIndex device, const void* ptr, size_t nbytes) {
    if (enabled() && ptr != nullptr) record_allocated(device, ptr, nbytes);
  }
  void freed(c10::DeviceIndex device, const void* ptr, size_t nbytes) {
    if (ptr != nullptr && (live_count_.load(std::memory_order_acquire) > 0 || enabled())) record_freed(device, ptr, nbytes);
  }
  void out_of_memory(c10::DeviceIndex device, size_t nbytes, int64_t device_free);

  std::vector<MemoryEvent> events() const;  // oldest first, the last max_entries
  std::vector<MemoryBlock> live() const;    // allocations made while recording, still alive
  // Allocated HBM of `device` over modeled time, as it stands at `now` (the allocator's series).
  HbmSeries hbm_series(c10::DeviceIndex device, double now) const;

 private:
  void add(MemoryEvent e);
  void record_allocated(c10::DeviceIndex device, const void* ptr, size_t nbytes);
  void record_freed(c10::DeviceIndex device, const void* ptr, size_t nbytes);

  std::atomic<bool> enabled_{false};
  bool stacks_ = false;
  size_t max_entries_ = 0;
  mutable std::mutex mutex_;
  std::vector<MemoryEvent> events_;  // a ring of max_entries_ once full
  size_t next_ = 0;                  // where the ring writes next once full
  std::unordered_map<uintptr_t, MemoryBlock> live_;
  std::atomic<size_t> live_count_{0};  // live_.size(), readable without mutex_
};

MemoryHistory& memory_history();

}  // namespace zion::device
