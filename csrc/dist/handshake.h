#pragma once
// Before a collective moves any data, every rank tells every other what it
// is about to do: which call, dtype and size, its global device and the
// virtual time its communication could start. One small all-gather carries
// it: through shared memory when every rank runs on one host
// (shm_handshake.h), else through gloo. Then every rank holds the same table and so reaches the same
// verdict: a mismatch (or a local error on any rank) raises on every rank,
// instead of gloo aborting the process or hanging; the collective starts at
// the latest start among the ranks.
//
// In a group with absent ranks (present_ranks.h) only the present ranks
// take part in the all-gather; the table then gets a side for every absent
// rank, drawn from its counterpart's.

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "dist/present_ranks.h"
#include "dist/shm_handshake.h"

namespace zion::dist {

// The calls of torch.distributed a group can be in the middle of.
enum class Call : int {
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kAllGatherIntoTensor,
  kReduceScatter,
  kReduceScatterTensor,
  kAllToAllSingle,
  kBarrier,
  kGather,
  kScatter,
  kAllToAll,
  kAllReduceCoalesced,
  kAllGatherIntoTensorCoalesced,
  kReduceScatterTensorCoalesced,
};
const char* call_name(Call call);

// What one rank brings to a collective.
struct RankSide {
  double start = 0;  // seconds on this rank's virtual timeline
  int device = 0;    // global device id (node-major, OAM-minor)
  bool host = false;  // CPU tensors: data through gloo, no modeled time
  // Timing-only mode: some tensor of the call has no bytes (storage-less),
  // so no rank's payload moves.
  bool storage_less = false;
  Call call = Call::kAllReduce;
  int dtype = -1;      // c10::ScalarType; must agree
  int64_t numel = 0;   // the size every rank must pass (what it means depends on the call)
  int64_t root = -1;   // broadcast, reduce
  int64_t reduce_op = -1;
  // all_to_all(_single): elements this rank sends to / receives from each rank.
  std::vector<int64_t> send_counts;
  std::vector<int64_t> recv_counts;
  // A problem found locally (wrong device, bad split sizes); only its
  // presence travels, the words stay on the rank that found it.
  std::string error;
};

struct Agreement {
  std::vector<RankSide> sides;  // indexed by group rank, absent ranks included
  double start = 0;             // the latest start
  std::vector<int> devices;     // global device of each group rank
  bool payload = true;          // false when any rank's tensors are storage-less: no data moves
};

// The doubles one rank's side takes in the all-gather, for a group of `size`.
int handshake_words(int size);

// All-gathers every present rank's side through `shm` when the group has one
// (shm_handshake.h: all present ranks on one host), else through `gloo` (the
// present ranks' group), and checks that they agree. Throws (on every rank alike) when they
// do not, or when any rank had an error.
//
// An absent rank a gets its counterpart p's side, with its own device, the
// latest start and, for an all-to-all, these element counts S[i][j] (rank i
// sends rank j) and R[j][i] (rank j receives from rank i):
//   S[a][j] = what present j says it receives from a (its recv count);
//   S[a][j] = S[p][j] for absent j (what p really sends j);
//   R[a][i] = S[i][a].
// A present rank's own counts are as it passed them.
Agreement agree(c10d::Backend& gloo, ShmHandshake* shm, int rank, const PresentRanks& ranks, const RankSide& mine);

}  // namespace zion::dist
