#pragma once
// Host memory of the CPU sockets: one DDR pool per socket with the
// platform's capacity. Pinned buffers (pin_memory) and, inside
// zion_emu.socket(i), ordinary CPU tensors are placed in a socket's pool. A
// pinned buffer belongs to a socket (by default the one the current OAM's
// PCIe switch hangs off); copies from it to an OAM are priced on that
// socket's path and need no staging copy.

#include <c10/core/Allocator.h>

#include <atomic>
#include <map>
#include <mutex>
#include <vector>

#include "sim/platform.h"

namespace zion::device {

struct SocketMemoryStats {
  int64_t capacity = 0;
  int64_t in_use = 0;
  int64_t peak = 0;
  int64_t allocations = 0;  // live
  int64_t num_ooms = 0;
};

class PinnedAllocator final : public c10::Allocator {
 public:
  void configure(const sim::Platform& platform);
  // A pinned buffer on current_socket().
  c10::DataPtr allocate(size_t nbytes) override;
  // A buffer in `socket`'s pool, pinned or not (OutOfMemoryError past capacity).
  c10::DataPtr allocate_on(int socket, size_t nbytes, bool pinned);
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  // Counts `nbytes` in `socket`'s pool without host memory behind them, as
  // allocate_on counts a pageable buffer (OutOfMemoryError past capacity);
  // unreserve gives them back. For timing-only tensors in a socket's DDR.
  void reserve(int socket, size_t nbytes);
  void unreserve(int socket, size_t nbytes);
  // The socket whose pool holds a buffer containing `ptr`, or -1.
  int socket_of(const void* ptr) const;
  // Whether `ptr` lies in a pinned buffer.
  bool is_pinned(const void* ptr) const;
  SocketMemoryStats stats(int socket) const;
  void reset_peak(int socket);
  // A checkpoint's statistics: the peak becomes at least `peak`, num_ooms is replaced.
  void restore_peak(int socket, int64_t peak, int64_t num_ooms);
  int sockets() const;
  // Bytes in use over all sockets' pools (pinned buffers, tensors placed in a socket).
  int64_t bytes_in_use() const;
  // Frees a buffer of the pools; false (and nothing done) for any other pointer.
  bool release(void* ptr);
  // The pools' lock (BasicLockable), as HbmAllocator's: held across fork()
  // and by set_platform; the *_locked forms are for the holder.
  void lock() { mutex_.lock(); }
  void unlock() { mutex_.unlock(); }
  void configure_locked(const sim::Platform& platform);
  int64_t bytes_in_use_locked() const;

 private:
  // Raises a clear error if the host cannot back `nbytes` more (see host_bytes_available).
  void check_host_backing(int socket, size_t nbytes);
  static constexpr size_t kHostCheckBytes = size_t{64} << 20;
  std::atomic<size_t> unchecked_bytes_{0};  // allocated since the last host check
  struct Live {
    int socket;
    size_t nbytes;  // counted in the pool
    size_t extent;  // addresses it owns (at least 1)
    bool pinned;
  };
  // The live buffer containing ptr, or nullptr; the caller holds mutex_.
  const Live* find(const void* ptr) const;

  mutable std::mutex mutex_;
  std::vector<SocketMemoryStats> pools_;
  std::map<const char*, Live> live_;  // base address -> buffer, ordered for interior lookups
  std::atomic<size_t> owned_{0};      // live_.size(), read without the lock on every CPU free
};

PinnedAllocator& pinned_allocator();

// The socket new pinned buffers go to: the one zion_emu.socket(i) set on
// this thread, else the one the current OAM's PCIe switch hangs off.
int current_socket();
// zion_emu.socket(i) on this thread: -1 when none. While one is set, CPU
// tensors are allocated in that socket's pool.
int scoped_socket();
void set_scoped_socket(int socket);
int home_socket(const sim::Platform& platform, int oam);

}  // namespace zion::device
