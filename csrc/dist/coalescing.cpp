// Coalesced calls of ProcessGroupZion.
//
// dist._coalescing_manager (and all_reduce_coalesced) hand a backend a list
// of same-kind collectives at once: all_reduce, all_gather_into_tensor or
// reduce_scatter_tensor. NCCL runs such a list as one grouped launch; here
// the ranks agree once, gloo moves each tensor as the single call would (so
// results equal gloo's single calls), and the model prices one collective of
// the total size: one base latency, the bandwidth term of all the bytes.
//
// startCoalescing / endCoalescing bracket what batch_isend_irecv issues (and
// any collective issued inside a _coalescing_manager with a device): every
// Work of the batch is collected, and endCoalescing's Work ends when the
// last of them does.

#include <c10/util/Exception.h>

#include <algorithm>

#include "device/runtime/runtime.h"
#include "dist/process_group_zion.h"
#include "dist/tensor_lists.h"

namespace zion::dist {

c10::intrusive_ptr<c10d::Work> ProcessGroupZion::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                     const c10d::AllreduceCoalescedOptions& opts) {
  Plan p = plan(Call::kAllReduceCoalesced, sim::CollectiveOp::kAllReduce, tensors);
  p.side.reduce_op = static_cast<int64_t>(opts.reduceOp.op_);
  return run_in_place(std::move(p), tensors, c10d::OpType::ALLREDUCE_COALESCED,
                      [&](std::vector<at::Tensor>& data) { return gloo_->allreduce_coalesced(data, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZion::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                 std::vector<at::Tensor>& inputs,
                                                                                 const c10d::AllgatherOptions& opts) {
  return run_tensor_pairs(Call::kAllGatherIntoTensorCoalesced, outputs, inputs, -1, c10d::OpType::COALESCED,
                          [&](at::Tensor& out, at::Tensor& in) { return gloo_->_allgather_base(out, in, opts); },
                          [&](std::vector<at::Tensor>& in, std::vector<std::vector<at::Tensor>>& out) {
                            return gloo_->allgather(out, in, opts);
                          });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZion::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                 std::vector<at::Tensor>& inputs,
                                                                                 const c10d::ReduceScatterOptions& opts) {
  return run_tensor_pairs(Call::kReduceScatterTensorCoalesced, outputs, inputs, static_cast<int64_t>(opts.reduceOp.op_),
                          c10d::OpType::COALESCED,
                          [&](at::Tensor& out, at::Tensor& in) { return gloo_->_reduce_scatter_base(out, in, opts); },
                          [&](std::vector<at::Tensor>& out, std::vector<std::vector<at::Tensor>>& in) {
                            return gloo_->reduce_scatter(out, in, opts);
                          });
}

void ProcessGroupZion::startCoalescing() {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(!coalescing_, "zion backend: startCoalescing while a batch is already open; end it with endCoalescing first");
  coalescing_ = true;
  batch_.clear();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZion::endCoalescing() {
  std::vector<c10::intrusive_ptr<ZionWork>> works;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(coalescing_, "zion backend: endCoalescing without startCoalescing");
    coalescing_ = false;
    works.swap(batch_);
  }
  // The batch's Work lives on the first modeled communication's stream.
  c10::DeviceIndex device = -1;
  int comm = -1;
  std::vector<at::Tensor> outputs;
  for (const auto& w : works) {
    if (device < 0 && w->device() >= 0) device = w->device(), comm = w->comm_stream();
    for (const auto& t : w->result()) outputs.push_back(t);
  }
  auto finish = [works]() -> sim::Seconds {
    sim::Seconds end = 0;
    for (const auto& w : works) end = std::max(end, w->end());
    return end;
  };
  auto ready = [works] {
    return std::all_of(works.begin(), works.end(), [](const auto& w) { return w->finish_if_ready(); });
  };
  return c10::make_intrusive<ZionWork>(getRank(), c10d::OpType::COALESCED, device, comm, finish, ready,
                                       std::move(outputs));
}

}  // namespace zion::dist
