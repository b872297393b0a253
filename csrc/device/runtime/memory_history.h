#pragma once
// What torch.zion.memory._record_memory_history keeps: every HBM allocation,
// free and out-of-memory error, at the modeled host time it happened, with
// the Python stack that asked for it (torch.cuda.memory's history, for zion).
// The allocator reports here; nothing is kept while recording is off.

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

class MemoryHistory {
 public:
  // Starts (max_entries > 0) or stops recording; `stacks`: capture Python stacks.
  void configure(bool enabled, size_t max_entries, bool stacks);
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }

  void allocated(c10::DeviceIndex device, const void* ptr, size_t nbytes);
  void freed(c10::DeviceIndex device, const void* ptr, size_t nbytes);
  void out_of_memory(c10::DeviceIndex device, size_t nbytes, int64_t device_free);

  std::vector<MemoryEvent> events() const;  // oldest first, the last max_entries
  std::vector<MemoryBlock> live() const;    // allocations made while recording, still alive

 private:
  void add(MemoryEvent e);

  std::atomic<bool> enabled_{false};
  bool stacks_ = false;
  size_t max_entries_ = 0;
  mutable std::mutex mutex_;
  std::vector<MemoryEvent> events_;  // a ring of max_entries_ once full
  size_t next_ = 0;                  // where the ring writes next once full
  std::unordered_map<uintptr_t, MemoryBlock> live_;
};

MemoryHistory& memory_history();

}  // namespace zion::device
