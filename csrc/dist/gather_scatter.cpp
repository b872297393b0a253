// gather and scatter of ProcessGroupZion. The collective model has no
// gather or scatter of its own; each is the all_to_all whose only non-zero
// column (gather) or row (scatter) is the root's: every rank sends its
// tensor to the root, or the root sends each rank its own. The model then
// prices the root's links carrying (n-1) tensors, which is what bounds both.
// The size recorded is the root's buffer, n x the per-rank tensor, as
// nccl-tests' gather and scatter count it.
//
// With absent ranks (present_ranks.h) gloo gathers from or scatters to the
// present ranks; the root's entries of absent ranks are their
// counterparts'. At an absent root no data moves.

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

// What gather and scatter check alike. `own`: the one tensor every rank
// passes (gather's input, scatter's output); `lists`: the root's list of one
// tensor per rank (gather_list, scatter_list), which no other rank passes.
// Sets the size the ranks agree on and the bytes the model prices, sent
// `to_root` (gather) or from it (scatter).
void check_rooted(RankSide& side, sim::CollectiveRequest& request, const std::string& call, bool to_root, const char* own_name,
                  const char* list_name, const std::vector<at::Tensor>& own, const std::vector<std::vector<at::Tensor>>& lists,
                  int64_t root, int rank, int n) {
  if (root < 0 || root >= n) {
    note(side.error, "zion backend: " + call + ": root " + std::to_string(root) + " is not a rank of this group (0.." +
                         std::to_string(n - 1) + ")");
  }
  side.root = root;
  if (own.size() != 1) {
    note(side.error, "zion backend: " + call + " takes one " + own_name + " tensor per rank, got " + std::to_string(own.size()));
    return;
  }
  side.numel = own[0].numel();
  if (root == rank && (lists.size() != 1 || static_cast<int>(lists[0].size()) != n)) {
    note(side.error, "zion backend: " + call + ": the root needs a " + list_name + " of " + std::to_string(n) +
                         " tensors, one per rank");
  } else if (root != rank && !lists.empty() && !lists[0].empty()) {
    note(side.error, "zion backend: " + call + ": only the root (rank " + std::to_string(root) + ") passes a " + list_name +
                         "; rank " + std::to_string(rank) + " passed one");
  }
  for (const auto& list : lists) {
    note(side.error, same_numel_problem(call, std::string("a ") + list_name + " tensor", list, own_name, own[0].numel()));
  }
  double each = nbytes(own);
  request.bytes = each * n;
  if (side.error.empty()) request.all_to_all_bytes = rooted_bytes(n, static_cast<int>(root), each, to_root);
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupZion::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                        std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  const bool root = opts.rootRank == getRank();
  std::vector<at::Tensor> all = inputs;
  for (const auto& list : outputs) all.insert(all.end(), list.begin(), list.end());
  Plan p = plan(Call::kGather, sim::CollectiveOp::kAllToAll, all);
  check_rooted(p.side, p.request, "gather", true, "input", "gather_list", inputs, outputs, opts.rootRank, getRank(), getSize());
  if (root && !outputs.empty()) p.outputs = outputs[0];
  p.type = c10d::OpType::GATHER;
  return run(std::move(p), [&](const Agreement&) {
    if (!ranks_.is_present(static_cast<int>(opts.rootRank))) return;  // no present rank receives it
    std::vector<std::vector<at::Tensor>> out;
    std::vector<at::Tensor> per_rank;
    if (root) {
      per_rank = flat_gloo_views(outputs[0]);
      out.push_back(present_entries(ranks_, per_rank));
    }
    auto in = flat_gloo_views(inputs);
    c10d::GatherOptions gloo_opts = opts;
    gloo_opts.rootRank = ranks_.gloo_rank[opts.rootRank];
    gloo_->gather(out, in, gloo_opts)->wait();
    if (root) copy_counterparts(ranks_, per_rank);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZion::scatter(std::vector<at::Tensor>& outputs,
                                                         std::vector<std::vector<at::Tensor>>& inputs,
                                                         const c10d::ScatterOptions& opts) {
  const bool root = opts.rootRank == getRank();
  std::vector<at::Tensor> all = outputs;
  for (const auto& list : inputs) all.insert(all.end(), list.begin(), list.end());
  Plan p = plan(Call::kScatter, sim::CollectiveOp::kAllToAll, all);
  check_rooted(p.side, p.request, "scatter", false, "output", "scatter_list", outputs, inputs, opts.rootRank, getRank(), getSize());
  p.outputs = outputs;
  p.type = c10d::OpType::SCATTER;
  return run(std::move(p), [&](const Agreement&) {
    if (!ranks_.is_present(static_cast<int>(opts.rootRank))) return;  // no present rank has the scatter_list
    auto out = flat_gloo_views(outputs);
    std::vector<std::vector<at::Tensor>> in;
    if (root) in.push_back(present_entries(ranks_, flat_gloo_views(inputs[0])));
    c10d::ScatterOptions gloo_opts = opts;
    gloo_opts.rootRank = ranks_.gloo_rank[opts.rootRank];
    gloo_->scatter(out, in, gloo_opts)->wait();
  });
}

}  // namespace zion::dist
