// send / recv of ProcessGroupZion. The bytes go through gloo; the times go
// through the group's store: each side writes when its transfer could start
// and how many bytes it moves, under a key numbered per (sender, receiver)
// pair, and reads the other side's. The transfer then starts at the later of
// the two, lasts sim's send_recv time between the two devices and ends at the
// same virtual time on both. Transfers pair in issue order per (peer, tag),
// as gloo's and NCCL's do: a send tagged 2 meets the receive tagged 2. Sizes are checked before gloo sees the receive
// (gloo aborts the process on a size mismatch): both sides raise.
//
// Neither call blocks, as gloo's and NCCL's do not: a receive whose sender
// has not issued its send yet is posted to gloo from a helper thread once
// it has (in issue order per source, so gloo matches them as issued). A ring
// of irecv-then-isend (batch_isend_irecv) therefore does not deadlock.
//
// CPU tensors take the same path without modeled time.
//
// Timing-only mode: a storage-less tensor has no bytes to send. Each side
// says so in its record; a sender without bytes posts no gloo send, and its
// receiver posts no gloo receive (a receiving tensor with bytes then becomes
// storage-less, its values unknown). A receiver without bytes takes a real
// sender's bytes into a scratch buffer, so that the send completes.
//
// A peer that does not run as a process (a world bigger than its
// processes, present_ranks.h) cannot send or receive: both calls refuse it.

#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <thread>

#include "device/runtime/runtime.h"
#include "device/runtime/stream.h"
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
  double storage_less = 0;  // 1: a tensor without bytes (timing-only mode)
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

// The peer's side of a transfer, read (waiting for it) and removed from the
// store, checked against this side: a send (`sending`) or recv with `peer`.
// Waits for `key` by polling: a blocking get would hold a TCPStore client's
// lock until the peer writes it, and this process's other threads (the
// caller's next send, a receive posted from a helper thread) could not write
// their own records meanwhile. A peer whose process has ended (`gone`, asked
// every 100 ms: empty while it runs) or the store's timeout passing end the
// wait with DistBackendError, as a collective's wait ends.
void wait_for_key(c10d::Store& store, const std::string& key, const std::function<std::string()>& gone,
                  const std::string& what, int peer) {
  const auto timeout = store.getTimeout();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto next_check = std::chrono::steady_clock::now();
  auto pause = std::chrono::microseconds(50);  // doubling to 1 ms: a late peer costs the store little
  while (!store.check({key})) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= next_check) {
      const std::string ended = gone ? gone() : std::string();
      TORCH_CHECK_WITH(DistBackendError, ended.empty(), "zion backend: ", what, ": rank ", peer, " ", ended,
                       " before issuing its side of it");
      next_check = now + std::chrono::milliseconds(100);
    }
    TORCH_CHECK_WITH(DistBackendError, now < deadline, "zion backend: ", what, ": rank ", peer,
                     " did not issue its side of it within the group's timeout (",
                     std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count(), " ms)");
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

PeerSide take_peer_side(c10d::Store& store, const std::string& theirs_key, bool sending, int peer,
                        const std::function<std::string()>& gone) {
  wait_for_key(store, theirs_key, gone, sending ? "send to rank " + std::to_string(peer)
                                                : "recv from rank " + std::to_string(peer), peer);
  PeerSide theirs = decode(store.get(theirs_key));
  store.deleteKey(theirs_key);
  return theirs;
}

// The error for a peer's side that does not match this one.
void check_peer_side(const PeerSide& theirs, const PeerSide& mine, bool sending, int peer) {
  const char* call = sending ? "send" : "recv";
  const char* to = sending ? " to rank " : " from rank ";
  TORCH_CHECK(theirs.host == mine.host, "zion backend: ", call, sending ? " of " : " into ", where(mine.host), to, peer,
              sending ? ", which receives into " : ", which sends ", where(theirs.host),
              "; both sides must use zion tensors (or both CPU tensors)");
  TORCH_CHECK(theirs.bytes == mine.bytes, "zion backend: ", call, to, peer, " of ", mine.bytes, " bytes, but rank ", peer,
              sending ? " receives " : " sends ", theirs.bytes, " bytes; sizes must match");
}

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

// What this side tells its peer through the store.
PeerSide side_of(const TransferEnd& e, int global_device, bool storage_less) {
  return {e.start, e.bytes, static_cast<double>(global_device), e.host ? 1.0 : 0.0, storage_less ? 1.0 : 0.0};
}

std::string key(int src, int dst, int tag, int64_t seq, const char* side) {
  return "zion/p2p/" + std::to_string(src) + ">" + std::to_string(dst) + "/" + std::to_string(tag) + "/" +
         std::to_string(seq) + "/" + side;
}

// A receive posted to gloo (none when the sender has no bytes), and what its sender said.
struct PostedRecv {
  c10::intrusive_ptr<c10d::Work> gloo;
  PeerSide sender;
};

}  // namespace

TransferEnd ProcessGroupZion::transfer_end(const at::Tensor& t) {
  TransferEnd e;
  e.host = t.device().is_cpu();
  e.bytes = static_cast<double>(t.numel()) * t.element_size();
  if (e.host) return e;
  e.device = t.device().index();
  e.comm = comm_stream(e.device);
  e.start = local_start(e.device, e.comm);
  device::Runtime& rt = device::runtime();
  rt.timeline.launch(e.device, e.comm, rt.platform.oam.launch_overhead, 0, e.start);
  return e;
}

sim::Seconds ProcessGroupZion::charge_transfer(const char* call, const TransferEnd& mine, int src_device, int dst_device,
                                               sim::Seconds peer_start) {
  sim::CollectiveRequest request;
  request.op = sim::CollectiveOp::kSendRecv;
  request.bytes = mine.bytes;
  request.devices = {src_device, dst_device};
  request.algorithm = sim::Algorithm::kAuto;
  request.link_model = link_model_;
  sim::CollectiveResult priced = price(request);
  sim::Seconds start = std::max(mine.start, peer_start);
  device::runtime().timeline.stream_wait_until(mine.device, mine.comm, start + priced.time);
  record({sim::collective_op_name(request.op), call, mine.bytes, request.devices, sim::algorithm_name(priced.algorithm), start, start + priced.time,
          mine.device, mine.comm});
  return start + priced.time;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZion::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  const at::Tensor& t = only_tensor(tensors, "send");
  if (std::string problem = device_problem("send", t.device().is_cpu() ? -1 : t.device().index()); !problem.empty()) {
    TORCH_CHECK(false, problem);
  }
  TORCH_CHECK(dst >= 0 && dst < getSize() && dst != getRank(), "zion backend: send to rank ", dst,
              " is not another rank of this group (0..", getSize() - 1, ")");
  TORCH_CHECK(ranks_.is_present(dst), "zion backend: send to rank ", dst, ", which does not run as a process (the ranks ",
              "running are ", ranks_.present_list(), " of ", getSize(), "); point-to-point needs both ends running");
  int64_t seq;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    seq = send_seq_[{dst, tag}]++;
  }
  const TransferEnd end = transfer_end(t);
  const bool no_bytes = device::is_storage_less(t);
  const PeerSide mine = side_of(end, placement_.device, no_bytes);
  store_->set(key(getRank(), dst, tag, seq, "send"), encode(mine));
  std::vector<at::Tensor> data;
  c10::intrusive_ptr<c10d::Work> gloo_work;
  if (!no_bytes) {
    data.push_back(gloo_owning_view(t));
    WithoutPythonObjectsInTls gloo_call;
    gloo_work = gloo_->send(data, ranks_.gloo_rank[dst], tag);
  }

  const int rank = getRank();
  auto self = c10::intrusive_ptr<ProcessGroupZion>::unsafe_reclaim_from_nonowning(this);
  auto finish = [self, gloo_work, data, end, mine, dst, tag, seq, rank]() -> sim::Seconds {
    PeerSide theirs = take_peer_side(*self->store_, key(rank, dst, tag, seq, "recv"), true, dst,
                                     [self, dst] { return self->peer_gone(dst); });
    try {
      check_peer_side(theirs, mine, true, dst);
    } catch (...) {
      // The receiver takes these bytes into scratch (see recv), so the pair's
      // next transfer gets its own; the mismatch is the error either way.
      if (gloo_work) {
        try {
          gloo_work->wait();
        } catch (...) {
        }
      }
      throw;
    }
    if (gloo_work) gloo_work->wait();
    if (end.host) return 0;
    return self->charge_transfer("send", end, static_cast<int>(mine.device), static_cast<int>(theirs.device), theirs.start);
  };
  // Ready once the receiver has posted its side: gloo's send then completes.
  auto ready = [self, dst, tag, seq, rank] { return self->store_->check({key(rank, dst, tag, seq, "recv")}); };
  return keep_in_flight(
      collect(c10::make_intrusive<ZionWork>(getRank(), c10d::OpType::SEND, end.device, end.comm, finish, ready, tensors)));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZion::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  const at::Tensor& t = only_tensor(tensors, "recv");
  if (std::string problem = device_problem("recv", t.device().is_cpu() ? -1 : t.device().index()); !problem.empty()) {
    TORCH_CHECK(false, problem);
  }
  TORCH_CHECK(src >= 0 && src < getSize() && src != getRank(), "zion backend: recv from rank ", src,
              " is not another rank of this group (0..", getSize() - 1, ")");
  TORCH_CHECK(ranks_.is_present(src), "zion backend: recv from rank ", src, ", which does not run as a process (the ranks ",
              "running are ", ranks_.present_list(), " of ", getSize(), "); point-to-point needs both ends running");
  int64_t seq;
  std::shared_future<void> previous;  // the last receive from `src` still being posted
  {
    std::lock_guard<std::mutex> lock(mutex_);
    seq = recv_seq_[{src, tag}]++;
    previous = pending_recv_[{src, tag}];
  }
  const TransferEnd end = transfer_end(t);
  const bool no_bytes = device::is_storage_less(t);
  const PeerSide mine = side_of(end, placement_.device, no_bytes);
  store_->set(key(src, getRank(), tag, seq, "recv"), encode(mine));

  auto self = c10::intrusive_ptr<ProcessGroupZion>::unsafe_reclaim_from_nonowning(this);
  const std::string theirs_key = key(src, getRank(), tag, seq, "send");
  // Without bytes of its own, a receive from a real sender lands in scratch.
  std::vector<at::Tensor> data{no_bytes ? at::empty({static_cast<int64_t>(end.bytes)}, at::kByte) : gloo_owning_view(t)};
  // Reads the sender's side (waiting for its send), checks it and posts the
  // receive to gloo.
  const int gloo_src = ranks_.gloo_rank[src];
  auto post = [self, theirs_key, mine, data, src, gloo_src, tag]() -> PostedRecv {
    PeerSide theirs = take_peer_side(*self->store_, theirs_key, false, src, [self, src] { return self->peer_gone(src); });
    try {
      check_peer_side(theirs, mine, false, src);
    } catch (...) {
      // The sender's bytes are on their way through gloo: take them into
      // scratch, so that the pair's next transfer on this tag does not get them.
      if (theirs.storage_less == 0) {
        std::vector<at::Tensor> scratch{at::empty({static_cast<int64_t>(theirs.bytes)}, at::kByte)};
        WithoutPythonObjectsInTls gloo_call;
        self->gloo_->recv(scratch, gloo_src, tag)->wait();
      }
      throw;
    }
    if (theirs.storage_less != 0) return {{}, theirs};  // nothing is sent
    std::vector<at::Tensor> buffer = data;
    WithoutPythonObjectsInTls gloo_call;
    return {self->gloo_->recv(buffer, gloo_src, tag), theirs};
  };

  std::shared_future<PostedRecv> posted;
  const bool in_order = !previous.valid() || previous.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  if (in_order && store_->check({theirs_key})) {
    // A mismatch is the Work's error, at wait(), as when the sender comes
    // later: thrown here it would leave a batch_isend_irecv's coalescing open.
    std::promise<PostedRecv> now;
    try {
      now.set_value(post());
    } catch (...) {
      now.set_exception(std::current_exception());
    }
    posted = now.get_future().share();
  } else {
    auto done = std::make_shared<std::promise<void>>();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pending_recv_[{src, tag}] = done->get_future().share();
    }
    // A thread of its own, not std::async: the last future of an async task
    // waits for the task when destroyed, so dropping a receive's Work would
    // block until its sender sent.
    auto result = std::make_shared<std::promise<PostedRecv>>();
    posted = result->get_future().share();
    std::thread([post, previous, done, result] {
      if (previous.valid()) previous.wait();
      try {
        result->set_value(post());
      } catch (...) {
        result->set_exception(std::current_exception());
      }
      done->set_value();
    }).detach();
  }

  auto finish = [self, posted, end, mine, t]() -> sim::Seconds {
    const PostedRecv& r = posted.get();
    if (r.gloo) {
      r.gloo->wait();
    } else {
      forget_values({t});  // the sender had no bytes: this tensor's values are unknown
    }
    if (end.host) return 0;
    return self->charge_transfer("recv", end, static_cast<int>(r.sender.device), static_cast<int>(mine.device), r.sender.start);
  };
  // Ready once the sender's side is read and the receive posted to gloo.
  auto ready = [posted] { return posted.wait_for(std::chrono::seconds(0)) == std::future_status::ready; };
  return keep_in_flight(
      collect(c10::make_intrusive<ZionWork>(getRank(), c10d::OpType::RECV, end.device, end.comm, finish, ready, tensors)));
}

std::string ProcessGroupZion::peer_gone(int rank) const {
  return shm_ ? shm_->rank_gone(rank) : std::string();  // ranks on several hosts: only the timeout tells
}

c10::intrusive_ptr<c10d::Work> ProcessGroupZion::keep_in_flight(c10::intrusive_ptr<ZionWork> work) {
  std::vector<c10::intrusive_ptr<ZionWork>> held;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    held.swap(in_flight_p2p_);
  }
  // finish_if_ready never blocks: it finishes a transfer whose peer has done its side.
  std::vector<c10::intrusive_ptr<ZionWork>> open;
  for (auto& w : held) {
    if (!w->finish_if_ready()) open.push_back(std::move(w));
  }
  open.push_back(work);
  std::lock_guard<std::mutex> lock(mutex_);
  in_flight_p2p_.insert(in_flight_p2p_.end(), std::make_move_iterator(open.begin()), std::make_move_iterator(open.end()));
  return work;
}

}  // namespace zion::dist
