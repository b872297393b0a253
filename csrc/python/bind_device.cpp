// Bindings: the zion device's runtime (platform, devices, memory, clocks).
// Tensors never cross this boundary; torch reaches zion tensors through the
// dispatcher, so this file needs no torch Python headers.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "device/allocator.h"
#include "device/runtime.h"
#include "device/stream.h"
#include "sim/platform_loader.h"

namespace py = pybind11;
using namespace zion;

namespace {

py::dict stat_dict(const c10::CachingAllocator::Stat& s) {
  py::dict d;
  d["current"] = s.current;
  d["peak"] = s.peak;
  d["allocated"] = s.allocated;
  d["freed"] = s.freed;
  return d;
}

}  // namespace

void bind_device(py::module_& m) {
  py::module_ d = m.def_submodule("device", "The zion device runtime");
  d.def("set_platform", [](const sim::Platform& p) { device::set_platform(p); }, py::arg("platform"),
        "Sets the platform; only before the first zion tensor");
  d.def("platform_name", [] { return device::runtime().platform.name; });
  d.def("initialized", &device::initialized);
  d.def("device_count", [] { return static_cast<int>(device::device_count()); });
  d.def("current_device", [] { return static_cast<int>(device::current_device()); });
  d.def("set_device", [](int index) { device::set_current_device(static_cast<c10::DeviceIndex>(index)); }, py::arg("index"));
  d.def("memory_stats", [](int index) {
    device::check_device(static_cast<c10::DeviceIndex>(index));
    auto s = device::allocator().getDeviceStats(static_cast<c10::DeviceIndex>(index));
    constexpr size_t all = 0;
    py::dict out;
    out["allocated_bytes"] = stat_dict(s.allocated_bytes[all]);
    out["reserved_bytes"] = stat_dict(s.reserved_bytes[all]);
    out["active_bytes"] = stat_dict(s.active_bytes[all]);
    out["requested_bytes"] = stat_dict(s.requested_bytes[all]);
    out["allocation"] = stat_dict(s.allocation[all]);
    out["num_ooms"] = s.num_ooms;
    out["capacity"] = device::allocator().capacity(static_cast<c10::DeviceIndex>(index));
    return out;
  }, py::arg("index"));
  d.def("reset_peak_memory_stats", [](int index) {
    device::check_device(static_cast<c10::DeviceIndex>(index));
    device::allocator().resetPeakStats(static_cast<c10::DeviceIndex>(index));
  }, py::arg("index"));
  d.def("host_time", [] { return device::runtime().timeline.host(); }, "The host's virtual clock, seconds");
  d.def("stream_time", [](int index, int stream) {
    return device::runtime().timeline.stream_time(index, stream);
  }, py::arg("index"), py::arg("stream") = 0);
  d.def("synchronize", [](int index) { return device::runtime().timeline.wait_device(index); }, py::arg("index"));
  d.def("reset_clock", [] { device::runtime().timeline.reset(); });
  d.def("counters", [](int index) {
    auto c = device::runtime().timeline.counters(index);
    py::dict out;
    out["flops"] = c.flops;
    out["bytes"] = c.bytes;
    out["copy_bytes"] = c.copy_bytes;
    out["busy_s"] = c.busy;
    out["ops"] = c.ops;
    out["guessed_ops"] = c.guessed_ops;
    return out;
  }, py::arg("index"));
}
