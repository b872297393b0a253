// The one boxed kernel that runs every op zion has no native kernel for: the
// CPU kernel runs on zero-copy CPU aliases of the zion arguments, and its
// results come back as zion tensors (views stay views of the same storage,
// fresh buffers are adopted without copying). Then the op is priced.
//
// Every call passes here, so the per-call work is kept to the arguments
// themselves: what the schema says about an operator (which arguments are
// written, which are generators, whether CPU tensors may ride along) is read
// once per operator and cached; small on-stack vectors hold the rest.

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <iterator>
#include <string>
#include <unordered_map>
#include <vector>

#include "device/runtime/allocator.h"
#include "device/runtime/generator.h"
#include "device/aten/op_pricing.h"
#include "device/runtime/runtime.h"
#include "device/aten/tensor_alias.h"
#include "device/aten/timing.h"

namespace zion::device {
namespace {

// What the schema of an operator tells the fallback, read on its first call.
struct OpFacts {
  // CPU tensors of any size may stand beside zion tensors, as CUDA allows
  // for index tensors; elsewhere only 0-dim CPU tensors (scalars) may.
  bool accepts_cpu_tensors = false;
  c10::SmallVector<int, 2> generator_args;   // Generator? arguments: become the device's CPU generator
  c10::SmallVector<int, 2> written_args;     // Tensor(a!) arguments: may be resized by the kernel
  int pin_memory_arg = -1;                   // pinning means nothing for a zion result
  // A non-ATen op without an autograd kernel (fbgemm's dense TBE lookup):
  // its CPU kernel may record an autograd graph itself. Such a graph would
  // stay on the CPU aliases and the zion result would get no gradient, so
  // its aliases carry requires_grad and a result with history is refused.
  bool may_record_autograd = false;
  bool describes_undefined = false;  // a non-ATen op: see Call::convert_argument
};

// What an undefined tensor argument is priced as: no elements.
const at::Tensor& empty_argument() {
  static const at::Tensor empty = at::empty({0});
  return empty;
}

bool is_optional_of(const c10::TypePtr& type, c10::TypeKind kind) {
  return type->kind() == c10::TypeKind::OptionalType &&
         type->castRaw<c10::OptionalType>()->getElementType()->kind() == kind;
}

bool has_autograd_kernel(const c10::OperatorHandle& op) {
  for (c10::DispatchKey key : {c10::DispatchKey::Autograd, c10::DispatchKey::AutogradCPU,
                               c10::DispatchKey::AutogradPrivateUse1, c10::DispatchKey::CompositeImplicitAutograd}) {
    if (op.hasKernelForDispatchKey(key)) return true;
  }
  return false;
}

OpFacts read_facts(const c10::OperatorHandle& op) {
  const c10::FunctionSchema& schema = op.schema();
  OpFacts f;
  const std::string& name = schema.name();
  f.accepts_cpu_tensors = name == "aten::index" || name == "aten::index_put_" || name == "aten::_index_put_impl_" ||
                          name == "aten::index_put" || name == "aten::_unsafe_index" ||
                          name == "aten::_unsafe_index_put";
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    if (is_optional_of(args[i].type(), c10::TypeKind::GeneratorType)) f.generator_args.push_back(static_cast<int>(i));
    const auto* info = args[i].alias_info();
    if (info && info->isWrite() && args[i].type()->kind() == c10::TypeKind::TensorType) {
      f.written_args.push_back(static_cast<int>(i));
    }
    if (args[i].name() == "pin_memory" && is_optional_of(args[i].type(), c10::TypeKind::BoolType)) {
      f.pin_memory_arg = static_cast<int>(i);
    }
  }
  const bool aten = name.rfind("aten::", 0) == 0;
  f.may_record_autograd = !aten && !has_autograd_kernel(op);
  f.describes_undefined = !aten;
  return f;
}

const OpFacts& facts_of(const c10::OperatorHandle& op) {
  // Per thread, so no lock; keyed by the schema, which lives as long as the operator.
  thread_local std::unordered_map<const c10::FunctionSchema*, OpFacts> cache;
  const c10::FunctionSchema* key = &op.schema();
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, read_facts(op)).first;
  return it->second;
}

[[noreturn]] void mixed_devices(const c10::OperatorHandle& op, c10::DeviceIndex device, const at::Tensor& other) {
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ",
              device >= 0 ? "zion:" + std::to_string(device) : std::string("zion"), " and ", other.device(),
              "! (when checking arguments for ", op.schema().name(), ")");
}

struct Call {
  const c10::OperatorHandle& op;
  const OpFacts& facts;
  c10::DeviceIndex device = -1;
  AliasSet aliases;
  c10::SmallVector<std::pair<c10::TensorImpl*, at::Tensor>, 4> zion_of_alias;  // alias -> the argument it stands for
  c10::SmallVector<c10::StorageImpl*, 2> cpu_storages;                          // of CPU tensors passed through
  c10::SmallVector<at::Tensor, 4> inputs;                                       // for pricing
  bool watch_autograd = false;  // an alias carries requires_grad (OpFacts::may_record_autograd)

  at::Tensor alias(const at::Tensor& t) {
    if (!t.defined()) return t;
    if (t.device().is_privateuseone()) {
      if (device < 0) {
        device = t.device().index();
      } else if (t.device().index() != device) {
        mixed_devices(op, device, t);
      }
      at::Tensor a = aliases.alias(t);
      if (facts.may_record_autograd && t.requires_grad() && c10::GradMode::is_enabled()) {
        a.set_requires_grad(true);
        watch_autograd = true;
      }
      zion_of_alias.emplace_back(a.unsafeGetTensorImpl(), t);
      inputs.push_back(a);
      return a;
    }
    if (t.device().is_cpu()) {
      // A CPU scalar (0-dim) rides along, as with CUDA; so do index tensors.
      if (t.dim() > 0 && !facts.accepts_cpu_tensors) mixed_devices(op, device, t);
      if (t.has_storage()) cpu_storages.push_back(t.storage().unsafeGetStorageImpl());
      return t;
    }
    mixed_devices(op, device, t);
  }

  c10::IValue convert_argument(c10::IValue&& v) {
    if (v.isTensor()) {
      // A non-ATen op's undefined Tensor argument (fbgemm passes them) is
      // priced as an empty tensor, so its formula finds the others where
      // the schema puts them (op_formulas_fbgemm.cpp).
      if (!v.toTensor().defined() && facts.describes_undefined) inputs.push_back(empty_argument());
      return alias(v.toTensor());
    }
    if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      auto list = v.toTensorList();
      out.reserve(list.size());
      for (const at::Tensor& t : list) out.push_back(alias(t));
      return out;
    }
    if (v.isList()) {
      auto list = v.toList();
      bool has_tensors = false;
      for (const c10::IValue& e : list) has_tensors = has_tensors || e.isTensor();
      if (!has_tensors) return std::move(v);
      c10::List<std::optional<at::Tensor>> out;
      out.reserve(list.size());
      for (const c10::IValue& e : list) {
        out.push_back(e.isTensor() ? std::optional<at::Tensor>(alias(e.toTensor())) : std::nullopt);
      }
      return out;
    }
    if (v.isDevice() && v.toDevice().is_privateuseone()) {
      if (device < 0 && v.toDevice().has_index()) device = v.toDevice().index();
      return c10::Device(c10::DeviceType::CPU);
    }
    return std::move(v);
  }

  at::Tensor result(const at::Tensor& t) {
    if (!t.defined()) return t;
    for (auto& [alias, zion] : zion_of_alias) {
      if (alias == t.unsafeGetTensorImpl()) {
        aliases.write_back(t, zion);  // in place or out=: the argument itself, maybe resized
        return zion;
      }
    }
    if (t.device().is_cpu() && t.has_storage()) {
      for (c10::StorageImpl* s : cpu_storages) {
        // The kernel returned (a view of) a CPU argument: its bytes stay the caller's.
        if (s == t.storage().unsafeGetStorageImpl()) return aliases.to_zion(t.clone());
      }
    }
    TORCH_CHECK(!watch_autograd || !t.requires_grad(), "zion: the CPU kernel of ", op.schema().name(),
                " recorded an autograd graph on its result: the op has no autograd kernel, its autograd lives inside "
                "its CPU kernel. zion runs that kernel on CPU aliases, so the graph would stay on the CPU and the zion "
                "result would get no gradient. Register an AutogradPrivateUse1 kernel for the op (zion_emu.torchrec "
                "does for fbgemm's embedding lookups; import torchrec or fbgemm_gpu after zion_emu).");
    return aliases.to_zion(t);
  }

  c10::IValue convert_result(c10::IValue&& v) {
    if (v.isTensor()) return result(v.toTensor());
    if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      auto list = v.toTensorList();
      out.reserve(list.size());
      for (const at::Tensor& t : list) out.push_back(result(t));
      return out;
    }
    return std::move(v);
  }
};

// Makes `device` current for the CPU kernel (nested zion work lands there)
// and puts the previous one back, on errors too.
class DeviceScope {
 public:
  explicit DeviceScope(c10::DeviceIndex device) : previous_(current_device()) {
    if (device != previous_) set_current_device(device);
  }
  ~DeviceScope() {
    if (current_device() != previous_) set_current_device(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  c10::DeviceIndex previous_;
};

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (has_storage_less_argument(op, stack)) {
    timing_fallback(op, stack);
    return;
  }
  const OpFacts& facts = facts_of(op);
  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  Call call{op, facts};
  auto args = stack->end() - static_cast<std::ptrdiff_t>(num_args);
  for (size_t i = 0; i < num_args; ++i) {
    c10::IValue& v = args[static_cast<std::ptrdiff_t>(i)];
    v = call.convert_argument(std::move(v));
  }
  if (call.device < 0) call.device = current_device();
  call.aliases.set_device(call.device);
  for (int i : facts.generator_args) {
    c10::IValue& v = args[i];
    std::optional<at::Generator> gen = v.isNone() ? std::nullopt : std::optional<at::Generator>(v.toGenerator());
    v = cpu_generator_for(gen, call.device);
  }
  if (facts.pin_memory_arg >= 0) args[facts.pin_memory_arg] = c10::IValue();
  // Mutated arguments (aliases), whose new metadata goes back to the zion tensors.
  c10::SmallVector<at::Tensor, 2> written;
  for (int i : facts.written_args) {
    if (args[i].isTensor()) written.push_back(args[i].toTensor());
  }

  {
    DeviceScope scope(call.device);
    try {
      KernelHostMemory::Scope kernel_memory;
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
    } catch (const c10::NotImplementedError& e) {
      // The CPU has no kernel for it (a CUDA-only op such as flash attention):
      // say so in zion's words rather than "could not run ... on 'CPU'".
      if (std::string(e.what()).find("from the 'CPU' backend") == std::string::npos) throw;
      TORCH_CHECK_NOT_IMPLEMENTED(false, "zion: operator ", schema.operator_name(),
                                  " is not supported on zion: zion runs each op through its CPU kernel, and this op "
                                  "has none (it exists only for other backends, such as CUDA). Use an op with a CPU "
                                  "kernel, or move the tensors to a device that has this one.");
    }

    call.aliases.commit();
    for (const at::Tensor& alias : written) {
      for (auto& [a, zion] : call.zion_of_alias) {
        if (a == alias.unsafeGetTensorImpl()) call.aliases.write_back(alias, zion);
      }
    }
    const size_t num_returns = schema.returns().size();
    for (auto it = stack->end() - static_cast<std::ptrdiff_t>(num_returns); it != stack->end(); ++it) {
      *it = call.convert_result(std::move(*it));
    }
  }

  // The pricing takes std::vectors: per-thread ones, reused, so steady state allocates nothing.
  thread_local std::vector<at::Tensor> inputs, outputs;
  inputs.assign(std::make_move_iterator(call.inputs.begin()), std::make_move_iterator(call.inputs.end()));
  for (auto it = stack->end() - static_cast<std::ptrdiff_t>(schema.returns().size()); it != stack->end(); ++it) {
    if (it->isTensor()) outputs.push_back(it->toTensor());
  }
  charge_op(op, call.device, inputs, outputs);
  inputs.clear();
  outputs.clear();
}

// PyTorch gives many ops a generic kernel (CompositeExplicitAutograd, the
// NonFunctional one that structured ops get, or a CompositeImplicitAutograd
// decomposition) which a backend without its own kernel uses before any
// backend fallback: `add` becomes `empty` + `add.out`, `native_layer_norm` and
// `mish_backward` chains of smaller ops. Where CPU has its own kernel, zion
// runs that one through the fallback instead, so its dispatch mirrors CPU's:
// results are CPU's bit for bit, and an op is one call, not several. Ops with
// a native zion kernel (kernels.cpp, linked before this file) are left alone.
class CpuKernelsFirst {
 public:
  CpuKernelsFirst() : library_(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__) {
    auto& dispatcher = c10::Dispatcher::singleton();
    for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
      if (name.name.rfind("aten::", 0) != 0) continue;
      auto op = dispatcher.findOp(name);
      if (!op || op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1) ||
          !op->hasKernelForDispatchKey(c10::DispatchKey::CPU)) {
        continue;
      }
      if (!op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) &&
          !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional) &&
          !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) {
        continue;
      }
      std::string full = name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
      library_.impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&fallback>());
    }
  }

 private:
  torch::Library library_;
};

}  // namespace

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>()); }

const CpuKernelsFirst cpu_kernels_first;

}  // namespace zion::device
