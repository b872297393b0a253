#include "dist/shm_handshake.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <random>
#include <sstream>

namespace zion::dist {

namespace {

constexpr uint64_t kMagic = 0x7a696f6e68733031ULL;  // "zionhs01"
constexpr const char* kPrefix = "zion/handshake/";
// Polls before sleeping on the futex: a round where every rank is already
// there costs no system call.
constexpr int kSpins = 64;
// The longest sleep between checks that the awaited ranks still run.
constexpr std::chrono::milliseconds kSlice{20};

std::string read_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// Processes of one host share a boot id; a liveness check by pid needs one
// pid namespace too. Empty when either is unknown.
std::string host_key() {
  std::string boot = read_line("/proc/sys/kernel/random/boot_id");
  char ns[128] = {0};
  ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof(ns) - 1);
  if (boot.empty() || n <= 0) return {};
  return boot + "/" + std::string(ns, static_cast<size_t>(n));
}

std::string as_string(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::milliseconds slice) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(slice.count() / 1000);
  ts.tv_nsec = static_cast<long>((slice.count() % 1000) * 1000000);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace

struct alignas(64) ShmHandshake::Header {
  uint64_t magic;
  uint64_t token;
  int32_t slots;
  int32_t words;
  std::atomic<uint32_t> epoch;    // bumped by every write; the futex word
  std::atomic<uint32_t> waiters;  // ranks asleep (or about to be) on it
};

struct alignas(64) ShmHandshake::Slot {
  std::atomic<uint64_t> round;  // the last round this slot's rank has written
  // The round in which this slot's rank gave up (a rank gone or late), 0
  // while it has not: that round and later ones are void, and the ranks that
  // come to them are told why.
  std::atomic<uint64_t> abandoned;
  // Set when its rank's group is destroyed: rounds it has not written will
  // never come.
  std::atomic<uint32_t> left;
  int32_t pid;
  char why[192];  // what made it give up, for the others to relay
};

static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "the handshake's shared atomics must be lock-free to work across processes");

ShmHandshake::Slot& ShmHandshake::slot(int s) const {
  return reinterpret_cast<Slot*>(static_cast<char*>(base_) + sizeof(Header))[s];
}

double* ShmHandshake::buffer(int s, uint64_t round) const {
  char* data = static_cast<char*>(base_) + sizeof(Header) + sizeof(Slot) * ranks_.size();
  return reinterpret_cast<double*>(data) + (static_cast<size_t>(s) * 2 + round % 2) * static_cast<size_t>(words_);
}

std::unique_ptr<ShmHandshake> ShmHandshake::connect(c10d::Store& store, int slot, std::vector<int> ranks, int words,
                                                    std::chrono::milliseconds timeout) {
  const char* env = std::getenv("ZION_HANDSHAKE");
  const std::string choice = env ? env : "";
  if (!choice.empty() && choice != "shm" && choice != "gloo") {
    throw std::invalid_argument("ZION_HANDSHAKE is '" + choice +
                                "'; use 'shm' (the default: shared memory when all ranks run on one host) or 'gloo'");
  }
  const int slots = static_cast<int>(ranks.size());
  const size_t bytes = sizeof(Header) + sizeof(Slot) * slots + sizeof(double) * 2 * static_cast<size_t>(slots) * words;
  const std::string host = choice == "gloo" ? std::string() : host_key();

  std::unique_ptr<ShmHandshake> hs(new ShmHandshake());
  hs->slot_ = slot;
  hs->ranks_ = std::move(ranks);
  hs->words_ = words;
  hs->timeout_ = timeout;
  hs->bytes_ = bytes;
  hs->pid_ = static_cast<int>(getpid());

  // The first rank creates the segment and says where it is.
  std::string name;
  uint64_t token = 0;
  if (slot == 0) {
    std::string offer = "none";
    if (!host.empty()) {
      std::random_device random;
      token = (static_cast<uint64_t>(random()) << 32) ^ random();
      std::ostringstream n;
      n << "/zion-emu-handshake-" << getuid() << "-" << getpid() << "-" << std::hex << token;
      name = n.str();
      int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
      if (fd >= 0) {
        if (ftruncate(fd, static_cast<off_t>(bytes)) == 0) {
          void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
          if (base != MAP_FAILED) hs->base_ = base;
        }
        close(fd);
        if (!hs->base_) {
          shm_unlink(name.c_str());
        } else {
          auto* h = new (hs->base_) Header();
          h->token = token;
          h->slots = slots;
          h->words = words;
          h->epoch.store(0);
          h->waiters.store(0);
          for (int s = 0; s < slots; ++s) new (&hs->slot(s)) Slot();
          h->magic = kMagic;
          std::ostringstream o;
          o << name << " " << token << " " << host;
          offer = o.str();
        }
      }
    }
    store.set(std::string(kPrefix) + "segment", offer);
  } else {
    std::istringstream offer(as_string(store.get(std::string(kPrefix) + "segment")));
    std::string offered_host;
    offer >> name >> token >> offered_host;
    if (!host.empty() && name != "none" && offered_host == host) {
      int fd = shm_open(name.c_str(), O_RDWR, 0);
      struct stat st{};
      if (fd >= 0) {
        if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) == bytes) {
          void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
          if (base != MAP_FAILED) hs->base_ = base;
        }
        close(fd);
      }
      if (hs->base_) {
        auto* h = static_cast<Header*>(hs->base_);
        if (h->magic != kMagic || h->token != token || h->slots != slots || h->words != words) {
          munmap(hs->base_, bytes);
          hs->base_ = nullptr;
        }
      }
    }
  }
  if (hs->base_) hs->slot(slot).pid = hs->pid_;

  // Every rank says whether it mapped the segment; all decide alike.
  const bool named = !name.empty() && name != "none";
  bool everyone = true;
  try {
    store.set(std::string(kPrefix) + "mapped/" + std::to_string(slot), hs->base_ ? "1" : "0");
    for (int s = 0; s < slots; ++s) {
      everyone = as_string(store.get(std::string(kPrefix) + "mapped/" + std::to_string(s))) == "1" && everyone;
    }
  } catch (...) {  // a rank that never came: the store's timeout
    if (named) shm_unlink(name.c_str());
    throw;
  }
  // Every rank that will use it has it mapped: nothing needs the name now.
  if (named) shm_unlink(name.c_str());
  if (!everyone) return nullptr;
  return hs;
}

void ShmHandshake::leave() {
  if (!base_ || static_cast<int>(getpid()) != pid_) return;  // a forked child leaves nothing
  auto* h = static_cast<Header*>(base_);
  slot(slot_).left.store(1);
  h->epoch.fetch_add(1);
  futex_wake_all(&h->epoch);
}

ShmHandshake::~ShmHandshake() {
  if (!base_) return;
  leave();
  munmap(base_, bytes_);
}

std::string ShmHandshake::gone(int s) const {
  const int pid = slot(s).pid;
  if (kill(pid, 0) != 0 && errno == ESRCH) return "has exited";
  // A process that has exited but not been reaped yet still answers kill().
  std::string stat = read_line(("/proc/" + std::to_string(pid) + "/stat").c_str());
  size_t paren = stat.rfind(')');
  if (stat.empty() || paren == std::string::npos || paren + 2 >= stat.size()) return "has exited";
  char state = stat[paren + 2];
  if (state == 'Z' || state == 'X' || state == 'x') return "has exited";
  return {};
}

std::string ShmHandshake::rank_gone(int rank) const {
  for (size_t s = 0; s < ranks_.size(); ++s) {
    if (ranks_[s] == rank) return gone(static_cast<int>(s));
  }
  return {};
}

void ShmHandshake::all_gather(const double* mine, double* out) {
  if (static_cast<int>(getpid()) != pid_) {
    throw std::logic_error(
        "zion backend: this process was forked from a rank after its process group was created; a forked child is not a "
        "rank and cannot take part in the group's collectives");
  }
  std::lock_guard<std::mutex> lock(mutex_);  // one round at a time, whatever thread issues it
  auto* h = static_cast<Header*>(base_);
  const uint64_t round = round_ + 1;
  const int slots = static_cast<int>(ranks_.size());
  std::memcpy(buffer(slot_, round), mine, sizeof(double) * words_);
  slot(slot_).round.store(round, std::memory_order_release);
  h->epoch.fetch_add(1);
  if (h->waiters.load() > 0) futex_wake_all(&h->epoch);

  // Gives up on the group: the others must not wait for this rank either.
  auto give_up = [&](const std::string& why) {
    std::strncpy(slot(slot_).why, why.c_str(), sizeof(Slot::why) - 1);
    slot(slot_).abandoned.store(round);
    h->epoch.fetch_add(1);
    futex_wake_all(&h->epoch);
    throw HandshakeLost(why);
  };
  auto arrived = [&] {
    bool all = true;
    for (int s = 0; s < slots; ++s) {
      if (s == slot_) continue;
      const uint64_t abandoned = slot(s).abandoned.load();
      if (abandoned != 0 && abandoned <= round) {
        char why[sizeof(Slot::why)] = {0};
        std::memcpy(why, slot(s).why, sizeof(why) - 1);
        give_up("rank " + std::to_string(ranks_[s]) + " gave up on the group earlier: " + why);
      }
      const bool there = slot(s).round.load(std::memory_order_acquire) >= round;
      if (!there && slot(s).left.load()) {
        give_up("rank " + std::to_string(ranks_[s]) + " has left the group (destroyed its process group) without issuing it");
      }
      all = all && there;
    }
    return all;
  };
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (int spin = 0; !arrived(); ++spin) {
    if (spin < kSpins) {
      sched_yield();
      continue;
    }
    {
      const uint32_t epoch = h->epoch.load();
      h->waiters.fetch_add(1);
      struct Leave {
        std::atomic<uint32_t>& waiters;
        ~Leave() { waiters.fetch_sub(1); }
      } leave{h->waiters};
      if (!arrived()) futex_wait(&h->epoch, epoch, kSlice);
    }
    if (arrived()) break;
    // Who is missing: gone, or late past the timeout.
    std::vector<int> late;
    for (int s = 0; s < slots; ++s) {
      if (slot(s).round.load(std::memory_order_acquire) >= round) continue;
      std::string why = gone(s);
      if (!why.empty()) give_up("rank " + std::to_string(ranks_[s]) + " (pid " + std::to_string(slot(s).pid) + ") " + why);
      late.push_back(ranks_[s]);
    }
    if (std::chrono::steady_clock::now() > deadline) {
      std::ostringstream msg;
      msg << "rank(s) ";
      for (size_t i = 0; i < late.size(); ++i) msg << (i ? ", " : "") << late[i];
      msg << " did not issue it within the group's timeout (" << timeout_.count() / 1000.0 << " s)";
      give_up(msg.str());
    }
  }
  for (int s = 0; s < slots; ++s) std::memcpy(out + static_cast<size_t>(s) * words_, buffer(s, round), sizeof(double) * words_);
  round_ = round;
}

}  // namespace zion::dist
