#include "device/runtime/memory_history.h"

#include <torch/csrc/profiler/combined_traceback.h>

#include "device/runtime/runtime.h"

namespace zion::device {

MemoryHistory& memory_history() {
  static MemoryHistory* instance = new MemoryHistory();  // never destroyed: frees may come after exit begins
  return *instance;
}

void MemoryHistory::configure(bool enabled, size_t max_entries, bool stacks) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!enabled) {
    enabled_.store(false);
    return;  // what was recorded stays, for a snapshot, as with CUDA
  }
  stacks_ = stacks;
  if (max_entries != max_entries_) {
    events_.clear();
    next_ = 0;
  }
  max_entries_ = max_entries;
  enabled_.store(max_entries > 0);
}

void MemoryHistory::add(MemoryEvent e) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (max_entries_ == 0) return;
  if (events_.size() < max_entries_) {
    events_.push_back(std::move(e));
  } else {
    events_[next_] = std::move(e);
    next_ = (next_ + 1) % max_entries_;
  }
}

namespace {
std::shared_ptr<torch::CapturedTraceback> stack_if(bool stacks) {
  // Outside every lock: gathering a Python stack takes the GIL.
  return stacks ? torch::CapturedTraceback::gather(/*python=*/true, /*script=*/false, /*cpp=*/false) : nullptr;
}
double now() { return runtime().timeline.host(); }
}  // namespace

void MemoryHistory::allocated(c10::DeviceIndex device, const void* ptr, size_t nbytes) {
  if (!enabled() || ptr == nullptr) return;
  auto stack = stack_if(stacks_);
  auto address = reinterpret_cast<uintptr_t>(ptr);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    live_[address] = MemoryBlock{device, address, nbytes, stack};
  }
  add(MemoryEvent{MemoryEvent::Action::kAlloc, device, address, nbytes, now(), 0, std::move(stack)});
}

void MemoryHistory::freed(c10::DeviceIndex device, const void* ptr, size_t nbytes) {
  if (ptr == nullptr) return;
  auto address = reinterpret_cast<uintptr_t>(ptr);
  bool known;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    known = live_.erase(address) > 0;
  }
  if (!enabled() && !known) return;
  add(MemoryEvent{MemoryEvent::Action::kFree, device, address, nbytes, now(), 0, stack_if(stacks_ && enabled())});
}

void MemoryHistory::out_of_memory(c10::DeviceIndex device, size_t nbytes, int64_t device_free) {
  if (!enabled()) return;
  add(MemoryEvent{MemoryEvent::Action::kOom, device, 0, nbytes, now(), device_free, stack_if(stacks_)});
}

std::vector<MemoryEvent> MemoryHistory::events() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<MemoryEvent> out(events_.begin() + static_cast<std::ptrdiff_t>(next_), events_.end());
  out.insert(out.end(), events_.begin(), events_.begin() + static_cast<std::ptrdiff_t>(next_));
  return out;
}

std::vector<MemoryBlock> MemoryHistory::live() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<MemoryBlock> out;
  out.reserve(live_.size());
  for (const auto& [address, block] : live_) out.push_back(block);
  return out;
}

}  // namespace zion::device
