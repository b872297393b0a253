#include "device/runtime/memory_history.h"

#include <torch/csrc/profiler/combined_traceback.h>

#include <algorithm>
#include <cmath>

#include "device/runtime/allocator.h"
#include "device/runtime/runtime.h"

namespace zion::device {

namespace {
std::shared_ptr<torch::CapturedTraceback> stack_if(bool stacks) {
  // Outside every lock: gathering a Python stack takes the GIL.
  return stacks ? torch::CapturedTraceback::gather(/*python=*/true, /*script=*/false, /*cpp=*/false) : nullptr;
}
double now() { return runtime().timeline.host(); }
}  // namespace

MemoryHistory& memory_history() {
  static MemoryHistory* instance = new MemoryHistory();  // never destroyed: frees may come after exit begins
  return *instance;
}

void HbmSeries::add(double t, int64_t delta) {
  if (!bins.empty() && t < bins.back().time_s) {  // the clock went back: a reset
    *this = at(t);
  }
  current_bytes += delta;
  if (current_bytes > peak_bytes) {
    peak_bytes = current_bytes;
    peak_s = t;
  }
  const double bin = std::floor(t / bin_s);
  if (!bins.empty() && last_bin_ == bin) {
    HbmBin& b = bins.back();
    b.max_bytes = std::max(b.max_bytes, current_bytes);
    b.end_bytes = current_bytes;
    return;
  }
  bins.push_back(HbmBin{t, current_bytes, current_bytes});
  last_bin_ = bin;
  if (bins.size() > kMaxBins) {
    coarsen();
    last_bin_ = std::floor(bins.back().time_s / bin_s);
  }
}

void HbmSeries::coarsen() {
  while (bins.size() > kMaxBins / 2) {
    bin_s *= 2;
    size_t kept = 0;
    double kept_bin = std::floor(bins[0].time_s / bin_s);  // the wider bin bins[kept] falls into
    for (size_t i = 1; i < bins.size(); ++i) {
      const double bin = std::floor(bins[i].time_s / bin_s);
      if (bin == kept_bin) {
        HbmBin& into = bins[kept];
        into.max_bytes = std::max(into.max_bytes, bins[i].max_bytes);
        into.end_bytes = bins[i].end_bytes;
      } else {
        bins[++kept] = bins[i];
        kept_bin = bin;
      }
    }
    bins.resize(kept + 1);
  }
}

HbmSeries HbmSeries::at(double now) const {
  if (bins.empty() || bins.back().time_s <= now) return *this;
  HbmSeries fresh;
  fresh.start_s = now;
  fresh.start_bytes = fresh.current_bytes = fresh.peak_bytes = current_bytes;
  fresh.peak_s = now;
  return fresh;
}

HbmSeries MemoryHistory::hbm_series(c10::DeviceIndex device, double now) const {
  return allocator().hbm_series(device, now);
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

void MemoryHistory::record_allocated(c10::DeviceIndex device, const void* ptr, size_t nbytes) {
  auto stack = stack_if(stacks_);
  auto address = reinterpret_cast<uintptr_t>(ptr);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    live_[address] = MemoryBlock{device, address, nbytes, stack};
    live_count_.store(live_.size(), std::memory_order_release);
  }
  add(MemoryEvent{MemoryEvent::Action::kAlloc, device, address, nbytes, now(), 0, std::move(stack)});
}

void MemoryHistory::record_freed(c10::DeviceIndex device, const void* ptr, size_t nbytes) {
  auto address = reinterpret_cast<uintptr_t>(ptr);
  bool known = false;
  // Without a block recorded (history never on), no lock on each free.
  if (live_count_.load(std::memory_order_acquire) > 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    known = live_.erase(address) > 0;
    live_count_.store(live_.size(), std::memory_order_release);
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
