// Bindings: the CPU sockets: their DDR pools (pinned memory, and tensors
// placed by zion_emu.socket(i)), the socket scope, and CPU ops priced on a
// socket's track.

#include <pybind11/pybind11.h>

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
