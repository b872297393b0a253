#include "device/sockets.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <memory>
#include <mutex>

#include "device/host_memory.h"
#include "device/runtime.h"

namespace zion::device {
namespace {

c10::DeleterFnPtr g_base_deleter = nullptr;

// One deleter for both kinds of buffer, so raw_deleter() is right for every
// pointer raw_allocate() hands out.
void delete_cpu(void* ptr) {
  if (!pinned_allocator().release(ptr)) g_base_deleter(ptr);
}

class SocketCpuAllocator final : public c10::Allocator {
 public:
  explicit SocketCpuAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t nbytes) override {
    int socket = scoped_socket();
    if (socket < 0) return base_->allocate(nbytes);
    return pinned_allocator().allocate_on(socket, nbytes, /*pinned=*/false);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &delete_cpu; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { base_->copy_data(dest, src, count); }

 private:
  c10::Allocator* base_;
};

struct SocketModel {
  std::mutex mutex;
  std::unique_ptr<sim::OpCostModel> model;
  const sim::OpCostModel* built_for = nullptr;  // the device's model when this was built (a new platform: rebuild)
};

SocketModel& socket_model() {
  static SocketModel instance;
  return instance;
}

}  // namespace

int socket_track(int socket) { return runtime().platform.oam.count + socket; }

void charge_socket_op(int socket, const sim::OpCall& call) {
  Runtime& rt = runtime();
  TORCH_CHECK_INDEX(socket >= 0 && socket < rt.platform.socket.count, "zion: socket ", socket, " does not exist; platform '",
                    rt.platform.name, "' has ", rt.platform.socket.count, " sockets");
  sim::OpCost cost;
  {
    SocketModel& m = socket_model();
    std::lock_guard<std::mutex> lock(m.mutex);
    if (m.built_for != rt.cost.get()) {
      m.model = std::make_unique<sim::OpCostModel>(sim::ComputeUnit::socket(rt.platform));
      m.built_for = rt.cost.get();
    }
    cost = m.model->cost(call, m.model->resolve(call.name));
  }
  int track = socket_track(socket);
  rt.timeline.launch(track, 0, 0, cost.device_time, rt.timeline.host(), sim::Activity::kCompute,
                     rt.timeline.label(call.name));
  rt.timeline.count(track, cost.work.flops, cost.work.bytes + cost.work.gathered_bytes, cost.guessed);
  rt.timeline.wait_stream(track, 0);  // the host ran it
}

void install_socket_cpu_allocator() {
  static bool installed = [] {
    c10::Allocator* base = c10::GetCPUAllocator();
    g_base_deleter = base->raw_deleter();
    static SocketCpuAllocator instance(base);
    c10::SetCPUAllocator(&instance, /*priority=*/1);
    return true;
  }();
  (void)installed;
}

}  // namespace zion::device
