#pragma once
// ProcessGroupZion: the `zion` torch.distributed backend.
//
// Data: every collective runs through an inner gloo backend on zero-copy CPU
// aliases of the zion tensors, so the bytes really move between ranks and
// the numerics are gloo's. Before any byte moves, the ranks agree (one small
// all-gather, handshake.h: through shared memory when every rank runs on one
// host, else through gloo) on what they are doing and when each could start;
// a mismatch raises on every rank.
//
// Time: the collective starts at the latest start among the ranks, lasts
// what sim::CollectiveModel says for the ranks' global devices, and ends at
// the same virtual time on every rank's communication stream (one per
// device, as NCCL's). Work::wait() makes the current stream wait for it.
//
// Each collective runs to completion inside the call (the returned Work is
// complete as far as data goes); send/recv stay asynchronous until wait().
//
// CPU tensors (all of a call's, on every rank) go through the inner gloo
// backend as a gloo group would move them, with no modeled time: the group is
// registered for cpu too, so object collectives and host-side reductions
// work. A call mixing CPU and zion tensors is refused, naming the device it
// wanted.
//
// A world bigger than its processes (present_ranks.h): `present` names the
// group ranks that run; gloo moves the data among them alone (gloo rank =
// position among the present ranks), and every collective is priced for the
// whole group on the devices of all its ranks. What absent ranks contribute:
// - all_reduce, reduce, reduce_scatter: nothing; results reduce the present ranks';
// - all_gather, gather: an absent rank's piece is its counterpart's;
// - broadcast from an absent root: from its counterpart; reduce to or
//   gather at an absent root, scatter from one: no data moves;
// - all_to_all: a piece from an absent rank is the piece its counterpart
//   sends the receiver, when that has the size the receiver expects, else zeros;
// - send and recv with an absent peer are refused.

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <functional>
#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dist/handshake.h"
#include "dist/placement.h"
#include "dist/present_ranks.h"
#include "dist/work.h"
#include "sim/collective.h"

namespace zion::dist {

// One communication as this rank saw it on its timeline.
struct CommRecord {
  std::string op;  // the sim's name: all_reduce, all_gather, ..., send_recv
  std::string call;  // the torch.distributed call
  double bytes = 0;  // as the sim counts them (nccl-tests convention)
  std::vector<int> devices;
  std::string algorithm;
  sim::Seconds start = 0;
  sim::Seconds end = 0;
  int device = 0;  // local device index (zion:N)
  int stream = 0;  // the communication stream on it
  // NCCL's protocol ("LL", "LL128", "Simple") when the platform's NCCL tuning
  // model priced the call, which then also chose `algorithm`; empty when the
  // topology model priced it: an algorithm forced on the group, a link model
  // other than fair, the tuner off or a fabric it does not cover, ranks on
  // more than one node, all_to_all, gather/scatter, send/recv, one rank.
  std::string protocol;
};

// This rank's end of a send or recv (point_to_point.cpp).
struct TransferEnd {
  bool host = false;  // a CPU tensor: no modeled time
  c10::DeviceIndex device = -1;
  int comm = -1;  // the communication stream
  sim::Seconds start = 0;
  double bytes = 0;
};

// Runs f(arg) with the calling thread's Python GIL released, if the thread
// holds it. The Python module (zion_emu._C) sets it; in a C++ program
// without Python it stays unset, and f simply runs.
using WithoutGil = void (*)(void (*f)(void*), void* arg);
void set_without_gil(WithoutGil without_gil);

class ProcessGroupZion : public c10d::Backend {
 public:
  struct Options {
    int global_rank = 0;
    int local_rank = -1;  // LOCAL_RANK when known: the OAM
    int node_rank = -1;   // GROUP_RANK when known: the node
    std::string algorithm = "auto";
    std::string link_model = "fair";
    // The group ranks that run as processes (any order); empty: all of them.
    std::vector<int> present;
    // Group rank -> global rank, for the devices of absent ranks; empty: the same.
    std::vector<int> global_ranks;
    // The group's timeout: how long a handshake through shared memory waits
    // for the other ranks (gloo's own calls keep gloo's).
    std::chrono::milliseconds timeout{std::chrono::minutes(30)};
    // Makes the backend of a group split from this one (torch.distributed's
    // split_group, DeviceMesh with a bound device): given the split's store,
    // this rank's place in it, its size, its ranks' global ranks and its
    // timeout. Its inner gloo backend is a Python object (zion_emu.distributed
    // makes both); unset: the group cannot be split.
    std::function<c10::intrusive_ptr<c10d::Backend>(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    const std::vector<int>& global_ranks, double timeout_s)>
        make_split;
  };

  ProcessGroupZion(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<c10d::Backend> gloo, int rank, int size,
                   Options options);
  // Lets the inner gloo backend go with the GIL released (see the definition).
  ~ProcessGroupZion() override;

  const std::string getBackendName() const override { return "zion"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits, const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  // gather_scatter.cpp; all_to_all.cpp (with alltoall_base)
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;

  // coalescing.cpp: the fused calls of dist._coalescing_manager and
  // all_reduce_coalesced, each priced as one collective of the total size;
  // and NCCL-style start/endCoalescing (batch_isend_irecv), whose Work
  // ends when the last communication of the batch does.
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  bool supportsCoalescing() const override { return true; }
  // split_group: a group of `ranks` (this group's ranks, sorted) with the
  // same algorithm and link model; null on a rank that is not among them.
  bool supportsSplitting() const override { return true; }
  // split_group asks every split to number its collectives; this backend
  // numbers none (getSequenceNumberForGroup stays unsupported).
  void setSequenceNumberForGroup() override {}
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<c10d::Backend::Options>& opts) override;
  // destroy_process_group: a rank waiting in a handshake for this one is
  // told it left (the gloo handshake learns it from gloo's closed sockets).
  void shutdown() override;
  void abort() override { shutdown(); }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  // point_to_point.cpp
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;

  const RankPlacement& placement() const { return placement_; }
  const PresentRanks& present_ranks() const { return ranks_; }
  const Options& options() const { return options_; }
  // How the handshake travels: "shm" (all present ranks on one host) or "gloo".
  std::string handshake() const { return shm_ ? "shm" : "gloo"; }
  CommRecord last() const;

 private:
  // What a collective needs besides its side of the handshake.
  struct Plan {
    RankSide side;
    c10::DeviceIndex device = -1;  // local zion device; -1 for CPU tensors or when the tensors are wrong
    sim::CollectiveRequest request;  // op, bytes, root, link model, algorithm; devices come from the handshake
    std::vector<at::Tensor> outputs;
    c10d::OpType type = c10d::OpType::UNKNOWN;
  };
  // Moves a collective's data once the ranks have agreed on it.
  using MoveData = std::function<void(const Agreement& agreed)>;
  // Agrees with the other ranks, moves the data, prices the collective and
  // charges it on the communication stream.
  c10::intrusive_ptr<ZionWork> run(Plan plan, const MoveData& move_data);

  // gloo's call on the CPU views of a call's tensors, in place; null when
  // there is nothing to move (a reduce to an absent root).
  using ListCall = std::function<c10::intrusive_ptr<c10d::Work>(std::vector<at::Tensor>& tensors)>;
  // gloo's call on the CPU views of one output and one input tensor.
  using PairCall = std::function<c10::intrusive_ptr<c10d::Work>(at::Tensor& output, at::Tensor& input)>;
  // all_reduce, broadcast, reduce, all_reduce_coalesced: every tensor is an
  // input and an output, and the size is all of them.
  c10::intrusive_ptr<ZionWork> run_in_place(Plan p, std::vector<at::Tensor>& tensors, c10d::OpType type,
                                            const ListCall& gloo_call);
  // Output/input pairs moved one by one by `gloo_call`; the caller has set
  // the size and checked the pairs.
  c10::intrusive_ptr<ZionWork> run_pairs(Plan p, std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                         c10d::OpType type, const PairCall& gloo_call);
  // gloo's call on the CPU views of a rank's single tensor and its list of one
  // tensor per rank.
  using ListsCall = std::function<c10::intrusive_ptr<c10d::Work>(std::vector<at::Tensor>& singles,
                                                                 std::vector<std::vector<at::Tensor>>& lists)>;
  // all_gather (an input, a list of outputs) and reduce_scatter (an output, a
  // list of inputs): one list tensor per rank, each the size of the single one.
  c10::intrusive_ptr<ZionWork> run_list_collective(Call call, std::vector<at::Tensor>& singles,
                                                   std::vector<std::vector<at::Tensor>>& lists, int64_t reduce_op,
                                                   c10d::OpType type, const ListsCall& gloo_call);
  // all_gather_into_tensor and reduce_scatter_tensor, single or coalesced:
  // each pair's gathered side holds its other side x group size elements.
  // With absent ranks each pair goes through `list_call` (all_gather or
  // reduce_scatter of lists) on the present ranks' pieces instead.
  c10::intrusive_ptr<ZionWork> run_tensor_pairs(Call call, std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                int64_t reduce_op, c10d::OpType type, const PairCall& gloo_call,
                                                const ListsCall& list_call);
  // all_to_all.cpp: an all-to-all's elements (flat CPU views, counts as
  // agreed) moved among the present ranks, and the pieces from absent
  // ranks filled (process_group_zion.h's list at the top).
  void all_to_all_present(const at::Tensor& out, const at::Tensor& in, const Agreement& agreed,
                          const c10d::AllToAllOptions& opts);

  // point_to_point.cpp: this rank's end of a send or recv of `t`, its issue
  // charged on the communication stream; then, once the peer's end is
  // known, the transfer priced, charged there and recorded.
  TransferEnd transfer_end(const at::Tensor& t);
  sim::Seconds charge_transfer(const char* call, const TransferEnd& mine, int src_device, int dst_device,
                               sim::Seconds peer_start);

  Plan plan(Call call, sim::CollectiveOp op, const std::vector<at::Tensor>& tensors);
  // Empty when `root` is a rank of the group, else what is wrong.
  std::string root_problem(const char* call, int64_t root) const;
  // Empty when `device` (a zion tensor's) is this rank's OAM, or the rank's
  // OAM is not known (no LOCAL_RANK) or the group has one rank; else why not.
  std::string device_problem(const char* call, c10::DeviceIndex device) const;
  // The exact bytes each rank sends each other one, from the agreed counts of
  // an all_to_all; empty when every pair moves the same amount.
  static std::vector<std::vector<double>> uneven_all_to_all_bytes(const Agreement& agreed, double element_bytes);
  // Returns `work`, also collected into the batch while coalescing.
  c10::intrusive_ptr<ZionWork> collect(c10::intrusive_ptr<ZionWork> work);
  // point_to_point.cpp: returns `work` (a send or recv), held by the group
  // until it completes, so that one whose Work the script drops unwaited
  // still moves its bytes, as NCCL's do; those done are let go at the next
  // send or recv, the rest at shutdown.
  c10::intrusive_ptr<c10d::Work> keep_in_flight(c10::intrusive_ptr<ZionWork> work);
  // point_to_point.cpp: empty while group rank `rank`'s process runs (or
  // when that cannot be told: ranks on several hosts), else how it ended.
  std::string peer_gone(int rank) const;
  int comm_stream(c10::DeviceIndex device);
  sim::Seconds local_start(c10::DeviceIndex device, int comm);
  sim::CollectiveResult price(const sim::CollectiveRequest& request) const;
  uint32_t count_traffic(const sim::CollectiveRequest& request, const sim::CollectiveResult& priced) const;
  void record(CommRecord r);

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Backend> gloo_;
  Options options_;
  std::unique_ptr<ShmHandshake> shm_;  // null: the handshake goes through gloo
  RankPlacement placement_;
  PresentRanks ranks_;
  sim::Algorithm algorithm_;
  sim::LinkModel link_model_;

  mutable std::mutex mutex_;  // comm streams, sequence numbers, the last record
  std::map<int, int> comm_streams_;  // local device -> its communication stream
  // Point-to-point, per (peer, tag): transfers are paired in issue order
  // within a tag, as gloo and NCCL pair them.
  std::map<std::pair<int, int>, int64_t> send_seq_, recv_seq_;
  // Per (source, tag): ready once the last receive from it is posted to gloo
  // (point_to_point.cpp), so later ones are posted after it.
  std::map<std::pair<int, int>, std::shared_future<void>> pending_recv_;
  std::vector<c10::intrusive_ptr<ZionWork>> in_flight_p2p_;  // keep_in_flight's
  bool coalescing_ = false;
  std::vector<c10::intrusive_ptr<ZionWork>> batch_;  // works since startCoalescing
  CommRecord last_;
  // torch 2.13's splitGroup splits the group once per device type it is
  // registered for (zion and cpu), with one store: the second call gets the
  // backend the first made, whose inner gloo has rendezvoused there.
  std::mutex split_mutex_;  // held while the split is made (its gloo rendezvous)
  const c10d::Store* last_split_store_ = nullptr;
  std::optional<c10::weak_intrusive_ptr<c10d::Backend>> last_split_;
};

}  // namespace zion::dist
