#pragma once
// The process-wide state of the zion device: the active platform, the op
// cost model, the virtual timeline, and the current device of each thread.
//
// The platform is fixed at first use: `set_platform` before any tensor is
// made (ZION_PLATFORM names a preset otherwise; "zion" by default).

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "sim/dtype.h"
#include "sim/op_cost.h"
#include "sim/platform.h"
#include "sim/timeline.h"
#include "sim/topology.h"

namespace zion::device {

struct Runtime {
  sim::Platform platform;
  std::unique_ptr<sim::OpCostModel> cost;
  sim::Timeline timeline;
  sim::Topology topology;  // of one node: copies stay within the rank's node

  // Ops priced by the default guess, by name, per device: what the user may
  // want to give a formula (zion_emu.cost.register).
  void note_guessed(c10::DeviceIndex device, const std::string& op);
  std::map<std::string, int64_t> guessed(c10::DeviceIndex device) const;
  void clear_guessed();

  // The CPU sockets' op cost model, made at the first op a socket runs. It
  // lives as long as the runtime: a runtime set_platform replaced is kept, so
  // a thread pricing on the old one never sees its model freed.
  const sim::OpCostModel& socket_cost();

 private:
  std::once_flag socket_cost_once_;
  std::unique_ptr<sim::OpCostModel> socket_cost_;
  mutable std::mutex guessed_mutex_;
  std::vector<std::map<std::string, int64_t>> guessed_;
};

// The cost model's dtype of a tensor's scalar type (integers price as int8);
// the ATen op pricing and the sockets' CPU op pricing both ask.
sim::DType model_dtype(c10::ScalarType t);

namespace detail {
// The runtime once made, read without a lock on every op (pricing, streams,
// device checks); start_runtime makes it under the lock.
extern std::atomic<Runtime*> g_runtime_ptr;
Runtime& start_runtime();
}  // namespace detail

// The runtime, created on first use.
inline Runtime& runtime() {
  if (Runtime* rt = detail::g_runtime_ptr.load(std::memory_order_acquire)) return *rt;
  return detail::start_runtime();
}
// Replaces the platform; refused once the device is in use (pools hold memory).
void set_platform(const sim::Platform& platform);
inline bool initialized() { return detail::g_runtime_ptr.load(std::memory_order_acquire) != nullptr; }

c10::DeviceIndex device_count();
// The device count without starting the device: the started platform's, or
// the one the first use would load (ZION_PLATFORM, else the zion preset). For
// callers that only size things by it, as autograd's engine does at its
// first backward pass in every process, zion used or not.
c10::DeviceIndex device_count_unstarted();
// The thread's current device. One set under a platform that set_platform
// has since replaced may not exist on the new one: every thread's current
// device is zion:0 again after set_platform (and its current streams the
// default ones, stream.h).
c10::DeviceIndex current_device();
void set_current_device(c10::DeviceIndex index);
// Puts back a device current_device() returned, without a check that could
// throw: for destructors and other paths that must not fail.
void restore_current_device(c10::DeviceIndex index) noexcept;
// Throws an error naming the allowed range for an index that is not a device.
void check_device(c10::DeviceIndex index);

// Fork safety. A process forked while other threads allocate (a DataLoader
// starting its workers while threads run zion ops) must not inherit the
// memory pools half-updated: their locks are taken just before fork() and
// released after it, in the parent and in the child. As with CUDA, the child
// is "in a bad fork": torch then leaves zion alone there (a DataLoader
// worker's torch.manual_seed does not seed the zion generators).
bool in_bad_fork();

// Waits until autograd's worker thread of every zion device has let go of
// the last backward pass it ran. Call before the interpreter finalizes, with
// the GIL released: a worker may still hold that pass, whose saved thread
// state keeps Python objects; dropped after finalization has begun, they
// would make the worker take the GIL and abort the process.
void drain_autograd_threads();

}  // namespace zion::device
