#include "device/aten/op_pricing.h"

#include <atomic>
#include <unordered_map>

#include "device/runtime/runtime.h"
#include "device/runtime/stream.h"

namespace zion::device {
namespace {

// Fills `out` from `tensors`, reusing the vectors' capacity.
void describe(const std::vector<at::Tensor>& tensors, std::vector<sim::TensorDesc>& out) {
  size_t n = 0;
  for (const auto& t : tensors) n += t.defined() ? 1 : 0;
  out.resize(n);
  size_t i = 0;
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    sim::TensorDesc& d = out[i++];
    d.sizes.assign(t.sizes().begin(), t.sizes().end());
    d.dtype = model_dtype(t.scalar_type());
    d.element_size = static_cast<int>(t.element_size());
  }
}

std::atomic<int64_t> g_priced_ops{0};

struct Priced {
  std::string name;
  sim::OpCostModel::FormulaRef formula;
  const sim::OpCostModel* model = nullptr;  // set_platform makes a new model
  uint64_t generation = ~uint64_t{0};
  int label = -1;  // the operator's name on the timeline's spans
};

void charge(Runtime& rt, sim::OpCall& call, const sim::OpCostModel::FormulaRef& formula, int label,
            c10::DeviceIndex device, const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs) {
  g_priced_ops.fetch_add(1, std::memory_order_relaxed);
  describe(inputs, call.inputs);
  describe(outputs, call.outputs);
  sim::OpCost cost = rt.cost->cost(call, formula);
  int stream = static_cast<int>(current_stream(device).id());
  rt.timeline.launch(device, stream, cost.launch_overhead, cost.device_time, 0, sim::Activity::kCompute, label);
  rt.timeline.count(device, cost.work.flops, cost.work.bytes + cost.work.gathered_bytes, cost.guessed);
  if (cost.guessed) rt.note_guessed(device, call.name);
}

}  // namespace

int64_t priced_ops() { return g_priced_ops.load(std::memory_order_relaxed); }

void charge_op(const c10::OperatorHandle& op, c10::DeviceIndex device, const std::vector<at::Tensor>& inputs,
               const std::vector<at::Tensor>& outputs, c10::ArrayRef<int64_t> int_args) {
  Runtime& rt = runtime();
  // Per thread: no lock on the hot path. Keyed by the operator's schema,
  // which lives as long as the operator is registered.
  thread_local std::unordered_map<const void*, Priced> cache;
  thread_local sim::OpCall call;
  Priced& p = cache[&op.schema()];
  uint64_t generation = rt.cost->generation();
  if (p.generation != generation || p.model != rt.cost.get()) {
    const auto& schema = op.schema();
    p.name = schema.name() + (schema.overload_name().empty() ? "" : "." + schema.overload_name());
    p.formula = rt.cost->resolve(p.name);
    p.generation = generation;
    p.model = rt.cost.get();
    p.label = rt.timeline.label(p.name);
  }
  call.name = p.name;
  call.int_args.assign(int_args.begin(), int_args.end());
  charge(rt, call, p.formula, p.label, device, inputs, outputs);
}

void charge_op(const std::string& op_name, c10::DeviceIndex device, const std::vector<at::Tensor>& inputs,
               const std::vector<at::Tensor>& outputs) {
  Runtime& rt = runtime();
  thread_local sim::OpCall call;
  call.name = op_name;
  charge(rt, call, rt.cost->resolve(op_name), rt.timeline.label(op_name), device, inputs, outputs);
}

void charge_kernel(c10::DeviceIndex device, const std::string& label, double flops, double bytes,
                   sim::OpClass op_class, sim::DType dtype) {
  check_device(device);
  Runtime& rt = runtime();
  sim::OpWork work;
  work.flops = flops;
  work.bytes = bytes;
  work.op_class = op_class;
  const sim::OpCost cost = rt.cost->price(work, dtype, label);
  const int stream = static_cast<int>(current_stream(device).id());
  rt.timeline.launch(device, stream, cost.launch_overhead, cost.device_time, 0, sim::Activity::kCompute,
                     rt.timeline.label(label));
  rt.timeline.count(device, cost.work.flops, cost.work.bytes, false);
  rt.timeline.count_compiled_kernel(device, cost.device_time);
}

}  // namespace zion::device
