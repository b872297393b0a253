// Bindings: zero-copy CPU aliases of zion tensors (csrc/device/aten/tensor_alias.h),
// for Python code that runs a library's CPU-only glue on zion memory
// (zion_emu.torchrec runs fbgemm's TBE autograd functions this way), and
// whether a tensor has host bytes at all (timing-only mode). Tensors
// cross this boundary, so this file includes torch's pybind.h (its Tensor
// caster), as bind_dist.cpp does.

#include <torch/csrc/utils/pybind.h>

#include <optional>

#include "device/aten/tensor_alias.h"
#include "device/aten/timing.h"

namespace py = pybind11;

void bind_tensor_alias(py::module_& m) {
  py::module_ d = m.attr("device").cast<py::module_>();
  d.def(
      "cpu_alias",
      [](const at::Tensor& t, bool storage_less_ok) {
        TORCH_CHECK(t.device().is_privateuseone(), "zion: cpu_alias takes a zion tensor, got one on ", t.device());
        return zion::device::cpu_alias(t, storage_less_ok);
      },
      py::arg("tensor"), py::arg("storage_less_ok") = false,
      "A CPU tensor over the zion tensor's bytes (same storage, sizes, strides, offset; no autograd history); "
      "it keeps the zion storage alive. With storage_less_ok, a storage-less tensor (timing-only mode) gets an "
      "alias with a null data pointer, for code that reads only metadata and hands the alias back to zion");
  d.def("is_storage_less", [](const at::Tensor& t) { return zion::device::is_storage_less(t); }, py::arg("tensor"),
        "Whether a zion tensor has no host bytes (timing-only mode); False for any other tensor");
  d.def(
      "zion_tensor_of_alias",
      [](const at::Tensor& t) -> std::optional<at::Tensor> {
        at::Tensor z = zion::device::zion_tensor_of_alias(t);
        if (!z.defined()) return std::nullopt;
        return z;
      },
      py::arg("tensor"),
      "The zion tensor a CPU alias (or a CPU view of one) stands for, with the alias's geometry; None for any "
      "other tensor");
}
