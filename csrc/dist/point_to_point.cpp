// send / recv of ProcessGroupZion. The bytes go through gloo; the times go
// through the group's store: each side writes when its transfer could start
// and how many bytes it moves, under a key numbered per (sender, receiver)
// pair, and reads the other side's. The transfer then starts at the later of
// the two, lasts sim's send_recv time between the two devices and ends at the
// same virtual time on both. Sizes are checked before gloo sees the receive
// (gloo aborts the process on a size mismatch): both sides raise.

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>

#include "device/runtime.h"
#include "device/stream.h"
#include "device/tensor_alias.h"
#include "dist/process_group_zion.h"

namespace zion::dist {
namespace {

struct PeerSide {
  double start = 0;
  double bytes = 0;
  double device = 0;
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

// The single zion tensor of a send or recv, or an error naming it.
const at::Tensor& only_tensor(const std::vector<at::Tensor>& tensors, const char* call) {
  TORCH_CHECK(tensors.size() == 1, "zion backend: ", call, " takes exactly one tensor, got ", tensors.size());
  const at::Tensor& t = tensors[0];
  const std::string zion = c10::get_privateuse1_backend();
  TORCH_CHECK(t.defined() && t.device().is_privateuseone(), "zion backend: ", call, ": got a tensor on ",
              t.defined() ? t.device().str() : "nothing", ", but a '", zion, "' process group moves ", zion,
              " tensors (wanted device '", zion, "'; move it with tensor.to('", zion, "'))");
  TORCH_CHECK(t.layout() == c10::kStrided && t.is_contiguous(), "zion backend: ", call, " needs a dense contiguous tensor");
  return t;
}

std::string key(int src, int dst, int64_t seq, const char* side) {
  return "zion/p2p/" + std::to_string(src) + ">" + std::to_string(dst) + "/" + std::to_string(seq) + "/" + side;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupZion::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  const at::Tensor& t = only_tensor(tensors, "send");
  TORCH_CHECK(dst >= 0 && dst < getSize() && dst != getRank(), "zion backend: send to rank ", dst,
              " is not another rank of this group (0..", getSize() - 1, ")");
  c10::DeviceIndex device = t.device().index();
  int comm = comm_stream(device);
  int64_t seq;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    seq = send_seq_[dst]++;
  }
  PeerSide mine{local_start(device, comm), static_cast<double>(t.numel()) * t.element_size(),
                static_cast<double>(placement_.device)};
  device::Runtime& rt = device::runtime();
  rt.timeline.launch(device, comm, rt.platform.oam.launch_overhead, 0, mine.start);
  store_->set(key(getRank(), dst, seq, "send"), encode(mine));
  std::vector<at::Tensor> data{device::cpu_alias(t)};
  auto gloo_work = gloo_->send(data, dst, tag);

  const int rank = getRank();
  auto self = c10::intrusive_ptr<ProcessGroupZion>::unsafe_reclaim_from_nonowning(this);
  auto finish = [self, gloo_work, data, mine, device, comm, dst, seq, rank]() -> sim::Seconds {
    std::string theirs_key = key(rank, dst, seq, "recv");
    PeerSide theirs = decode(self->store_->get(theirs_key));
    self->store_->deleteKey(theirs_key);
    TORCH_CHECK(theirs.bytes == mine.bytes, "zion backend: send to rank ", dst, " of ", mine.bytes, " bytes, but rank ", dst,
                " receives ", theirs.bytes, " bytes; sizes must match");
    gloo_work->wait();
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
  return c10::make_intrusive<ZionWork>(getRank(), c10d::OpType::SEND, device, comm, finish, tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZion::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  const at::Tensor& t = only_tensor(tensors, "recv");
  TORCH_CHECK(src >= 0 && src < getSize() && src != getRank(), "zion backend: recv from rank ", src,
              " is not another rank of this group (0..", getSize() - 1, ")");
  c10::DeviceIndex device = t.device().index();
  int comm = comm_stream(device);
  int64_t seq;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    seq = recv_seq_[src]++;
  }
  PeerSide mine{local_start(device, comm), static_cast<double>(t.numel()) * t.element_size(),
                static_cast<double>(placement_.device)};
  device::Runtime& rt = device::runtime();
  rt.timeline.launch(device, comm, rt.platform.oam.launch_overhead, 0, mine.start);
  store_->set(key(src, getRank(), seq, "recv"), encode(mine));
  // Waits until the sender has issued its send (not until it completes).
  std::string theirs_key = key(src, getRank(), seq, "send");
  PeerSide theirs = decode(store_->get(theirs_key));
  store_->deleteKey(theirs_key);
  TORCH_CHECK(theirs.bytes == mine.bytes, "zion backend: recv from rank ", src, " of ", mine.bytes, " bytes, but rank ", src,
              " sends ", theirs.bytes, " bytes; sizes must match");
  std::vector<at::Tensor> data{device::cpu_alias(t)};
  auto gloo_work = gloo_->recv(data, src, tag);

  auto self = c10::intrusive_ptr<ProcessGroupZion>::unsafe_reclaim_from_nonowning(this);
  auto finish = [self, gloo_work, data, mine, theirs, device, comm, src]() -> sim::Seconds {
    gloo_work->wait();
    sim::CollectiveRequest request;
    request.op = sim::CollectiveOp::kSendRecv;
    request.bytes = mine.bytes;
    request.devices = {static_cast<int>(theirs.device), static_cast<int>(mine.device)};
    request.algorithm = sim::Algorithm::kAuto;
    request.mode = self->mode_;
    sim::CollectiveResult priced = self->price(request);
    sim::Seconds start = std::max(mine.start, theirs.start);
    device::runtime().timeline.stream_wait_until(device, comm, start + priced.time);
    self->record({"send_recv", "recv", mine.bytes, request.devices, sim::algorithm_name(priced.algorithm), start,
            start + priced.time, device, comm});
    return start + priced.time;
  };
  return c10::make_intrusive<ZionWork>(getRank(), c10d::OpType::RECV, device, comm, finish, tensors);
}

}  // namespace zion::dist
