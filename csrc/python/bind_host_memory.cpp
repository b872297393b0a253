// Bindings: the CPU sockets: their DDR pools (pinned memory, and tensors
// placed by zion_emu.socket(i)), the socket scope, and CPU ops priced on a
// socket's track.

#include <ATen/record_function.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>

#include "device/aten/copy.h"
#include "device/aten/timing.h"

#include "device/runtime/host_memory.h"
#include "device/runtime/runtime.h"
#include "device/runtime/sockets.h"

namespace py = pybind11;
using namespace zion;

void bind_host_memory(py::module_& m) {
  py::module_ h = m.def_submodule("host_memory", "Pinned host memory pools per CPU socket");
  h.def("sockets", [] {
    device::runtime();
    return device::pinned_allocator().sockets();
  });
  h.def("stats", [](int socket) {
    device::runtime();
    auto s = device::pinned_allocator().stats(socket);
    py::dict out;
    out["capacity"] = s.capacity;
    out["in_use"] = s.in_use;
    out["peak"] = s.peak;
    out["allocations"] = s.allocations;
    out["num_ooms"] = s.num_ooms;
    return out;
  }, py::arg("socket"));
  h.def("reset_peak", [](int socket) { device::pinned_allocator().reset_peak(socket); }, py::arg("socket"));
  h.def("restore_peak", [](int socket, int64_t peak, int64_t num_ooms) {
    device::runtime();
    device::pinned_allocator().restore_peak(socket, peak, num_ooms);
  }, py::arg("socket"), py::arg("peak"), py::arg("num_ooms"),
        "A checkpoint's statistics: the pool's peak becomes at least `peak`, num_ooms is replaced");
  h.def("current_socket", [] { return device::current_socket(); });
  h.def("scoped_socket", [] { return device::scoped_socket(); }, "zion_emu.socket(i) of this thread, or -1");
  h.def("set_scoped_socket", [](int socket) { device::set_socket_scope(socket); }, py::arg("socket"),
        "zion_emu.socket(i) on this thread (-1: none): placement of CPU tensors and pricing of CPU ops");
  h.def("socket_of", [](uintptr_t address) { return device::pinned_allocator().socket_of(reinterpret_cast<const void*>(address)); },
        py::arg("address"), "The socket whose DDR pool holds this address, or -1");
  h.def("charge_op", [](int socket, const sim::OpCall& call) { device::charge_socket_op(socket, call); },
        py::arg("socket"), py::arg("call"), "Charge a CPU op run under zion_emu.socket(socket) on that socket's track");
  // Timing-only tensors in a socket's DDR (zion_emu/socket_tensor.py): pool
  // bytes without host memory, copies priced without bytes, placeholder reads.
  h.def("reserve", [](int socket, size_t nbytes) {
    device::runtime();
    device::pinned_allocator().reserve(socket, nbytes);
  }, py::arg("socket"), py::arg("nbytes"), "Count nbytes in a socket's DDR pool with no host memory behind them");
  h.def("unreserve", [](int socket, size_t nbytes) { device::pinned_allocator().unreserve(socket, nbytes); },
        py::arg("socket"), py::arg("nbytes"), "Give back bytes counted by reserve");
  h.def("price_copy", [](int device, int socket, bool pinned, double bytes, bool to_zion, bool non_blocking) {
    device::price_host_copy(device, socket, pinned, bytes, to_zion, non_blocking);
  }, py::arg("device"), py::arg("socket"), py::arg("pinned"), py::arg("bytes"), py::arg("to_zion"),
        py::arg("non_blocking"), "Price a copy between a socket's DDR and a device as copy_ does, moving no bytes");
  h.def("home_socket", [](int device) {
    device::Runtime& rt = device::runtime();
    return device::home_socket(rt.platform, device);
  }, py::arg("device"), "The socket the device's PCIe switch hangs off");
  h.def("record_placeholder_read", [](const at::Tensor& like, const std::string& what) {
    device::record_placeholder_read(like, what.c_str());
  }, py::arg("like"), py::arg("what"), "Count a read of a storage-less value (a tensor of its dtype and shape)");
  h.def("set_record_function_enabled", [](bool enabled) {
    bool was = at::isRecordFunctionEnabled();
    at::enableRecordFunction(enabled);
    return was;
  }, py::arg("enabled"), "Turn RecordFunction (and so socket pricing) on or off on this thread; returns the old state");
  h.def("track", [](int socket) {
    device::runtime();
    return device::socket_track(socket);
  }, py::arg("socket"), "The timeline index of a socket's track (after the OAMs)");
  h.def("counters", [](int socket) {
    device::Runtime& rt = device::runtime();
    TORCH_CHECK_INDEX(socket >= 0 && socket < rt.platform.socket.count, "zion: socket ", socket, " does not exist");
    sim::DeviceCounters c = rt.timeline.counters(device::socket_track(socket));
    py::dict d;
    d["flops"] = c.flops;
    d["bytes"] = c.bytes;
    d["busy_s"] = c.busy;
    d["ops"] = c.ops;
    d["guessed_ops"] = c.guessed_ops;
    return d;
  }, py::arg("socket"), "Work charged on a socket's track");
}
