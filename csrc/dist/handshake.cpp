#include "dist/handshake.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <iterator>
#include <string>
#include <utility>
#include <sstream>

namespace zion::dist {
namespace {

// Fixed fields of a side, then send_counts[size], then recv_counts[size].
// Doubles carry every field exactly (integers below 2^53).
enum Field { kStart, kDevice, kHost, kCall, kDtype, kNumel, kRoot, kReduceOp, kError, kStorageLess, kHasCounts, kFixed };

std::vector<double> encode(const RankSide& s, int size) {
  std::vector<double> v(kFixed + 2 * size, 0.0);
  v[kStart] = s.start;
  v[kDevice] = s.device;
  v[kHost] = s.host ? 1 : 0;
  v[kCall] = static_cast<int>(s.call);
  v[kDtype] = s.dtype;
  v[kNumel] = static_cast<double>(s.numel);
  v[kRoot] = static_cast<double>(s.root);
  v[kReduceOp] = static_cast<double>(s.reduce_op);
  v[kError] = s.error.empty() ? 0 : 1;
  v[kStorageLess] = s.storage_less ? 1 : 0;
  bool counts = static_cast<int>(s.send_counts.size()) == size && static_cast<int>(s.recv_counts.size()) == size;
  v[kHasCounts] = counts ? 1 : 0;
  for (int i = 0; counts && i < size; ++i) {
    v[kFixed + i] = static_cast<double>(s.send_counts[i]);
    v[kFixed + size + i] = static_cast<double>(s.recv_counts[i]);
  }
  return v;
}

RankSide decode(const double* v, int size) {
  RankSide s;
  s.start = v[kStart];
  s.device = static_cast<int>(v[kDevice]);
  s.host = v[kHost] != 0;
  s.call = static_cast<Call>(static_cast<int>(v[kCall]));
  s.dtype = static_cast<int>(v[kDtype]);
  s.numel = static_cast<int64_t>(v[kNumel]);
  s.root = static_cast<int64_t>(v[kRoot]);
  s.reduce_op = static_cast<int64_t>(v[kReduceOp]);
  if (v[kError] != 0) s.error = "error";
  s.storage_less = v[kStorageLess] != 0;
  if (v[kHasCounts] != 0) {
    for (int i = 0; i < size; ++i) {
      s.send_counts.push_back(static_cast<int64_t>(v[kFixed + i]));
      s.recv_counts.push_back(static_cast<int64_t>(v[kFixed + size + i]));
    }
  }
  return s;
}

// "rank 0: 4, rank 1: 5" for one field of every side.
template <typename F>
std::string per_rank(const std::vector<RankSide>& sides, F field) {
  std::ostringstream out;
  for (size_t r = 0; r < sides.size(); ++r) out << (r ? ", " : "") << "rank " << r << ": " << field(sides[r]);
  return out.str();
}

// c10d::ReduceOp's names, in the order of its RedOpType.
std::string reduce_op_name(int64_t op) {
  static const char* const names[] = {"SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM", "UNUSED"};
  if (op >= 0 && op < static_cast<int64_t>(std::size(names))) return names[op];
  return std::to_string(op);
}

template <typename F>
bool all_equal(const std::vector<RankSide>& sides, F field) {
  return std::all_of(sides.begin(), sides.end(), [&](const RankSide& s) { return field(s) == field(sides[0]); });
}

// The first (i, j) where what rank i counts for rank j (send_counts[j]) is not
// what rank j counts for rank i (recv_counts[i]), or (-1, -1): an all-to-all's
// splits, a reduce_scatter's entries against each rank's output.
std::pair<int, int> count_mismatch(const std::vector<RankSide>& sides) {
  const size_t n = sides.size();
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      if (sides[i].send_counts.size() == n && sides[j].recv_counts.size() == n &&
          sides[i].send_counts[j] != sides[j].recv_counts[i]) {
        return {static_cast<int>(i), static_cast<int>(j)};
      }
    }
  }
  return {-1, -1};
}

void check(const Agreement& a, int rank, const RankSide& mine) {
  const auto& sides = a.sides;
  const char* name = call_name(mine.call);
  std::vector<int> failed;
  for (size_t r = 0; r < sides.size(); ++r) {
    if (!sides[r].error.empty()) failed.push_back(static_cast<int>(r));
  }
  if (!failed.empty()) {
    TORCH_CHECK(mine.error.empty(), mine.error);
    std::ostringstream ranks;
    for (size_t i = 0; i < failed.size(); ++i) ranks << (i ? ", " : "") << failed[i];
    TORCH_CHECK(false, "zion backend: ", name, " failed on rank(s) ", ranks.str(), " (see the error there); rank ", rank,
                " stops too instead of waiting for them");
  }
  TORCH_CHECK(all_equal(sides, [](const RankSide& s) { return static_cast<int>(s.call); }),
              "zion backend: ranks are in different collectives (", per_rank(sides, [](const RankSide& s) { return call_name(s.call); }),
              "); every rank of a group must issue the same collectives in the same order");
  TORCH_CHECK(all_equal(sides, [](const RankSide& s) { return s.host; }), "zion backend: ", name,
              ": ranks pass tensors on different devices (", per_rank(sides, [](const RankSide& s) {
                return s.host ? std::string("cpu") : c10::get_privateuse1_backend();
              }), "); every rank must pass ", c10::get_privateuse1_backend(), " tensors (or every rank CPU tensors, which go through gloo unmodeled)");
  TORCH_CHECK(all_equal(sides, [](const RankSide& s) { return s.dtype; }), "zion backend: ", name,
              ": dtypes differ across ranks (", per_rank(sides, [](const RankSide& s) {
                return std::string(c10::toString(static_cast<c10::ScalarType>(s.dtype)));
              }), ")");
  if (mine.call == Call::kAllGather) {
    // Entry j of every rank's output list receives rank j's input.
    const auto [i, j] = count_mismatch(sides);
    TORCH_CHECK(i < 0, "zion backend: ", name, ": rank ", i, "'s input has ", sides[i].send_counts[j],
                " elements, where rank ", j, "'s output list has ", sides[j].recv_counts[i], " at index ", i,
                "; entry i of every rank's output list must have rank i's input size");
  }
  if (mine.call == Call::kReduceScatter) {
    // Entry j of rank i's input list is reduced into rank j's output.
    const auto [i, j] = count_mismatch(sides);
    TORCH_CHECK(i < 0, "zion backend: ", name, ": rank ", i, "'s input list has ", sides[i].send_counts[j],
                " elements at index ", j, ", where rank ", j, "'s output has ", sides[j].recv_counts[i],
                "; entry j of every rank's input list must have rank j's output size");
  }
  TORCH_CHECK(all_equal(sides, [](const RankSide& s) { return s.numel; }), "zion backend: ", name,
              ": tensor sizes differ across ranks (elements per rank: ", per_rank(sides, [](const RankSide& s) { return s.numel; }),
              "); every rank must pass the same size");
  TORCH_CHECK(all_equal(sides, [](const RankSide& s) { return s.root; }), "zion backend: ", name,
              ": ranks name different roots (", per_rank(sides, [](const RankSide& s) { return s.root; }), ")");
  TORCH_CHECK(all_equal(sides, [](const RankSide& s) { return s.reduce_op; }), "zion backend: ", name,
              ": ranks name different reduce ops (", per_rank(sides, [](const RankSide& s) { return reduce_op_name(s.reduce_op); }), ")");
  // PREMUL_SUM carries a factor the backend does not receive; every rank asked for it, so every rank refuses.
  TORCH_CHECK(mine.reduce_op < 8, "zion backend: ", name, ": reduce op ", reduce_op_name(mine.reduce_op),
              " is not supported; the zion backend reduces with SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR or BXOR");
  std::vector<int> seen;
  for (const auto& s : sides) {
    TORCH_CHECK(std::find(seen.begin(), seen.end(), s.device) == seen.end(), "zion backend: two ranks of the group are placed on the same device ",
                s.device, " (", per_rank(sides, [](const RankSide& x) { return x.device; }),
                "); give each process its own LOCAL_RANK");
    seen.push_back(s.device);
  }
  if (mine.call == Call::kAllToAllSingle || mine.call == Call::kAllToAll) {
    const char* fix = mine.call == Call::kAllToAll ? "the sizes of the input and output tensor lists"
                                                   : "input_split_sizes and output_split_sizes";
    const auto [i, j] = count_mismatch(sides);
    TORCH_CHECK(i < 0, "zion backend: ", name, ": rank ", i, " sends ", sides[i].send_counts[j], " elements to rank ", j,
                ", which expects ", sides[j].recv_counts[i], " from it; check ", fix);
  }
}

// Gives each absent rank its counterpart's side (handshake.h says how).
void add_absent_sides(Agreement& a, const PresentRanks& ranks) {
  const int n = ranks.size;
  for (int g = 0; g < n; ++g) {
    if (ranks.is_present(g)) continue;
    RankSide s = a.sides[ranks.counterpart[g]];
    s.device = ranks.device[g];
    s.start = a.start;
    s.error.clear();  // the counterpart reports its own
    s.send_counts.clear();
    s.recv_counts.clear();
    a.sides[g] = std::move(s);
  }
  bool counts = std::all_of(ranks.present.begin(), ranks.present.end(), [&](int g) {
    return static_cast<int>(a.sides[g].send_counts.size()) == n && static_cast<int>(a.sides[g].recv_counts.size()) == n;
  });
  if (!counts) return;
  for (int i = 0; i < n; ++i) {
    if (ranks.is_present(i)) continue;
    const int p = ranks.counterpart[i];
    auto& send = a.sides[i].send_counts;
    send.resize(n);
    for (int j = 0; j < n; ++j) {
      send[j] = ranks.is_present(j) ? a.sides[j].recv_counts[i] : a.sides[p].send_counts[j];
    }
  }
  for (int j = 0; j < n; ++j) {
    if (ranks.is_present(j)) continue;
    auto& recv = a.sides[j].recv_counts;
    recv.resize(n);
    for (int i = 0; i < n; ++i) recv[i] = a.sides[i].send_counts[j];
  }
}

}  // namespace

const char* call_name(Call call) {
  switch (call) {
    case Call::kAllReduce: return "all_reduce";
    case Call::kBroadcast: return "broadcast";
    case Call::kReduce: return "reduce";
    case Call::kAllGather: return "all_gather";
    case Call::kAllGatherIntoTensor: return "all_gather_into_tensor";
    case Call::kReduceScatter: return "reduce_scatter";
    case Call::kReduceScatterTensor: return "reduce_scatter_tensor";
    case Call::kAllToAllSingle: return "all_to_all_single";
    case Call::kBarrier: return "barrier";
    case Call::kGather: return "gather";
    case Call::kScatter: return "scatter";
    case Call::kAllToAll: return "all_to_all";
    case Call::kAllReduceCoalesced: return "all_reduce_coalesced";
    case Call::kAllGatherIntoTensorCoalesced: return "all_gather_into_tensor_coalesced";
    case Call::kReduceScatterTensorCoalesced: return "reduce_scatter_tensor_coalesced";
  }
  return "unknown";
}

int handshake_words(int size) { return kFixed + 2 * size; }

Agreement agree(c10d::Backend& gloo, ShmHandshake* shm, int rank, const PresentRanks& ranks, const RankSide& mine) {
  const int size = ranks.size;
  const int present = static_cast<int>(ranks.present.size());
  std::vector<double> packed = encode(mine, size);
  const int64_t width = static_cast<int64_t>(packed.size());
  at::Tensor in = shm ? at::Tensor() : at::from_blob(packed.data(), {width}, at::kDouble).clone();
  at::Tensor out = at::empty({width * present}, at::kDouble);
  // A rank that left, crashed or never came: said in the group's words, as
  // torch's DistBackendError (what NCCL raises) for whoever handles it.
  auto lost = [&](const char* via, const char* says) {
    TORCH_CHECK_WITH(DistBackendError, false, "zion backend: ", call_name(mine.call), " on rank ", rank, " of ", size,
                     ": lost the other ranks before agreeing on it (a rank has exited or crashed, or did not issue ",
                     "it within the group's timeout). ", via, ": ", says);
  };
  if (shm) {
    try {
      shm->all_gather(packed.data(), out.data_ptr<double>());
    } catch (const HandshakeLost& e) {
      lost("shared memory", e.what());
    } catch (const std::logic_error& e) {
      TORCH_CHECK(false, e.what());
    }
  } else {
    try {
      gloo._allgather_base(out, in)->wait();
    } catch (const c10::Error& e) {
      lost("gloo", e.what_without_backtrace());
    } catch (const std::exception& e) {  // gloo's own IoException
      lost("gloo", e.what());
    }
  }

  Agreement a;
  a.sides.resize(size);
  const double* all = out.const_data_ptr<double>();
  for (int q = 0; q < present; ++q) {
    a.sides[ranks.present[q]] = decode(all + q * width, size);
    a.start = std::max(a.start, a.sides[ranks.present[q]].start);
    a.payload = a.payload && !a.sides[ranks.present[q]].storage_less;
  }
  if (!ranks.all()) add_absent_sides(a, ranks);
  for (const auto& s : a.sides) a.devices.push_back(s.device);
  check(a, rank, mine);
  return a;
}

}  // namespace zion::dist
