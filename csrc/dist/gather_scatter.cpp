// gather and scatter of ProcessGroupZion. The collective model has no
// gather or scatter of its own; each is the all_to_all whose only non-zero
// column (gather) or row (scatter) is the root's: every rank sends its
// tensor to the root, or the root sends each rank its own. The model then
// prices the root's links carrying (n-1) tensors, which is what bounds both.
// The size recorded is the root's buffer, n x the per-rank tensor, as
// nccl-tests' gather and scatter count it.

#include <c10/util/Exception.h>

#include "dist/process_group_zion.h"
#include "dist/tensor_lists.h"

namespace zion::dist {
namespace {

// matrix[i][j]: bytes rank i sends rank j; `to_root` for gather, else scatter.
std::vector<std::vector<double>> rooted_bytes(int n, int root, double bytes, bool to_root) {
  std::vector<std::vector<double>> matrix(n, std::vector<double>(n, 0.0));
  for (int r = 0; r < n; ++r) (to_root ? matrix[r][root] : matrix[root][r]) = bytes;
  return matrix;
}

std::string root_problem(const char* call, int64_t root, int size) {
  if (root >= 0 && root < size) return {};
  return std::string("zion backend: ") + call + ": root " + std::to_string(root) + " is not a rank of this group (0.." +
         std::to_string(size - 1) + ")";
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupZion::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                        std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  const int n = getSize();
  const bool root = opts.rootRank == getRank();
  std::vector<at::Tensor> all = inputs;
  for (const auto& list : outputs) all.insert(all.end(), list.begin(), list.end());
  Plan p = plan(Call::kGather, sim::CollectiveOp::kAllToAll, all);
  note(p.side.error, root_problem("gather", opts.rootRank, n));
  p.side.root = opts.rootRank;
  if (inputs.size() != 1) {
    note(p.side.error, "zion backend: gather takes one input tensor per rank, got " + std::to_string(inputs.size()));
  } else {
    p.side.numel = inputs[0].numel();
    if (root && (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != n)) {
      note(p.side.error, "zion backend: gather: the root needs a gather_list of " + std::to_string(n) + " tensors, one per rank");
    } else if (!root && !outputs.empty() && !outputs[0].empty()) {
      note(p.side.error, "zion backend: gather: only the root (rank " + std::to_string(opts.rootRank) +
                             ") passes a gather_list; rank " + std::to_string(getRank()) + " passed one");
    }
    for (const auto& list : outputs) {
      for (const auto& o : list) {
        if (o.defined() && o.numel() != inputs[0].numel()) {
          note(p.side.error, "zion backend: gather: a gather_list tensor has " + std::to_string(o.numel()) +
                                 " elements; the input has " + std::to_string(inputs[0].numel()));
        }
      }
    }
    double each = nbytes(inputs);
    p.request.bytes = each * n;
    if (p.side.error.empty()) p.request.all_to_all_bytes = rooted_bytes(n, static_cast<int>(opts.rootRank), each, true);
  }
  if (root && !outputs.empty()) p.outputs = outputs[0];
  p.type = c10d::OpType::GATHER;
  return run(std::move(p), [&] {
    std::vector<std::vector<at::Tensor>> out;
    if (root) out.push_back(gloo_views(outputs[0]));
    auto in = gloo_views(inputs);
    gloo_->gather(out, in, opts)->wait();
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZion::scatter(std::vector<at::Tensor>& outputs,
                                                         std::vector<std::vector<at::Tensor>>& inputs,
                                                         const c10d::ScatterOptions& opts) {
  const int n = getSize();
  const bool root = opts.rootRank == getRank();
  std::vector<at::Tensor> all = outputs;
  for (const auto& list : inputs) all.insert(all.end(), list.begin(), list.end());
  Plan p = plan(Call::kScatter, sim::CollectiveOp::kAllToAll, all);
  note(p.side.error, root_problem("scatter", opts.rootRank, n));
  p.side.root = opts.rootRank;
  if (outputs.size() != 1) {
    note(p.side.error, "zion backend: scatter takes one output tensor per rank, got " + std::to_string(outputs.size()));
  } else {
    p.side.numel = outputs[0].numel();
    if (root && (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != n)) {
      note(p.side.error, "zion backend: scatter: the root needs a scatter_list of " + std::to_string(n) + " tensors, one per rank");
    } else if (!root && !inputs.empty() && !inputs[0].empty()) {
      note(p.side.error, "zion backend: scatter: only the root (rank " + std::to_string(opts.rootRank) +
                             ") passes a scatter_list; rank " + std::to_string(getRank()) + " passed one");
    }
    for (const auto& list : inputs) {
      for (const auto& t : list) {
        if (t.defined() && t.numel() != outputs[0].numel()) {
          note(p.side.error, "zion backend: scatter: a scatter_list tensor has " + std::to_string(t.numel()) +
                                 " elements; the output has " + std::to_string(outputs[0].numel()));
        }
      }
    }
    double each = nbytes(outputs);
    p.request.bytes = each * n;
    if (p.side.error.empty()) p.request.all_to_all_bytes = rooted_bytes(n, static_cast<int>(opts.rootRank), each, false);
  }
  p.outputs = outputs;
  p.type = c10d::OpType::SCATTER;
  return run(std::move(p), [&] {
    auto out = gloo_views(outputs);
    std::vector<std::vector<at::Tensor>> in;
    if (root) in.push_back(gloo_views(inputs[0]));
    gloo_->scatter(out, in, opts)->wait();
  });
}

}  // namespace zion::dist
