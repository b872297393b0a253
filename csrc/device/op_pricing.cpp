#include "device/op_pricing.h"

#include <ATen/Context.h>

#include "device/runtime.h"
#include "device/stream.h"

namespace zion::device {
namespace {

sim::DType model_dtype(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::BFloat16: return sim::DType::kBf16;
    case c10::ScalarType::Half: return sim::DType::kFp16;
    case c10::ScalarType::Char:
    case c10::ScalarType::Byte:
    case c10::ScalarType::Bool: return sim::DType::kInt8;
    default: return sim::DType::kFp32;
  }
}

sim::TensorDesc describe(const at::Tensor& t) {
  sim::TensorDesc d;
  d.sizes.assign(t.sizes().begin(), t.sizes().end());
  d.dtype = model_dtype(t.scalar_type());
  d.element_size = static_cast<int>(t.element_size());
  return d;
}

}  // namespace

void charge_op(const std::string& op_name, c10::DeviceIndex device, const std::vector<at::Tensor>& inputs,
               const std::vector<at::Tensor>& outputs) {
  Runtime& rt = runtime();
  sim::OpCall call;
  call.name = op_name;
  for (const auto& t : inputs) {
    if (t.defined()) call.inputs.push_back(describe(t));
  }
  for (const auto& t : outputs) {
    if (t.defined()) call.outputs.push_back(describe(t));
  }
  sim::OpCost cost = rt.cost->cost(call);
  int stream = static_cast<int>(current_stream(device).id());
  rt.timeline.launch(device, stream, cost.launch_overhead, cost.device_time);
  rt.timeline.count(device, cost.work.flops, cost.work.bytes + cost.work.gathered_bytes, cost.guessed);
}

}  // namespace zion::device
