// The pipeline model of NCCL v2.21.5's kernels (collectives.nccl_tuner.time_model
// = "pipeline"): NcclTuning::launch and NcclTuning::time. See nccl_tuning.h.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "nccl_tables.h"
#include "nccl_tuning.h"

namespace zion::sim {
namespace {

using nccl_tables::generation_index;
using nccl_tables::kBaseLatency;
using nccl_tables::kLLMaxBw;
using nccl_tables::kNvlinkLatency;
using nccl_tables::kPerChMaxRingLL128Bw;

// The pipeline model's figures, NCCL v2.21.5:
constexpr int kNcclSteps = 8;                // src/include/device.h NCCL_STEPS
constexpr int kWarpSize = 32;
// src/init.cc: DEFAULT_LL_BUFFSIZE = NCCL_LL_LINES_PER_THREAD (8) x NCCL_LL_MAX_NTHREADS (512) x NCCL_STEPS x
// 16-byte ncclLLFifoLine; DEFAULT_LL128_BUFFSIZE = NCCL_LL128_ELEMS_PER_THREAD (120) x NCCL_LL128_MAX_NTHREADS (640)
// x NCCL_STEPS x 8 B; DEFAULT_BUFFSIZE (Simple) 1 << 22.
constexpr double kBuffSize[kNcclProtocols] = {8.0 * 512 * kNcclSteps * 16, 120.0 * 640 * kNcclSteps * 8, 4194304.0};
// src/device/device.h: NCCL_LL_MAX_NTHREADS, NCCL_LL128_MAX_NTHREADS, NCCL_SIMPLE_MAX_NTHREADS (ring Simple runs
// 512 when the ring graph's bwIntra x channels is above PCI_BW, 24 GB/s: tuning.cc simpleDefaultThreads; every
// NVSwitch graph here is).
constexpr int kMaxThreads[kNcclProtocols] = {512, 640, 512};
// src/include/comm.h NCCL_LL_THREAD_THRESHOLD, NCCL_LL128_THREAD_THRESHOLD, NCCL_SIMPLE_THREAD_THRESHOLD
// (tuning.cc multiplies ring LL's by nRanks).
constexpr int kThreadThreshold[kNcclProtocols] = {8, 8, 64};

// src/enqueue.cc computeCollChunkInfo, ring: a step is buffSize / NCCL_STEPS; Simple chunks are chunkSteps steps
// (ALLREDUCE / ALLGATHER / REDUCESCATTER_CHUNKSTEPS = NCCL_STEPS / 2 in src/include/collectives.h, BROADCAST /
// REDUCE_CHUNKSTEPS 1), LL and LL128 one step; LL carries 8 data bytes per 16-byte line (chunkSize / 2), LL128
// 15 data words per 16-word 128-byte line (NCCL_LL128_DATAELEMS / NCCL_LL128_LINEELEMS).
double ring_chunk_bytes(NcclProtocol p, int chunk_steps) {
  const double step = kBuffSize[static_cast<int>(p)] / kNcclSteps;
  switch (p) {
    case NcclProtocol::kLL: return step / 2;
    case NcclProtocol::kLL128: return std::floor(step / 16) * 15;
    case NcclProtocol::kSimple: return step * chunk_steps;
  }
  return step;
}

// src/include/enqueue.h: NCCL_SIMPLE_ALIGNMENT (WARP_SIZE x 8 x 16 bytes), NCCL_LL128_ALIGNMENT_PER_WARP (480 B),
// NCCL_LL_ALIGNMENT_PER_THREAD (8 B); enqueue.cc computeCollAlignCount, in bytes.
double align_bytes(NcclProtocol p, int threads) {
  switch (p) {
    case NcclProtocol::kSimple: return kWarpSize * 8.0 * 16.0;
    case NcclProtocol::kLL128: return 480.0 * (threads / kWarpSize);
    case NcclProtocol::kLL: return 8.0 * threads;
  }
  return 1;
}

double div_up(double a, double b) { return std::ceil(a / b); }

// The cuts of a chunk of `bytes` into prims_simple.h's slices: sliceSize = max(divUp(nelem, 16 x SlicePerChunk)
// x 16, stepSize x StepPerSlice / 32) (the 16-element rounding, under 129 bytes, is left out), as many slices as
// cover the chunk, at most SlicePerChunk. LL and LL128 have one.
std::vector<double> slice_bytes(double bytes, int slices, double step_bytes, int steps_per_slice) {
  if (slices <= 1 || bytes <= 0) return {bytes};
  const double slice = std::max(bytes / slices, step_bytes * steps_per_slice / 32);
  std::vector<double> out;
  for (double done = 0; done < bytes && static_cast<int>(out.size()) < slices; done += slice) {
    out.push_back(std::min(slice, bytes - done));
  }
  return out;
}

// One loop of a ring kernel (all_reduce.h, all_gather.h, reduce_scatter.h runRing), seen from one rank (every
// rank runs the same sends at the same times): `sends` sends of the chunk, one after another on the channel;
// slice s of send j needs slice s of send j - 1 from the previous rank, which arrives a hop latency after it
// left; the loop's last receive (directRecv) ends it a hop after the last send, and the next loop starts then.
Seconds ring_loop(int sends, const std::vector<double>& slices, double bandwidth, Seconds hop) {
  std::vector<Seconds> prev(slices.size(), 0.0), cur(slices.size(), 0.0);
  Seconds t = 0;
  for (int j = 0; j < sends; ++j) {
    for (size_t s = 0; s < slices.size(); ++s) {
      const Seconds start = j == 0 ? t : std::max(t, prev[s] + hop);
      t = cur[s] = start + slices[s] / bandwidth;
    }
    std::swap(prev, cur);
  }
  return sends > 0 ? prev.back() + hop : 0;
}

// LL and LL128 move data in lines that carry their own flags (src/device/prims_ll.h: readLL spins on each
// 16-byte line's two flags; prims_ll128.h: each warp on its 128-byte lines' flag words): a receiving thread
// takes a line as soon as it lands and stores it on at once, so a rank passes on the previous rank's data a
// hop behind it, line by line, not a whole chunk later as with Simple's slices. A rank's steps still run one
// after another: each step ends in a block barrier (postRecv's and waitSend's barrier()). With every rank on
// the same schedule and a step's lines leaving at the channel's rate, step j's first line leaves at
// p_j = max(end_{j-1}, p_{j-1} + hop) (the rank is done with step j - 1, and the previous rank's first line of
// step j - 1 has landed), and the step ends at p_j + h for a chunk time h. So each send adds max(h, hop):
// the loop takes (sends - 1) max(h, hop) + h, and ends when the last send's last line has landed, a hop later.
Seconds ring_loop_lines(int sends, double bytes, double bandwidth, Seconds hop) {
  if (sends <= 0) return 0;
  const Seconds h = bytes / bandwidth;
  Seconds first = 0, end = h;
  for (int j = 1; j < sends; ++j) {
    first = std::max(end, first + hop);
    end = first + h;
  }
  return end + hop;
}

// The chain below with LL / LL128's lines: rank m starts chunk i once it has ended chunk i - 1 and chunk i's
// first line has come from rank m - 1, a hop after rank m - 1 started it. Every path through (rank, chunk) has
// i chunk times and m hops, so rank m starts chunk i at i h + m x hop, and the last rank's last line lands at
// (full) h + last + hops x hop.
Seconds chain_lines(int hops, double full, Seconds h, Seconds last, Seconds hop) {
  return hops <= 0 ? 0 : full * h + last + hops * hop;
}

// A chain of `hops` (broadcast.h / reduce.h runRing: the root's chunks pass rank to rank): chunk i leaves rank
// m once rank m has sent chunk i - 1 and chunk i has arrived from rank m - 1 (a hop after it left there); the
// call ends when the last chunk reaches the chain's end. With `full` chunks of h seconds every path through
// (rank, chunk) has the same length, so rank m finishes chunk i at (m + i + 1) h + m x hop; a smaller last
// chunk of `last` seconds follows those.
Seconds chain(int hops, double full, Seconds h, Seconds last, Seconds hop) {
  if (hops <= 0) return 0;
  Seconds arrived = 0, done = 0;
  for (int m = 0; m < hops; ++m) {
    const Seconds prev = full > 0 ? (m + full) * h + m * hop : 0;  // rank m done with chunk full - 1
    const Seconds start = std::max(prev, m == 0 ? 0.0 : arrived);
    done = start + last;
    arrived = done + hop;
  }
  return arrived;
}

// NVLS all_reduce on one node, NCCL v2.21.5 (src/device/all_reduce.h, RunWorkElement<ncclFuncAllReduce, T,
// RedOp, NCCL_ALGO_NVLS, NCCL_PROTO_SIMPLE>, the args->oneNode branch). Each channel's thread block is split
// into three warp groups that run at once: scatter (the channel's input to every head's buffer, nvls->up),
// reduce (directRecvDirectSend over nvls->down: multimem load-reduce of the head's chunk from every rank, and a
// multimem store of the sum to every rank) and gather (the sums to the output). Each group walks the channel's
// elements in loops of nHeads x chunk, one NCCL step a loop, so the loops pass through the three groups like a
// pipeline: the reduce of loop i needs every rank's scatter of loop i, the gather of loop i every head's reduce
// of it. The source has no speed for one warp group; each is taken to move a loop's bytes at the channel's
// share of the tuner's NVLS bandwidth (the one figure NCCL has for these kernels). With equal stages the loops
// take sum(t_i) + (stages - 1) x max(t_i) (a proportionate flow shop).
constexpr int kNvlsStages = 3;                 // all_reduce: scatter, reduce, gather warp groups (one node)
constexpr int kNvlsChannels = 16;              // src/transport/nvls.cc: NCCL_PARAM(NvlsChannels, "NVLS_NCHANNELS", 16)
constexpr double kNvlsChunkSize = 131072;      // src/transport/nvls.cc: NCCL_PARAM(NvlsChunkSize, ..., 128*1024)
constexpr int kMaxNthreads = 640;              // src/include/device.h NCCL_MAX_NTHREADS (tuning.cc: NVLS's maxThreads)

// enqueue.cc computeCollChunkInfo, NVLS on one node: a Simple step (buffSize / NCCL_STEPS, chunkSteps 1 for
// non-ring algorithms), capped at nvlsChunkSize, then shrunk for small calls against the concurrent ops
// (channels x heads): below 64 x ops x chunk to 64 KiB, below 8 x ops x chunk to 32 KiB, below 2 x ops x chunk
// to 16 KiB, each test on the chunk the previous one left.
double nvls_chunk_bytes(double bytes, int channels, int heads) {
  double chunk = std::min(kBuffSize[static_cast<int>(NcclProtocol::kSimple)] / kNcclSteps, kNvlsChunkSize);
  const double ops = static_cast<double>(channels) * heads;
  if (bytes < 64 * ops * chunk && chunk > 65536) chunk = 65536;
  if (bytes < 8 * ops * chunk && chunk > 32768) chunk = 32768;
  if (bytes < 2 * ops * chunk && chunk > 16384) chunk = 16384;
  return chunk;
}

// The pipeline model of an NVLS call on one node of `ranks` GPUs (every GPU the head of one channel graph:
// nHeads = ranks), priced from the tuner's NVLS latency (us) and algorithm bandwidth (GB/s).
// enqueue.cc: getChannnelThreadInfo launches comm->nvlsChannels and NVLS's maxThreads; addTunedCollToPlan
// splits the count over them in NCCL_SIMPLE_ALIGNMENT pieces (all_gather / reduce_scatter: the count is each
// rank's piece, src/include/info.h ncclInfoSetDerived) and passes computeCollChunkInfo the call's nBytes (the
// gathered or scattered total); computeCollLastChunkInfo gives all_reduce's last chunk. Every launched channel
// moves its bytes at 1 / nvlsChannels of the call's bandwidth.
//   all_reduce (all_reduce.h): loops of nHeads x chunk through scatter, reduce and gather warp groups (above).
//   all_gather (all_gather.h, not registered): loops of one chunk of the rank's piece through two warp groups,
//     a broadcast of the chunk through NVLS (nvls->down) and a gather of every head's chunk (nvls->up).
//   reduce_scatter (reduce_scatter.h): loops of one chunk of the piece through a scatter of every head's chunk
//     (nvls->up) and a multimem reduce of this rank's (nvls->down).
// A loop's stage moves the loop's share of the call's bytes: all_reduce the loop's elements, all_gather and
// reduce_scatter nHeads chunks (the gathered / scattered bytes the tuner's bandwidth is of).
NcclLaunch nvls_launch(CollectiveOp op, double bytes, int ranks, double latency_us, double bandwidth_gb_per_s,
                       NcclLaunch l) {
  l.modeled = true;
  const int heads = ranks;
  const bool all_reduce = op == CollectiveOp::kAllReduce;
  const int stages = all_reduce ? kNvlsStages : kNvlsStages - 1;
  const double work = all_reduce ? bytes : bytes / ranks;
  const double align = align_bytes(NcclProtocol::kSimple, kMaxNthreads);
  const double per_channel = work > 0 ? div_up(div_up(work, kNvlsChannels), align) * align : 0;
  l.channels = work > 0 ? static_cast<int>(div_up(work, per_channel)) : kNvlsChannels;
  l.threads = kMaxNthreads;
  l.channel_bytes = std::min(per_channel, work);
  l.chunk_bytes = nvls_chunk_bytes(bytes, l.channels, heads);
  l.sends = stages;  // NVLS: the pipeline's stages (warp groups), not ring sends
  l.slices = 1;      // ProtoSimple<1, 1>: one slice of one step a chunk
  l.channel_bandwidth = bandwidth_gb_per_s * 1e9 / kNvlsChannels;
  l.hop_latency = 0;
  l.base_latency = latency_us * 1e-6;
  const double W = l.channel_bytes;
  // all_reduce.h: loopCount = nvls->nHeads * chunkSize; all_gather.h / reduce_scatter.h step by chunkCount.
  const double loop_bytes = all_reduce ? heads * l.chunk_bytes : l.chunk_bytes;
  const double moved = all_reduce ? 1.0 : heads;  // bytes of the call per byte of the channel's elements
  const double full = std::floor(W / loop_bytes);
  const double rest = W - full * loop_bytes;
  l.loops = static_cast<long long>(full) + (rest > 0 ? 1 : 0);
  l.last_chunk_bytes = rest > 0 ? (all_reduce ? div_up(div_up(rest, heads), align) * align : rest)
                                : (full > 0 ? l.chunk_bytes : 0);
  // The last loop moves what is left (nelem = min(loopCount or chunkCount, what is left)).
  const Seconds t_full = moved * loop_bytes / l.channel_bandwidth;
  const Seconds t_rest = moved * rest / l.channel_bandwidth;
  const Seconds longest = full > 0 ? t_full : t_rest;
  const Seconds loops = full * t_full + t_rest + (l.loops > 0 ? (stages - 1) * longest : 0);
  l.time = l.base_latency + loops;
  return l;
}

}  // namespace

NcclLaunch NcclTuning::launch(CollectiveOp op, double bytes, NcclAlgorithm a, NcclProtocol p) const {
  NcclLaunch l;
  const int c = op_index(op);
  if (c < 0) throw std::invalid_argument(std::string("NCCL's tuner does not price ") + collective_op_name(op));
  if (!(bytes >= 0) || !std::isfinite(bytes)) throw std::invalid_argument("NCCL launch: bytes must be >= 0");
  if (bandwidth_[c][static_cast<int>(a)][static_cast<int>(p)] == 0) {
    throw std::invalid_argument(std::string("NCCL offers no ") + nccl_algorithm_name(a) + "/" + nccl_protocol_name(p) +
                                " for " + collective_op_name(op) + " here");
  }
  l.collective_channels = collective_channels();
  if (a == NcclAlgorithm::kNvls) {
    const int ai = static_cast<int>(a), pi = static_cast<int>(p);
    return nvls_launch(op, bytes, input_.ranks, latency_[c][ai][pi], bandwidth_[c][ai][pi], l);
  }
  if (a != NcclAlgorithm::kRing || input_.nodes > 1) {
    // Tree, and any pair across nodes, keeps the tuner's price (see nccl_tuning.h).
    for (const auto& choice : candidates(op, bytes)) {
      if (choice.algorithm == a && choice.protocol == p) l.time = choice.time;
    }
    return l;
  }
  l.modeled = true;
  const int n = input_.ranks;
  const int pi = static_cast<int>(p);

  // enqueue.cc getChannnelThreadInfo: drop a channel while nBytes < channels x threads x threshold, then halve
  // the threads (while a multiple of 128) the same way; ring Simple adds a sync warp; at least 3 warps.
  const double threshold = kThreadThreshold[pi] * (p == NcclProtocol::kLL ? n : 1);
  int nc = l.collective_channels;
  int nt = kMaxThreads[pi];
  while (bytes < static_cast<double>(nc) * nt * threshold && nc >= 2) --nc;
  while (bytes < static_cast<double>(nc) * nt * threshold && nt % 128 == 0) nt /= 2;
  if (p == NcclProtocol::kSimple) nt += kWarpSize;
  if (nt / kWarpSize < 3) nt = 3 * kWarpSize;
  l.threads = nt;

  // addTunedCollToPlan: count split evenly over channels in aligned pieces; all_gather and reduce_scatter count
  // each rank's piece (nBytes / nRanks).
  const bool per_rank_piece = op == CollectiveOp::kAllGather || op == CollectiveOp::kReduceScatter;
  const double work = per_rank_piece ? bytes / n : bytes;
  const double align = align_bytes(p, nt);
  const double per_channel = work > 0 ? div_up(div_up(work, nc), align) * align : 0;
  l.channels = work > 0 ? static_cast<int>(div_up(work, per_channel)) : nc;
  l.channel_bytes = std::min(per_channel, work);

  const bool chained = op == CollectiveOp::kBroadcast || op == CollectiveOp::kReduce;
  // collectives.h: ALLREDUCE / ALLGATHER / REDUCESCATTER chunk NCCL_STEPS / 2 steps in slices of NCCL_STEPS / 4;
  // BROADCAST / REDUCE 1 and 1. Only ring Simple uses them (computeCollChunkInfo).
  const int chunk_steps = chained ? 1 : kNcclSteps / 2;
  const int slice_steps = chained ? 1 : kNcclSteps / 4;
  l.slices = p == NcclProtocol::kSimple ? chunk_steps / slice_steps : 1;
  l.chunk_bytes = ring_chunk_bytes(p, chunk_steps);
  // A channel's bandwidth: the tuner's ring bus bandwidth formula (the protocol factors and caps above) for
  // the channels launched, over those channels. Each collective channel carries its share of the search's
  // channels x bwIntra; LL's llMaxBw caps all launched channels together, LL128's per-channel cap scales with
  // them. With every collective channel launched it is the tuner's bus bandwidth / collective channels.
  {
    const NcclGraph& g = graphs_[static_cast<int>(NcclAlgorithm::kRing)];
    const double share = static_cast<double>(l.channels) / l.collective_channels;
    const double raw = g.channels * g.bandwidth * share;
    const int gen = generation_index(input_.compute_capability);
    double bus = raw;
    if (p == NcclProtocol::kLL) bus = std::min(kLLMaxBw[gen], raw * 0.5);
    if (p == NcclProtocol::kLL128) bus = std::min(raw * 0.92, g.channels * share * kPerChMaxRingLL128Bw[gen]);
    l.channel_bandwidth = bus * 1e9 / l.channels;
  }
  l.hop_latency = kNvlinkLatency[static_cast<int>(NcclAlgorithm::kRing)][pi] * 1e-6;
  l.base_latency = kBaseLatency[static_cast<int>(NcclAlgorithm::kRing)][pi] * 1e-6;
  const double step_bytes = kBuffSize[pi] / kNcclSteps;
  const double W = l.channel_bytes;

  // LL and LL128 pass data on line by line, Simple slice by slice (ring_loop_lines above).
  const bool lines = p != NcclProtocol::kSimple;
  Seconds t = 0;
  if (chained) {
    // One chunk per loop down a chain of n - 1 hops.
    l.sends = n - 1;
    l.loops = W > 0 ? static_cast<long long>(div_up(W, l.chunk_bytes)) : 0;
    l.last_chunk_bytes = l.loops > 0 ? W - (l.loops - 1) * l.chunk_bytes : 0;
    if (l.loops > 0) {
      t = (lines ? chain_lines : chain)(n - 1, static_cast<double>(l.loops - 1), l.chunk_bytes / l.channel_bandwidth,
                                        l.last_chunk_bytes / l.channel_bandwidth, l.hop_latency);
    }
  } else {
    // all_reduce: a loop covers nRanks chunks (one per rank, 2(n-1) sends); the last loop's chunk is the rest
    // over nRanks, aligned (computeCollLastChunkInfo), and a send moves at most what is left of the loop.
    // all_gather / reduce_scatter: a loop covers one chunk of each rank's piece, n - 1 sends.
    const bool all_reduce = op == CollectiveOp::kAllReduce;
    l.sends = all_reduce ? 2 * (n - 1) : n - 1;
    const double loop_bytes = all_reduce ? n * l.chunk_bytes : l.chunk_bytes;
    const double full = std::floor(W / loop_bytes);
    const double rest = W - full * loop_bytes;
    l.loops = static_cast<long long>(full) + (rest > 0 ? 1 : 0);
    l.last_chunk_bytes = rest > 0 ? (all_reduce ? std::min(div_up(div_up(rest, n), align) * align, rest) : rest)
                                  : (full > 0 ? l.chunk_bytes : 0);
    const auto loop = [&](double chunk) {
      return lines ? ring_loop_lines(l.sends, chunk, l.channel_bandwidth, l.hop_latency)
                   : ring_loop(l.sends, slice_bytes(chunk, l.slices, step_bytes, slice_steps), l.channel_bandwidth,
                               l.hop_latency);
    };
    if (full > 0) t += full * loop(l.chunk_bytes);
    if (rest > 0) t += loop(l.last_chunk_bytes);
  }
  l.time = l.base_latency + t;
  return l;
}

Seconds NcclTuning::time(CollectiveOp op, double bytes, const NcclChoice& choice, NcclTimeModel model) const {
  if (model == NcclTimeModel::kTuner || choice.algorithm == NcclAlgorithm::kTree || input_.nodes > 1) return choice.time;
  return launch(op, bytes, choice.algorithm, choice.protocol).time;
}

}  // namespace zion::sim
