// The C++ API (zion_emu/zion.h): a thin layer over the device runtime
// (csrc/device) and the hardware model (csrc/sim). Nothing here keeps state
// of its own; each call reads or drives the runtime that Python uses too.

#include "zion_emu/zion.h"

#include <c10/core/DeviceType.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <dlfcn.h>

#include <filesystem>
#include <mutex>
#include <stdexcept>

#include "device/runtime/allocator.h"
#include "device/runtime/host_memory.h"
#include "device/runtime/runtime.h"
#include "device/runtime/stream.h"
#include "sim/platform_loader.h"
#include "sim/platform_topology.h"

namespace zion_emu {
namespace {

constexpr double kNsPerS = 1e9;

const c10::impl::DeviceGuardImplInterface* guard() {
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1);
}

c10::DeviceIndex checked(int index) {
  auto d = static_cast<c10::DeviceIndex>(index);
  zion::device::check_device(d);
  return d;
}

c10::DeviceIndex resolve(int index) {
  return index < 0 ? zion::device::current_device() : checked(index);
}

// Presets installed beside the library (<prefix>/share/zion_emu/platforms,
// the library in <prefix>/lib) are searched after ZION_PLATFORM_PATH and the
// directory the library was built with.
std::vector<std::string> search_dirs() {
  auto dirs = zion::sim::default_preset_dirs();
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&search_dirs), &info) && info.dli_fname) {
    namespace fs = std::filesystem;
    fs::path installed = fs::path(info.dli_fname).parent_path().parent_path() / "share" / "zion_emu" / "platforms";
    std::error_code ec;
    if (fs::is_directory(installed, ec)) dirs.push_back(installed.string());
  }
  return dirs;
}

}  // namespace

void init() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (!c10::is_privateuse1_backend_registered()) {
      c10::register_privateuse1_backend("zion");
    } else {
      TORCH_CHECK(c10::get_privateuse1_backend() == "zion", "zion: PrivateUse1 is already registered as '",
                  c10::get_privateuse1_backend(), "'; a process can host one PrivateUse1 backend");
    }
  });
}

void set_platform(const std::string& name_or_path, const std::vector<std::pair<std::string, std::string>>& overrides) {
  zion::sim::Platform platform = zion::sim::load_platform(name_or_path, overrides, search_dirs());
  zion::device::set_platform(platform);
}

std::string platform_name() { return zion::device::runtime().platform.name; }
std::string platform_json() { return zion::device::runtime().platform.json; }
std::vector<std::string> preset_names() { return zion::sim::preset_names(search_dirs()); }

int device_count() { return zion::device::device_count(); }
c10::Device device(int index) { return {c10::DeviceType::PrivateUse1, checked(index)}; }

c10::Stream current_stream(int device) { return zion::device::current_stream(resolve(device)); }
c10::Stream new_stream(int device) { return zion::device::new_stream(resolve(device)); }

StreamGuard::StreamGuard(const c10::Stream& stream) : previous_(zion::device::exchange_stream(stream)) {}
StreamGuard::~StreamGuard() { zion::device::exchange_stream(previous_); }

Event::Event() : event_(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT) {}
void Event::record() { record(current_stream(-1)); }
void Event::record(const c10::Stream& stream) { event_.record(stream); }
bool Event::recorded() const { return event_.was_marked_for_recording(); }
bool Event::query() const { return event_.query(); }
void Event::synchronize() const { event_.synchronize(); }
void Event::block(const c10::Stream& stream) const { event_.block(stream); }
double Event::elapsed_ns(const Event& end) const {
  // The guard's elapsed time is modeled milliseconds.
  return event_.elapsedTime(end.event_) * 1e6;
}

void synchronize(int device) {
  if (device >= 0) {
    guard()->synchronizeDevice(checked(device));
    return;
  }
  for (int d = 0; d < device_count(); ++d) guard()->synchronizeDevice(static_cast<c10::DeviceIndex>(d));
}

double host_time_ns() { return zion::device::runtime().timeline.host() * kNsPerS; }

double stream_time_ns(const c10::Stream& stream) {
  TORCH_CHECK(stream.device_type() == c10::DeviceType::PrivateUse1, "zion: stream_time_ns takes a zion stream, got ",
              stream);
  return zion::device::runtime().timeline.stream_time(checked(stream.device_index()), static_cast<int>(stream.id())) *
         kNsPerS;
}

void reset_clock() {
  zion::device::runtime().timeline.reset();
  zion::device::runtime().clear_guessed();
}

MemoryStats memory_stats(int device) {
  auto d = checked(device);
  auto s = zion::device::allocator().getDeviceStats(d);
  constexpr size_t all = 0;  // StatType::AGGREGATE
  MemoryStats out;
  out.allocated_bytes = s.allocated_bytes[all].current;
  out.reserved_bytes = s.reserved_bytes[all].current;
  out.peak_allocated_bytes = s.allocated_bytes[all].peak;
  out.peak_reserved_bytes = s.reserved_bytes[all].peak;
  out.allocations = s.allocation[all].current;
  out.num_ooms = s.num_ooms;
  out.capacity_bytes = zion::device::allocator().capacity(d);
  return out;
}

void reset_peak_memory_stats(int device) { zion::device::allocator().resetPeakStats(checked(device)); }

int socket_count() {
  zion::device::runtime();  // the socket pools are sized by the platform
  return zion::device::pinned_allocator().sockets();
}

HostMemoryStats host_memory_stats(int socket) {
  zion::device::runtime();
  auto s = zion::device::pinned_allocator().stats(socket);
  return {s.in_use, s.peak, s.allocations, s.num_ooms, s.capacity};
}

DeviceCounters counters(int device) {
  auto c = zion::device::runtime().timeline.counters(checked(device));
  using zion::sim::Activity;
  auto ns = [&](Activity a) { return c.busy_by_activity[static_cast<int>(a)] * kNsPerS; };
  return {c.flops, c.bytes, c.copy_bytes, c.busy * kNsPerS, ns(Activity::kCompute), ns(Activity::kCopy),
          ns(Activity::kCommunication), c.ops, c.guessed_ops};
}

std::vector<LinkCounters> link_counters() {
  auto& rt = zion::device::runtime();
  std::vector<zion::sim::LinkCounters> traffic = rt.timeline.link_counters();  // indexed by link class
  const auto& classes = rt.topology.link_classes();
  std::vector<LinkCounters> out(classes.size());
  for (const auto& l : rt.topology.links()) ++out[l.link_class].links;
  for (size_t c = 0; c < classes.size(); ++c) {
    zion::sim::LinkCounters k = c < traffic.size() ? traffic[c] : zion::sim::LinkCounters{};
    out[c].name = classes[c].name;
    out[c].bandwidth_bytes_per_s = classes[c].bandwidth;
    out[c].latency_ns = classes[c].latency * kNsPerS;
    out[c].bytes = k.bytes;
    out[c].busy_ns = k.busy * kNsPerS;
    out[c].transfers = k.transfers;
  }
  return out;
}

OamRoute oam_route(int src, int dst) {
  checked(src);
  checked(dst);
  TORCH_CHECK_VALUE(src != dst, "zion: oam_route takes two different OAMs, got zion:", src, " twice");
  auto& rt = zion::device::runtime();
  const auto& topo = rt.topology;
  const auto& route = topo.route(zion::sim::device_vertex(topo, rt.platform, src),
                                 zion::sim::device_vertex(topo, rt.platform, dst));
  OamRoute out;
  out.hops = route.hops();
  out.paths = static_cast<int>(route.paths.size());
  out.bandwidth_bytes_per_s = route.bandwidth;
  out.latency_ns = route.latency * kNsPerS;
  if (!route.paths.empty()) {
    for (int link : route.paths.front().links) {
      out.link_classes.push_back(topo.link_classes().at(topo.links().at(link).link_class).name);
    }
  }
  return out;
}

}  // namespace zion_emu
