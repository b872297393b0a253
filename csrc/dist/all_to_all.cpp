// all_to_all_single and all_to_all of ProcessGroupZion. The ranks agree on
// the elements each sends each other one (handshake.h), so uneven splits are
// checked on every rank before gloo sees them and priced as the exact
// matrix of bytes (ProcessGroupZion::run).
//
// gloo's own list all_to_all takes only equal sizes; the list form goes
// through gloo's all_to_all_single on one flat buffer per rank instead, which
// moves the same elements to the same places.
//
// With absent ranks (present_ranks.h) gloo moves the pieces between present
// ranks; a piece from an absent rank a, standing on its counterpart p, is
// the piece p sends this rank, if it has the number of elements this rank
// expects from a, else zeros. Split sizes, lengths and indices a script
// exchanges stay consistent with each other and within this rank's shards.

#include <c10/util/Exception.h>

#include <algorithm>
#include <numeric>

#include "dist/process_group_zion.h"
#include "dist/tensor_lists.h"

namespace zion::dist {

c10::intrusive_ptr<c10d::Work> ProcessGroupZion::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                               std::vector<int64_t>& output_splits,
                                                               std::vector<int64_t>& input_splits,
                                                               const c10d::AllToAllOptions& opts) {
  Plan p = plan(Call::kAllToAllSingle, sim::CollectiveOp::kAllToAll, {output, input});
  const int n = getSize();
  if (p.side.error.empty()) {
    // Splits count rows (dim 0); the handshake counts elements.
    // Elements per row: the product of the sizes after the first (1 for a
    // 1-D tensor), so an empty input (a rank with nothing to send) still has rows of its shape.
    auto row = [](const at::Tensor& t) {
      int64_t n = 1;
      for (int64_t d = 1; d < t.dim(); ++d) n *= t.size(d);
      return t.dim() == 0 ? int64_t{1} : n;
    };
    auto counts = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* what) {
      std::vector<int64_t> c;
      int64_t rows = t.dim() == 0 ? 1 : t.size(0);
      if (splits.empty()) {
        if (rows % n != 0) {
          note(p.side.error, std::string("zion backend: all_to_all_single: the ") + what + " has " + std::to_string(rows) +
                                 " rows, which do not split evenly over " + std::to_string(n) + " ranks; pass split sizes");
        }
        c.assign(n, rows / n * row(t));
      } else if (static_cast<int>(splits.size()) != n ||
                 std::accumulate(splits.begin(), splits.end(), int64_t{0}) != rows) {
        note(p.side.error, std::string("zion backend: all_to_all_single: ") + what + " split sizes must be " +
                               std::to_string(n) + " numbers summing to its " + std::to_string(rows) + " rows");
        c.assign(n, 0);
      } else {
        for (int64_t s : splits) c.push_back(s * row(t));
      }
      return c;
    };
    p.side.send_counts = counts(input, input_splits, "input");
    p.side.recv_counts = counts(output, output_splits, "output");
    // The input's and the output's rows may differ in width, within a rank
    // and across ranks, as gloo's and NCCL's splits count each tensor's own
    // rows (torchrec's sequence embeddings send [n, D] rows into a flat
    // output, and a rank with nothing to send passes a flat empty input):
    // the handshake matches each piece's elements, sender against receiver.
    p.side.numel = 0;
  }
  p.request.bytes = nbytes({input});
  std::vector<at::Tensor> outputs{output}, inputs{input};
  if (!ranks_.all()) {
    p.outputs = outputs;
    p.type = c10d::OpType::ALLTOALL_BASE;
    return run(std::move(p), [&](const Agreement& agreed) {
      all_to_all_present(gloo_view(output).view({-1}), gloo_view(input).view({-1}), agreed, opts);
    });
  }
  return run_pairs(std::move(p), outputs, inputs, c10d::OpType::ALLTOALL_BASE, [&](at::Tensor& out, at::Tensor& in) {
    return gloo_->alltoall_base(out, in, output_splits, input_splits, opts);
  });
}

void ProcessGroupZion::all_to_all_present(const at::Tensor& out, const at::Tensor& in, const Agreement& agreed,
                                          const c10d::AllToAllOptions& opts) {
  const int n = getSize(), me = getRank();
  const auto& send = agreed.sides[me].send_counts;
  const auto& recv = agreed.sides[me].recv_counts;
  auto offsets = [n](const std::vector<int64_t>& counts) {
    std::vector<int64_t> at(n + 1, 0);
    for (int r = 0; r < n; ++r) at[r + 1] = at[r] + counts[r];
    return at;
  };
  const std::vector<int64_t> send_at = offsets(send), recv_at = offsets(recv);

  // Between present ranks: their pieces, packed, through gloo.
  std::vector<at::Tensor> to_present;
  std::vector<int64_t> send_splits, recv_splits;
  for (int g : ranks_.present) {
    to_present.push_back(in.narrow(0, send_at[g], send[g]));
    send_splits.push_back(send[g]);
    recv_splits.push_back(recv[g]);
  }
  at::Tensor packed_in = at::cat(to_present);
  at::Tensor packed_out = at::empty({std::accumulate(recv_splits.begin(), recv_splits.end(), int64_t{0})}, in.options());
  std::vector<int64_t> gloo_out_splits = recv_splits, gloo_in_splits = send_splits;  // gloo moves from them
  gloo_->alltoall_base(packed_out, packed_in, gloo_out_splits, gloo_in_splits, opts)->wait();
  int64_t offset = 0;
  for (size_t q = 0; q < ranks_.present.size(); ++q) {
    const int g = ranks_.present[q];
    out.narrow(0, recv_at[g], recv[g]).copy_(packed_out.narrow(0, offset, recv[g]));
    offset += recv[g];
  }

  // From an absent rank: its counterpart's piece for this rank, or zeros
  // when this rank expects a different size from it.
  for (int a = 0; a < n; ++a) {
    if (ranks_.is_present(a)) continue;
    at::Tensor piece = out.narrow(0, recv_at[a], recv[a]);
    const int p = ranks_.counterpart[a];
    if (recv[p] == recv[a]) {
      piece.copy_(out.narrow(0, recv_at[p], recv[p]));
    } else {
      piece.zero_();
    }
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZion::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                          const c10d::AllToAllOptions& opts) {
  std::vector<at::Tensor> all = outputs;
  all.insert(all.end(), inputs.begin(), inputs.end());
  Plan p = plan(Call::kAllToAll, sim::CollectiveOp::kAllToAll, all);
  const int n = getSize();
  if (static_cast<int>(inputs.size()) != n || static_cast<int>(outputs.size()) != n) {
    note(p.side.error, "zion backend: all_to_all: the input and output lists have " + std::to_string(inputs.size()) + " and " +
                           std::to_string(outputs.size()) + " tensors; the group has " + std::to_string(n) + " ranks");
  }
  if (p.side.error.empty()) {
    for (const auto& t : inputs) p.side.send_counts.push_back(t.numel());
    for (const auto& t : outputs) p.side.recv_counts.push_back(t.numel());
  }
  p.request.bytes = nbytes(inputs);
  p.outputs = outputs;
  p.type = c10d::OpType::ALLTOALL;
  return run(std::move(p), [&](const Agreement& agreed) {
    std::vector<at::Tensor> flat_inputs;
    for (const auto& t : inputs) flat_inputs.push_back(gloo_view(t).reshape({-1}));
    at::Tensor in = at::cat(flat_inputs);
    std::vector<int64_t> in_splits, out_splits;
    for (const auto& t : inputs) in_splits.push_back(t.numel());
    for (const auto& t : outputs) out_splits.push_back(t.numel());
    at::Tensor out = at::empty({std::accumulate(out_splits.begin(), out_splits.end(), int64_t{0})}, in.options());
    if (ranks_.all()) {
      // gloo takes the split vectors over (moves from them): it gets copies.
      std::vector<int64_t> gloo_out_splits = out_splits, gloo_in_splits = in_splits;
      gloo_->alltoall_base(out, in, gloo_out_splits, gloo_in_splits, opts)->wait();
    } else {
      all_to_all_present(out, in, agreed, opts);
    }
    int64_t offset = 0;
    for (size_t j = 0; j < outputs.size(); ++j) {
      gloo_view(outputs[j]).view({-1}).copy_(out.narrow(0, offset, out_splits[j]));
      offset += out_splits[j];
    }
  });
}

}  // namespace zion::dist
