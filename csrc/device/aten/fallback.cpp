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
#include <ATen/Operators.h>
#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/MaybeOwned.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <iterator>
#include <tuple>
#include <type_traits>
#include <string>
#include <vector>

#include "device/runtime/allocator.h"
#include "device/runtime/generator.h"
#include "device/aten/op_pricing.h"
#include "device/runtime/runtime.h"
#include "device/aten/tensor_alias.h"
#include "device/aten/operator_facts.h"
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

const OpFacts& facts_of(const c10::OperatorHandle& op) { return facts_per_operator(op, &read_facts); }

[[noreturn]] void mixed_devices(const c10::OperatorHandle& op, c10::DeviceIndex device, const at::Tensor& other) {
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ",
              device >= 0 ? "zion:" + std::to_string(device) : std::string("zion"), " and ", other.device(),
              "! (when checking arguments for ", op.schema().name(), ")");
}

// A written argument (in place, out=) on the CPU, beside zion tensors in `args`.
[[noreturn]] void refuse_written_cpu_tensor(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                                            const at::Tensor& written) {
  c10::DeviceIndex device = -1;
  for (const c10::IValue& v : args) {
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().device().is_privateuseone()) {
      device = v.toTensor().device().index();
      break;
    }
  }
  mixed_devices(op, device, written);
}

struct Call {
  const c10::OperatorHandle& op;
  const OpFacts& facts;
  c10::DeviceIndex device = -1;
  AliasSet aliases;
  // alias -> the argument it stands for: taken from the boxed stack (owned),
  // or the caller's own argument (borrowed) on the unboxed path.
  c10::SmallVector<std::pair<c10::TensorImpl*, c10::MaybeOwned<at::Tensor>>, 8> zion_of_alias;
  c10::SmallVector<c10::StorageImpl*, 2> cpu_storages;                          // of CPU tensors passed through
  c10::SmallVector<at::Tensor, 8> inputs;                                       // for pricing
  bool watch_autograd = false;  // an alias carries requires_grad (OpFacts::may_record_autograd)
  bool in_indices = false;      // converting a Tensor?[] argument: an index op's indices
  c10::ArrayRef<c10::IValue> all_args;  // the boxed call's arguments, for naming a zion device in an error

  // The zion device of a later argument, when a CPU tensor comes first (an error's message).
  c10::DeviceIndex device_named_later() const {
    for (const c10::IValue& v : all_args) {
      if (v.isTensor() && v.toTensor().defined() && v.toTensor().device().is_privateuseone()) {
        return v.toTensor().device().index();
      }
      if (v.isTensorList()) {
        for (const at::Tensor& t : v.toTensorList()) {
          if (t.defined() && t.device().is_privateuseone()) return t.device().index();
        }
      }
    }
    return -1;
  }

  // The alias of `t`, which the caller keeps alive for the call.
  at::Tensor alias(const at::Tensor& t) { return alias_of(c10::MaybeOwned<at::Tensor>::borrowed(t)); }
  // The alias of `t`, which the call keeps (an argument taken off the stack).
  at::Tensor alias(at::Tensor&& t) { return alias_of(c10::MaybeOwned<at::Tensor>::owned(std::move(t))); }

  at::Tensor alias_of(c10::MaybeOwned<at::Tensor>&& keep) {
    const at::Tensor& t = *keep;  // valid until `keep` moves into zion_of_alias
    if (!t.defined()) return at::Tensor();
    if (t.device().is_privateuseone()) {
      if (device < 0) {
        device = t.device().index();
      } else if (t.device().index() != device) {
        mixed_devices(op, device, t);
      }
      // The same tensor passed twice (self and out=, x.logical_and_(x))
      // gets one alias: the kernel must see one tensor (is_same), as on the
      // CPU, or it resizes an output that is also an input.
      for (const auto& [seen, zion] : zion_of_alias) {
        if (zion->unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
          at::Tensor same(c10::intrusive_ptr<c10::TensorImpl>::reclaim_copy(seen));
          inputs.push_back(same);
          return same;
        }
      }
      at::Tensor a = aliases.alias(t);
      if (facts.may_record_autograd && t.requires_grad() && c10::GradMode::is_enabled()) {
        a.set_requires_grad(true);
        watch_autograd = true;
      }
      zion_of_alias.emplace_back(a.unsafeGetTensorImpl(), std::move(keep));
      inputs.push_back(a);
      return a;
    }
    if (t.device().is_cpu()) {
      // A CPU scalar (0-dim) rides along, as with CUDA; so do index tensors.
      if (t.dim() > 0 && !(facts.accepts_cpu_tensors && in_indices)) {
        mixed_devices(op, device >= 0 ? device : device_named_later(), t);
      }
      if (t.has_storage()) cpu_storages.push_back(t.storage().unsafeGetStorageImpl());
      // Priced where the schema puts it (the formulas read inputs by
      // position); a Python number is a kernel argument, not an input.
      if (!t.unsafeGetTensorImpl()->is_wrapped_number()) inputs.push_back(*keep);
      return *keep;
    }
    mixed_devices(op, device, t);
  }

  c10::IValue convert_argument(c10::IValue&& v) {
    if (v.isTensor()) {
      // A non-ATen op's undefined Tensor argument (fbgemm passes them) is
      // priced as an empty tensor, so its formula finds the others where
      // the schema puts them (op_formulas_fbgemm.cpp).
      if (!v.toTensor().defined() && facts.describes_undefined) inputs.push_back(empty_argument());
      return alias(std::move(v).toTensor());  // moved: no reference taken or dropped
    }
    if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      auto list = v.toTensorList();
      out.reserve(list.size());
      for (const at::Tensor& t : list) out.push_back(alias(at::Tensor(t)));  // owned: the list goes
      return out;
    }
    if (v.isList()) {
      auto list = v.toList();
      bool has_tensors = false;
      for (const c10::IValue& e : list) has_tensors = has_tensors || e.isTensor();
      if (!has_tensors) return std::move(v);
      c10::List<std::optional<at::Tensor>> out;
      out.reserve(list.size());
      in_indices = true;
      for (const c10::IValue& e : list) {
        out.push_back(e.isTensor() ? std::optional<at::Tensor>(alias(at::Tensor(e.toTensor()))) : std::nullopt);
      }
      in_indices = false;
      return out;
    }
    if (v.isDevice() && v.toDevice().is_privateuseone()) {
      if (device < 0 && v.toDevice().has_index()) device = v.toDevice().index();
      return c10::Device(c10::DeviceType::CPU);
    }
    return std::move(v);
  }

  // The argument `alias` stands for, or null.
  const at::Tensor* zion_of(const c10::TensorImpl* alias) {
    for (auto& [a, zion] : zion_of_alias) {
      if (a == alias) return &*zion;
    }
    return nullptr;
  }

  at::Tensor result(at::Tensor&& t) {
    if (!t.defined()) return std::move(t);
    if (const at::Tensor* zion = zion_of(t.unsafeGetTensorImpl())) {
      aliases.write_back(t, *zion);  // in place or out=: the argument itself, maybe resized
      return *zion;
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
    return aliases.to_zion(std::move(t));
  }

  c10::IValue convert_result(c10::IValue&& v) {
    if (v.isTensor()) return result(std::move(v).toTensor());
    if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      auto list = v.toTensorList();
      out.reserve(list.size());
      for (const at::Tensor& t : list) out.push_back(result(at::Tensor(t)));
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

// The tensors an op returns, for pricing: on the stack, nothing allocated for up to four.
using PricedOutputs = c10::SmallVector<at::Tensor, 4>;

void charge_call(const c10::OperatorHandle& op, Call& call, c10::ArrayRef<at::Tensor> outputs) {
  charge_op(op, call.device, call.inputs, outputs);
}

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
  for (int i : facts.written_args) {
    // A CPU scalar may only be read beside zion tensors, as with CUDA: an op
    // does not write a CPU tensor (in place, out=).
    const c10::IValue& v = args[i];
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().device().is_cpu()) {
      refuse_written_cpu_tensor(op, c10::ArrayRef<c10::IValue>(&*args, num_args), v.toTensor());
    }
  }
  call.all_args = c10::ArrayRef<c10::IValue>(&*args, num_args);
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
      refuse_op_without_cpu_kernel(schema.operator_name());
    }

    call.aliases.commit();
    for (const at::Tensor& alias : written) {
      if (const at::Tensor* zion = call.zion_of(alias.unsafeGetTensorImpl())) call.aliases.write_back(alias, *zion);
    }
    const size_t num_returns = schema.returns().size();
    for (auto it = stack->end() - static_cast<std::ptrdiff_t>(num_returns); it != stack->end(); ++it) {
      *it = call.convert_result(std::move(*it));
    }
  }

  PricedOutputs outputs;  // a returned list's tensors too (fbgemm's batch_index_select returns its rows so)
  for (auto it = stack->end() - static_cast<std::ptrdiff_t>(schema.returns().size()); it != stack->end(); ++it) {
    if (it->isTensor()) {
      outputs.push_back(it->toTensor());
    } else if (it->isTensorList()) {
      for (const at::Tensor& t : it->toTensorList()) outputs.push_back(t);
    }
  }
  charge_call(op, call, outputs);
}

// ---- The unboxed path ----
//
// The hottest ops (elementwise arithmetic, matmuls, reductions, embedding
// bags) get the fallback's work without boxing: their arguments are aliased
// straight from the C++ call, the CPU kernel is called unboxed, and no
// argument is copied onto a stack and off it again. (A zion argument put on
// a stack gains a second owner; with a Python object that costs taking the
// GIL twice, once to keep the object alive and once to let it go.) Each
// step is the fallback's own (Call, AliasSet, charge_call), in the same
// order, so results, memory accounting and modeled times are the same; any
// call the fast path does not expect (timing-only mode, an argument that is
// sparse, on another device or a CPU tensor beyond a 0-dim scalar) goes to
// the boxed fallback as before.

constexpr c10::DispatchKeySet kCpuKeys{c10::DispatchKey::CPU};

// How one argument of the C++ signature is handed to the CPU kernel.
template <class T>
struct Arg {  // not a tensor: passed on as it is
  using Held = std::remove_reference_t<T>*;
  static Held hold(Call&, std::remove_reference_t<T>& v) { return &v; }
  static T pass(Held h) { return static_cast<T>(*h); }
};
template <>
struct Arg<const at::Tensor&> {
  using Held = at::Tensor;
  static Held hold(Call& c, const at::Tensor& t) { return c.alias(t); }
  static const at::Tensor& pass(const Held& h) { return h; }
};
template <>
struct Arg<at::Tensor&> {  // in place or out=: written, so never a CPU scalar (see fallback)
  using Held = at::Tensor;
  static Held hold(Call& c, at::Tensor& t) {
    if (t.defined() && t.device().is_cpu()) mixed_devices(c.op, c.device, t);
    return c.alias(static_cast<const at::Tensor&>(t));
  }
  static at::Tensor& pass(Held& h) { return h; }
};
template <>
struct Arg<const std::optional<at::Tensor>&> {
  using Held = std::optional<at::Tensor>;
  static Held hold(Call& c, const std::optional<at::Tensor>& t) {
    return t.has_value() ? Held(c.alias(*t)) : Held(std::nullopt);
  }
  static const std::optional<at::Tensor>& pass(const Held& h) { return h; }
};
template <>
struct Arg<const at::ITensorListRef&> {
  using Held = c10::SmallVector<at::Tensor, 4>;
  static Held hold(Call& c, const at::ITensorListRef& list) {
    Held h;
    h.reserve(list.size());
    for (const at::Tensor& t : list) h.push_back(c.alias(t));
    return h;
  }
  static at::ITensorListRef pass(const Held& h) { return at::ITensorListRef(at::ArrayRef<at::Tensor>(h.data(), h.size())); }
};

// Whether every tensor argument is one the fast path takes: a dense zion
// tensor with storage (all on one device) or a 0-dim CPU tensor.
struct Plain {
  c10::DeviceIndex device = -1;
  bool ok = true;
  void tensor(const at::Tensor& t) {
    if (!t.defined()) return;
    if (t.device().is_privateuseone()) {
      if (t.layout() != c10::kStrided || !t.has_storage()) ok = false;
      if (device < 0) device = t.device().index();
      ok = ok && t.device().index() == device;
      return;
    }
    ok = ok && t.device().is_cpu() && t.dim() == 0;
  }
  template <class T>
  void operator()(const T& v) {
    using D = std::decay_t<T>;
    if constexpr (std::is_same_v<D, at::Tensor>) {
      tensor(v);
    } else if constexpr (std::is_same_v<D, std::optional<at::Tensor>>) {
      if (v.has_value()) tensor(*v);
    } else if constexpr (std::is_same_v<D, at::ITensorListRef>) {
      for (const at::Tensor& t : v) tensor(t);
    }
  }
};

// How the CPU kernel's result comes back; charge() prices the op with it as its outputs.
template <class R>
struct Ret {  // not a tensor
  static R back(Call&, R r) { return r; }
  static void charge(Call& c, const R&) { charge_call(c.op, c, {}); }
};
template <>
struct Ret<at::Tensor> {
  static at::Tensor back(Call& c, at::Tensor r) { return c.result(std::move(r)); }
  static void charge(Call& c, const at::Tensor& r) { charge_call(c.op, c, r); }
};
template <>
struct Ret<at::Tensor&> {  // in place or out=: one of the caller's mutable arguments
  static at::Tensor& back(Call& c, at::Tensor& r, c10::ArrayRef<at::Tensor*> mutable_args) {
    const at::Tensor* zion = c.zion_of(r.unsafeGetTensorImpl());
    TORCH_INTERNAL_ASSERT(zion, "zion: the CPU kernel of ", c.op.schema().name(), " returned none of its arguments");
    c.aliases.write_back(r, *zion);
    for (at::Tensor* arg : mutable_args) {
      if (arg->unsafeGetTensorImpl() == zion->unsafeGetTensorImpl()) return *arg;
    }
    TORCH_INTERNAL_ASSERT(false, "zion: the CPU kernel of ", c.op.schema().name(),
                          " returned an argument that is not a mutable one");
  }
  static void charge(Call& c, const at::Tensor& r) { charge_call(c.op, c, r); }
};
template <class... T>
struct Ret<std::tuple<T...>> {
  static_assert((std::is_same_v<T, at::Tensor> && ...), "tuples of tensors only");
  static std::tuple<T...> back(Call& c, std::tuple<T...> r) {
    // Braced: the results are converted in order, as the fallback does.
    return std::apply([&](auto&... t) { return std::tuple<T...>{c.result(std::move(t))...}; }, r);
  }
  static void charge(Call& c, const std::tuple<T...>& r) {
    std::apply([&](const auto&... t) { charge_call(c.op, c, std::array<at::Tensor, sizeof...(T)>{t...}); }, r);
  }
};

template <class Op, class Signature = typename Op::schema>
struct Fast;

template <class Op, class R, class... Args>
struct Fast<Op, R(Args...)> {
  static const c10::OperatorHandle& handle() {
    static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(Op::name, Op::overload_name);
    return op;
  }

  static R call(Args... args) {
    const c10::OperatorHandle& op = handle();
    static const OpFacts facts = read_facts(op);
    Plain plain;
    (plain(args), ...);
    if (timing_only() || !plain.ok || plain.device < 0 || !facts.generator_args.empty() || facts.pin_memory_arg >= 0 ||
        facts.accepts_cpu_tensors || facts.may_record_autograd || facts.describes_undefined) {
      return c10::impl::BoxedKernelWrapper<R(Args...)>::call(c10::BoxedKernel::makeFromFunction<&fallback>(), op,
                                                             c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                             args...);
    }
    Call call{op, facts};
    call.device = plain.device;
    // Braced: aliases are made in argument order, so pricing sees the inputs as the fallback lists them.
    std::tuple<typename Arg<Args>::Held...> held{Arg<Args>::hold(call, args)...};
    call.aliases.set_device(call.device);
    c10::SmallVector<at::Tensor*, 2> mutable_args;
    (note_mutable(mutable_args, args), ...);
    return run(call, held, mutable_args, std::index_sequence_for<Args...>{});
  }

  template <class T>
  static void note_mutable(c10::SmallVector<at::Tensor*, 2>& out, T& arg) {
    if constexpr (std::is_same_v<T, at::Tensor>) out.push_back(&arg);
  }

  template <size_t... I>
  static R run(Call& call, std::tuple<typename Arg<Args>::Held...>& held, c10::ArrayRef<at::Tensor*> mutable_args,
               std::index_sequence<I...>) {
    if constexpr (std::is_void_v<R>) {
      {
        DeviceScope scope(call.device);
        {
          KernelHostMemory::Scope kernel_memory;
          Op::redispatch(kCpuKeys, Arg<Args>::pass(std::get<I>(held))...);
        }
        finish_arguments<I...>(call, held);
      }
      charge_call(call.op, call, {});
    } else {
      DeviceScope scope(call.device);
      R cpu = [&]() -> R {
        KernelHostMemory::Scope kernel_memory;
        return Op::redispatch(kCpuKeys, Arg<Args>::pass(std::get<I>(held))...);
      }();
      finish_arguments<I...>(call, held);
      R zion = [&]() -> R {
        if constexpr (std::is_same_v<R, at::Tensor&>) {
          return Ret<R>::back(call, cpu, mutable_args);
        } else {
          return Ret<R>::back(call, std::forward<R>(cpu));
        }
      }();
      Ret<R>::charge(call, zion);
      return std::forward<R>(zion);
    }
  }

  // As the fallback after the kernel: grown aliases move into their zion
  // storages, and the written arguments take their aliases' new metadata.
  template <size_t... I>
  static void finish_arguments(Call& call, std::tuple<typename Arg<Args>::Held...>& held) {
    call.aliases.commit();
    if (call.facts.written_args.empty()) return;  // a functional op: no argument takes new metadata
    (write_back<I>(call, std::get<I>(held)), ...);
  }

  template <size_t I, class H>
  static void write_back(Call& call, const H& alias) {
    if constexpr (std::is_same_v<H, at::Tensor>) {
      const auto& written = call.facts.written_args;
      if (std::find(written.begin(), written.end(), static_cast<int>(I)) == written.end()) return;
      if (const at::Tensor* zion = call.zion_of(alias.unsafeGetTensorImpl())) call.aliases.write_back(alias, *zion);
    }
  }

  static void register_in(torch::Library& library) {
    auto op = c10::Dispatcher::singleton().findOp(c10::OperatorName(Op::name, Op::overload_name));
    // Only where the fallback would run the op: it has a CPU kernel and zion none.
    if (!op || op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1) ||
        !op->hasKernelForDispatchKey(c10::DispatchKey::CPU)) {
      return;
    }
    std::string name = std::string(Op::name).substr(std::strlen("aten::"));
    if (*Op::overload_name) name += std::string(".") + Op::overload_name;
    library.impl(name.c_str(), c10::CompileTimeFunctionPointer<R(Args...), &call>());
  }
};

// The ops of a training step that reach the fallback most often.
void register_fast_kernels(torch::Library& library) {
  Fast<at::_ops::add_Tensor>::register_in(library);
  Fast<at::_ops::add__Tensor>::register_in(library);
  Fast<at::_ops::sub_Tensor>::register_in(library);
  Fast<at::_ops::sub__Tensor>::register_in(library);
  Fast<at::_ops::mul_Tensor>::register_in(library);
  Fast<at::_ops::mul__Tensor>::register_in(library);
  Fast<at::_ops::div_Tensor>::register_in(library);
  Fast<at::_ops::div__Tensor>::register_in(library);
  Fast<at::_ops::div__Scalar>::register_in(library);
  Fast<at::_ops::mm>::register_in(library);
  Fast<at::_ops::addmm>::register_in(library);
  Fast<at::_ops::bmm>::register_in(library);
  Fast<at::_ops::relu>::register_in(library);
  Fast<at::_ops::relu_>::register_in(library);
  Fast<at::_ops::sigmoid>::register_in(library);
  Fast<at::_ops::threshold_backward>::register_in(library);
  Fast<at::_ops::sum_dim_IntList>::register_in(library);
  Fast<at::_ops::clone>::register_in(library);
  Fast<at::_ops::cat>::register_in(library);
  Fast<at::_ops::_embedding_bag>::register_in(library);
  Fast<at::_ops::_embedding_bag_backward>::register_in(library);
  Fast<at::_ops::binary_cross_entropy_with_logits>::register_in(library);
  Fast<at::_ops::sigmoid_backward>::register_in(library);
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
    register_fast_kernels(library_);
    for (const std::string& name : ops_with_their_own_cpu_kernel(c10::DispatchKey::CPU, c10::DispatchKey::PrivateUse1)) {
      library_.impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&fallback>());
    }
    // Generic kernels that call a device-typed kernel stub or check the
    // device type themselves (conj_physical_ of a complex tensor; mode's out=
    // form "only supports CPU, CUDA and XPU"), so they cannot run on zion
    // tensors: the fallback runs them on CPU aliases, where they pick CPU's.
    for (const char* name : {"conj_physical_", "mode.values"}) {
      library_.impl(name, torch::CppFunction::makeFromBoxedFunction<&fallback>());
    }
  }

 private:
  torch::Library library_;
};

}  // namespace

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>()); }

const CpuKernelsFirst cpu_kernels_first;

}  // namespace zion::device
