#include "device/aten/op_pricing.h"

#include <ATen/Context.h>
#include <ATen/SparseTensorImpl.h>
#include <ATen/native/SparseTensorUtils.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "device/runtime/runtime.h"
#include "device/runtime/stream.h"

namespace zion::device {
namespace {

// Fills `out` from `tensors`, reusing the vectors' capacity.
void describe(c10::ArrayRef<at::Tensor> tensors, std::vector<sim::TensorDesc>& out) {
  size_t n = 0;
  for (const auto& t : tensors) n += t.defined() ? 1 : 0;
  out.resize(n);
  size_t i = 0;
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    sim::TensorDesc& d = out[i++];
    if (t.is_sparse()) {  // described by what it stores (sim::TensorDesc)
      const at::SparseTensorImpl* sparse = at::sparse::get_sparse_impl(t);
      d.sizes.assign(sparse->values().sizes().begin(), sparse->values().sizes().end());
      d.sparse_index_elements = sparse->indices().numel();
    } else {
      d.sizes.assign(t.sizes().begin(), t.sizes().end());
      d.sparse_index_elements = -1;
    }
    d.dtype = model_dtype(t.scalar_type());
    d.element_size = static_cast<int>(t.element_size());
  }
}

// What describe() and the int_args give a formula of one call: the scalar
// type and sizes of each defined tensor, in order, and the int_args. A
// built-in formula reads nothing else of the call but the operator's name
// (sim::OpCostModel::Formula), and strides, offsets and values never reach
// it; so two calls of one operator with equal shapes, priced by the same
// model under the same precision settings, cost the same. A sparse tensor
// stands for what describe() gives of it: its values' scalar type and sizes
// and the number of its indices. The shapes of a call, written as words, are
// the key of its remembered price.
class ShapeWords {
 public:
  // Writes the call's words into `out`, sized once (its capacity reused).
  static void of(c10::ArrayRef<at::Tensor> inputs, c10::ArrayRef<at::Tensor> outputs, c10::ArrayRef<int64_t> int_args,
                 std::vector<int64_t>& out) {
    out.resize(count(inputs) + count(outputs) + int_args.size());
    int64_t* w = write(inputs, out.data());
    w = write(outputs, w);
    std::copy(int_args.begin(), int_args.end(), w);
  }

  struct Hash {
    size_t operator()(const std::vector<int64_t>& words) const {
      uint64_t h = 14695981039346656037ull;  // FNV-1a over the words
      for (int64_t w : words) {
        h ^= static_cast<uint64_t>(w);
        h *= 1099511628211ull;
      }
      return static_cast<size_t>(h);
    }
  };

 private:
  // Per defined dense tensor: its scalar type, its dim, its sizes. Per sparse
  // one: kSparse, then its values' scalar type, dim and sizes, then the number
  // of its indices. kEndOfList after each list, so the int_args that follow
  // cannot be read as sizes.
  static constexpr int64_t kEndOfList = -1;
  static constexpr int64_t kSparse = -2;

  static size_t count(c10::ArrayRef<at::Tensor> tensors) {
    size_t n = 1;  // kEndOfList
    for (const at::Tensor& t : tensors) {
      if (!t.defined()) continue;
      n += t.is_sparse() ? 4 + static_cast<size_t>(at::sparse::get_sparse_impl(t)->values().dim())
                         : 2 + static_cast<size_t>(t.dim());
    }
    return n;
  }

  static int64_t* write(c10::ArrayRef<at::Tensor> tensors, int64_t* w) {
    for (const at::Tensor& t : tensors) {
      if (!t.defined()) continue;
      const at::SparseTensorImpl* sparse = t.is_sparse() ? at::sparse::get_sparse_impl(t) : nullptr;
      const c10::IntArrayRef sizes = sparse ? sparse->values().sizes() : t.sizes();
      if (sparse) *w++ = kSparse;
      *w++ = static_cast<int64_t>(t.scalar_type());
      *w++ = static_cast<int64_t>(sizes.size());
      w = std::copy(sizes.begin(), sizes.end(), w);
      if (sparse) *w++ = sparse->indices().numel();
    }
    *w++ = kEndOfList;
    return w;
  }
};

std::atomic<int64_t> g_priced_ops{0};
std::atomic<int64_t> g_formula_runs{0};

// The precisions the script allows float32 matmuls and convolutions, read as
// CUDA reads them: torch.set_float32_matmul_precision("high") or
// torch.backends.cuda.matmul.allow_tf32 / .fp32_precision = "tf32" -> TF32,
// "medium" -> bf16; torch.backends.cudnn.allow_tf32 / .conv.fp32_precision
// (TF32 unless turned off) for convolutions.
struct Fp32Precision {
  sim::DType matmul = sim::DType::kFp32;
  sim::DType convolution = sim::DType::kFp32;
};

sim::DType read_fp32_matmul_precision() {
  at::Context& ctx = at::globalContext();
  sim::DType matmul = ctx.allowTF32CuBLAS() ? sim::DType::kTf32 : sim::DType::kFp32;
  try {
    if (ctx.float32MatmulPrecision() == at::Float32MatmulPrecision::MEDIUM) matmul = sim::DType::kBf16;
  } catch (const c10::Error&) {
    // Legacy and per-backend precision APIs mixed: torch has no single answer; the cuBLAS flag stands.
  }
  return matmul;
}

sim::DType read_fp32_convolution_precision() {
  return at::globalContext().allowTF32CuDNN(at::Float32Op::CONV) ? sim::DType::kTf32 : sim::DType::kFp32;
}

Fp32Precision read_fp32_precision() { return {read_fp32_matmul_precision(), read_fp32_convolution_precision()}; }

void set_fp32_precision(sim::OpCall& call, const Fp32Precision& p) {
  call.fp32_matmul = p.matmul;
  call.fp32_convolution = p.convolution;
}

// Only matmul-class ops and convolutions are priced by the precision settings.
bool priced_by_precision(sim::OpClass c) { return c == sim::OpClass::kMatmul || c == sim::OpClass::kConvolution; }

// An op's cost, and what the fp32 matmul counters need to know of its call.
struct Price {
  sim::OpCost cost;
  bool fp32_operands = false;  // sim::compute_dtype(call) is fp32
  Fp32Precision precision;     // read for it (matmul-class ops, convolutions, registered formulas)
};

// Prices `call`, whose name, inputs, outputs and int_args are filled in.
Price price(Runtime& rt, sim::OpCall& call, const sim::OpCostModel::FormulaRef& formula) {
  // rt.cost->cost(call, formula) in two halves: the precision settings take
  // several hash lookups to read, and only matmul-class ops and convolutions
  // are priced by them, so they are read for those (and before a registered
  // formula, which may look at them).
  Price p;
  const bool registered = formula && !formula->builtin;
  if (registered) {
    p.precision = read_fp32_precision();
    set_fp32_precision(call, p.precision);
  }
  const sim::OpWork work = rt.cost->work(call, formula);
  if (!registered && priced_by_precision(work.op_class)) {
    p.precision = read_fp32_precision();
    set_fp32_precision(call, p.precision);
  }
  p.cost = rt.cost->price(work, sim::compute_dtype(call, work.op_class), call.name);
  p.cost.guessed = formula == nullptr;
  p.fp32_operands = sim::compute_dtype(call) == sim::DType::kFp32;
  return p;
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

void note_fp32_matmul(Runtime& rt, const Price& p, int label) {
  const sim::OpCost& cost = p.cost;
  if (!priced_by_precision(cost.work.op_class) || !p.fp32_operands || cost.work.flops <= 0) return;
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

// Charges a priced op to the device's current stream.
void launch(Runtime& rt, const Price& p, int label, c10::DeviceIndex device, const std::string& name) {
  note_fp32_matmul(rt, p, label);
  const sim::OpCost& cost = p.cost;
  int stream = static_cast<int>(current_stream(device).id());
  rt.timeline.launch_op(device, stream, cost.launch_overhead, cost.device_time, label, cost.work.flops,
                        cost.work.bytes + cost.work.gathered_bytes, cost.guessed);
  if (cost.guessed) rt.note_guessed(device, name);
}

// How many prices of one operator a thread remembers before it starts
// afresh. A training step calls one operator on many shapes (add_ once per
// parameter, addmm once per layer, mm twice per layer in backward), in the
// same order every step: every one of them is kept, looked up by its shapes.
// The bound only keeps a script that makes new shapes all the time (a
// growing sequence length) from growing the table without end.
constexpr size_t kRememberedPrices = 1024;

// One operator, as this thread prices it: its name and formula, looked up
// once per model and formula table, and its prices by the shapes they stand
// for (see ShapeWords).
struct PricedOp {
  std::string name;
  sim::OpCostModel::FormulaRef formula;
  // set_platform makes a new model (the old one is never freed, so its address is not reused)
  const sim::OpCostModel* model = nullptr;
  uint64_t generation = ~uint64_t{0};
  int label = -1;  // the operator's name on the timeline's spans
  std::unordered_map<std::vector<int64_t>, Price, ShapeWords::Hash> remembered;
  // The entry of `remembered` charged last (a node stays where it is until
  // clear()): a call on the same shapes as the one before compares its words
  // with that entry's key and is not hashed.
  const std::vector<int64_t>* last_words = nullptr;
  Price* last_price = nullptr;

  void forget() {
    remembered.clear();
    last_words = nullptr;
    last_price = nullptr;
  }
};

// This thread's pricing state: no lock on the hot path.
struct ThreadPricing {
  // Keyed by the operator's schema, which lives as long as the operator is registered.
  std::unordered_map<const void*, PricedOp> ops;
  // The operator priced last and its entry (a map's entries stay where they
  // are as it grows): an op called again skips the lookup.
  const void* last_key = nullptr;
  PricedOp* last_op = nullptr;
  sim::OpCall call;            // reused, so steady state allocates nothing
  std::vector<int64_t> words;  // the call's shapes, likewise
  Price unremembered;          // the price of a call a registered formula priced

  PricedOp& op(const void* key) {
    if (key != last_key) {
      last_op = &ops[key];
      last_key = key;
    }
    return *last_op;
  }
};

ThreadPricing& thread_pricing() {
  thread_local ThreadPricing state;
  return state;
}

// A remembered price stands for the call if the setting it was priced under
// still holds: a matmul-class op reads the matmul setting again, a
// convolution the convolution setting; no other op depends on either.
bool still_holds(const Price& p) {
  switch (p.cost.work.op_class) {
    case sim::OpClass::kMatmul:
      return read_fp32_matmul_precision() == p.precision.matmul;
    case sim::OpClass::kConvolution:
      return read_fp32_convolution_precision() == p.precision.convolution;
    default:
      return true;
  }
}

}  // namespace

int64_t priced_ops() { return g_priced_ops.load(std::memory_order_relaxed); }

int64_t formula_runs() { return g_formula_runs.load(std::memory_order_relaxed); }

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

void charge_op(const c10::OperatorHandle& op, c10::DeviceIndex device, c10::ArrayRef<at::Tensor> inputs,
               c10::ArrayRef<at::Tensor> outputs, c10::ArrayRef<int64_t> int_args) {
  g_priced_ops.fetch_add(1, std::memory_order_relaxed);
  Runtime& rt = runtime();
  ThreadPricing& state = thread_pricing();
  PricedOp& p = state.op(&op.schema());
  const uint64_t generation = rt.cost->generation();
  if (p.generation != generation || p.model != rt.cost.get()) {
    const auto& schema = op.schema();
    p.name = schema.name() + (schema.overload_name().empty() ? "" : "." + schema.overload_name());
    p.formula = rt.cost->resolve(p.name);
    p.generation = generation;
    p.model = rt.cost.get();
    p.label = rt.timeline.label(p.name);
    p.forget();
  }
  // A registered formula may read anything (a Python function): priced afresh on every call.
  const bool builtin = !p.formula || p.formula->builtin;
  const Price* charged = nullptr;
  auto it = p.remembered.end();
  if (builtin) {
    ShapeWords::of(inputs, outputs, int_args, state.words);
    if (p.last_words && *p.last_words == state.words && still_holds(*p.last_price)) {
      launch(rt, *p.last_price, p.label, device, p.name);
      return;
    }
    it = p.remembered.find(state.words);
    if (it != p.remembered.end() && still_holds(it->second)) charged = &it->second;
  }
  if (!charged) {
    sim::OpCall& call = state.call;
    call.name = p.name;
    call.int_args.assign(int_args.begin(), int_args.end());
    describe(inputs, call.inputs);
    describe(outputs, call.outputs);
    Price priced = price(rt, call, p.formula);  // remembered only once priced: a formula's error leaves nothing behind
    g_formula_runs.fetch_add(1, std::memory_order_relaxed);
    if (!builtin) {
      state.unremembered = std::move(priced);
      charged = &state.unremembered;
    } else if (it != p.remembered.end()) {
      it->second = std::move(priced);  // the precision settings changed since
    } else {
      if (p.remembered.size() >= kRememberedPrices) p.forget();
      it = p.remembered.emplace(state.words, std::move(priced)).first;
    }
  }
  if (builtin) {
    p.last_words = &it->first;
    p.last_price = &it->second;
    charged = p.last_price;
  }
  launch(rt, *charged, p.label, device, p.name);
}

void charge_op(const std::string& op_name, c10::DeviceIndex device, c10::ArrayRef<at::Tensor> inputs,
               c10::ArrayRef<at::Tensor> outputs) {
  g_priced_ops.fetch_add(1, std::memory_order_relaxed);
  Runtime& rt = runtime();
  sim::OpCall& call = thread_pricing().call;
  call.name = op_name;
  call.int_args.clear();
  describe(inputs, call.inputs);
  describe(outputs, call.outputs);
  const Price priced = price(rt, call, rt.cost->resolve(op_name));
  g_formula_runs.fetch_add(1, std::memory_order_relaxed);
  launch(rt, priced, rt.timeline.label(op_name), device, op_name);
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
