#include "op_cost.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <stdexcept>

namespace zion::sim {

namespace {

constexpr const char* kOpClassNames[kNumOpClasses] = {
    "matmul", "convolution", "elementwise", "reduction", "embedding_bag", "other"};

std::string format_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

void require_positive(double value, const std::string& unit, const char* field) {
  if (!(value > 0) || !std::isfinite(value)) {
    throw std::invalid_argument(unit + "." + field + " must be a positive number for the op cost model (got " +
                                format_number(value) + ")");
  }
}

void require_count(double value, std::string_view op, const char* field) {
  if (std::isnan(value) || value < 0 || std::isinf(value)) {
    throw std::invalid_argument("op cost formula for " + std::string(op) + " returned " +
                                (std::isnan(value) ? "NaN" : value < 0 ? "negative" : "infinite") + " " + field +
                                " (" + format_number(value) + ")");
  }
}

// Unknown ops: priced like an elementwise kernel, which is what most
// unlisted ATen ops are (one pass over their tensors).
OpWork default_guess(const OpCall& call) {
  OpWork work;
  work.op_class = OpClass::kOther;
  for (const TensorDesc& t : call.inputs) work.bytes += t.bytes();
  for (const TensorDesc& t : call.outputs) {
    work.bytes += t.bytes();
    work.flops += static_cast<double>(t.numel());
  }
  return work;
}

}  // namespace

ComputeUnit ComputeUnit::oam(const Platform& platform) {
  ComputeUnit unit;
  unit.name = "oam";
  unit.peak_flops = platform.oam.peak_flops;
  unit.memory_bandwidth = platform.oam.hbm_bandwidth;
  unit.efficiency = platform.oam.efficiency;
  unit.launch_overhead = platform.oam.launch_overhead;
  return unit;
}

ComputeUnit ComputeUnit::socket(const Platform& platform) {
  ComputeUnit unit;
  unit.name = "socket";
  unit.peak_flops = platform.socket.peak_flops;
  unit.memory_bandwidth = platform.socket.ddr_bandwidth;
  unit.efficiency = EfficiencySpec{};  // 1.0 each: see op_cost.h
  unit.efficiency.embedding_random_access = platform.socket.ddr_random_access_efficiency;
  unit.launch_overhead = 0;
  return unit;
}

int64_t TensorDesc::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

const char* op_class_name(OpClass c) { return kOpClassNames[static_cast<int>(c)]; }

std::optional<OpClass> parse_op_class(std::string_view name) {
  for (int i = 0; i < kNumOpClasses; ++i) {
    if (name == kOpClassNames[i]) return static_cast<OpClass>(i);
  }
  return std::nullopt;
}

double class_efficiency(const EfficiencySpec& efficiency, OpClass c) {
  switch (c) {
    case OpClass::kMatmul: return efficiency.matmul;
    case OpClass::kConvolution: return efficiency.convolution;
    case OpClass::kReduction: return efficiency.reduction;
    case OpClass::kElementwise:
    case OpClass::kEmbeddingBag:
    case OpClass::kOther: return efficiency.elementwise;
  }
  return efficiency.elementwise;
}

DType compute_dtype(const OpCall& call) {
  for (const auto* list : {&call.inputs, &call.outputs}) {
    for (const TensorDesc& t : *list) {
      if (t.is_floating_point()) return t.dtype;
    }
  }
  for (const auto* list : {&call.inputs, &call.outputs}) {
    if (!list->empty()) return list->front().element_size == 1 ? DType::kInt8 : DType::kFp32;
  }
  return DType::kFp32;
}

DType compute_dtype(const OpCall& call, OpClass op_class) {
  const DType dtype = compute_dtype(call);
  if (dtype != DType::kFp32) return dtype;
  // Integer operands (int64 matmuls) come back as fp32 too; TF32 is for floats.
  bool floating = false;
  for (const auto* list : {&call.inputs, &call.outputs}) {
    for (const TensorDesc& t : *list) floating = floating || t.is_floating_point();
  }
  if (!floating) return dtype;
  if (op_class == OpClass::kMatmul) return call.fp32_matmul;
  if (op_class == OpClass::kConvolution) return call.fp32_convolution;
  return dtype;
}

OpCostModel::OpCostModel(ComputeUnit unit) : unit_(std::move(unit)) {
  require_positive(unit_.peak_flops[static_cast<int>(DType::kFp32)], unit_.name, "peak_flops.fp32");
  require_positive(unit_.memory_bandwidth, unit_.name, "memory_bandwidth");
  require_positive(unit_.efficiency.matmul, unit_.name, "efficiency.matmul");
  require_positive(unit_.efficiency.convolution, unit_.name, "efficiency.convolution");
  require_positive(unit_.efficiency.elementwise, unit_.name, "efficiency.elementwise");
  require_positive(unit_.efficiency.reduction, unit_.name, "efficiency.reduction");
  require_positive(unit_.efficiency.embedding_random_access, unit_.name, "efficiency.embedding_random_access");
  for (auto& [name, work] : builtin_op_formulas()) {
    table_[name] = std::make_shared<const Formula>(Formula{name, std::move(work), true});
  }
}

OpCostModel::FormulaRef OpCostModel::find_locked(std::string_view name) const {
  auto it = table_.find(name);
  return it == table_.end() ? nullptr : it->second;
}

OpCostModel::FormulaRef OpCostModel::resolve(std::string_view name) const {
  std::shared_lock lock(mutex_);
  if (FormulaRef f = find_locked(name)) return f;
  // The overload follows the first '.' after the namespace ("aten::add.Tensor").
  const size_t ns = name.find("::");
  const size_t dot = name.find('.', ns == std::string_view::npos ? 0 : ns + 2);
  const std::string_view base = name.substr(0, dot);
  if (dot != std::string_view::npos) {
    if (FormulaRef f = find_locked(base)) return f;
  }
  // In-place ops do the work of their functional form: read self, write self.
  if (base.size() > 1 && base.back() == '_') return find_locked(base.substr(0, base.size() - 1));
  return nullptr;
}

void OpCostModel::register_formula(const std::string& name, WorkFormula formula) {
  if (name.empty()) throw std::invalid_argument("register_formula: the op name is empty");
  if (!formula) throw std::invalid_argument("register_formula: the formula for " + name + " is empty");
  auto entry = std::make_shared<const Formula>(Formula{name, std::move(formula)});
  std::unique_lock lock(mutex_);
  table_[name] = std::move(entry);
  ++generation_;
}

std::vector<std::string> OpCostModel::formula_names() const {
  std::shared_lock lock(mutex_);
  std::vector<std::string> names;
  names.reserve(table_.size());
  for (const auto& entry : table_) names.push_back(entry.first);
  return names;
}

OpWork OpCostModel::work(const OpCall& call, const FormulaRef& formula) const {
  // The formula runs without the table lock: it may be slow (Python) and may
  // itself look at the model.
  return formula ? formula->work(call) : default_guess(call);
}

OpCost OpCostModel::cost(const OpCall& call, const FormulaRef& formula) const {
  const OpWork work = this->work(call, formula);
  OpCost cost = price(work, compute_dtype(call, work.op_class), call.name);
  cost.guessed = formula == nullptr;
  cost.formula = formula ? formula->name : kDefaultFormula;
  return cost;
}

OpCost OpCostModel::price(const OpWork& work, DType dtype, std::string_view op) const {
  require_count(work.flops, op, "flops");
  require_count(work.bytes, op, "bytes");
  require_count(work.gathered_bytes, op, "gathered_bytes");
  const int kind = static_cast<int>(work.op_class);
  if (kind < 0 || kind >= kNumOpClasses) {
    throw std::invalid_argument("op cost formula for " + std::string(op) + " returned an unknown op_class");
  }

  // A unit without units for a dtype (a socket has no TF32 or FP16 FMA) runs
  // it at its fp32 rate; the constructor checked that the fp32 peak is set.
  DType priced = dtype;
  double peak = unit_.peak_flops[static_cast<int>(dtype)];
  if (!(peak > 0)) {
    priced = DType::kFp32;
    peak = unit_.peak_flops[static_cast<int>(DType::kFp32)];
  }
  const double efficiency = class_efficiency(unit_.efficiency, work.op_class);

  OpCost cost;
  cost.work = work;
  cost.requested_dtype = dtype;
  cost.priced_dtype = priced;
  cost.compute_time = work.flops / (peak * efficiency);
  cost.memory_time = work.bytes / (unit_.memory_bandwidth * efficiency) +
                     work.gathered_bytes / (unit_.memory_bandwidth * unit_.efficiency.embedding_random_access);
  cost.device_time = std::max(cost.compute_time, cost.memory_time);
  const bool launches_kernel = work.flops > 0 || work.bytes > 0 || work.gathered_bytes > 0;
  cost.launch_overhead = launches_kernel ? unit_.launch_overhead : 0;
  return cost;
}

}  // namespace zion::sim
