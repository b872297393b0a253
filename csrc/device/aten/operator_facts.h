#pragma once

// What an operator's schema tells a kernel (its name, its arguments' kinds
// and names), worked out on the operator's first call on a thread and looked
// up after that, instead of comparing names on every call.

#include <ATen/core/dispatch/Dispatcher.h>

#include <unordered_map>

namespace zion::device {

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
