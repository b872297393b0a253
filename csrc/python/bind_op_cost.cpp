// Python bindings for the op cost model (csrc/sim/op_cost.h). Users see them
// as zion_emu.sim.TensorDesc, OpCall, OpWork, OpCost, OpClass, ComputeUnit and
// OpCostModel. Platform is bound elsewhere and must be registered first.

#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "sim/op_cost.h"

namespace py = pybind11;

namespace zion::sim {

namespace {

// Storage type names a TensorDesc accepts: the DType names, plus integer
// storage types, which all price as DType::kInt8 (see TensorDesc).
struct StorageType {
  const char* name;
  DType dtype;
  int element_size;
};
constexpr StorageType kStorageTypes[] = {
    {"fp32", DType::kFp32, 4},  {"tf32", DType::kTf32, 4},  {"bf16", DType::kBf16, 2},
    {"fp16", DType::kFp16, 2},  {"int8", DType::kInt8, 1},  {"uint8", DType::kInt8, 1},
    {"bool", DType::kInt8, 1},  {"int16", DType::kInt8, 2}, {"int32", DType::kInt8, 4},
    {"int64", DType::kInt8, 8},
};

const StorageType& storage_type(const std::string& name) {
  for (const StorageType& t : kStorageTypes) {
    if (name == t.name) return t;
  }
  std::string allowed;
  for (const StorageType& t : kStorageTypes) allowed += std::string(allowed.empty() ? "" : ", ") + t.name;
  throw py::value_error("unknown tensor dtype '" + name + "'; allowed: " + allowed);
}

// The storage name for a TensorDesc: integer tensors by their width.
std::string storage_name(const TensorDesc& t) {
  if (t.dtype != DType::kInt8) return dtype_name(t.dtype);
  switch (t.element_size) {
    case 2: return "int16";
    case 4: return "int32";
    case 8: return "int64";
    default: return "int8";
  }
}

std::string sizes_repr(const std::vector<int64_t>& sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + "]";
}

OpClass to_op_class(const py::handle& value) {
  if (py::isinstance<OpClass>(value)) return value.cast<OpClass>();
  const std::string name = py::str(value);
  if (auto c = parse_op_class(name)) return *c;
  std::string allowed;
  for (int i = 0; i < kNumOpClasses; ++i) allowed += std::string(i ? ", " : "") + op_class_name(static_cast<OpClass>(i));
  throw py::value_error("unknown op_class '" + name + "'; allowed: " + allowed);
}

double count_field(const py::handle& value, const std::string& op, const char* key) {
  try {
    return value.cast<double>();
  } catch (const py::cast_error&) {
    throw py::type_error("op cost formula for " + op + " returned a non-number " + key + " (" +
                         std::string(py::str(py::repr(value))) + ")");
  }
}

// What a Python formula returns: an OpWork, or a dict with keys flops, bytes,
// op_class (default "other") and gathered_bytes (default 0).
OpWork to_op_work(const py::handle& result, const std::string& op) {
  if (py::isinstance<OpWork>(result)) return result.cast<OpWork>();
  if (!py::isinstance<py::dict>(result)) {
    throw py::type_error("op cost formula for " + op +
                         " must return an OpWork, a dict (flops, bytes, op_class, gathered_bytes) or, through "
                         "zion_emu.cost.register, a (flops, bytes) pair; got " +
                         std::string(py::str(py::type::of(result).attr("__name__"))));
  }
  OpWork work;
  bool has_flops = false, has_bytes = false;
  for (const auto& item : result.cast<py::dict>()) {
    const std::string key = py::str(item.first);
    if (key == "flops") {
      work.flops = count_field(item.second, op, "flops");
      has_flops = true;
    } else if (key == "bytes") {
      work.bytes = count_field(item.second, op, "bytes");
      has_bytes = true;
    } else if (key == "op_class") {
      work.op_class = to_op_class(item.second);
    } else if (key == "gathered_bytes") {
      work.gathered_bytes = count_field(item.second, op, "gathered_bytes");
    } else {
      throw py::value_error("op cost formula for " + op + " returned unknown key '" + key +
                            "'; allowed: flops, bytes, op_class, gathered_bytes");
    }
  }
  if (!has_flops || !has_bytes) {
    throw py::value_error("op cost formula for " + op + " must return both 'flops' and 'bytes'");
  }
  return work;
}

// A Python object that may be released on any thread: takes the GIL to drop
// its reference (a formula can outlive the Python call that registered it and
// die in the device layer's thread).
struct PythonObject {
  py::object object;
  explicit PythonObject(py::object o) : object(std::move(o)) {}
  PythonObject(const PythonObject&) = delete;
  PythonObject& operator=(const PythonObject&) = delete;
  ~PythonObject() {
    if (!Py_IsInitialized()) {
      object.release();  // the interpreter is gone; nothing left to free
      return;
    }
    py::gil_scoped_acquire gil;
    object = py::object();
  }
};

// A formula written in Python: a callable f(call) -> OpWork | dict, or a
// constant dict. An exception raised in it reaches the caller with the op
// name added and the original chained as __cause__; the common built-in
// exception types are kept, others (whose constructors may take other
// arguments than a message) become RuntimeError.
WorkFormula python_formula(const std::string& name, py::object f) {
  if (!PyCallable_Check(f.ptr())) {
    const OpWork constant = to_op_work(f, name);  // checks the dict now, not at the first call
    return [constant](const OpCall&) { return constant; };
  }
  auto callable = std::make_shared<const PythonObject>(std::move(f));
  return [callable](const OpCall& call) {
    py::gil_scoped_acquire gil;
    try {
      // A copy: the callable may keep its argument past this call.
      return to_op_work(callable->object(py::cast(call, py::return_value_policy::copy)), call.name);
    } catch (py::error_already_set& e) {
      py::object type = e.type();
      PyObject* raised = PyExc_RuntimeError;
      for (PyObject* kept : {PyExc_ValueError, PyExc_TypeError, PyExc_KeyError, PyExc_IndexError, PyExc_LookupError,
                             PyExc_AttributeError, PyExc_ArithmeticError, PyExc_ZeroDivisionError,
                             PyExc_OverflowError, PyExc_AssertionError, PyExc_NotImplementedError}) {
        if (type.ptr() == kept) raised = kept;
      }
      // e.what() would add the traceback; the chained original keeps it.
      const std::string message = "op cost formula for " + call.name + " raised " +
                                  py::str(type.attr("__name__")).cast<std::string>() + ": " +
                                  py::str(e.value()).cast<std::string>();
      py::raise_from(e, raised, message.c_str());
      throw py::error_already_set();
    }
  };
}

py::dict peak_flops_dict(const PeakFlops& peak) {
  py::dict d;
  for (int i = 0; i < kNumDTypes; ++i) d[kDTypeNames[i]] = peak[i];
  return d;
}

py::dict efficiency_dict(const EfficiencySpec& e) {
  py::dict d;
  d["matmul"] = e.matmul;
  d["convolution"] = e.convolution;
  d["elementwise"] = e.elementwise;
  d["reduction"] = e.reduction;
  d["embedding_random_access"] = e.embedding_random_access;
  return d;
}

ComputeUnit make_compute_unit(const std::string& name, const py::dict& peak_flops, double memory_bandwidth,
                              const py::dict& efficiency, double launch_overhead) {
  ComputeUnit unit;
  unit.name = name;
  for (const auto& item : peak_flops) {
    const std::string key = py::str(item.first);
    const auto dtype = parse_dtype(key);
    if (!dtype) throw py::value_error("peak_flops: unknown dtype '" + key + "'; allowed: fp32, tf32, bf16, fp16, int8");
    unit.peak_flops[static_cast<int>(*dtype)] = item.second.cast<double>();
  }
  unit.memory_bandwidth = memory_bandwidth;
  for (const auto& item : efficiency) {
    const std::string key = py::str(item.first);
    const double value = item.second.cast<double>();
    if (key == "matmul") unit.efficiency.matmul = value;
    else if (key == "convolution") unit.efficiency.convolution = value;
    else if (key == "elementwise") unit.efficiency.elementwise = value;
    else if (key == "reduction") unit.efficiency.reduction = value;
    else if (key == "embedding_random_access") unit.efficiency.embedding_random_access = value;
    else
      throw py::value_error("efficiency: unknown key '" + key +
                            "'; allowed: matmul, convolution, elementwise, reduction, embedding_random_access");
  }
  unit.launch_overhead = launch_overhead;
  return unit;
}

// zion_emu.load_platform returns the Python Platform (zion_emu/platform.py),
// which holds the native one in `.native`; accept either. Resolved at call
// time, so Platform's binding (bind_platform.cpp) may come in any order.
const Platform& native_platform(const py::handle& platform) {
  if (py::isinstance<Platform>(platform)) return platform.cast<const Platform&>();
  if (py::hasattr(platform, "native")) return platform.attr("native").cast<const Platform&>();
  throw py::type_error("expected a Platform (zion_emu.load_platform(...)), got " +
                       std::string(py::str(py::type::of(platform).attr("__name__"))));
}

}  // namespace

}  // namespace zion::sim

namespace {
zion::sim::DType fp32_precision(const std::string& name, const char* field) {
  using zion::sim::DType;
  auto d = zion::sim::parse_dtype(name);
  if (!d || (*d != DType::kFp32 && *d != DType::kTf32 && *d != DType::kBf16)) {
    throw py::value_error(std::string("OpCall.") + field + ": unknown precision '" + name +
                          "'; allowed: fp32, tf32, bf16");
  }
  return *d;
}
}  // namespace

void bind_op_cost(py::module_& sim) {
  using namespace zion::sim;

  py::enum_<OpClass>(sim, "OpClass", "Which efficiency factor of the unit prices an op.")
      .value("matmul", OpClass::kMatmul)
      .value("convolution", OpClass::kConvolution)
      .value("elementwise", OpClass::kElementwise)
      .value("reduction", OpClass::kReduction)
      .value("embedding_bag", OpClass::kEmbeddingBag)
      .value("other", OpClass::kOther);

  py::class_<TensorDesc>(sim, "TensorDesc", "Shape and type of one tensor argument of an op.")
      .def(py::init([](std::vector<int64_t> sizes, const std::string& dtype, std::optional<int> element_size) {
             const StorageType& t = storage_type(dtype);
             return TensorDesc{std::move(sizes), t.dtype, element_size.value_or(t.element_size)};
           }),
           py::arg("sizes"), py::arg("dtype") = "fp32", py::arg("element_size") = py::none(),
           "dtype: fp32, tf32, bf16, fp16, int8, or an integer storage type (uint8, bool, int16, int32, int64), "
           "which prices as int8; element_size defaults to the dtype's width in bytes.")
      .def_readwrite("sizes", &TensorDesc::sizes)
      .def_property_readonly("dtype", &storage_name)
      .def_readwrite("element_size", &TensorDesc::element_size)
      .def_readwrite("sparse_index_elements", &TensorDesc::sparse_index_elements,
                     "a sparse COO tensor (sizes are its values'): its int64 indices, sparse_dim x nnz; -1: dense")
      .def("is_sparse", &TensorDesc::is_sparse)
      .def("numel", &TensorDesc::numel)
      .def("bytes", &TensorDesc::bytes)
      .def("__repr__", [](const TensorDesc& t) {
        return "TensorDesc(" + sizes_repr(t.sizes) + ", " + storage_name(t) +
               ", element_size=" + std::to_string(t.element_size) + ")";
      });

  py::class_<OpCall>(sim, "OpCall", "An operator by ATen schema name and the tensors it reads and writes.")
      .def(py::init([](std::string name, std::vector<TensorDesc> inputs, std::vector<TensorDesc> outputs,
                       std::vector<int64_t> int_args, const std::string& fp32_matmul,
                       const std::string& fp32_convolution) {
             OpCall call{std::move(name), std::move(inputs), std::move(outputs), std::move(int_args)};
             call.fp32_matmul = fp32_precision(fp32_matmul, "fp32_matmul");
             call.fp32_convolution = fp32_precision(fp32_convolution, "fp32_convolution");
             return call;
           }),
           py::arg("name"), py::arg("inputs") = std::vector<TensorDesc>{},
           py::arg("outputs") = std::vector<TensorDesc>{}, py::arg("int_args") = std::vector<int64_t>{},
           py::arg("fp32_matmul") = "fp32", py::arg("fp32_convolution") = "fp32",
           "fp32_matmul / fp32_convolution: the precision (fp32, tf32 or bf16) float32 matmul-class ops and "
           "convolutions are priced at.")
      .def_readwrite("name", &OpCall::name)
      .def_readwrite("inputs", &OpCall::inputs)
      .def_readwrite("outputs", &OpCall::outputs)
      .def_readwrite("int_args", &OpCall::int_args)
      .def_property(
          "fp32_matmul", [](const OpCall& c) { return std::string(dtype_name(c.fp32_matmul)); },
          [](OpCall& c, const std::string& v) { c.fp32_matmul = fp32_precision(v, "fp32_matmul"); })
      .def_property(
          "fp32_convolution", [](const OpCall& c) { return std::string(dtype_name(c.fp32_convolution)); },
          [](OpCall& c, const std::string& v) { c.fp32_convolution = fp32_precision(v, "fp32_convolution"); })
      .def("__repr__", [](const OpCall& c) {
        return "OpCall(" + c.name + ", " + std::to_string(c.inputs.size()) + " inputs, " +
               std::to_string(c.outputs.size()) + " outputs)";
      });

  py::class_<OpWork>(sim, "OpWork", "FLOPs and bytes of one op; gathered_bytes are read by random row gathers.")
      .def(py::init([](double flops, double bytes, const py::object& op_class, double gathered_bytes) {
             OpWork work;
             work.flops = flops;
             work.bytes = bytes;
             work.op_class = to_op_class(op_class);
             work.gathered_bytes = gathered_bytes;
             return work;
           }),
           py::arg("flops") = 0.0, py::arg("bytes") = 0.0, py::arg("op_class") = "other",
           py::arg("gathered_bytes") = 0.0)
      .def_readwrite("flops", &OpWork::flops)
      .def_readwrite("bytes", &OpWork::bytes)
      .def_readwrite("op_class", &OpWork::op_class)
      .def_readwrite("gathered_bytes", &OpWork::gathered_bytes)
      .def("__repr__", [](const OpWork& w) {
        return "OpWork(flops=" + std::string(py::str(py::float_(w.flops))) +
               ", bytes=" + std::string(py::str(py::float_(w.bytes))) + ", op_class=" + op_class_name(w.op_class) +
               ", gathered_bytes=" + std::string(py::str(py::float_(w.gathered_bytes))) + ")";
      });

  py::class_<OpCost>(sim, "OpCost", "Modeled times of one op, in seconds.")
      .def_readonly("work", &OpCost::work)
      .def_readonly("compute_time", &OpCost::compute_time)
      .def_readonly("memory_time", &OpCost::memory_time)
      .def_readonly("device_time", &OpCost::device_time)
      .def_readonly("launch_overhead", &OpCost::launch_overhead)
      .def_readonly("guessed", &OpCost::guessed)
      .def_readonly("formula", &OpCost::formula)
      .def_property_readonly("requested_dtype", [](const OpCost& c) { return std::string(dtype_name(c.requested_dtype)); })
      .def_property_readonly("priced_dtype", [](const OpCost& c) { return std::string(dtype_name(c.priced_dtype)); })
      .def("__repr__", [](const OpCost& c) {
        return "OpCost(" + c.formula + ", device_time=" + std::string(py::str(py::float_(c.device_time))) +
               " s, compute_time=" + std::string(py::str(py::float_(c.compute_time))) +
               " s, memory_time=" + std::string(py::str(py::float_(c.memory_time))) + " s" +
               (c.guessed ? ", guessed" : "") + ")";
      });

  py::class_<ComputeUnit>(sim, "ComputeUnit", "What the roofline knows of an OAM or a CPU socket.")
      .def(py::init(&make_compute_unit), py::arg("name"), py::arg("peak_flops"), py::arg("memory_bandwidth"),
           py::arg("efficiency") = py::dict(), py::arg("launch_overhead") = 0.0,
           "peak_flops: {dtype: FLOP/s}; memory_bandwidth: bytes/s; efficiency: {class: fraction}, 1.0 where "
           "not given; launch_overhead: seconds.")
      .def_static(
          "oam", [](const py::object& p) { return ComputeUnit::oam(native_platform(p)); }, py::arg("platform"))
      .def_static(
          "socket", [](const py::object& p) { return ComputeUnit::socket(native_platform(p)); }, py::arg("platform"))
      .def_readonly("name", &ComputeUnit::name)
      .def_property_readonly("peak_flops", [](const ComputeUnit& u) { return peak_flops_dict(u.peak_flops); })
      .def_readonly("memory_bandwidth", &ComputeUnit::memory_bandwidth)
      .def_property_readonly("efficiency", [](const ComputeUnit& u) { return efficiency_dict(u.efficiency); })
      .def_readonly("launch_overhead", &ComputeUnit::launch_overhead);

  py::class_<OpCostModel>(sim, "OpCostModel", "Prices ops on one compute unit from a table of work formulas.")
      .def(py::init<ComputeUnit>(), py::arg("unit"))
      .def_static(
          "for_oam",
          [](const py::object& p) { return std::make_unique<OpCostModel>(ComputeUnit::oam(native_platform(p))); },
          py::arg("platform"))
      .def_static(
          "for_socket",
          [](const py::object& p) { return std::make_unique<OpCostModel>(ComputeUnit::socket(native_platform(p))); },
          py::arg("platform"))
      .def_property_readonly("unit", &OpCostModel::unit)
      .def("cost", py::overload_cast<const OpCall&>(&OpCostModel::cost, py::const_), py::arg("call"))
      .def(
          "register_formula",
          [](OpCostModel& model, const std::string& name, py::object formula) {
            model.register_formula(name, python_formula(name, std::move(formula)));
          },
          py::arg("name"), py::arg("formula"),
          "formula: a callable f(call: OpCall) -> OpWork | dict, or a constant dict with keys flops, bytes, "
          "op_class (default 'other'), gathered_bytes (default 0).")
      .def("has_formula", &OpCostModel::has_formula, py::arg("name"))
      .def("formula_names", &OpCostModel::formula_names);
}
