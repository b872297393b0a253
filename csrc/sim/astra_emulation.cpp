#include "astra_emulation.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <queue>
#include <stdexcept>
#include <vector>

namespace zion::sim {
namespace {

// Events at one time run in the order they were scheduled, as in ASTRA-sim's
// event queue.
class EventQueue {
 public:
  void at(uint64_t time, std::function<void()> f) { queue_.push({time, next_++, std::move(f)}); }
  uint64_t now() const { return now_; }
  void run() {
    while (!queue_.empty()) {
      Event e = queue_.top();
      queue_.pop();
      now_ = e.time;
      e.action();
    }
  }

 private:
  struct Event {
    uint64_t time;
    uint64_t seq;
    std::function<void()> action;
    bool operator>(const Event& o) const { return time != o.time ? time > o.time : seq > o.seq; }
  };
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> queue_;
  uint64_t next_ = 0;
  uint64_t now_ = 0;
};

class Network {
 public:
  Network(const AstraEmulation& s, EventQueue& q) : s_(s), q_(q) {
    bytes_per_ns_ = s.bandwidth_gb_per_s * static_cast<double>(1 << 30) / 1e9;
  }

  // Sends `bytes` from src to dst now; `arrived` runs when the whole message is there.
  void send(int src, int dst, uint64_t bytes, std::function<void()> arrived) {
    ++messages;
    if (s_.backend == AstraBackend::kCongestionUnaware) {
      const double delay = hops(src, dst) * s_.latency_ns + static_cast<double>(bytes) / bytes_per_ns_;
      q_.at(q_.now() + static_cast<uint64_t>(delay), std::move(arrived));
      return;
    }
    auto m = std::make_shared<Message>(Message{route(src, dst), 0, bytes, std::move(arrived)});
    forward(m);
  }

  uint64_t messages = 0;

 private:
  struct Message {
    std::vector<int> route;  // devices, source first
    size_t at = 0;           // index of the device holding it
    uint64_t bytes = 0;
    std::function<void()> arrived;
  };
  struct Link {
    bool busy = false;
    std::deque<std::shared_ptr<Message>> pending;
  };

  int hops(int src, int dst) const {
    if (s_.topology == AstraBlock::kSwitch) return 2;
    if (s_.topology == AstraBlock::kFullyConnected) return 1;
    int cw = dst - src;
    if (cw < 0) cw += s_.npus;
    return std::min(cw, s_.npus - cw);  // bidirectional ring
  }

  std::vector<int> route(int src, int dst) const {
    if (s_.topology == AstraBlock::kSwitch) return {src, s_.npus, dst};  // the switch is device npus
    if (s_.topology == AstraBlock::kFullyConnected) return {src, dst};
    int cw = dst - src;
    if (cw < 0) cw += s_.npus;
    const int step = (s_.npus - cw) < cw ? -1 : 1;  // anticlockwise only when strictly shorter
    std::vector<int> r{src};
    for (int cur = src; cur != dst;) {
      cur = (cur + step + s_.npus) % s_.npus;
      r.push_back(cur);
    }
    return r;
  }

  void forward(const std::shared_ptr<Message>& m) {
    if (m->at + 1 == m->route.size()) {
      m->arrived();
      return;
    }
    Link& link = links_[{m->route[m->at], m->route[m->at + 1]}];
    if (link.busy) {
      link.pending.push_back(m);
    } else {
      transmit(link, m);
    }
  }

  void transmit(Link& link, const std::shared_ptr<Message>& m) {
    link.busy = true;
    const double serialization = static_cast<double>(m->bytes) / bytes_per_ns_;
    const uint64_t now = q_.now();
    q_.at(now + static_cast<uint64_t>(s_.latency_ns + serialization), [this, m] {
      ++m->at;
      forward(m);
    });
    Link* l = &link;
    q_.at(now + static_cast<uint64_t>(serialization), [this, l] {
      l->busy = false;
      if (!l->pending.empty()) {
        auto next = l->pending.front();
        l->pending.pop_front();
        transmit(*l, next);
      }
    });
  }

  const AstraEmulation& s_;
  EventQueue& q_;
  double bytes_per_ns_ = 0;
  std::map<std::pair<int, int>, Link> links_;
};

// One NPU's part of one stream (Ring.cc / AllToAll.cc).
struct StreamState {
  bool started = false;
  bool done = false;
  int stream_count = 0;
  int parallel = 1;
  int free_packets = 0;
  int zero_latency = 0;
  int non_zero_latency = 0;
  bool toggle = false;
  int received = 0;     // PacketReceived events so far
  int recvs_posted = 0;
  int arrivals_waiting = 0;  // arrived before a receive was posted
  int receiver = 0;
  std::deque<int> packets;  // destinations of packets ready to send, in order
};

class Emulator {
 public:
  Emulator(CollectiveOp op, uint64_t bytes, const AstraEmulation& s) : op_(op), s_(s), net_(s, q_) {
    n_ = s.npus;
    direct_ = s.implementation == AstraImplementation::kDirect;
    chunk_ = bytes / static_cast<uint64_t>(s.splits);
    msg_ = op == CollectiveOp::kAllGather ? chunk_ : chunk_ / static_cast<uint64_t>(n_);
    if (direct_) {
      parallel_ = s.direct_window < 0 ? n_ - 1 : std::min(s.direct_window, n_ - 1);
      stream_count_ = op == CollectiveOp::kAllReduce ? 2 * (n_ - 1) : n_ - 1;
    } else {
      parallel_ = 1;  // InjectionPolicy::Normal, as Sys.cc builds every ring
      stream_count_ = op == CollectiveOp::kAllReduce   ? 2 * (n_ - 1)
                      : op == CollectiveOp::kAllToAll ? n_ * (n_ - 1) / 2
                                                      : n_ - 1;
    }
    // Ring.cc: (n-1) x parallel; AllToAll.cc outside a local dimension: parallel.
    non_zero_count_ = direct_ ? parallel_ : (n_ - 1) * parallel_;
    endpoint_ = static_cast<uint64_t>(s.endpoint_delay_ns);
    if (s.local_memory_gb_per_s > 0) {
      const uint64_t pass = static_cast<uint64_t>(static_cast<double>(msg_) / (s.local_memory_gb_per_s * 1e9) * 1e9);
      reduction_ = 3 * pass;  // a write and two reads
    }
    state_.assign(n_, std::vector<StreamState>(s.splits));
  }

  AstraEmulationResult run() {
    for (int npu = 0; npu < n_; ++npu) {
      for (int k = 0; k < std::min(s_.active_chunks, s_.splits); ++k) start(npu, k);
    }
    q_.run();
    for (int npu = 0; npu < n_; ++npu) {
      for (int k = 0; k < s_.splits; ++k) {
        if (!state_[npu][k].done) throw std::logic_error("ASTRA-sim emulation: a stream did not finish");
      }
    }
    return {finish_, net_.messages};
  }

 private:
  void start(int npu, int k) {
    StreamState& st = state_[npu][k];
    st.started = true;
    st.stream_count = stream_count_;
    st.parallel = parallel_;
    st.receiver = (npu + 1) % n_;
    for (int i = 0; i < parallel_; ++i) insert_packet(npu, k);
    // Arrivals for this stream that came before it started wait for receives.
  }

  void insert_packet(int npu, int k) {
    StreamState& st = state_[npu][k];
    if (st.zero_latency == 0 && st.non_zero_latency == 0) {
      st.zero_latency = st.parallel;
      st.non_zero_latency = non_zero_count_;
      st.toggle = !st.toggle;
    }
    bool processed = false;
    if (st.zero_latency > 0) {
      --st.zero_latency;
    } else {
      processed = op_ == CollectiveOp::kReduceScatter || (op_ == CollectiveOp::kAllReduce && st.toggle);
      --st.non_zero_latency;
    }
    st.packets.push_back(st.receiver);
    if (direct_) {  // AllToAll::process_max_count: the next packet goes to the next NPU
      st.receiver = (st.receiver + 1) % n_;
      if (st.receiver == npu) st.receiver = (st.receiver + 1) % n_;
    }
    // PacketBundle through MemBus: the endpoint delay, then the reduction.
    const uint64_t delay = endpoint_ + (processed ? reduction_ : 0);
    q_.at(q_.now() + delay, [this, npu, k] { general(npu, k); });
  }

  void general(int npu, int k) {
    StreamState& st = state_[npu][k];
    st.free_packets += 1;
    if (direct_ && op_ == CollectiveOp::kAllReduce && st.stream_count <= n_ - 1) {
      if (st.received < n_ - 1) return;  // the second half waits for the first to arrive
      for (int i = 0; i < st.parallel; ++i) ready(npu, k);
    } else {
      ready(npu, k);
    }
    iteratable(npu, k);
  }

  void ready(int npu, int k) {
    StreamState& st = state_[npu][k];
    if (st.packets.empty() || st.stream_count == 0 || st.free_packets == 0) return;
    const int dst = st.packets.front();
    st.packets.pop_front();
    --st.stream_count;
    --st.free_packets;
    net_.send(npu, dst, msg_, [this, dst, k] { arrive(dst, k); });
    ++st.recvs_posted;
    if (st.arrivals_waiting > 0) {
      --st.arrivals_waiting;
      q_.at(q_.now(), [this, npu, k] { packet_received(npu, k); });
    }
  }

  void arrive(int npu, int k) {
    StreamState& st = state_[npu][k];
    if (st.recvs_posted > st.received + st.arrivals_waiting) {
      packet_received(npu, k);
    } else {
      ++st.arrivals_waiting;
    }
  }

  void packet_received(int npu, int k) {
    StreamState& st = state_[npu][k];
    ++st.received;
    insert_packet(npu, k);
  }

  void iteratable(int npu, int k) {
    StreamState& st = state_[npu][k];
    if (st.done || st.stream_count != 0 || st.free_packets != st.parallel) return;
    st.done = true;
    finish_ = std::max(finish_, q_.now());
    const int next = k + s_.active_chunks;
    if (next < s_.splits) start(npu, next);
  }

  CollectiveOp op_;
  const AstraEmulation& s_;
  EventQueue q_;
  Network net_;
  int n_ = 0;
  bool direct_ = false;
  uint64_t chunk_ = 0;
  uint64_t msg_ = 0;
  int parallel_ = 1;
  int stream_count_ = 0;
  int non_zero_count_ = 0;
  uint64_t endpoint_ = 0;
  uint64_t reduction_ = 0;
  uint64_t finish_ = 0;
  std::vector<std::vector<StreamState>> state_;
};

}  // namespace

AstraEmulationResult emulate_astra(CollectiveOp op, uint64_t bytes, const AstraEmulation& s) {
  if (op != CollectiveOp::kAllReduce && op != CollectiveOp::kReduceScatter && op != CollectiveOp::kAllGather &&
      op != CollectiveOp::kAllToAll) {
    throw std::invalid_argument(std::string("ASTRA-sim emulation: ") + collective_op_name(op) +
                                " is not emulated; allowed: all_reduce, reduce_scatter, all_gather, all_to_all");
  }
  if (s.npus < 2 || s.npus > 4096) {
    throw std::invalid_argument("ASTRA-sim emulation: npus must be 2..4096, got " + std::to_string(s.npus));
  }
  if (!(s.bandwidth_gb_per_s > 0) || !std::isfinite(s.bandwidth_gb_per_s)) {
    throw std::invalid_argument("ASTRA-sim emulation: bandwidth must be a positive number of GB/s");
  }
  if (!(s.latency_ns >= 0) || !std::isfinite(s.latency_ns) || !(s.endpoint_delay_ns >= 0) ||
      !std::isfinite(s.endpoint_delay_ns) || !(s.local_memory_gb_per_s >= 0) || !std::isfinite(s.local_memory_gb_per_s)) {
    throw std::invalid_argument("ASTRA-sim emulation: latency, endpoint delay and local memory bandwidth must be finite and >= 0");
  }
  if (s.splits < 1 || s.active_chunks < 1) {
    throw std::invalid_argument("ASTRA-sim emulation: splits and active chunks must be >= 1");
  }
  if (s.direct_window == 0 || s.direct_window < -1) {
    throw std::invalid_argument("ASTRA-sim emulation: the direct window must be >= 1, or -1 for npus - 1");
  }
  const uint64_t msg = op == CollectiveOp::kAllGather ? bytes / s.splits : bytes / s.splits / s.npus;
  if (msg == 0) {
    throw std::invalid_argument("ASTRA-sim emulation: " + std::to_string(bytes) + " bytes in " +
                                std::to_string(s.splits) + " splits over " + std::to_string(s.npus) +
                                " NPUs leave empty messages, which ASTRA-sim's network refuses");
  }
  // Every packet is a few events: refuse runs that would take minutes rather than milliseconds.
  const double n = s.npus;
  const bool direct = s.implementation == AstraImplementation::kDirect;
  const double per_stream = op == CollectiveOp::kAllReduce ? 2 * (n - 1)
                            : (op == CollectiveOp::kAllToAll && !direct) ? n * (n - 1) / 2
                                                                         : n - 1;
  const double packets = n * s.splits * per_stream;
  constexpr double kMaxPackets = 2e7;
  if (packets > kMaxPackets) {
    throw std::invalid_argument("ASTRA-sim emulation: " + std::to_string(static_cast<long long>(packets)) +
                                " packets (npus x splits x packets per stream) is more than the " +
                                std::to_string(static_cast<long long>(kMaxPackets)) + " emulated at most");
  }
  return Emulator(op, bytes, s).run();
}

}  // namespace zion::sim
