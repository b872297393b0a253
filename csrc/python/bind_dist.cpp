// Bindings: zion_emu._C.dist, ProcessGroupZion for torch.distributed.
//
// It passes torch's own pybind types: a c10d.Store and a gloo Backend come
// in, a c10d.Backend goes out. That is why _C is built against the pybind11
// torch ships and includes torch's pybind.h (the intrusive_ptr holder).

#include <torch/csrc/utils/pybind.h>

#include <pybind11/chrono.h>
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <stdexcept>

#include "dist/process_group_zion.h"
#include "sim/collective.h"
#include "sim/link_model.h"

namespace py = pybind11;
using zion::dist::ProcessGroupZion;

namespace {

py::dict record_dict(const zion::dist::CommRecord& r) {
  py::dict d;
  d["op"] = r.op;
  d["call"] = r.call;
  d["bytes"] = r.bytes;
  d["devices"] = r.devices;
  d["algorithm"] = r.algorithm;
  d["start"] = r.start;
  d["end"] = r.end;
  d["time"] = r.end - r.start;
  d["device"] = r.device;
  d["stream"] = r.stream;
  d["protocol"] = r.protocol.empty() ? py::object(py::none()) : py::object(py::str(r.protocol));
  return d;
}

// Runs f(arg) with the GIL released when this thread holds it; not while
// the interpreter finalizes, when a thread that takes the GIL is stopped.
void run_without_gil(void (*f)(void*), void* arg) {
#if PY_VERSION_HEX >= 0x030D0000
  const bool finalizing = Py_IsFinalizing();
#else
  const bool finalizing = _Py_IsFinalizing();
#endif
  if (Py_IsInitialized() && !finalizing && PyGILState_Check()) {
    py::gil_scoped_release released;
    f(arg);
    return;
  }
  f(arg);
}

}  // namespace

void bind_dist(py::module_& m) {
  zion::dist::set_without_gil(&run_without_gil);
  // torch.distributed's Backend type must be registered before ours derives
  // from it (`import torch` has imported it already; this makes it certain).
  py::module_::import("torch.distributed");

  py::class_<ProcessGroupZion, c10d::Backend, c10::intrusive_ptr<ProcessGroupZion>>(
      m, "ProcessGroupZion",
      "A torch.distributed backend for zion tensors: data through an inner gloo backend on zero-copy CPU aliases, "
      "time from the collective model on the device timeline")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, const c10::intrusive_ptr<c10d::Backend>& gloo, int rank,
                       int size, int global_rank, int local_rank, int node_rank, const std::string& algorithm,
                       const std::string& link_model, const std::vector<int>& present, const std::vector<int>& global_ranks,
                       double timeout_s,
                       std::function<c10::intrusive_ptr<c10d::Backend>(const c10::intrusive_ptr<c10d::Store>&, int, int,
                                                                      const std::vector<int>&, double)> split) {
             ProcessGroupZion::Options options;
             options.global_rank = global_rank;
             options.local_rank = local_rank;
             options.node_rank = node_rank;
             options.algorithm = algorithm;
             options.link_model = link_model;
             options.present = present;
             options.global_ranks = global_ranks;
             options.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
             options.make_split = std::move(split);
             try {
               return c10::make_intrusive<ProcessGroupZion>(store, gloo, rank, size, options);
             } catch (const c10::ValueError& e) {
               throw py::value_error(e.what_without_backtrace());
             } catch (const c10::Error& e) {
               throw std::runtime_error(e.what_without_backtrace());
             }
           }),
           py::arg("store"), py::arg("gloo"), py::arg("rank"), py::arg("size"), py::arg("global_rank"),
           py::arg("local_rank") = -1, py::arg("node_rank") = -1, py::arg("algorithm") = "auto", py::arg("link_model") = "fair",
           py::arg("present") = std::vector<int>{}, py::arg("global_ranks") = std::vector<int>{}, py::arg("timeout_s") = 1800.0,
           py::arg("split") = py::none(),
           // Joining the ranks waits for the others: other Python threads of this process run meanwhile.
           py::call_guard<py::gil_scoped_release>(),
           "`gloo` holds the present ranks alone when `present` (group ranks that run as processes) leaves some out; "
           "`global_ranks` (group rank -> global rank) places the absent ones; `timeout_s` bounds a handshake through "
           "shared memory (ZION_HANDSHAKE=gloo, or ranks on different hosts: through gloo, with gloo's timeout); "
           "`split(store, rank, size, global_ranks, timeout_s)` makes the backend of a group split from this one "
           "(None: it cannot be split)")
      .def_property_readonly("handshake", &ProcessGroupZion::handshake,
                             "How the ranks agree on each collective: 'shm' (shared memory; every present rank on this "
                             "host) or 'gloo'")
      .def_property_readonly("global_device", [](const ProcessGroupZion& pg) { return pg.placement().device; },
                             "The global device (node-major, OAM-minor) the collective model places this rank on")
      .def_property_readonly("algorithm", [](const ProcessGroupZion& pg) { return pg.options().algorithm; },
                             "The collective algorithm this group prices with (auto: the platform's choice per call)")
      .def_property_readonly("link_model", [](const ProcessGroupZion& pg) { return pg.options().link_model; },
                             "The link model this group prices with: fair, unaware or astra")
      .def_property_readonly("timeout", [](const ProcessGroupZion& pg) { return pg.options().timeout; },
                             "The group's timeout (a split of it gets the same unless split_group names another)")
      .def_property_readonly("present_ranks", [](const ProcessGroupZion& pg) { return pg.present_ranks().present; },
                             "The group ranks that run as processes (all of them unless the world is bigger than its processes)")
      .def_property_readonly("counterparts", [](const ProcessGroupZion& pg) { return pg.present_ranks().counterpart; },
                             "For each group rank, the present rank that stands in for it (itself when present)")
      .def_property_readonly("node", [](const ProcessGroupZion& pg) { return pg.placement().node; })
      .def_property_readonly("oam", [](const ProcessGroupZion& pg) { return pg.placement().oam; })
      .def("last_collective", [](const ProcessGroupZion& pg) { return record_dict(pg.last()); },
           "The last communication of this rank: op, call, bytes, devices, algorithm, protocol (NCCL's, or None when "
           "NCCL's tuning model did not price it), start, end, time (s), device, stream");

  m.def("counterparts",
        [](int size, const std::vector<int>& present) {
          try {
            return zion::dist::PresentRanks::make(size, present, std::vector<int>(size, 0)).counterpart;
          } catch (const c10::Error& e) {
            throw py::value_error(e.what_without_backtrace());
          }
        },
        py::arg("size"), py::arg("present"),
        "For each rank of a group of `size` of which `present` run as processes, the running rank that stands in "
        "for it (itself when it runs): the nearest running rank before it, cyclically");

  m.def("check_model",
        [](const std::string& algorithm, const std::string& link_model, const std::string& where) {
          try {
            zion::sim::parse_algorithm(algorithm);
            zion::sim::parse_link_model(link_model);
          } catch (const std::invalid_argument& e) {
            throw py::value_error("zion backend: " + where + ": " + e.what());
          }
        },
        py::arg("algorithm"), py::arg("link_model"), py::arg("where"),
        "Raises ValueError, naming `where` and the allowed values, unless the collective model knows both names");
}
