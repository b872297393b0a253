// send / recv of ProcessGroupZion. The bytes go through gloo; the times go
// through the group's store: each side writes when its transfer could start
// and how many bytes it moves, under a key numbered per (sender, receiver)
// pair, and reads the other side's. The transfer then starts at the later of
// the two, lasts sim's send_recv time between the two devices and ends at the
// same virtual time on both. Sizes are checked before gloo sees the receive
// (gloo aborts the process on a size mismatch): both sides raise.
//
// Neither call blocks, as gloo's and NCCL's do not: a receive whose sender
// has not issued its send yet is posted to gloo from a helper thread once
// it has (in issue order per source, so gloo matches them as issued). A ring
// of irecv-then-isend (batch_isend_irecv) therefore does not deadlock.
//
// CPU tensors take the same path without modeled time.

#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>

#include "device/runtime.h"
#include "device/stream.h"
#include "dist/gloo_thread_state.h"
#include "dist/process_group_zion.h"
#include "dist/tensor_lists.h"

namespace zion::dist {
namespace {

struct PeerSide {
  double start = 0;
  double bytes = 0;
  double device = 0;
  double host = 0;  // 1: a CPU tensor
};

std::vector<uint8_t> encode(const PeerSide& s) {
  std::vector<uint8_t> out(sizeof(PeerSide));
  std::memcpy(out.data(), &s, sizeof(PeerSide));
  return out;
}

PeerSide decode(const std::vector<uint8_t>& bytes) {
  PeerSide s;
  TORCH_CHECK(bytes.size() == sizeof(PeerSide), "zion backend: a malformed send/recv record in the store");
  std::memcpy(&s, bytes.data(), sizeof(PeerSide));
  return s;
}

const char* where(double host) { return host != 0 ? "a CPU tensor" : "a zion tensor"; }

// The single tensor of a send or recv (zion, or CPU for an unmodeled
// transfer), or an error naming it.
const at::Tensor& only_tensor(const std::vector<at::Tensor>& tensors, const char* call) {
  TORCH_CHECK(tensors.size() == 1, "zion backend: ", call, " takes exactly one tensor, got ", tensors.size());
  const at::Tensor& t = tensors[0];
  const std::string zion = c10::get_privateuse1_backend();
  TORCH_CHECK(t.defined() && (t.device().is_privateuseone() || t.device().is_cpu()), "zion backend: ", call,
              ": got a tensor on ", t.defined() ? t.device().str() : "nothing", ", but a '", zion, "' process group moves ",
              zion, " tensors (wanted device '", zion, "'; move it with tensor.to('", zion, "'))");
  TORCH_CHECK(t.layout() == c10::kStrided && t.is_contiguous(), "zion backend: ", call, " needs a dense contiguous tensor");
  return t;
}

std::string key(int src, int dst, int64_t seq, const char* side) {
  return "zion/p2p/" + std::to_string(src) + ">" + std::to_string(dst) + "/" + std::to_string(seq) + "/" + side;
}

// A receive posted to gloo, and what its sender said.
struct PostedRecv {
  c10::intrusive_ptr<c10d::Work> gloo;
  PeerSide sender;
};

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupZion::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  const at::Tensor& t = only_tensor(tensors, "send");
  TORCH_CHECK(dst >= 0 && dst < getSize() && dst != getRank(), "zion backend: send to rank ", dst,
              " is not another rank of this group (0..", getSize() - 1, ")");
  const bool host = t.device().is_cpu();
  c10::DeviceIndex device = host ? -1 : t.device().index();
  int comm = host ? -1 : comm_stream(device);
  int64_t seq;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    seq = send_seq_[dst]++;
  }
  PeerSide mine{host ? 0 : local_start(device, comm), static_cast<double>(t.numel()) * t.element_size(),
                static_cast<double>(placement_.device), host ? 1.0 : 0.0};
  device::Runtime& rt = device::runtime();
  if (!host) rt.timeline.launch(device, comm, rt.platform.oam.launch_overhead, 0, mine.start);
  store_->set(key(getRank(), dst, seq, "send"), encode(mine));
  std::vector<at::Tensor> data{gloo_view(t)};
  c10::intrusive_ptr<c10d::Work> gloo_work;
  {
    WithoutPythonObjectsInTls gloo_call;
    gloo_work = gloo_->send(data, dst, tag);
  }

  const int rank = getRank();
  auto self = c10::intrusive_ptr<ProcessGroupZion>::unsafe_reclaim_from_nonowning(this);
  auto finish = [self, gloo_work, data, mine, device, comm, dst, seq, rank]() -> sim::Seconds {
    std::string theirs_key = key(rank, dst, seq, "recv");
    PeerSide theirs = decode(self->store_->get(theirs_key));
    self->store_->deleteKey(theirs_key);
    TORCH_CHECK(theirs.host == mine.host, "zion backend: send of ", where(mine.host), " to rank ", dst, ", which receives into ",
                where(theirs.host), "; both sides must use zion tensors (or both CPU tensors)");
    TORCH_CHECK(theirs.bytes == mine.bytes, "zion backend: send to rank ", dst, " of ", mine.bytes, " bytes, but rank ", dst,
                " receives ", theirs.bytes, " bytes; sizes must match");
    gloo_work->wait();
    if (mine.host != 0) return 0;
    sim::CollectiveRequest request;
    request.op = sim::CollectiveOp::kSendRecv;
    request.bytes = mine.bytes;
    request.devices = {static_cast<int>(mine.device), static_cast<int>(theirs.device)};
    request.algorithm = sim::Algorithm::kAuto;
    request.mode = self->mode_;
    sim::CollectiveResult priced = self->price(request);
    sim::Seconds start = std::max(mine.start, theirs.start);
    device::runtime().timeline.stream_wait_until(device, comm, start + priced.time);
    self->record({"send_recv", "send", mine.bytes, request.devices, sim::algorithm_name(priced.algorithm), start,
                  start + priced.time, device, comm});
    return start + priced.time;
  };
  return collect(c10::make_intrusive<ZionWork>(getRank(), c10d::OpType::SEND, device, comm, finish, tensors));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZion::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  const at::Tensor& t = only_tensor(tensors, "recv");
  TORCH_CHECK(src >= 0 && src < getSize() && src != getRank(), "zion backend: recv from rank ", src,
              " is not another rank of this group (0..", getSize() - 1, ")");
  const bool host = t.device().is_cpu();
  c10::DeviceIndex device = host ? -1 : t.device().index();
  int comm = host ? -1 : comm_stream(device);
  int64_t seq;
  std::shared_future<void> previous;  // the last receive from `src` still being posted
  {
    std::lock_guard<std::mutex> lock(mutex_);
    seq = recv_seq_[src]++;
    previous = pending_recv_[src];
  }
  PeerSide mine{host ? 0 : local_start(device, comm), static_cast<double>(t.numel()) * t.element_size(),
                static_cast<double>(placement_.device), host ? 1.0 : 0.0};
  device::Runtime& rt = device::runtime();
  if (!host) rt.timeline.launch(device, comm, rt.platform.oam.launch_overhead, 0, mine.start);
  store_->set(key(src, getRank(), seq, "recv"), encode(mine));

  auto self = c10::intrusive_ptr<ProcessGroupZion>::unsafe_reclaim_from_nonowning(this);
  const std::string theirs_key = key(src, getRank(), seq, "send");
  std::vector<at::Tensor> data{gloo_view(t)};
  // Reads the sender's side (waiting for its send), checks it and posts the
  // receive to gloo.
  auto post = [self, theirs_key, mine, data, src, tag]() -> PostedRecv {
    PeerSide theirs = decode(self->store_->get(theirs_key));
    self->store_->deleteKey(theirs_key);
    TORCH_CHECK(theirs.host == mine.host, "zion backend: recv into ", where(mine.host), " from rank ", src, ", which sends ",
                where(theirs.host), "; both sides must use zion tensors (or both CPU tensors)");
    TORCH_CHECK(theirs.bytes == mine.bytes, "zion backend: recv from rank ", src, " of ", mine.bytes, " bytes, but rank ", src,
                " sends ", theirs.bytes, " bytes; sizes must match");
    std::vector<at::Tensor> buffer = data;
    WithoutPythonObjectsInTls gloo_call;
    return {self->gloo_->recv(buffer, src, tag), theirs};
  };

  std::shared_future<PostedRecv> posted;
  const bool in_order = !previous.valid() || previous.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  if (in_order && store_->check({theirs_key})) {
    std::promise<PostedRecv> now;
    now.set_value(post());
    posted = now.get_future().share();
  } else {
    auto done = std::make_shared<std::promise<void>>();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pending_recv_[src] = done->get_future().share();
    }
    posted = std::async(std::launch::async, [post, previous, done]() -> PostedRecv {
               if (previous.valid()) previous.wait();
               try {
                 PostedRecv r = post();
                 done->set_value();
                 return r;
               } catch (...) {
                 done->set_value();
                 throw;
               }
             }).share();
  }

  auto finish = [self, posted, mine, device, comm]() -> sim::Seconds {
    const PostedRecv& r = posted.get();
    r.gloo->wait();
    if (mine.host != 0) return 0;
    sim::CollectiveRequest request;
    request.op = sim::CollectiveOp::kSendRecv;
    request.bytes = mine.bytes;
    request.devices = {static_cast<int>(r.sender.device), static_cast<int>(mine.device)};
    request.algorithm = sim::Algorithm::kAuto;
    request.mode = self->mode_;
    sim::CollectiveResult priced = self->price(request);
    sim::Seconds start = std::max(mine.start, r.sender.start);
    device::runtime().timeline.stream_wait_until(device, comm, start + priced.time);
    self->record({"send_recv", "recv", mine.bytes, request.devices, sim::algorithm_name(priced.algorithm), start,
                  start + priced.time, device, comm});
    return start + priced.time;
  };
  return collect(c10::make_intrusive<ZionWork>(getRank(), c10d::OpType::RECV, device, comm, finish, tensors));
}

}  // namespace zion::dist
