#pragma once
// Op cost model: how long one operator takes on one compute unit (an OAM or a
// CPU socket), from the operator's name and the shapes of its tensors.
//
// The model is a roofline (Williams, Waterman, Patterson, "Roofline: an
// insightful visual performance model", CACM 2009):
//   compute_time = flops / (peak_flops[dtype] * efficiency[class])
//   memory_time  = bytes / (memory_bandwidth * efficiency[class])
//                + gathered_bytes / (memory_bandwidth * embedding_random_access)
//   device_time  = max(compute_time, memory_time)
// Random row gathers (embedding bags) are priced apart because streaming
// bandwidth overstates them by several times; the preset's
// embedding_random_access efficiency says by how much.
//
// FLOP and byte counts come from one table of work formulas, keyed by ATen
// schema name (op_formulas.cpp). Python may override or extend it.
//
// Contract for callers building an OpCall from an ATen operator:
//   - inputs: the tensor arguments in schema order (tensor lists flattened in
//     place), except `out=` arguments; an optional tensor that is None is left
//     out (formulas only ever omit trailing optionals);
//   - outputs: every tensor the op writes, each once: its returned tensors and
//     its mutable arguments (self of add_, out of add.out);
//   - copies between two devices or between host and device are not ops: the
//     link model prices them.

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dtype.h"
#include "platform.h"
#include "units.h"

namespace zion::sim {

// What the roofline needs to know about the unit an op runs on.
struct ComputeUnit {
  PeakFlops peak_flops{};
  BytesPerSecond memory_bandwidth = 0;
  EfficiencySpec efficiency;
  Seconds launch_overhead = 0;
  std::string name = "compute unit";  // "oam" or "socket"; used in error messages

  // An OAM: HBM bandwidth, the preset's efficiencies and launch overhead.
  static ComputeUnit oam(const Platform& platform);
  // A CPU socket: DDR bandwidth, no launch overhead (a CPU kernel is a function
  // call), ddr_random_access_efficiency for gathers. The preset has no CPU
  // matmul/conv/elementwise/reduction efficiencies, and borrowing the OAM's
  // would price a CPU with accelerator numbers, so they are 1.0: a socket's
  // peak_flops and ddr_bandwidth in the preset are taken as achievable rates.
  static ComputeUnit socket(const Platform& platform);
};

// Shape and type of one tensor argument.
//
// dtype names the peak-FLOP/s class, not the storage type: every integer or
// bool tensor is DType::kInt8 (the only integer class a preset prices) and
// element_size gives its storage width (8 for int64 indices).
//
// A sparse COO tensor is described by what it stores: sizes are its values'
// ([nnz, dense dims...]), and sparse_index_elements counts its int64 indices
// (sparse_dim x nnz), which bytes() adds. A dense tensor has -1 there.
struct TensorDesc {
  std::vector<int64_t> sizes;
  DType dtype = DType::kFp32;
  int element_size = 4;
  int64_t sparse_index_elements = -1;

  int64_t numel() const;
  bool is_sparse() const { return sparse_index_elements >= 0; }
  double bytes() const {
    return static_cast<double>(numel()) * element_size +
           (is_sparse() ? static_cast<double>(sparse_index_elements) * 8 : 0.0);
  }
  bool is_floating_point() const { return dtype != DType::kInt8; }
};

struct OpCall {
  // ATen schema name with optional overload: "aten::mm", "aten::add.Tensor".
  std::string name;
  std::vector<TensorDesc> inputs;
  std::vector<TensorDesc> outputs;
  // Non-tensor arguments a formula cannot derive from shapes; each formula in
  // op_formulas.cpp documents the ones it reads. Missing entries take defaults.
  std::vector<int64_t> int_args;
  // The precision the script allows float32 matmul-class work (op class
  // matmul) and convolutions to run at: kFp32 (IEEE), kTf32 or kBf16. Only
  // an op whose compute dtype is fp32 is affected; its numerics are not.
  DType fp32_matmul = DType::kFp32;
  DType fp32_convolution = DType::kFp32;
};

enum class OpClass { kMatmul = 0, kConvolution, kElementwise, kReduction, kEmbeddingBag, kOther };
inline constexpr int kNumOpClasses = 6;
const char* op_class_name(OpClass c);
std::optional<OpClass> parse_op_class(std::string_view name);

// Work one op does. bytes stream through memory; gathered_bytes are read by
// random row gathers and priced at random-access efficiency.
struct OpWork {
  double flops = 0;
  double bytes = 0;
  OpClass op_class = OpClass::kOther;
  double gathered_bytes = 0;
};

using WorkFormula = std::function<OpWork(const OpCall&)>;

struct OpCost {
  OpWork work;
  Seconds compute_time = 0;
  Seconds memory_time = 0;
  Seconds device_time = 0;  // max(compute_time, memory_time): the stream's busy time
  // Host time to issue the op; the device layer charges it to the host clock.
  // Zero for ops with no work (views, metadata): they launch no kernel.
  Seconds launch_overhead = 0;
  bool guessed = false;  // no formula matched; work is the default guess
  std::string formula;   // table key that priced the op, or kDefaultFormula
  // The dtype whose peak was asked for (after the fp32 matmul/convolution
  // precision of the call) and the one that priced the FLOPs: they differ
  // when the unit has no peak for the asked dtype (no TF32 units), which
  // falls back to the fp32 peak.
  DType requested_dtype = DType::kFp32;
  DType priced_dtype = DType::kFp32;
};

inline constexpr const char* kDefaultFormula = "default";

// Fraction of peak an op class reaches on a unit. Embedding bags and ops
// outside the named classes stream like elementwise kernels.
double class_efficiency(const EfficiencySpec& efficiency, OpClass c);

// The dtype whose peak prices an op's FLOPs: the first floating input, else the
// first floating output; with integer tensors only, int8 when the first one is
// one byte wide (int8/uint8/bool) and fp32 otherwise (int64 arithmetic gets no
// integer tensor units on any preset); fp32 with no tensors at all.
DType compute_dtype(const OpCall& call);
// compute_dtype, with an fp32 matmul (op class matmul) or convolution moved to
// the precision the call allows (OpCall::fp32_matmul, fp32_convolution).
DType compute_dtype(const OpCall& call, OpClass op_class);

// The built-in formula table (op_formulas.cpp): ATen name -> work.
std::vector<std::pair<std::string, WorkFormula>> builtin_op_formulas();

class OpCostModel {
 public:
  // A table entry; shared so that a cached entry survives re-registration.
  struct Formula {
    std::string name;
    WorkFormula work;
    // One of the table's own (op_formulas*.cpp), which read only shapes,
    // dtypes and int_args; a registered one may read any field of the call.
    bool builtin = false;
  };
  using FormulaRef = std::shared_ptr<const Formula>;  // null: default guess

  // Throws std::invalid_argument naming the unit's field if fp32 peak, memory
  // bandwidth or an efficiency is not a positive finite number.
  explicit OpCostModel(ComputeUnit unit);

  const ComputeUnit& unit() const { return unit_; }

  OpCost cost(const OpCall& call) const { return cost(call, resolve(call.name)); }

  // Lookup as cost() does it: the exact name, then the name without overload
  // ("aten::add.Tensor" -> "aten::add"), then the functional form of an
  // in-place op ("aten::relu_" -> "aten::relu"). The device layer may cache the
  // result per operator while generation() is unchanged.
  FormulaRef resolve(std::string_view name) const;
  OpCost cost(const OpCall& call, const FormulaRef& formula) const;
  // The first half of cost(): the work `formula` counts (the default guess
  // when null). cost() is price(work(call, f), compute_dtype(call,
  // work.op_class), call.name) with guessed and formula filled in; a caller
  // may fill fields of the call that only the second half reads in between.
  OpWork work(const OpCall& call, const FormulaRef& formula) const;
  // Read without the table's lock: the device layer asks on every op.
  uint64_t generation() const { return generation_.load(std::memory_order_acquire); }

  // Adds or replaces the formula for an exact name (with or without overload).
  // Safe against concurrent cost() calls.
  void register_formula(const std::string& name, WorkFormula formula);
  bool has_formula(std::string_view name) const { return resolve(name) != nullptr; }
  std::vector<std::string> formula_names() const;  // sorted

  // Times for work already counted, FLOPs at `dtype`'s peak (the fp32 peak
  // where the unit has none for `dtype`); throws std::invalid_argument naming
  // `op` if a count is negative or not finite.
  OpCost price(const OpWork& work, DType dtype, std::string_view op) const;

 private:
  FormulaRef find_locked(std::string_view name) const;

  ComputeUnit unit_;
  mutable std::shared_mutex mutex_;
  std::map<std::string, FormulaRef, std::less<>> table_;
  std::atomic<uint64_t> generation_{0};  // raised under the unique lock, after the table changed
};

}  // namespace zion::sim
