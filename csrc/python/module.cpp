// zion_emu._C: the only place that knows both C++ and Python.
// Submodule `sim` holds the hardware model (csrc/sim), submodule `dist` the
// torch.distributed backend (csrc/dist); the device's bindings are top level.

#include <pybind11/pybind11.h>

#include "sim/platform_loader.h"

namespace py = pybind11;

void bind_platform(py::module_& sim);
void bind_collectives(py::module_& sim);
void bind_op_cost(py::module_& sim);
void bind_device(py::module_& m);
void bind_host_memory(py::module_& m);
void bind_timeline(py::module_& m);
void bind_tensor_alias(py::module_& m);
void bind_memory(py::module_& m);
void bind_dist(py::module_& dist);

PYBIND11_MODULE(_C, m) {
  m.doc() = "zion-emu native core";
  py::module_ sim = m.def_submodule("sim", "The hardware model: platforms, topology, link model, collectives, op cost");
  // A wrong platform field is a ValueError that names the field.
  py::register_exception<zion::sim::ConfigError>(sim, "ConfigError", PyExc_ValueError);
  bind_platform(sim);
  bind_collectives(sim);
  bind_op_cost(sim);
  bind_device(m);
  bind_host_memory(m);
  bind_timeline(m);
  bind_tensor_alias(m);
  bind_memory(m);
  py::module_ dist = m.def_submodule("dist", "The zion torch.distributed backend (ProcessGroupZion)");
  bind_dist(dist);
}
