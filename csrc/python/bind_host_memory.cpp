// Bindings: pinned host memory pools, one per CPU socket.

#include <pybind11/pybind11.h>

#include "device/host_memory.h"
#include "device/runtime.h"

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
  h.def("current_socket", [] { return device::current_socket(); });
}
