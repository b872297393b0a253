#pragma once
// What every collective of ProcessGroupZion does with its tensors: the CPU
// tensors gloo moves in their place (a zero-copy alias of a zion tensor, a
// CPU tensor itself), their sizes, and the first problem found.

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "device/aten/tensor_alias.h"
#include "device/aten/timing.h"
#include "dist/present_ranks.h"

namespace zion::dist {

// The CPU tensor gloo reads and writes for `t` in a collective that waits
// for gloo before it returns: the CPU tensor itself, or a zero-copy view of a
// zion tensor's bytes that does not own them. gloo's worker thread lets go of
// a finished work's tensors a moment after wait() returns; a view that owned
// the zion storage would keep its HBM accounted until then, and peaks would
// depend on thread timing. The caller holds the zion tensors throughout.
inline at::Tensor gloo_view(const at::Tensor& t) {
  if (t.device().is_cpu()) return t;
  at::Tensor owning = device::cpu_alias(t);  // checks the tensor has bytes
  if (owning.numel() == 0) return owning;
  return at::from_blob(owning.data_ptr(), owning.sizes(), owning.strides(), owning.options());
}

// The view for gloo work still in flight when the call returns (send and
// recv): it owns the zion storage, so the bytes outlive the caller's tensor.
inline at::Tensor gloo_owning_view(const at::Tensor& t) { return t.device().is_cpu() ? t : device::cpu_alias(t); }

inline std::vector<at::Tensor> gloo_views(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) out.push_back(gloo_view(t));
  return out;
}

// As gloo_views, each contiguous view flattened to 1-D: the ranks agreed on
// element counts, which is all NCCL checks for gather, scatter and the list
// forms of all_gather and reduce_scatter; gloo also compares shapes, and one
// rank refusing would leave the others waiting for it.
inline std::vector<at::Tensor> flat_gloo_views(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> out = gloo_views(tensors);
  for (auto& t : out) {
    if (t.defined() && t.is_contiguous()) t = t.view({-1});
  }
  return out;
}

inline double nbytes(const std::vector<at::Tensor>& tensors) {
  double total = 0;
  for (const auto& t : tensors) {
    if (t.defined()) total += static_cast<double>(t.numel()) * static_cast<double>(t.element_size());
  }
  return total;
}

inline int64_t numel(const std::vector<at::Tensor>& tensors) {
  int64_t total = 0;
  for (const auto& t : tensors) {
    if (t.defined()) total += t.numel();
  }
  return total;
}

// Whether any of the tensors has no bytes (timing-only mode's storage-less tensors).
inline bool any_storage_less(const std::vector<at::Tensor>& tensors) {
  for (const auto& t : tensors) {
    if (device::is_storage_less(t)) return true;
  }
  return false;
}

// After a collective that moved no payload (some rank's tensors had no
// bytes): outputs that still hold bytes would hold values computed from
// unknown ones, so those that are whole storages become storage-less too;
// a view into a larger storage keeps its old values.
inline void forget_values(const std::vector<at::Tensor>& outputs) {
  for (const auto& t : outputs) {
    if (t.defined() && t.device().is_privateuseone() && !device::is_storage_less(t) && device::covers_storage(t)) {
      device::make_storage_less(t);
    }
  }
}

// Keeps the first problem: the one the user should fix first.
inline void note(std::string& error, const std::string& problem) {
  if (error.empty()) error = problem;
}

// Empty when every defined tensor of `list` has `numel` elements, as the
// rank's own `own_name` tensor has; else the first one that does not.
inline std::string same_numel_problem(const std::string& call, const std::string& member, const std::vector<at::Tensor>& list,
                                      const char* own_name, int64_t numel) {
  for (const auto& t : list) {
    if (t.defined() && t.numel() != numel) {
      return "zion backend: " + call + ": " + member + " has " + std::to_string(t.numel()) + " elements; the " + own_name +
             " has " + std::to_string(numel);
    }
  }
  return {};
}

// Empty when `whole` (an all_gather's output, a reduce_scatter's input) has
// `part` x `ranks` elements; else the problem, naming both.
inline std::string group_multiple_problem(const std::string& call, const std::string& whole_name, int64_t whole,
                                          const char* part_name, int64_t part, int ranks) {
  if (whole == part * ranks) return {};
  return "zion backend: " + call + ": " + whole_name + " has " + std::to_string(whole) + " elements; it needs " + part_name +
         " elements x group size = " + std::to_string(part) + " x " + std::to_string(ranks);
}

// Groups with absent ranks (present_ranks.h).

// The entries of a per-rank list that belong to present ranks, in the inner
// gloo group's order.
inline std::vector<at::Tensor> present_entries(const PresentRanks& ranks, const std::vector<at::Tensor>& per_rank) {
  std::vector<at::Tensor> out;
  out.reserve(ranks.present.size());
  for (int g : ranks.present) out.push_back(per_rank[g]);
  return out;
}

// Each absent rank's entry of a per-rank list becomes a copy of its counterpart's.
inline void copy_counterparts(const PresentRanks& ranks, const std::vector<at::Tensor>& per_rank) {
  for (int g = 0; g < ranks.size; ++g) {
    if (!ranks.is_present(g)) per_rank[g].copy_(per_rank[ranks.counterpart[g]]);
  }
}

// The CPU view of `whole` (a tensor of `size` equal pieces, one per rank,
// as an all_gather_into_tensor's output) cut into its pieces, each shaped
// like `part`.
inline std::vector<at::Tensor> rank_pieces(const at::Tensor& whole, int size, const at::Tensor& part) {
  at::Tensor flat = gloo_view(whole).view({-1});
  const int64_t piece = part.numel();
  std::vector<at::Tensor> out;
  out.reserve(size);
  for (int r = 0; r < size; ++r) out.push_back(flat.narrow(0, r * piece, piece).view(part.sizes()));
  return out;
}

}  // namespace zion::dist
