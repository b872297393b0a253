#pragma once
// The handshake (handshake.h) through shared memory, for a group whose
// present ranks are all processes on one host: each rank writes its side into
// its own slot of a POSIX shared-memory segment and reads everyone's, instead
// of a gloo all-gather over sockets. The table, the checks and every verdict
// are the same; only the transport differs.
//
// Setting up (at the group's creation, through its store): the first present
// rank creates the segment and publishes its name and a random token; every
// other rank that runs on the same host (same boot id and pid namespace) maps
// it and checks the token; each says through the store whether it could. When
// every rank could, all use the segment; otherwise all use gloo alike (ranks
// on different hosts, or ZION_HANDSHAKE=gloo on any rank). Once every rank has
// mapped it, the segment is unlinked, so nothing stays in /dev/shm however the
// processes end; the mapping goes with the last of them.
//
// A round: rank r writes its side into buffer g % 2 of its slot and publishes
// round number g; it then waits until every slot has published g and copies
// them. Two buffers suffice: a rank can only be one round ahead of another,
// and a rank writes round g + 1 only after reading everyone's round g, so no
// buffer is overwritten while someone may still read it. Waiting spins
// briefly, then sleeps on a futex in the segment that every write wakes;
// while waiting it checks that the ranks it waits for still run (their pids)
// and have not destroyed their group, and gives up at the group's timeout,
// with an error naming those ranks. A rank that gives up marks its slot, so
// the ranks that reach that round after it are told why instead of waiting.
//
// A forked child inherits the mapping but is not a rank: a handshake from it
// is refused.

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace zion::dist {

// The ranks the handshake waited for are gone or late; what() says which.
struct HandshakeLost : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class ShmHandshake {
 public:
  // Null when the group's present ranks (group rank of each slot in
  // `ranks`, this rank in slot `slot`) are not all on one host, or
  // ZION_HANDSHAKE=gloo: every rank then gets null alike. Each round carries
  // `words` doubles per rank.
  static std::unique_ptr<ShmHandshake> connect(c10d::Store& store, int slot, std::vector<int> ranks, int words,
                                               std::chrono::milliseconds timeout);
  ~ShmHandshake();
  ShmHandshake(const ShmHandshake&) = delete;
  ShmHandshake& operator=(const ShmHandshake&) = delete;

  // One round: `mine` (words doubles) in, every slot's words into `out` (slot
  // order). Throws HandshakeLost when a rank it waits for has exited or does
  // not come within the timeout; std::logic_error from a forked child.
  void all_gather(const double* mine, double* out);

  // Empty while the process of group rank `rank` runs (or the rank has no
  // slot), else how it ended ("has exited").
  std::string rank_gone(int rank) const;

  // This rank takes no further part (its group is shut down or destroyed):
  // a rank waiting for a round it has not written is told so.
  void leave();

 private:
  struct Header;
  struct Slot;
  ShmHandshake() = default;
  Slot& slot(int s) const;
  double* buffer(int s, uint64_t round) const;
  // Empty while the rank of slot `s` runs, else how it ended.
  std::string gone(int s) const;

  void* base_ = nullptr;
  size_t bytes_ = 0;
  int slot_ = 0;
  std::vector<int> ranks_;
  int words_ = 0;
  std::chrono::milliseconds timeout_{0};
  std::mutex mutex_;
  uint64_t round_ = 0;
  int pid_ = 0;  // the process that connected
};

}  // namespace zion::dist
