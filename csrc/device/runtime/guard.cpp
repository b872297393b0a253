// The device guard of zion: current device and stream per thread, events on
// the virtual timeline, and synchronization that advances the host clock.

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <array>

#include "device/runtime/runtime.h"
#include "device/runtime/stream.h"

namespace zion::device {
namespace {

constexpr int kMaxDevices = 64;
// The thread's current stream per device and the runtime they were set
// under, in one thread-local (one TLS lookup on every op's path).
struct CurrentStreams {
  std::array<c10::StreamId, kMaxDevices> ids{};
  const Runtime* set_under = nullptr;
};
thread_local CurrentStreams t_current_streams;

// The thread's current streams; those set under a platform set_platform has
// since replaced are the default streams again (the new timeline has no others).
std::array<c10::StreamId, kMaxDevices>& current_streams() {
  CurrentStreams& current = t_current_streams;
  const Runtime* rt = detail::g_runtime_ptr.load(std::memory_order_acquire);
  if (current.set_under != rt) {
    current.ids.fill(0);
    current.set_under = rt;
  }
  return current.ids;
}

c10::Device zion(c10::DeviceIndex index) { return {c10::DeviceType::PrivateUse1, index}; }

}  // namespace

c10::Stream current_stream(c10::DeviceIndex device) {
  if (device < 0) device = current_device();
  check_device(device);
  return c10::Stream(c10::Stream::UNSAFE, zion(device), current_streams().at(device));
}

c10::Stream exchange_stream(c10::Stream stream) {
  c10::Stream previous = current_stream(stream.device_index());
  // Every device has its default stream, 0: autograd's engine sets it around
  // each node of a backward pass, and it needs no look at the timeline's streams.
  TORCH_CHECK(stream.id() == 0 || (stream.id() > 0 && stream.id() < runtime().timeline.streams(stream.device_index())),
              "zion: stream ", stream.id(), " does not exist on zion:", static_cast<int>(stream.device_index()));
  current_streams().at(stream.device_index()) = stream.id();
  return previous;
}

c10::Stream new_stream(c10::DeviceIndex device) {
  check_device(device);
  return c10::Stream(c10::Stream::UNSAFE, zion(device), runtime().timeline.new_stream(device));
}

namespace {

struct GuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return c10::DeviceType::PrivateUse1; }

  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    if (old.index() != d.index()) setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return zion(current_device()); }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.is_privateuseone(), "zion: expected a zion device, got ", d);
    set_current_device(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    try {
      set_current_device(d.index());
    } catch (...) {
    }
  }
  c10::Stream getStream(c10::Device d) const override { return current_stream(d.index()); }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, zion(d.index() < 0 ? current_device() : d.index()));
  }
  c10::Stream getNewStream(c10::Device d, int /*priority*/) const override { return new_stream(d.index()); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*high_priority*/) const override {
    return new_stream(d.index());
  }
  c10::Stream exchangeStream(c10::Stream s) const override { return exchange_stream(s); }
  c10::DeviceCapability getDeviceCapability(c10::Device /*device*/) const override { return {}; }
  // Does not start the device: autograd's engine asks every registered
  // device at a process's first backward pass.
  c10::DeviceIndex deviceCount() const noexcept override {
    try {
      return device_count_unstarted();
    } catch (...) {
      return 0;
    }
  }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag /*flag*/) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(), "zion: event on zion:",
                static_cast<int>(device_index), " cannot record a stream of zion:", static_cast<int>(stream.device_index()));
    if (*event == nullptr) *event = new Event();
    auto* e = static_cast<Event*>(*event);
    e->device = stream.device_index();
    // The stream reaches the event when it has finished what came before and
    // the host has issued the record, as a CUDA event on an idle stream.
    auto& tl = runtime().timeline;
    e->time = std::max(tl.stream_time(stream.device_index(), static_cast<int>(stream.id())), tl.host());
    e->recorded = true;
  }
  void block(void* event, const c10::Stream& stream) const override {
    if (!event) return;
    auto* e = static_cast<Event*>(event);
    if (e->recorded) runtime().timeline.stream_wait_until(stream.device_index(), static_cast<int>(stream.id()), e->time);
  }
  bool queryEvent(void* event) const override {
    // Modeled work is complete once the host clock has passed it.
    auto* e = static_cast<Event*>(event);
    return !e || !e->recorded || runtime().timeline.host() >= e->time;
  }
  void destroyEvent(void* event, const c10::DeviceIndex /*device_index*/) const noexcept override {
    delete static_cast<Event*>(event);
  }
  void synchronizeEvent(void* event) const override {
    auto* e = static_cast<Event*>(event);
    if (e && e->recorded) runtime().timeline.wait_until(e->time);
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex /*device_index*/) const override {
    auto* a = static_cast<Event*>(start);
    auto* b = static_cast<Event*>(end);
    TORCH_CHECK(a && b && a->recorded && b->recorded, "zion: both events must be recorded before elapsed_time");
    // One clock runs all devices here, but CUDA refuses events of two
    // devices (cudaEventElapsedTime), so a script that asks would fail there.
    TORCH_CHECK(a->device == b->device, "zion: elapsed_time takes two events of one device, as CUDA's does; these were "
                "recorded on zion:", static_cast<int>(a->device), " and zion:", static_cast<int>(b->device));
    return (b->time - a->time) * 1e3;  // modeled milliseconds
  }
  bool queryStream(const c10::Stream& stream) const override {
    return runtime().timeline.host() >= runtime().timeline.stream_time(stream.device_index(), static_cast<int>(stream.id()));
  }
  void synchronizeStream(const c10::Stream& stream) const override {
    runtime().timeline.wait_stream(stream.device_index(), static_cast<int>(stream.id()));
  }
  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    // The timeline's tracks past the devices are the CPU sockets': not devices.
    if (device_index >= 0) check_device(device_index);
    runtime().timeline.wait_device(device_index < 0 ? current_device() : device_index);
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

}  // namespace
}  // namespace zion::device
