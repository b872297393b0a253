#include "dist/process_group_zion.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <numeric>
#include <stdexcept>

#include "device/runtime/runtime.h"
#include "device/runtime/stream.h"
#include "dist/gloo_thread_state.h"
#include "dist/tensor_lists.h"

namespace zion::dist {
namespace {

// The collective model of the device's platform. set_platform replaces the
// runtime, so the model follows the runtime it was built from.
std::shared_ptr<const sim::CollectiveModel> collective_model() {
  static std::mutex mutex;
  static const device::Runtime* built_for = nullptr;
  static std::shared_ptr<const sim::CollectiveModel> model;
  std::lock_guard<std::mutex> lock(mutex);
  device::Runtime& rt = device::runtime();
  if (built_for != &rt || !model) {
    model = std::make_shared<sim::CollectiveModel>(rt.platform);
    built_for = &rt;
  }
  return model;
}

// Empty when `t` can take part in `call` on `device` (-1: any zion device),
// or as a CPU tensor when `host`; else why not, in the user's words.
std::string tensor_problem(const at::Tensor& t, Call call, c10::DeviceIndex device, bool host) {
  const std::string zion = c10::get_privateuse1_backend();
  std::string where = std::string("zion backend: ") + call_name(call) + ": ";
  if (!t.defined()) return where + "got an undefined tensor";
  if (!host && !t.device().is_privateuseone()) {
    return where + "got a tensor on " + t.device().str() + ", but a '" + zion + "' process group moves " + zion +
           " tensors (wanted device '" + zion + "'; move it with tensor.to('" + zion + "'); only a call whose tensors are all "
           "on the CPU goes through gloo, unmodeled)";
  }
  if (!host && device >= 0 && t.device().index() != device) {
    return where + "tensors on " + zion + ":" + std::to_string(device) + " and " + t.device().str() +
           "; one collective works on one device per rank";
  }
  if (t.layout() != c10::kStrided) return where + "sparse tensors are not supported yet";
  // An element-wise call takes a tensor dense in its own memory format
  // (channels_last), as NCCL does; the others, whose tensors are cut into or
  // stacked from pieces, take contiguous ones.
  const bool element_wise = call == Call::kAllReduce || call == Call::kBroadcast || call == Call::kReduce;
  if (element_wise ? !t.is_contiguous(t.suggest_memory_format()) : !t.is_contiguous()) {
    return where + (element_wise ? "needs tensors dense in their memory format (contiguous or channels_last), as NCCL "
                                   "does; call .contiguous() first"
                                 : "needs contiguous tensors, as NCCL does; call .contiguous() first");
  }
  return {};
}

// Whether the counts are not all the same.
bool uneven(const std::vector<int64_t>& counts) {
  return std::any_of(counts.begin(), counts.end(), [&](int64_t c) { return c != counts[0]; });
}

}  // namespace

namespace {
std::atomic<WithoutGil> g_without_gil{nullptr};
}  // namespace

void set_without_gil(WithoutGil without_gil) { g_without_gil.store(without_gil); }

// gloo's destructor waits for its queued work and joins its worker threads.
// A worker that has just finished a work then drops it, and with it the last
// reference to any tensor of it whose Python object outlived Python's own
// references (torch keeps such an object alive from C++): letting that
// object go takes the GIL. When the group's last reference goes from Python
// (DDP's reducer collected at the end of a script, holding the GIL), the
// join would wait for a worker that waits for the GIL: the process hung at
// exit. So gloo goes with the GIL released; the other members go as usual.
ProcessGroupZion::~ProcessGroupZion() {
  WithoutGil without_gil = g_without_gil.load();
  if (without_gil && gloo_) {
    without_gil([](void* self) { static_cast<ProcessGroupZion*>(self)->gloo_.reset(); }, this);
  }
}

ProcessGroupZion::ProcessGroupZion(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<c10d::Backend> gloo, int rank,
                                   int size, Options options)
    : Backend(rank, size), store_(std::move(store)), gloo_(std::move(gloo)), options_(std::move(options)) {
  TORCH_CHECK(gloo_, "zion backend: needs a gloo backend to move the data");
  const sim::Platform& platform = device::runtime().platform;
  placement_ = place_rank(platform, options_.global_rank, options_.local_rank, options_.node_rank);
  TORCH_CHECK_VALUE(options_.global_ranks.empty() || static_cast<int>(options_.global_ranks.size()) == size,
                    "zion backend: ", options_.global_ranks.size(), " global ranks for a group of ", size);
  // The devices of absent ranks: where their global rank sits on the
  // platform (node by node), as a process of that rank would be placed by
  // `zion-emu run`. Present ranks say their own in the handshake.
  std::vector<int> present = options_.present;
  std::sort(present.begin(), present.end());
  std::vector<int> devices(size, -1);
  for (int g = 0; g < size; ++g) {
    if (present.empty() || std::binary_search(present.begin(), present.end(), g)) continue;
    int global = options_.global_ranks.empty() ? g : options_.global_ranks[g];
    devices[g] = place_rank(platform, global, -1, -1).device;
  }
  ranks_ = PresentRanks::make(size, present, std::move(devices));
  TORCH_CHECK_VALUE(ranks_.is_present(rank), "zion backend: rank ", rank, " runs, but the group's present ranks are ",
                    ranks_.present_list());
  try {
    algorithm_ = sim::parse_algorithm(options_.algorithm);
    link_model_ = sim::parse_link_model(options_.link_model);
    shm_ = ShmHandshake::connect(*store_, ranks_.gloo_rank[rank], ranks_.present, handshake_words(size), options_.timeout);
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, "zion backend: ", e.what());
  }
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupZion::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                         const std::vector<int>& ranks,
                                                         const c10::intrusive_ptr<c10d::Backend::Options>& opts) {
  auto me = std::find(ranks.begin(), ranks.end(), getRank());
  if (me == ranks.end()) return nullptr;
  TORCH_CHECK(ranks_.all(), "zion backend: split_group needs every rank of the group to run as a process; its present "
              "ranks are ", ranks_.present_list(), " of ", getSize(), ". Make the subgroup with new_group instead");
  TORCH_CHECK(options_.make_split, "zion backend: this group was made without a way to split it; groups made by "
              "torch.distributed (init_process_group, new_group) can be split");
  std::vector<int> global;
  for (int r : ranks) {
    TORCH_CHECK_VALUE(r >= 0 && r < getSize(), "zion backend: split_group: rank ", r, " is not a rank of the group (0..",
                      getSize() - 1, ")");
    global.push_back(options_.global_ranks.empty() ? r : options_.global_ranks[r]);
  }
  std::lock_guard<std::mutex> lock(split_mutex_);
  if (last_split_ && last_split_store_ == store.get()) {
    if (auto made = last_split_->lock()) return made;
  }
  const std::chrono::milliseconds timeout = opts ? opts->timeout : options_.timeout;
  auto made = options_.make_split(store, static_cast<int>(me - ranks.begin()), static_cast<int>(ranks.size()), global,
                                  static_cast<double>(timeout.count()) / 1000.0);
  last_split_store_ = store.get();
  last_split_.emplace(made);
  return made;
}

void ProcessGroupZion::shutdown() {
  if (shm_) shm_->leave();
  std::vector<c10::intrusive_ptr<ZionWork>> held;  // their transfers hold the group: let them go
  {
    std::lock_guard<std::mutex> lock(mutex_);
    held.swap(in_flight_p2p_);
  }
}

int ProcessGroupZion::comm_stream(c10::DeviceIndex device) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = comm_streams_.find(device);
  if (it == comm_streams_.end()) {
    it = comm_streams_.emplace(device, static_cast<int>(device::new_stream(device).id())).first;
  }
  return it->second;
}

// The earliest this rank's communication can begin: after the work already
// on the current stream (it wrote the inputs), after the communication
// stream's previous collective, and after the host has issued it.
sim::Seconds ProcessGroupZion::local_start(c10::DeviceIndex device, int comm) {
  device::Runtime& rt = device::runtime();
  int current = static_cast<int>(device::current_stream(device).id());
  return std::max({rt.timeline.stream_time(device, current), rt.timeline.stream_time(device, comm),
                   rt.timeline.host() + rt.platform.oam.launch_overhead});
}

sim::CollectiveResult ProcessGroupZion::price(const sim::CollectiveRequest& request) const {
  try {
    return collective_model()->run(request);
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK(false, "zion backend: the collective model refused ", sim::collective_op_name(request.op), ": ", e.what());
  }
}

// Every rank counts its share (1/n) of the collective's link traffic, so the
// link counters of all ranks add up to the traffic of the whole collective.
// Returns the link classes it crosses (bit c for class c).
uint32_t ProcessGroupZion::count_traffic(const sim::CollectiveRequest& request, const sim::CollectiveResult& priced) const {
  if (request.devices.size() < 2) return 0;
  std::vector<double> bytes = collective_model()->link_class_bytes(request, priced.algorithm);
  device::Runtime& rt = device::runtime();
  const auto& classes = rt.topology.link_classes();
  double share = 1.0 / static_cast<double>(request.devices.size());
  uint32_t crossed = 0;
  for (size_t c = 0; c < bytes.size() && c < classes.size(); ++c) {
    if (bytes[c] <= 0) continue;
    rt.timeline.count_link(static_cast<int>(c), bytes[c] * share, bytes[c] * share / classes[c].bandwidth);
    crossed |= c < 32 ? 1u << c : 0u;
  }
  return crossed;
}

void ProcessGroupZion::record(CommRecord r) {
  std::lock_guard<std::mutex> lock(mutex_);
  last_ = std::move(r);
}

CommRecord ProcessGroupZion::last() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_;
}

ProcessGroupZion::Plan ProcessGroupZion::plan(Call call, sim::CollectiveOp op, const std::vector<at::Tensor>& tensors) {
  Plan p;
  p.side.call = call;
  p.side.device = placement_.device;
  p.request.op = op;
  p.request.algorithm = algorithm_;
  p.request.link_model = link_model_;
  if (tensors.empty()) note(p.side.error, std::string("zion backend: ") + call_name(call) + ": got no tensors");
  // A call whose tensors are all on the CPU is a host call (gloo, unmodeled).
  p.side.host = !tensors.empty() && std::all_of(tensors.begin(), tensors.end(), [](const at::Tensor& t) {
    return t.defined() && t.device().is_cpu();
  });
  p.side.storage_less = any_storage_less(tensors);
  for (const auto& t : tensors) {
    std::string problem = tensor_problem(t, call, p.device, p.side.host);
    if (!problem.empty()) {
      note(p.side.error, problem);
      continue;
    }
    if (p.side.dtype < 0) {
      if (!p.side.host) p.device = t.device().index();
      p.side.dtype = static_cast<int>(t.scalar_type());
    } else if (static_cast<int>(t.scalar_type()) != p.side.dtype) {
      note(p.side.error, std::string("zion backend: ") + call_name(call) + ": tensors of different dtypes (" +
                             c10::toString(static_cast<c10::ScalarType>(p.side.dtype)) + " and " + c10::toString(t.scalar_type()) + ")");
    }
  }
  if (!p.side.host) note(p.side.error, device_problem(call_name(call), p.device));
  return p;
}

std::string ProcessGroupZion::device_problem(const char* call, c10::DeviceIndex device) const {
  if (device < 0 || options_.local_rank < 0 || getSize() < 2 || device == placement_.oam) return {};
  const std::string zion = c10::get_privateuse1_backend();
  return std::string("zion backend: ") + call + ": this rank (LOCAL_RANK " + std::to_string(options_.local_rank) +
         ") is OAM " + std::to_string(placement_.oam) + " of its node, " + zion + ":" + std::to_string(placement_.oam) +
         ", but its tensors are on " + zion + ":" + std::to_string(device) +
         ". In a group of several ranks each rank uses the device of its LOCAL_RANK, as NCCL needs one GPU per "
         "rank: call torch." + zion + ".set_device(int(os.environ['LOCAL_RANK'])) (torch.cuda.set_device under "
         "--cuda-compat) before making the tensors. A rank started by torch.multiprocessing.spawn inherits its "
         "parent's LOCAL_RANK: set os.environ['LOCAL_RANK'] to the rank's device before init_process_group";
}

std::string ProcessGroupZion::root_problem(const char* call, int64_t root) const {
  if (root >= 0 && root < getSize()) return {};
  return std::string("zion backend: ") + call + ": root " + std::to_string(root) + " is not a rank of this group (0.." +
         std::to_string(getSize() - 1) + ")";
}

std::vector<std::vector<double>> ProcessGroupZion::uneven_all_to_all_bytes(const Agreement& agreed, double element_bytes) {
  const auto& first = agreed.sides[0].send_counts;
  bool even = !first.empty();
  for (const auto& s : agreed.sides) {
    even = even && std::all_of(s.send_counts.begin(), s.send_counts.end(), [&](int64_t c) { return c == first[0]; });
  }
  std::vector<std::vector<double>> matrix;
  if (even) return matrix;
  for (const auto& s : agreed.sides) {
    std::vector<double> row;
    for (int64_t c : s.send_counts) row.push_back(element_bytes * static_cast<double>(c));
    matrix.push_back(std::move(row));
  }
  return matrix;
}

c10::intrusive_ptr<ZionWork> ProcessGroupZion::collect(c10::intrusive_ptr<ZionWork> work) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (coalescing_) batch_.push_back(work);
  return work;
}

c10::intrusive_ptr<ZionWork> ProcessGroupZion::run(Plan p, const MoveData& move_data) {
  int comm = -1;
  if (p.side.error.empty() && !p.side.host) {
    comm = comm_stream(p.device);
    p.side.start = local_start(p.device, comm);
  }
  Agreement agreed;
  {
    WithoutPythonObjectsInTls gloo_calls;
    agreed = agree(*gloo_, shm_.get(), getRank(), ranks_, p.side);
    // Timing-only mode: storage-less tensors have no payload to move; the
    // ranks agreed on everything the model needs all the same.
    if (agreed.payload) {
      move_data(agreed);
    } else {
      forget_values(p.outputs);
    }
  }
  if (p.side.host) {
    // CPU tensors: moved as a gloo group would, on no modeled timeline.
    return collect(c10::make_intrusive<ZionWork>(getRank(), p.type, -1, -1, sim::Seconds{0}, std::move(p.outputs)));
  }

  p.request.devices = agreed.devices;
  if (p.side.call == Call::kAllToAllSingle || p.side.call == Call::kAllToAll) {
    // Uneven splits: the exact bytes each rank sends each other rank, and the
    // largest per-rank input as the size. Even ones keep the closed form (and
    // equal sim.collective_time for the size).
    double element = static_cast<double>(c10::elementSize(static_cast<c10::ScalarType>(p.side.dtype)));
    p.request.all_to_all_bytes = uneven_all_to_all_bytes(agreed, element);
    if (!p.request.all_to_all_bytes.empty()) {
      double largest = 0;
      for (const auto& row : p.request.all_to_all_bytes) largest = std::max(largest, std::accumulate(row.begin(), row.end(), 0.0));
      p.request.bytes = largest;
    }
  }
  if (p.side.call == Call::kReduceScatter && uneven(agreed.sides[0].send_counts)) {
    // ProcessGroupNCCL runs a reduce_scatter of uneven entries as one reduce
    // per rank (to that rank, of its entry) in one group; a group is priced
    // as one collective of all its bytes (coalescing.cpp): a reduce of the
    // whole input.
    p.request.op = sim::CollectiveOp::kReduce;
    p.request.root = 0;
  }
  if (p.side.call == Call::kAllGather && uneven(agreed.sides[0].recv_counts)) {
    // Likewise an all_gather of uneven entries: one broadcast per rank (from
    // that rank, of its input) in one group, priced as a broadcast of the
    // whole output.
    p.request.op = sim::CollectiveOp::kBroadcast;
    p.request.root = 0;
  }
  sim::CollectiveResult priced = price(p.request);

  device::Runtime& rt = device::runtime();
  uint32_t classes = count_traffic(p.request, priced);
  sim::Interval in = rt.timeline.launch(p.device, comm, rt.platform.oam.launch_overhead, priced.time, agreed.start,
                                        sim::Activity::kCommunication,
                                        rt.timeline.label(sim::collective_op_name(p.request.op)), classes);
  CommRecord r;
  r.op = sim::collective_op_name(p.request.op);
  r.call = call_name(p.side.call);
  r.bytes = p.request.bytes;
  r.devices = agreed.devices;
  r.algorithm = sim::algorithm_name(priced.algorithm);
  r.protocol = priced.protocol;
  r.start = in.start;
  r.end = in.end;
  r.device = p.device;
  r.stream = comm;
  record(std::move(r));
  return collect(c10::make_intrusive<ZionWork>(getRank(), p.type, p.device, comm, in.end, std::move(p.outputs)));
}

c10::intrusive_ptr<ZionWork> ProcessGroupZion::run_in_place(Plan p, std::vector<at::Tensor>& tensors, c10d::OpType type,
                                                          const ListCall& gloo_call) {
  p.side.numel = numel(tensors);
  p.request.bytes = nbytes(tensors);
  p.outputs = tensors;
  p.type = type;
  return run(std::move(p), [&](const Agreement&) {
    auto data = gloo_views(tensors);
    if (auto work = gloo_call(data)) work->wait();
  });
}

c10::intrusive_ptr<ZionWork> ProcessGroupZion::run_pairs(Plan p, std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                       c10d::OpType type, const PairCall& gloo_call) {
  p.outputs = outputs;
  p.type = type;
  return run(std::move(p), [&](const Agreement&) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      at::Tensor out = gloo_view(outputs[i]), in = gloo_view(inputs[i]);
      gloo_call(out, in)->wait();
    }
  });
}

c10::intrusive_ptr<ZionWork> ProcessGroupZion::run_tensor_pairs(Call call, std::vector<at::Tensor>& outputs,
                                                              std::vector<at::Tensor>& inputs, int64_t reduce_op,
                                                              c10d::OpType type, const PairCall& gloo_call,
                                                              const ListsCall& list_call) {
  const bool gathers = call == Call::kAllGatherIntoTensor || call == Call::kAllGatherIntoTensorCoalesced;
  const bool coalesced = call == Call::kAllGatherIntoTensorCoalesced || call == Call::kReduceScatterTensorCoalesced;
  const std::string name = std::string(gathers ? "all_gather_into_tensor" : "reduce_scatter_tensor") + (coalesced ? " (coalesced)" : "");
  std::vector<at::Tensor> all = outputs;
  all.insert(all.end(), inputs.begin(), inputs.end());
  Plan p = plan(call, gathers ? sim::CollectiveOp::kAllGather : sim::CollectiveOp::kReduceScatter, all);
  if (outputs.size() != inputs.size()) {
    note(p.side.error, "zion backend: " + name + ": " + std::to_string(outputs.size()) + " outputs for " +
                           std::to_string(inputs.size()) + " inputs; pass one output per input");
  }
  // The gathered side: an all_gather's output, a reduce_scatter's input.
  const std::vector<at::Tensor>& whole = gathers ? outputs : inputs;
  const std::vector<at::Tensor>& part = gathers ? inputs : outputs;
  const char* whole_kind = gathers ? "output" : "input";
  for (size_t i = 0; p.side.error.empty() && i < whole.size(); ++i) {
    const std::string whole_name = coalesced ? whole_kind + (" " + std::to_string(i)) : std::string("the ") + whole_kind;
    note(p.side.error, group_multiple_problem(name, whole_name, whole[i].numel(), gathers ? "input" : "output", part[i].numel(),
                                              getSize()));
  }
  p.side.numel = numel(part);
  p.side.reduce_op = reduce_op;
  p.request.bytes = nbytes(whole);  // nccl-tests counts all_gather's output, reduce_scatter's input
  // Flat, as NCCL reads them: an output stacked as (ranks, n) gathers as one of ranks x n.
  PairCall flat = [&](at::Tensor& out, at::Tensor& in) {
    at::Tensor flat_out = out.view({-1}), flat_in = in.view({-1});
    return gloo_call(flat_out, flat_in);
  };
  if (ranks_.all()) return run_pairs(std::move(p), outputs, inputs, type, flat);
  // Absent ranks: the present ranks' pieces of the gathered side, as lists;
  // an all_gather's pieces of absent ranks are their counterparts'.
  PairCall present_pieces = [&](at::Tensor& out, at::Tensor& in) {
    at::Tensor& part = gathers ? in : out;
    std::vector<at::Tensor> pieces = rank_pieces(gathers ? out : in, getSize(), part);
    std::vector<at::Tensor> singles{part};
    std::vector<std::vector<at::Tensor>> lists{present_entries(ranks_, pieces)};
    auto work = list_call(singles, lists);
    work->wait();
    if (gathers) copy_counterparts(ranks_, pieces);
    return work;
  };
  return run_pairs(std::move(p), outputs, inputs, type, present_pieces);
}

c10::intrusive_ptr<ZionWork> ProcessGroupZion::run_list_collective(Call call, std::vector<at::Tensor>& singles,
                                                                 std::vector<std::vector<at::Tensor>>& lists, int64_t reduce_op,
                                                                 c10d::OpType type, const ListsCall& gloo_call) {
  const bool gathers = call == Call::kAllGather;
  const std::string name = call_name(call);
  const char* single_kind = gathers ? "input" : "output";
  const char* list_kind = gathers ? "output" : "input";
  std::vector<at::Tensor> all = singles;
  for (const auto& list : lists) all.insert(all.end(), list.begin(), list.end());
  Plan p = plan(call, gathers ? sim::CollectiveOp::kAllGather : sim::CollectiveOp::kReduceScatter, all);
  p.side.reduce_op = reduce_op;
  if (singles.size() != 1 || lists.size() != 1) {
    note(p.side.error, "zion backend: " + name + " takes one " + single_kind + " tensor and one " + list_kind + " list per rank");
  } else if (static_cast<int>(lists[0].size()) != getSize()) {
    note(p.side.error, "zion backend: " + name + ": the " + list_kind + " list has " + std::to_string(lists[0].size()) +
                           " tensors; the group has " + std::to_string(getSize()) + " ranks");
  } else if (gathers) {
    // Entry j of every rank's output list receives rank j's input. The
    // entries may differ in size, as NCCL allows (not gloo); the ranks agree
    // on every entry's size (handshake.cpp), and run() prices an uneven list
    // the way NCCL runs it.
    const int64_t own = lists[0][getRank()].defined() ? lists[0][getRank()].numel() : 0;
    if (own != singles[0].numel()) {
      note(p.side.error, "zion backend: " + name + ": the output list's entry for this rank (index " +
                             std::to_string(getRank()) + ") has " + std::to_string(own) + " elements; the input has " +
                             std::to_string(singles[0].numel()));
    }
    p.side.send_counts.assign(lists[0].size(), singles[0].numel());
    for (const auto& t : lists[0]) p.side.recv_counts.push_back(t.defined() ? t.numel() : 0);
    p.side.numel = std::accumulate(p.side.recv_counts.begin(), p.side.recv_counts.end(), int64_t{0});
    p.request.bytes = nbytes(lists[0]);  // nccl-tests counts the gathered side: n x the single tensor when even
    p.outputs = lists[0];
  } else {
    // reduce_scatter: entry j of every rank's input list is reduced into rank
    // j's output. The entries may differ in size, as gloo and NCCL allow; the
    // ranks agree on every entry's size (handshake.cpp), and run() prices an
    // uneven list the way NCCL runs it.
    const int64_t own = lists[0][getRank()].defined() ? lists[0][getRank()].numel() : 0;
    if (own != singles[0].numel()) {
      note(p.side.error, "zion backend: " + name + ": the input list's entry for this rank (index " +
                             std::to_string(getRank()) + ") has " + std::to_string(own) + " elements; the output has " +
                             std::to_string(singles[0].numel()));
    }
    for (const auto& t : lists[0]) p.side.send_counts.push_back(t.defined() ? t.numel() : 0);
    p.side.recv_counts.assign(lists[0].size(), singles[0].numel());
    p.side.numel = std::accumulate(p.side.send_counts.begin(), p.side.send_counts.end(), int64_t{0});
    p.request.bytes = nbytes(lists[0]);  // nccl-tests counts reduce_scatter's input
    p.outputs = singles;
  }
  p.type = type;
  return run(std::move(p), [&](const Agreement& agreed) {
    auto single_views = flat_gloo_views(singles);
    std::vector<at::Tensor> per_rank = flat_gloo_views(lists[0]);
    // Absent ranks: gloo sees the present ranks' entries; an all_gather's
    // entries of absent ranks are their counterparts'.
    if (gathers && uneven(agreed.sides[0].recv_counts)) {
      // gloo gathers equal pieces only: as ProcessGroupNCCL does, one
      // broadcast per rank, from that rank, of its input into entry j.
      TORCH_CHECK(ranks_.all(), "zion backend: ", name, ": entries of different sizes need every rank of the group "
                  "to run; present ranks are ", ranks_.present_list(), " of ", getSize(),
                  ". Pass entries of one size, or run every rank");
      per_rank[getRank()].copy_(single_views[0].reshape(per_rank[getRank()].sizes()));
      for (int j = 0; j < getSize(); ++j) {
        std::vector<at::Tensor> entry{per_rank[j]};
        c10d::BroadcastOptions from_j;
        from_j.rootRank = j;
        gloo_->broadcast(entry, from_j)->wait();
      }
      return;
    }
    std::vector<std::vector<at::Tensor>> list_views{ranks_.all() ? per_rank : present_entries(ranks_, per_rank)};
    gloo_call(single_views, list_views)->wait();
    if (!ranks_.all() && gathers) copy_counterparts(ranks_, per_rank);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZion::allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  Plan p = plan(Call::kAllReduce, sim::CollectiveOp::kAllReduce, tensors);
  p.side.reduce_op = static_cast<int64_t>(opts.reduceOp.op_);
  return run_in_place(std::move(p), tensors, c10d::OpType::ALLREDUCE,
                      [&](std::vector<at::Tensor>& data) { return gloo_->allreduce(data, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZion::broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  Plan p = plan(Call::kBroadcast, sim::CollectiveOp::kBroadcast, tensors);
  p.side.root = opts.rootRank;
  p.request.root = static_cast<int>(opts.rootRank);
  note(p.side.error, root_problem("broadcast", opts.rootRank));
  return run_in_place(std::move(p), tensors, c10d::OpType::BROADCAST, [&](std::vector<at::Tensor>& data) {
    c10d::BroadcastOptions gloo_opts = opts;
    gloo_opts.rootRank = ranks_.gloo_rank_for(static_cast<int>(opts.rootRank));  // an absent root's counterpart
    return gloo_->broadcast(data, gloo_opts);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZion::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  Plan p = plan(Call::kReduce, sim::CollectiveOp::kReduce, tensors);
  p.side.root = opts.rootRank;
  p.side.reduce_op = static_cast<int64_t>(opts.reduceOp.op_);
  p.request.root = static_cast<int>(opts.rootRank);
  note(p.side.error, root_problem("reduce", opts.rootRank));
  return run_in_place(std::move(p), tensors, c10d::OpType::REDUCE,
                      [&](std::vector<at::Tensor>& data) -> c10::intrusive_ptr<c10d::Work> {
                        if (!ranks_.is_present(static_cast<int>(opts.rootRank))) return {};  // no present rank receives it
                        c10d::ReduceOptions gloo_opts = opts;
                        gloo_opts.rootRank = ranks_.gloo_rank[opts.rootRank];
                        return gloo_->reduce(data, gloo_opts);
                      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZion::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                           std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  return run_list_collective(Call::kAllGather, inputs, outputs, -1, c10d::OpType::ALLGATHER,
                             [&](std::vector<at::Tensor>& in, std::vector<std::vector<at::Tensor>>& out) {
                               return gloo_->allgather(out, in, opts);
                             });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZion::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                 const c10d::AllgatherOptions& opts) {
  std::vector<at::Tensor> outputs{output}, inputs{input};
  return run_tensor_pairs(Call::kAllGatherIntoTensor, outputs, inputs, -1, c10d::OpType::_ALLGATHER_BASE,
                          [&](at::Tensor& out, at::Tensor& in) { return gloo_->_allgather_base(out, in, opts); },
                          [&](std::vector<at::Tensor>& in, std::vector<std::vector<at::Tensor>>& out) {
                            return gloo_->allgather(out, in, opts);
                          });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZion::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                                const c10d::ReduceScatterOptions& opts) {
  return run_list_collective(Call::kReduceScatter, outputs, inputs, static_cast<int64_t>(opts.reduceOp.op_),
                             c10d::OpType::REDUCE_SCATTER,
                             [&](std::vector<at::Tensor>& out, std::vector<std::vector<at::Tensor>>& in) {
                               return gloo_->reduce_scatter(out, in, opts);
                             });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZion::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                      const c10d::ReduceScatterOptions& opts) {
  std::vector<at::Tensor> outputs{output}, inputs{input};
  return run_tensor_pairs(Call::kReduceScatterTensor, outputs, inputs, static_cast<int64_t>(opts.reduceOp.op_),
                          c10d::OpType::_REDUCE_SCATTER_BASE,
                          [&](at::Tensor& out, at::Tensor& in) { return gloo_->_reduce_scatter_base(out, in, opts); },
                          [&](std::vector<at::Tensor>& out, std::vector<std::vector<at::Tensor>>& in) {
                            return gloo_->reduce_scatter(out, in, opts);
                          });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZion::barrier(const c10d::BarrierOptions& opts) {
  // As NCCL does it: an all-reduce of one byte, priced as such.
  c10::DeviceIndex device = device::current_device();
  if (opts.device.has_value() && opts.device->is_privateuseone() && opts.device->has_index()) device = opts.device->index();
  Plan p;
  p.side.call = Call::kBarrier;
  p.side.device = placement_.device;
  p.side.dtype = static_cast<int>(at::kByte);
  p.device = device;
  p.request.op = sim::CollectiveOp::kAllReduce;
  p.request.algorithm = algorithm_;
  p.request.link_model = link_model_;
  p.side.numel = 0;
  p.request.bytes = 1;
  p.type = c10d::OpType::BARRIER;
  auto work = run(std::move(p), [&](const Agreement&) {
    c10d::BarrierOptions gloo_opts;
    gloo_opts.timeout = opts.timeout;
    gloo_->barrier(gloo_opts)->wait();
  });
  work->hold_host();
  return work;
}

}  // namespace zion::dist
