#include "device/aten/op_pricing.h"

#include <ATen/Context.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <mutex>
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
    if (t.is_sparse()) {  // described by what it stores (sim::TensorDesc)
      const at::Tensor values = t._values();
      d.sizes.assign(values.sizes().begin(), values.sizes().end());
      d.sparse_index_elements = t._indices().numel();
    } else {
      d.sizes.assign(t.sizes().begin(), t.sizes().end());
      d.sparse_index_elements = -1;
    }
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

// The precisions the script allows float32 matmuls and convolutions, read as
// CUDA reads them: torch.set_float32_matmul_precision("high") or
// torch.backends.cuda.matmul.allow_tf32 / .fp32_precision = "tf32" -> TF32,
// "medium" -> bf16; torch.backends.cudnn.allow_tf32 / .conv.fp32_precision
// (TF32 unless turned off) for convolutions.
void read_fp32_precision(sim::OpCall& call) {
  at::Context& ctx = at::globalContext();
  call.fp32_matmul = ctx.allowTF32CuBLAS() ? sim::DType::kTf32 : sim::DType::kFp32;
  try {
    if (ctx.float32MatmulPrecision() == at::Float32MatmulPrecision::MEDIUM) call.fp32_matmul = sim::DType::kBf16;
  } catch (const c10::Error&) {
    // Legacy and per-backend precision APIs mixed: torch has no single answer; the cuBLAS flag stands.
  }
  call.fp32_convolution = ctx.allowTF32CuDNN(at::Float32Op::CONV) ? sim::DType::kTf32 : sim::DType::kFp32;
}

// The last float32 matmul-class op or convolution priced in this process:
// label id (upper 32 bits), requested dtype, priced dtype (8 bits each); ~0: none.
std::atomic<uint64_t> last_fp32_matmul{~uint64_t{0}};

std::mutex g_fp32_counts_mutex;
std::vector<Fp32MatmulCount> g_fp32_counts;

void count_fp32_matmul(const sim::OpCost& cost) {
  std::lock_guard<std::mutex> lock(g_fp32_counts_mutex);
  auto it = std::find_if(g_fp32_counts.begin(), g_fp32_counts.end(), [&](const Fp32MatmulCount& c) {
    return c.requested == cost.requested_dtype && c.priced == cost.priced_dtype;
  });
  if (it == g_fp32_counts.end()) it = g_fp32_counts.insert(it, Fp32MatmulCount{cost.requested_dtype, cost.priced_dtype});
  it->ops += 1;
  it->flops += cost.work.flops;
  it->device_s += cost.device_time;
}

void note_fp32_matmul(Runtime& rt, const sim::OpCall& call, const sim::OpCost& cost, int label) {
  const sim::OpClass c = cost.work.op_class;
  if ((c != sim::OpClass::kMatmul && c != sim::OpClass::kConvolution) || sim::compute_dtype(call) != sim::DType::kFp32 ||
      cost.work.flops <= 0) {
    return;
  }
  count_fp32_matmul(cost);
  last_fp32_matmul.store((static_cast<uint64_t>(static_cast<uint32_t>(label)) << 32) |
                             (static_cast<uint64_t>(cost.requested_dtype) << 8) |
                             static_cast<uint64_t>(cost.priced_dtype),
                         std::memory_order_relaxed);
  if (cost.requested_dtype != cost.priced_dtype) {
    TORCH_WARN_ONCE("zion: platform '", rt.platform.name, "' gives its OAMs no ", sim::dtype_name(cost.requested_dtype),
                    " peak; float32 matmuls and convolutions that the precision settings allow to run as ",
                    sim::dtype_name(cost.requested_dtype), " are priced at the fp32 peak");
  }
}

void charge(Runtime& rt, sim::OpCall& call, const sim::OpCostModel::FormulaRef& formula, int label,
            c10::DeviceIndex device, const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs) {
  g_priced_ops.fetch_add(1, std::memory_order_relaxed);
  describe(inputs, call.inputs);
  describe(outputs, call.outputs);
  // rt.cost->cost(call, formula) in two halves: the precision settings take
  // several hash lookups to read, and only matmul-class ops and convolutions
  // are priced by them, so they are read for those (and before a registered
  // formula, which may look at them).
  const bool registered = formula && !formula->builtin;
  if (registered) read_fp32_precision(call);
  const sim::OpWork work = rt.cost->work(call, formula);
  if (!registered && (work.op_class == sim::OpClass::kMatmul || work.op_class == sim::OpClass::kConvolution)) {
    read_fp32_precision(call);
  }
  sim::OpCost cost = rt.cost->price(work, sim::compute_dtype(call, work.op_class), call.name);
  cost.guessed = formula == nullptr;
  note_fp32_matmul(rt, call, cost, label);
  int stream = static_cast<int>(current_stream(device).id());
  rt.timeline.launch_op(device, stream, cost.launch_overhead, cost.device_time, label, cost.work.flops,
                        cost.work.bytes + cost.work.gathered_bytes, cost.guessed);
  if (cost.guessed) rt.note_guessed(device, call.name);
}

}  // namespace

int64_t priced_ops() { return g_priced_ops.load(std::memory_order_relaxed); }

std::optional<Fp32MatmulPricing> last_fp32_matmul_pricing() {
  const uint64_t v = last_fp32_matmul.load(std::memory_order_relaxed);
  if (v == ~uint64_t{0}) return std::nullopt;
  const std::vector<std::string> labels = runtime().timeline.labels();
  const auto label = static_cast<size_t>(v >> 32);
  return Fp32MatmulPricing{label < labels.size() ? labels[label] : std::string(),
                           static_cast<sim::DType>((v >> 8) & 0xff), static_cast<sim::DType>(v & 0xff)};
}

std::vector<Fp32MatmulCount> fp32_matmul_counts() {
  std::lock_guard<std::mutex> lock(g_fp32_counts_mutex);
  return g_fp32_counts;
}

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
