// The one boxed kernel that runs every op zion has no native kernel for: the
// CPU kernel runs on zero-copy CPU aliases of the zion arguments, and its
// results come back as zion tensors (views stay views of the same storage,
// fresh buffers are adopted without copying). Then the op is priced.

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <memory>
#include <unordered_map>

#include "device/generator.h"
#include "device/op_pricing.h"
#include "device/runtime.h"
#include "device/tensor_alias.h"

namespace zion::device {
namespace {

// Ops that take CPU index tensors beside device tensors, as CUDA allows.
bool accepts_cpu_tensors(const c10::OperatorName& name) {
  return name.name == "aten::index" || name.name == "aten::index_put_" || name.name == "aten::_index_put_impl_";
}

struct Call {
  const c10::OperatorHandle& op;
  c10::DeviceIndex device = -1;
  std::unique_ptr<AliasSet> aliases;
  std::unordered_map<c10::TensorImpl*, at::Tensor> zion_of_alias;  // alias -> the argument it stands for
  std::vector<at::Tensor> inputs;                                   // for pricing

  void note_device(const at::Tensor& t) {
    if (device < 0) {
      device = t.device().index();
    } else if (t.device().index() != device) {
      TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, zion:",
                  static_cast<int>(device), " and ", t.device(), "! (when checking arguments for ",
                  op.schema().name(), ")");
    }
  }

  at::Tensor alias(const at::Tensor& t) {
    if (!t.defined()) return t;
    if (t.device().is_privateuseone()) {
      note_device(t);
      if (!aliases) aliases = std::make_unique<AliasSet>(device);
      at::Tensor a = aliases->alias(t);
      zion_of_alias.emplace(a.unsafeGetTensorImpl(), t);
      inputs.push_back(a);
      return a;
    }
    if (t.device().is_cpu() && t.dim() > 0 && !accepts_cpu_tensors(op.schema().operator_name())) {
      TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ",
                  device >= 0 ? "zion:" + std::to_string(device) : std::string("zion"), " and cpu! (when checking arguments for ",
                  op.schema().name(), ")");
    }
    return t;
  }

  c10::IValue convert_argument(const c10::IValue& v) {
    if (v.isTensor()) return alias(v.toTensor());
    if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorList()) out.push_back(alias(t));
      return out;
    }
    if (v.isList()) {
      auto list = v.toList();
      bool has_tensors = false;
      for (const c10::IValue& e : list) has_tensors = has_tensors || e.isTensor();
      if (!has_tensors) return v;
      c10::List<std::optional<at::Tensor>> out;
      for (const c10::IValue& e : list) {
        out.push_back(e.isTensor() ? std::optional<at::Tensor>(alias(e.toTensor())) : std::nullopt);
      }
      return out;
    }
    if (v.isDevice() && v.toDevice().is_privateuseone()) return c10::Device(c10::DeviceType::CPU);
    return v;
  }

  c10::IValue convert_result(const c10::IValue& v) {
    if (v.isTensor()) return result(v.toTensor());
    if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorList()) out.push_back(result(t));
      return out;
    }
    return v;
  }

  at::Tensor result(const at::Tensor& t) {
    if (!t.defined()) return t;
    if (auto it = zion_of_alias.find(t.unsafeGetTensorImpl()); it != zion_of_alias.end()) {
      sync_metadata(t, it->second);  // in place or out=: the argument itself, maybe resized
      return it->second;
    }
    if (!aliases) aliases = std::make_unique<AliasSet>(device);
    return aliases->to_zion(t);
  }
};

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  Call call{op};
  auto args_begin = stack->end() - static_cast<std::ptrdiff_t>(num_args);
  for (size_t i = 0; i < num_args; ++i) {
    c10::IValue& v = *(args_begin + static_cast<std::ptrdiff_t>(i));
    v = call.convert_argument(v);
  }
  if (call.device < 0) call.device = current_device();
  // Generator arguments (and the default one) become the device's CPU generator.
  for (size_t i = 0; i < num_args; ++i) {
    const auto& type = schema.arguments()[i].type();
    if (type->kind() == c10::TypeKind::OptionalType &&
        type->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::GeneratorType) {
      c10::IValue& v = *(args_begin + static_cast<std::ptrdiff_t>(i));
      std::optional<at::Generator> gen = v.isNone() ? std::nullopt : std::optional<at::Generator>(v.toGenerator());
      v = cpu_generator_for(gen, call.device);
    }
  }
  // Mutated arguments, to copy their new metadata back after the call.
  std::vector<std::pair<at::Tensor, at::Tensor>> written;
  for (size_t i = 0; i < num_args; ++i) {
    const auto* info = schema.arguments()[i].alias_info();
    const c10::IValue& v = *(args_begin + static_cast<std::ptrdiff_t>(i));
    if (info && info->isWrite() && v.isTensor()) {
      auto it = call.zion_of_alias.find(v.toTensor().unsafeGetTensorImpl());
      if (it != call.zion_of_alias.end()) written.emplace_back(v.toTensor(), it->second);
    }
  }

  c10::impl::VirtualGuardImpl guard_impl(c10::DeviceType::PrivateUse1);
  c10::Device previous = guard_impl.exchangeDevice(c10::Device(c10::DeviceType::PrivateUse1, call.device));
  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  } catch (...) {
    guard_impl.exchangeDevice(previous);
    throw;
  }

  if (call.aliases) call.aliases->commit();
  for (auto& [alias, original] : written) sync_metadata(alias, original);
  const size_t num_returns = schema.returns().size();
  std::vector<at::Tensor> outputs;
  for (auto it = stack->end() - static_cast<std::ptrdiff_t>(num_returns); it != stack->end(); ++it) {
    *it = call.convert_result(*it);
    if (it->isTensor()) outputs.push_back(it->toTensor());
  }
  guard_impl.exchangeDevice(previous);
  charge_op(schema.name() + (schema.overload_name().empty() ? "" : "." + schema.overload_name()), call.device,
            call.inputs, outputs);
}

}  // namespace

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>()); }

}  // namespace zion::device
