// DDP's runtime statistics on zion: the timer DistributedDataParallel's
// reducer asks for by device type. Its events read the modeled clock of the
// current stream, as CUDA's read CUDA events, so the forward, backward and
// communication times DDP logs (get_ddp_logging_data) are modeled times.
// Without it DDP warns that it only times CPU and CUDA devices.

#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

#include <algorithm>
#include <array>
#include <cmath>

#include "device/runtime/runtime.h"
#include "device/runtime/stream.h"

namespace zion::dist {
namespace {

class ZionTimer final : public c10d::Timer {
 public:
  explicit ZionTimer(c10::Device device) : device_(device.index() < 0 ? device::current_device() : device.index()) {}

  void record(Event event) override {
    Timer::record(event);  // the host-side timestamp, as every timer keeps
    // As a zion event on the current stream: when that stream has finished
    // what was issued before, and not before the host issued the record.
    auto& tl = device::runtime().timeline;
    int stream = static_cast<int>(device::current_stream(device_).id());
    modeled_[slot(event)] = std::max(tl.stream_time(device_, stream), tl.host());
  }

  std::optional<int64_t> measureDifference(Event start, Event end) override {
    double from = modeled_[slot(start)], to = modeled_[slot(end)];
    if (from < 0 || to < 0 || to < from) return std::nullopt;
    return static_cast<int64_t>(std::llround((to - from) * 1e9));
  }

 private:
  static size_t slot(Event event) { return static_cast<size_t>(event); }

  c10::DeviceIndex device_;
  std::array<double, 5> modeled_{-1, -1, -1, -1, -1};  // seconds; -1: not recorded
};

}  // namespace
}  // namespace zion::dist

namespace c10d {
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, zion::dist::ZionTimer)
}  // namespace c10d
