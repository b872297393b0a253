#pragma once

// What an operator's schema tells a kernel (its name, its arguments' kinds
// and names), worked out on the operator's first call on a thread and looked
// up after that, instead of comparing names on every call.

#include <ATen/core/dispatch/Dispatcher.h>

#include <string>
#include <unordered_map>
#include <vector>

namespace zion::device {

// The aten operators, by full name ("aten::add.out"), that have a kernel of
// their own for `cpu` (CPU, SparseCPU) and none yet for `zion`, whose generic
// kernel (CompositeExplicitAutograd, its NonFunctional form, or a
// CompositeImplicitAutograd decomposition) zion would take instead: where zion
// runs the CPU's kernel through a fallback, as CpuKernelsFirst (fallback.cpp)
// and SparseCpuKernelsFirst (sparse.cpp) register it.
inline std::vector<std::string> ops_with_their_own_cpu_kernel(c10::DispatchKey cpu, c10::DispatchKey zion) {
  std::vector<std::string> names;
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto op = dispatcher.findOp(name);
    if (!op || op->hasKernelForDispatchKey(zion) || !op->hasKernelForDispatchKey(cpu)) continue;
    if (!op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) &&
        !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional) &&
        !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) {
      continue;
    }
    names.push_back(name.overload_name.empty() ? name.name : name.name + "." + name.overload_name);
  }
  return names;
}

// The Facts that `read` gives for `op`, read once per operator and thread.
// Per thread, so no lock; keyed by the schema, which lives as long as the
// operator.
template <class Facts>
const Facts& facts_per_operator(const c10::OperatorHandle& op, Facts (*read)(const c10::OperatorHandle&)) {
  thread_local std::unordered_map<const c10::FunctionSchema*, Facts> cache;
  const c10::FunctionSchema* key = &op.schema();
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, read(op)).first;
  return it->second;
}

}  // namespace zion::device
