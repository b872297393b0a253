#include "device/runtime/sockets.h"

#include <ATen/record_function.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <ATen/core/dispatch/Dispatcher.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "device/runtime/allocator.h"
#include "device/runtime/host_memory.h"
#include "device/runtime/runtime.h"

namespace zion::device {
namespace {

c10::DeleterFnPtr g_base_deleter = nullptr;

// One deleter for both kinds of buffer, so raw_deleter() is right for every
// pointer raw_allocate() hands out.
void delete_cpu(void* ptr) {
  if (!pinned_allocator().release(ptr)) g_base_deleter(ptr);
}

class SocketCpuAllocator final : public c10::Allocator {
 public:
  explicit SocketCpuAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t nbytes) override {
    // A zion op's CPU kernel works in device memory; its scratch is not the socket's.
    if (KernelHostMemory::in_zion_kernel()) return base_->allocate(nbytes);
    const int socket = scoped_socket();
    if (socket < 0) return base_->allocate(nbytes);
    return pinned_allocator().allocate_on(socket, nbytes, /*pinned=*/false);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &delete_cpu; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { base_->copy_data(dest, src, count); }

 private:
  c10::Allocator* base_;
};

// Every op the thread runs while a socket scope is set is observed through
// RecordFunction (as the profiler observes ops: dispatch is unchanged, and
// the autograd engine carries the callback to the backward of CPU ops).
// Each piece of work is charged once: the outermost op the cost table has a
// formula for (an aten::mm, not the allocations and resizes inside it); a
// composite op without one is priced by the ops it calls; a leaf without a
// formula is the default guess. Views move no data and are free.
struct Frame {
  bool transparent = false;  // torch's record of a Python dispatch (a mode, a tensor subclass): not an op
  bool priced = false;   // charged at its end; what it calls is not
  bool covered = false;  // inside a priced op (or a view): not charged
  bool had_child = false;
  bool off_cpu = false;  // an input is not a CPU tensor
  std::vector<sim::TensorDesc> inputs;  // taken at the start: RecordFunction keeps inputs only until then
};
thread_local std::vector<Frame> t_frames;
thread_local at::CallbackHandle t_callback = 0;

struct OpFacts {
  bool has_formula = false;
  bool is_view = false;
};

std::string full_name(const c10::OperatorName& n) {
  return n.name + (n.overload_name.empty() ? "" : "." + n.overload_name);
}

const OpFacts& facts(const c10::OperatorName& name, const sim::OpCostModel& model) {
  thread_local std::unordered_map<std::string, OpFacts> cache;
  thread_local const sim::OpCostModel* cached_for = nullptr;
  if (cached_for != &model) {
    cache.clear();
    cached_for = &model;
  }
  std::string key = full_name(name);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  OpFacts f;
  f.has_formula = model.resolve(key) != nullptr;
  if (auto op = c10::Dispatcher::singleton().findOp(name)) {
    if (op->hasSchema()) {
      for (const auto& r : op->schema().returns()) {
        if (r.alias_info() && !r.alias_info()->isWrite()) f.is_view = true;
      }
    }
  }
  return cache.emplace(std::move(key), f).first->second;
}

void describe(const c10::IValue& v, std::vector<sim::TensorDesc>& out, bool& off_cpu) {
  auto add = [&](const at::Tensor& t) {
    if (!t.defined()) return;
    if (!t.device().is_cpu()) off_cpu = true;
    if (t.is_sparse()) {
      // Described by what it stores, as a zion tensor is (op_pricing.cpp): a
      // sparse update of a table costs its rows, not a pass over the table.
      // The accessors run unobserved (a socket tensor's are Python's).
      at::RecordFunctionGuard unobserved(false);
      const at::Tensor values = t._values();
      out.push_back(sim::TensorDesc{std::vector<int64_t>(values.sizes().begin(), values.sizes().end()),
                                    model_dtype(t.scalar_type()), static_cast<int>(t.element_size()),
                                    t._indices().numel()});
      return;
    }
    out.push_back(sim::TensorDesc{std::vector<int64_t>(t.sizes().begin(), t.sizes().end()), model_dtype(t.scalar_type()),
                                  static_cast<int>(t.element_size())});
  };
  if (v.isTensor()) {
    add(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) add(t);
  } else if (v.isOptionalTensorList()) {
    for (const std::optional<at::Tensor> t : v.toOptionalTensorList()) {
      if (t.has_value()) add(*t);
    }
  }
}

// torch records each call into Python dispatch (__torch_dispatch__ of a mode
// or a tensor subclass) under these names: the ops inside belong to the op
// that dispatched there, as they would without the Python layer.
bool is_python_dispatch(const at::RecordFunction& fn) {
  const char* name = fn.name();
  return std::strcmp(name, "PythonDispatchMode") == 0 || std::strcmp(name, "PythonSubclass") == 0;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  Frame f;
  Frame* parent = nullptr;  // the nearest op above
  for (auto it = t_frames.rbegin(); it != t_frames.rend(); ++it) {
    if (!it->transparent) {
      parent = &*it;
      break;
    }
  }
  if (parent) f.covered = parent->priced || parent->covered;
  // A zion op's CPU kernel (on aliases of device memory, or timing-only
  // mode's stand-ins) is the device's work, priced on the device.
  if (KernelHostMemory::in_zion_kernel()) f.covered = true;
  if (!fn.operator_name() && is_python_dispatch(fn)) {
    f.transparent = true;
    t_frames.push_back(std::move(f));
    return nullptr;
  }
  if (parent) parent->had_child = true;
  if (!f.covered) {
    if (auto name = fn.operator_name()) {
      const OpFacts& k = facts(*name, runtime().socket_cost());
      f.covered = k.is_view;
      f.priced = !k.is_view && k.has_formula;
    } else {
      f.covered = true;
    }
  }
  if (!f.covered) {
    for (const c10::IValue& v : fn.inputs()) describe(v, f.inputs, f.off_cpu);
  }
  t_frames.push_back(std::move(f));
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (t_frames.empty()) return;  // started before the scope
  Frame frame = std::move(t_frames.back());
  t_frames.pop_back();
  int socket = scoped_socket();
  if (socket < 0 || frame.transparent || frame.covered || (!frame.priced && frame.had_child)) return;
  auto name = fn.operator_name();
  if (!name) return;
  if (fn.outputs().empty()) {
    // An op that raised returns nothing: it did no work to charge.
    auto op = c10::Dispatcher::singleton().findOp(*name);
    if (op && !op->schema().returns().empty()) return;
  }
  sim::OpCall call;
  call.name = full_name(*name);
  bool off_cpu = frame.off_cpu;
  call.inputs = std::move(frame.inputs);
  for (const c10::IValue& v : fn.outputs()) describe(v, call.outputs, off_cpu);
  if (off_cpu) return;  // an op on a zion tensor is priced on its device
  charge_socket_op(socket, call);
}

}  // namespace

int socket_track(int socket) { return runtime().platform.oam.count + socket; }

void set_socket_scope(int socket) {
  // The runtime installs the CPU allocator that places tensors in the
  // socket's pool: a scope opened before the first zion tensor starts it.
  if (socket >= 0) runtime();
  set_scoped_socket(socket);  // checks the index
  if (socket >= 0 && t_callback == 0) {
    t_frames.clear();
    t_callback = at::addThreadLocalCallback(at::RecordFunctionCallback(&on_start, &on_end)
                                                .needsInputs(true)
                                                .needsOutputs(true)
                                                .scopes({at::RecordScope::FUNCTION}));
  } else if (socket < 0 && t_callback != 0) {
    at::removeCallback(t_callback);
    t_callback = 0;
    t_frames.clear();
  }
}

void charge_socket_op(int socket, const sim::OpCall& call) {
  Runtime& rt = runtime();
  TORCH_CHECK_INDEX(socket >= 0 && socket < rt.platform.socket.count, "zion: socket ", socket, " does not exist; platform '",
                    rt.platform.name, "' has ", rt.platform.socket.count, " sockets");
  const sim::OpCostModel& model = rt.socket_cost();
  sim::OpCost cost = model.cost(call, model.resolve(call.name));
  int track = socket_track(socket);
  rt.timeline.launch(track, 0, 0, cost.device_time, rt.timeline.host(), sim::Activity::kCompute,
                     rt.timeline.label(call.name));
  rt.timeline.count(track, cost.work.flops, cost.work.bytes + cost.work.gathered_bytes, cost.guessed);
  rt.timeline.wait_stream(track, 0);  // the host ran it
}

void install_socket_cpu_allocator() {
  static bool installed = [] {
    c10::Allocator* base = c10::GetCPUAllocator();
    g_base_deleter = base->raw_deleter();
    // Never destroyed: CPU tensors may be freed after static destructors ran.
    c10::SetCPUAllocator(new SocketCpuAllocator(base), /*priority=*/1);
    return true;
  }();
  (void)installed;
}

}  // namespace zion::device
