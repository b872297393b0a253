#include "device/runtime/runtime.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <pthread.h>

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "device/runtime/allocator.h"
#include "device/runtime/host_memory.h"
#include "device/runtime/sockets.h"
#include "sim/platform_loader.h"
#include "sim/platform_topology.h"

namespace zion::device {

namespace detail {
std::atomic<Runtime*> g_runtime_ptr{nullptr};
}  // namespace detail
using detail::g_runtime_ptr;

namespace {

std::mutex g_mutex;  // taken to make or replace the runtime
// The runtime is never destroyed: a tensor freed or an op run by a thread
// after exit begins still finds it. One that set_platform replaced stays
// alive too, as another thread may hold a reference taken before the swap
// (one per call).
Runtime* g_runtime = nullptr;
// The thread's current device and the runtime it was set under, in one
// thread-local (one TLS lookup on every op's path).
struct CurrentDevice {
  c10::DeviceIndex index = 0;
  const Runtime* set_under = nullptr;
};
thread_local CurrentDevice t_current_device;

std::unique_ptr<Runtime> make_runtime(const sim::Platform& platform) {
  auto rt = std::make_unique<Runtime>();
  rt->platform = platform;
  rt->cost = std::make_unique<sim::OpCostModel>(sim::ComputeUnit::oam(platform));
  // One track per OAM, then one per CPU socket (device/runtime/sockets.h).
  rt->timeline.resize(platform.oam.count + platform.socket.count);
  rt->topology = sim::build_topology(platform);
  return rt;
}

// fork(): the runtime's and the pools' locks are held across it, always in
// this order (the order they nest in when the runtime is made), so that no
// other thread is half-way through them when the child's copy is taken.
std::atomic<bool> g_in_bad_fork{false};

void before_fork() {
  g_mutex.lock();
  allocator().lock();
  kernel_host_memory().lock_for_fork();
  pinned_allocator().lock();
}

void after_fork_in_parent() {
  pinned_allocator().unlock();
  kernel_host_memory().unlock_after_fork();
  allocator().unlock();
  g_mutex.unlock();
}

void after_fork_in_child() {
  after_fork_in_parent();
  g_in_bad_fork.store(true);
}

const bool g_fork_handlers = [] {
  pthread_atfork(&before_fork, &after_fork_in_parent, &after_fork_in_child);
  return true;
}();

}  // namespace

bool in_bad_fork() { return g_in_bad_fork.load(); }

const sim::OpCostModel& Runtime::socket_cost() {
  std::call_once(socket_cost_once_,
                 [this] { socket_cost_ = std::make_unique<sim::OpCostModel>(sim::ComputeUnit::socket(platform)); });
  return *socket_cost_;
}

void Runtime::note_guessed(c10::DeviceIndex device, const std::string& op) {
  std::lock_guard<std::mutex> lock(guessed_mutex_);
  if (guessed_.size() <= static_cast<size_t>(device)) guessed_.resize(device + 1);
  guessed_[device][op] += 1;
}

std::map<std::string, int64_t> Runtime::guessed(c10::DeviceIndex device) const {
  std::lock_guard<std::mutex> lock(guessed_mutex_);
  if (static_cast<size_t>(device) >= guessed_.size()) return {};
  return guessed_[device];
}

void Runtime::clear_guessed() {
  std::lock_guard<std::mutex> lock(guessed_mutex_);
  guessed_.clear();
}

sim::DType model_dtype(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::BFloat16: return sim::DType::kBf16;
    case c10::ScalarType::Half: return sim::DType::kFp16;
    case c10::ScalarType::Char:
    case c10::ScalarType::Byte:
    case c10::ScalarType::Bool: return sim::DType::kInt8;
    default: return sim::DType::kFp32;
  }
}

Runtime& detail::start_runtime() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_runtime) {
    const char* name = std::getenv("ZION_PLATFORM");
    g_runtime = make_runtime(sim::load_platform(name && *name ? name : "zion")).release();
    allocator().configure(g_runtime->platform);
    pinned_allocator().configure(g_runtime->platform);
    install_socket_cpu_allocator();
    g_runtime_ptr.store(g_runtime, std::memory_order_release);
  }
  return *g_runtime;
}


void set_platform(const sim::Platform& platform) {
  std::lock_guard<std::mutex> lock(g_mutex);
  // The pools stay locked (in fork's order) from the check that they are
  // empty until they are replaced: a block counted in between would be lost
  // with the old pools and its free would count below zero.
  std::lock_guard<HbmAllocator> hbm(allocator());
  std::lock_guard<PinnedAllocator> pinned(pinned_allocator());
  const std::string current = g_runtime ? g_runtime->platform.name : "";
  const size_t hbm_bytes = allocator().bytes_in_use_locked();
  TORCH_CHECK(hbm_bytes == 0, "zion: set_platform must come before any zion tensor is made; ", hbm_bytes,
              " bytes are allocated on the current platform '", current, "'");
  // A pinned buffer or a tensor placed in a socket is counted in its socket's
  // pool; freed after the pools were made afresh, it would count below zero.
  const int64_t host_bytes = pinned_allocator().bytes_in_use_locked();
  TORCH_CHECK(host_bytes == 0, "zion: set_platform must come before any pinned or socket-placed host memory is made; ",
              host_bytes, " bytes are held in the socket pools of the current platform '", current,
              "' (pin_memory() buffers, tensors made under zion_emu.socket(i)); free them first");
  const size_t recording = g_runtime ? g_runtime->timeline.recording() : 0;
  g_runtime = make_runtime(platform).release();  // the one it replaces stays alive
  // Span recording (zion-emu run's report and trace, a profiler session)
  // goes on on the new platform's timeline, with the same cap.
  if (recording > 0) g_runtime->timeline.set_recording(recording);
  allocator().configure_locked(platform);
  pinned_allocator().configure_locked(platform);
  install_socket_cpu_allocator();  // as runtime() does: socket scopes place CPU tensors in their pools
  g_runtime_ptr.store(g_runtime, std::memory_order_release);
}

c10::DeviceIndex device_count() { return static_cast<c10::DeviceIndex>(runtime().platform.oam.count); }

c10::DeviceIndex device_count_unstarted() {
  if (initialized()) return device_count();
  static std::once_flag once;
  static c10::DeviceIndex count = 0;
  std::call_once(once, [] {
    const char* name = std::getenv("ZION_PLATFORM");
    count = static_cast<c10::DeviceIndex>(sim::load_platform(name && *name ? name : "zion").oam.count);
  });
  return initialized() ? device_count() : count;
}

void check_device(c10::DeviceIndex index) {
  auto n = device_count();
  TORCH_CHECK_INDEX(index >= 0 && index < n, "zion: device index ", static_cast<int>(index),
                    " is out of range; platform '", runtime().platform.name, "' has ", static_cast<int>(n),
                    " devices per node (zion:0 .. zion:", static_cast<int>(n) - 1, ")");
}

c10::DeviceIndex current_device() {
  const CurrentDevice& current = t_current_device;
  return current.set_under == g_runtime_ptr.load(std::memory_order_acquire) ? current.index : 0;
}

void set_current_device(c10::DeviceIndex index) {
  check_device(index);
  t_current_device = {index, &runtime()};
}

void restore_current_device(c10::DeviceIndex index) noexcept {
  t_current_device = {index, g_runtime_ptr.load(std::memory_order_acquire)};
}

}  // namespace zion::device

namespace zion::device {

void drain_autograd_threads() {
  if (!initialized()) return;  // no zion tensor was made, so no zion backward ran
  // Each device's worker thread takes tasks from its queue in order and lets
  // go of one backward pass before it takes the next task. A backward pass
  // of our own, through one view op on the device, therefore returns only
  // once the user's last pass there is released; ours holds no Python
  // objects (made here, never seen by Python), so dropping it is harmless.
  torch::autograd::AutoGradMode enable_grad(true);
  for (c10::DeviceIndex d = 0; d < device_count(); ++d) {
    try {
      auto options = at::TensorOptions().device(c10::Device(c10::DeviceType::PrivateUse1, d));
      at::Tensor leaf = at::empty({}, options).requires_grad_(true);
      torch::autograd::backward({leaf.alias()}, {at::empty({}, options)});
    } catch (const c10::Error&) {
      // A full HBM pool cannot hold the 4 bytes: that device is left as it is.
    }
  }
}

}  // namespace zion::device
