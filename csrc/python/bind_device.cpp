// Bindings: the zion device's runtime (platform, devices, memory, clocks,
// the op cost model). Tensors and the default generators cross only through
// the dispatcher (ops taking or returning them), so this file needs no torch
// Python headers.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/library.h>

#include <memory>
#include <string>

#include "device/runtime/allocator.h"
#include "device/aten/copy.h"
#include "device/aten/op_pricing.h"
#include "device/aten/timing.h"
#include "device/runtime/generator.h"
#include "device/runtime/runtime.h"
#include "device/runtime/stream.h"
#include "sim/platform_loader.h"

namespace py = pybind11;
using namespace zion;

namespace {

// The script's source line that read a storage-less value: the innermost
// Python frame outside torch and zion_emu ("" when there is none).
std::string python_call_site() {
  if (!Py_IsInitialized()) return {};
  py::gil_scoped_acquire gil;
  try {
    py::object frame = py::module_::import("sys").attr("_getframe")(0);
    while (!frame.is_none()) {
      py::object code = frame.attr("f_code");
      const std::string file = code.attr("co_filename").cast<std::string>();
      const bool internal = file.find("/torch/") != std::string::npos || file.find("/zion_emu/") != std::string::npos ||
                            file.rfind("<frozen", 0) == 0;
      if (!internal) return file + ":" + std::to_string(frame.attr("f_lineno").cast<int>());
      frame = frame.attr("f_back");
    }
  } catch (const py::error_already_set&) {
  }
  return {};
}

py::dict stat_dict(const c10::CachingAllocator::Stat& s) {
  py::dict d;
  d["current"] = s.current;
  d["peak"] = s.peak;
  d["allocated"] = s.allocated;
  d["freed"] = s.freed;
  return d;
}

// The runtime's op cost model, as zion_emu.sim.OpCostModel, for the length of
// one call: set_platform replaces the model, so no Python reference may keep it.
py::object cost_model() { return py::cast(device::runtime().cost.get(), py::return_value_policy::reference); }

// A device's default generator, the one ATen hands its random ops. Python gets
// it as a torch.Generator through the dispatcher: torch.ops.zion.default_generator(i).
at::Generator default_generator_op(int64_t index) {
  return device::default_generator(static_cast<c10::DeviceIndex>(index));
}

// Copies issued at once (device/aten/copy.h): torch.ops.zion.copy_batch, so
// that tensors cross through the dispatcher and this file needs no torch
// Python headers. torch.zion.comm (zion_emu/comm.py) calls it.
void copy_batch_op(at::TensorList src, at::TensorList dst, c10::IntArrayRef streams) {
  device::copy_batch(src, dst, streams);
}

TORCH_LIBRARY_FRAGMENT(zion, m) {
  m.def("default_generator(int index) -> Generator?", &default_generator_op);
  m.def("copy_batch(Tensor[] src, Tensor(a!)[] dst, int[] streams) -> ()", &copy_batch_op);
}

}  // namespace

void bind_device(py::module_& m) {
  // The runtime's checks (TORCH_CHECK) reach Python as torch's own errors do:
  // the message without the C++ backtrace.
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const c10::IndexError& e) {
      PyErr_SetString(PyExc_IndexError, e.what_without_backtrace());
    } catch (const c10::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
    } catch (const c10::TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what_without_backtrace());
    } catch (const c10::NotImplementedError& e) {
      PyErr_SetString(PyExc_NotImplementedError, e.what_without_backtrace());
    } catch (const c10::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    }
  });
  py::module_ d = m.def_submodule("device", "The zion device runtime");
  d.def("set_platform", [](const sim::Platform& p) { device::set_platform(p); }, py::arg("platform"),
        "Sets the platform; only before the first zion tensor");
  d.def("priced_ops", &device::priced_ops, "Ops priced so far by this process (all threads and devices)");
  d.def("formula_runs", &device::formula_runs,
        "Of the ops priced so far, those whose price a formula worked out (the others were charged a price "
        "remembered for the same operator and shapes)");
  d.def("mode", [] { return device::timing_only() ? "timing" : "real"; },
        "'timing' (timing-only: float zion tensors have no host bytes) or 'real'; ZION_MODE, read once");
  device::set_call_site_reader(&python_call_site);
  d.def("placeholder_reads", [] {
    py::list out;
    for (const auto& r : device::placeholder_reads()) {
      py::dict e;
      e["site"] = r.site;
      e["what"] = r.what;
      e["dtype"] = r.dtype;
      e["count"] = r.count;
      out.append(e);
    }
    return out;
  }, "Reads of storage-less values (timing-only mode): one entry per call site and kind of read, with its count");
  d.def("reset_placeholder_reads", &device::reset_placeholder_reads);
  d.def("platform_name", [] { return device::runtime().platform.name; });
  d.def("platform", [] { return std::make_shared<sim::Platform>(device::runtime().platform); },
        "A copy of the active platform");
  d.def("compute_unit", [] { return device::runtime().cost->unit(); },
        "What the roofline knows of one OAM: peak FLOP/s per dtype, HBM bandwidth, efficiencies, launch overhead");
  d.def("register_formula", [](const std::string& name, const py::object& formula) {
    cost_model().attr("register_formula")(name, formula);
  }, py::arg("name"), py::arg("formula"), "Adds or replaces the work formula of an op in the device's cost model");
  d.def("has_formula", [](const std::string& name) { return device::runtime().cost->has_formula(name); },
        py::arg("name"));
  d.def("formula_names", [] { return device::runtime().cost->formula_names(); });
  d.def("initialized", &device::initialized);
  d.def("drain_autograd_threads", &device::drain_autograd_threads, py::call_guard<py::gil_scoped_release>(),
        "Waits until autograd's zion worker threads hold no finished backward pass (run at interpreter exit)");
  d.def("device_count", [] { return static_cast<int>(device::device_count()); });
  d.def("device_count_unstarted", [] { return static_cast<int>(device::device_count_unstarted()); },
        "The OAMs per node, without starting the runtime (the platform ZION_PLATFORM names until it starts)");
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
  d.def("kernel_host_cached_bytes", [] { return device::kernel_host_memory().cached_bytes(); },
        "Freed host bytes of zion ops' CPU kernels kept for reuse (freed by torch.zion.empty_cache)");
  d.def("host_time", [] { return device::runtime().timeline.host(); }, "The host's virtual clock, seconds");
  d.def("in_bad_fork", [] { return device::in_bad_fork(); },
        "Whether this process was forked from one that had loaded zion (torch then leaves zion alone here)");
  d.def("stream_time", [](int index, int stream) {
    return device::runtime().timeline.stream_time(index, stream);
  }, py::arg("index"), py::arg("stream") = 0);
  d.def("synchronize", [](int index) { return device::runtime().timeline.wait_device(index); }, py::arg("index"));
  d.def("reset_clock", [] {
    device::runtime().timeline.reset();
    device::restore_link_free_times({});  // links queue copies from time zero again
    device::runtime().clear_guessed();
  });
  d.def("guessed_ops", [](int index) { return device::runtime().guessed(static_cast<c10::DeviceIndex>(index)); },
        py::arg("index"), "Ops priced by the default guess on this device: name -> count");
  d.def("last_fp32_matmul_pricing", []() -> py::object {
    auto p = device::last_fp32_matmul_pricing();
    if (!p) return py::none();
    py::dict out;
    out["op"] = p->op;
    out["requested"] = sim::dtype_name(p->requested);
    out["priced"] = sim::dtype_name(p->priced);
    return out;
  }, "The last float32 matmul or convolution priced: op, the precision its settings asked for, the one that priced it");
  d.def("fp32_matmul_counts", [] {
    py::list out;
    for (const auto& c : device::fp32_matmul_counts()) {
      py::dict e;
      e["requested"] = sim::dtype_name(c.requested);
      e["priced"] = sim::dtype_name(c.priced);
      e["ops"] = c.ops;
      e["flops"] = c.flops;
      e["device_s"] = c.device_s;
      out.append(e);
    }
    return out;
  }, "Every float32 matmul-class op and convolution priced in this process, by (requested, priced) precision: "
     "ops, flops, device_s");
  d.def("counters", [](int index) {
    auto c = device::runtime().timeline.counters(index);
    py::dict out;
    out["flops"] = c.flops;
    out["bytes"] = c.bytes;
    out["copy_bytes"] = c.copy_bytes;
    out["busy_s"] = c.busy;
    out["ops"] = c.ops;
    out["guessed_ops"] = c.guessed_ops;
    out["compiled_kernels"] = c.compiled_kernels;
    out["compiled_busy_s"] = c.compiled_busy;
    return out;
  }, py::arg("index"));
  d.def("charge_kernel", [](int index, const std::string& label, double flops, double bytes,
                            const std::string& op_class, const std::string& dtype) {
    auto cls = sim::parse_op_class(op_class);
    if (!cls) {
      std::string allowed;
      for (int i = 0; i < sim::kNumOpClasses; ++i) {
        allowed += std::string(i ? ", " : "") + sim::op_class_name(static_cast<sim::OpClass>(i));
      }
      throw py::value_error("charge_kernel: unknown op_class '" + op_class + "'; allowed: " + allowed);
    }
    auto type = sim::parse_dtype(dtype);
    if (!type) throw py::value_error("charge_kernel: unknown dtype '" + dtype + "'; allowed: fp32, tf32, bf16, fp16, int8");
    device::charge_kernel(static_cast<c10::DeviceIndex>(index), label, flops, bytes, *cls, *type);
  }, py::arg("index"), py::arg("label"), py::arg("flops"), py::arg("bytes"), py::arg("op_class"),
     py::arg("dtype") = "fp32",
     "Charges one kernel generated by torch.compile on the device's current stream: the roofline of its FLOPs "
     "(at dtype's peak) and bytes (at op_class's efficiency) plus one launch; counted as an op and a compiled kernel");
}
