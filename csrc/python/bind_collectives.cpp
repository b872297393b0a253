// Bindings: the link model and timed collectives.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "sim/collective.h"
#include "sim/astra_emulation.h"
#include "sim/nccl_tuning.h"
#include "sim/platform_topology.h"

namespace py = pybind11;
using namespace zion::sim;

namespace {

CollectiveSettings settings_from_dict(const py::dict& d) {
  CollectiveSettings s;
  auto get = [&](const char* key, auto fallback) {
    return d.contains(key) ? d[key].cast<decltype(fallback)>() : fallback;
  };
  s.base_latency = get("base_latency_s", 0.0);
  s.pipeline_chunks = get("pipeline_chunks", 1);
  s.astra.endpoint_delay = get("endpoint_delay_s", 0.0);
  s.astra.preferred_dataset_splits = get("preferred_dataset_splits", 1);
  s.astra.active_chunks_per_dimension = get("active_chunks_per_dimension", 1);
  s.local_memory_bandwidth = get("local_memory_bandwidth_bytes_per_s", 0.0);
  s.default_algorithm = parse_algorithm(get("algorithm", std::string("auto")));
  for (const auto& name : get("level_algorithms", std::vector<std::string>{})) s.level_algorithms.push_back(parse_algorithm(name));
  for (auto item : d) {
    static const std::vector<std::string> known = {"base_latency_s", "pipeline_chunks", "endpoint_delay_s", "preferred_dataset_splits",
                                                   "active_chunks_per_dimension", "local_memory_bandwidth_bytes_per_s",
                                                   "algorithm", "level_algorithms"};
    auto key = item.first.cast<std::string>();
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      throw py::value_error("unknown collective setting '" + key + "'");
    }
  }
  if (s.pipeline_chunks < 1 || s.astra.preferred_dataset_splits < 1 || s.astra.active_chunks_per_dimension < 1) {
    throw py::value_error("pipeline_chunks, preferred_dataset_splits and active_chunks_per_dimension must be >= 1");
  }
  return s;
}

}  // namespace

void bind_collectives(py::module_& sim) {
  py::class_<CollectiveResult>(sim, "CollectiveResult")
      .def_readonly("time", &CollectiveResult::time, "seconds")
      .def_readonly("algbw", &CollectiveResult::algbw, "bytes per second")
      .def_readonly("busbw", &CollectiveResult::busbw, "bytes per second")
      .def_property_readonly("algorithm", [](const CollectiveResult& r) { return algorithm_name(r.algorithm); })
      .def_readonly("closed_form", &CollectiveResult::closed_form)
      .def_readonly("transfers", &CollectiveResult::transfers)
      .def_readonly("protocol", &CollectiveResult::protocol,
                    "NCCL's protocol (LL, LL128, Simple) when NCCL's tuning model priced the call; '' otherwise")
      .def("__repr__", [](const CollectiveResult& r) {
        return "<CollectiveResult " + std::string(algorithm_name(r.algorithm)) +
               (r.protocol.empty() ? "" : "/" + r.protocol) + " time=" + std::to_string(r.time * 1e6) + "us busbw=" +
               std::to_string(r.busbw / 1e9) + "GB/s>";
      });

  sim.def(
      "emulate_astra",
      [](const std::string& op, uint64_t bytes, const std::string& topology, int npus, double bandwidth_gb_per_s,
         double latency_ns, const std::string& implementation, int direct_window, double endpoint_delay_ns,
         int splits, int active_chunks, double local_memory_gb_per_s, bool congestion_aware) {
        AstraEmulation s;
        if (topology == "Ring") {
          s.topology = AstraBlock::kRing;
        } else if (topology == "FullyConnected") {
          s.topology = AstraBlock::kFullyConnected;
        } else if (topology == "Switch") {
          s.topology = AstraBlock::kSwitch;
        } else {
          throw py::value_error("emulate_astra: topology '" + topology + "'; allowed: Ring, FullyConnected, Switch");
        }
        if (implementation == "ring") {
          s.implementation = AstraImplementation::kRing;
        } else if (implementation == "direct") {
          s.implementation = AstraImplementation::kDirect;
        } else {
          throw py::value_error("emulate_astra: implementation '" + implementation + "'; allowed: ring, direct");
        }
        s.npus = npus;
        s.bandwidth_gb_per_s = bandwidth_gb_per_s;
        s.latency_ns = latency_ns;
        s.direct_window = direct_window;
        s.endpoint_delay_ns = endpoint_delay_ns;
        s.splits = splits;
        s.active_chunks = active_chunks;
        s.local_memory_gb_per_s = local_memory_gb_per_s;
        s.backend = congestion_aware ? AstraBackend::kCongestionAware : AstraBackend::kCongestionUnaware;
        const AstraEmulationResult r = emulate_astra(parse_collective_op(op), bytes, s);
        return py::make_tuple(r.time_ns, r.messages);
      },
      py::arg("op"), py::arg("bytes"), py::arg("topology"), py::arg("npus"), py::arg("bandwidth_gb_per_s"),
      py::arg("latency_ns"), py::arg("implementation") = "ring", py::arg("direct_window") = -1,
      py::arg("endpoint_delay_ns") = 10.0, py::arg("splits") = 1, py::arg("active_chunks") = 1,
      py::arg("local_memory_gb_per_s") = 0.0, py::arg("congestion_aware") = true,
      "ASTRA-sim 2.0's system layer and analytical backend (congestion-aware or -unaware) on a one-dimensional "
      "network, event by event: (nanoseconds, network messages). bytes is ASTRA-sim's size (all_gather: each "
      "NPU's contribution); bandwidth in GB/s of 2^30 B, local memory in GB/s of 10^9 B.");

  py::class_<NcclTuning>(sim, "NcclTuning",
                         "NCCL v2.21.5's tuning model for the GPUs of one NVSwitch node, or of nodes of them joined "
                         "by NICs: latency + bytes / bandwidth per (algorithm, protocol), the least time chosen")
      .def(py::init([](int compute_capability, int ranks, double nvlink_gb_per_s, bool nvls, int nodes, int nics,
                       double nic_gb_per_s, bool amd_cpu) {
             NcclTuningInput in;
             in.compute_capability = compute_capability;
             in.ranks = ranks;
             in.nvlink_gb_per_s = nvlink_gb_per_s;
             in.nvls = nvls;
             in.nodes = nodes;
             in.nics = nics;
             in.nic_gb_per_s = nic_gb_per_s;
             in.amd_cpu = amd_cpu;
             try {
               return NcclTuning(in);
             } catch (const std::invalid_argument& e) {
               throw py::value_error(e.what());
             }
           }),
           py::arg("compute_capability"), py::arg("ranks"), py::arg("nvlink_gb_per_s"), py::arg("nvls") = false,
           py::arg("nodes") = 1, py::arg("nics") = 0, py::arg("nic_gb_per_s") = 0.0, py::arg("amd_cpu") = false,
           "ranks: all nodes' GPUs; across nodes (nodes > 1) nics per node at nic_gb_per_s each (the GPU-to-NIC path) "
           "and whether the host CPU is AMD's")
      .def("graph",
           [](const NcclTuning& t, const std::string& algorithm) {
             const NcclGraph& g = t.graph(parse_nccl_algorithm(algorithm));
             return py::make_tuple(g.channels, g.bandwidth);
           },
           py::arg("algorithm"), "(channels, GB/s per channel) of NCCL's channel search")
      .def(
          "graph_across_nodes",
          [](const NcclTuning& t, const std::string& algorithm) {
            const NcclGraph& g = t.graph(parse_nccl_algorithm(algorithm));
            return py::make_tuple(g.channels, g.bandwidth, g.inter_bandwidth);
          },
          py::arg("algorithm"), "(channels, bwIntra, bwInter GB/s per channel) of NCCL's channel search with NICs")
      .def(
          "candidates",
          [](const NcclTuning& t, const std::string& op, double bytes) {
            py::list out;
            for (const auto& c : t.candidates(parse_collective_op(op), bytes)) {
              py::dict d;
              d["algorithm"] = nccl_algorithm_name(c.algorithm);
              d["protocol"] = nccl_protocol_name(c.protocol);
              d["time"] = c.time;
              d["latency"] = c.latency;
              d["bandwidth"] = c.bandwidth;
              out.append(d);
            }
            return out;
          },
          py::arg("op"), py::arg("bytes"),
          "Every (algorithm, protocol) NCCL offers for op: time and latency (s), algorithm bandwidth (bytes/s)")
      .def(
          "choose",
          [](const NcclTuning& t, const std::string& op, double bytes) {
            const NcclChoice c = t.choose(parse_collective_op(op), bytes);
            return py::make_tuple(nccl_algorithm_name(c.algorithm), nccl_protocol_name(c.protocol), c.time);
          },
          py::arg("op"), py::arg("bytes"), "(algorithm, protocol, seconds) of least time")
      .def_property_readonly("collective_channels", &NcclTuning::collective_channels,
                             "the communicator's collective channels (2 x min(ring, tree) search channels, <= 32)")
      .def(
          "launch",
          [](const NcclTuning& t, const std::string& op, double bytes, const std::string& algorithm,
             const std::string& protocol) {
            const NcclAlgorithm a = parse_nccl_algorithm(algorithm);
            int p = -1;
            for (int i = 0; i < kNcclProtocols; ++i) {
              if (protocol == nccl_protocol_name(static_cast<NcclProtocol>(i))) p = i;
            }
            if (p < 0) throw py::value_error("unknown NCCL protocol '" + protocol + "'; allowed: LL, LL128, Simple");
            NcclLaunch l;
            try {
              l = t.launch(parse_collective_op(op), bytes, a, static_cast<NcclProtocol>(p));
            } catch (const std::invalid_argument& e) {
              throw py::value_error(e.what());
            }
            py::dict d;
            d["modeled"] = l.modeled;
            d["collective_channels"] = l.collective_channels;
            d["channels"] = l.channels;
            d["threads"] = l.threads;
            d["channel_bytes"] = l.channel_bytes;
            d["chunk_bytes"] = l.chunk_bytes;
            d["loops"] = l.loops;
            d["last_chunk_bytes"] = l.last_chunk_bytes;
            d["sends"] = l.sends;
            d["slices"] = l.slices;
            d["channel_bandwidth"] = l.channel_bandwidth;
            d["hop_latency"] = l.hop_latency;
            d["base_latency"] = l.base_latency;
            d["time"] = l.time;
            return d;
          },
          py::arg("op"), py::arg("bytes"), py::arg("algorithm"), py::arg("protocol"),
          "The pipeline model of one call of (algorithm, protocol): channels launched, threads, the busiest "
          "channel's bytes, chunk, loops, last chunk, sends per loop, slices per chunk, channel bandwidth "
          "(bytes/s), hop and base latency and time (s). NVLS: sends are the pipeline's stages (all_reduce 3: scatter, "
          "reduce, gather; all_gather / reduce_scatter 2). Tree: modeled False and the tuner's time");

  py::class_<CollectiveModel, std::shared_ptr<CollectiveModel>>(sim, "CollectiveModel",
                                                               "Times collectives among devices of a platform or topology")
      .def(py::init<const Platform&>(), py::arg("platform"))
      .def(py::init([](const std::shared_ptr<Topology>& topology, const std::vector<int>& level_sizes, const py::dict& settings) {
             return std::make_shared<CollectiveModel>(topology, level_sizes, settings_from_dict(settings));
           }),
           py::arg("topology"), py::arg("level_sizes"), py::arg("settings") = py::dict())
      .def_property_readonly("topology", [](const CollectiveModel& m) { return std::const_pointer_cast<Topology>(m.shared_topology()); })
      .def_property_readonly("device_count", &CollectiveModel::device_count)
      .def("device_vertex", &CollectiveModel::device_vertex, py::arg("device"))
      .def("rings", &CollectiveModel::rings, py::arg("devices"),
           "The rings the ring algorithm runs at once among these devices (device orders, the data split evenly "
           "among them, each run both ways): the given order, or on a hybrid cube mesh the link-disjoint rings of "
           "direct links")
      .def("run",
           [](const CollectiveModel& m, const std::string& op, double bytes, const std::vector<int>& devices,
              const std::string& algorithm, const std::string& link_model, int root,
              const std::vector<std::vector<double>>& all_to_all_bytes, bool force_simulation) {
             CollectiveRequest r;
             r.op = parse_collective_op(op);
             r.bytes = bytes;
             r.devices = devices;
             r.algorithm = parse_algorithm(algorithm);
             r.link_model = parse_link_model(link_model);
             r.root = root;
             r.all_to_all_bytes = all_to_all_bytes;
             r.force_simulation = force_simulation;
             py::gil_scoped_release release;
             return m.run(r);
           },
           py::arg("op"), py::arg("bytes"), py::arg("devices"), py::arg("algorithm") = "auto", py::arg("link_model") = "fair",
           py::arg("root") = 0, py::arg("all_to_all_bytes") = std::vector<std::vector<double>>{},
           py::arg("force_simulation") = false);

  sim.def("bus_bandwidth_factor", [](const std::string& op, int n) { return bus_bandwidth_factor(parse_collective_op(op), n); },
          py::arg("op"), py::arg("ranks"));
  // The name tables of csrc/sim, for the CLI's choices and Python's checks.
  sim.def("algorithm_names", &algorithm_names, "Collective algorithms, auto (the platform's choice per call) first");
  sim.def("collective_op_names", &collective_op_names, "Collectives the model times");
  sim.def("link_model_names", &link_model_names, "Link models: how transfers share the links");

  sim.def("simulate_transfers",
          [](const std::shared_ptr<Topology>& t, const std::vector<py::dict>& transfers, const std::string& link_model,
             double endpoint_delay_s, double local_memory_bandwidth) {
            std::vector<Transfer> list;
            for (const auto& d : transfers) {
              Transfer tr;
              tr.src = d["src"].cast<int>();
              tr.dst = d["dst"].cast<int>();
              tr.bytes = d["bytes"].cast<double>();
              if (d.contains("deps")) tr.deps = d["deps"].cast<std::vector<int>>();
              if (d.contains("not_before")) tr.not_before = d["not_before"].cast<double>();
              if (d.contains("reduce_bytes")) tr.reduce_bytes = d["reduce_bytes"].cast<double>();
              int n = static_cast<int>(t->vertices().size());
              if (tr.src < 0 || tr.dst < 0 || tr.src >= n || tr.dst >= n || tr.src == tr.dst) {
                throw py::value_error("transfer endpoints must be two different vertices in 0.." + std::to_string(n - 1));
              }
              list.push_back(std::move(tr));
            }
            LinkModel m = parse_link_model(link_model);
            SimulationResult r;
            {
              py::gil_scoped_release release;
              r = simulate(*t, list, m, {endpoint_delay_s, local_memory_bandwidth});
            }
            py::dict out;
            py::list times;
            for (const auto& x : r.timings) times.append(py::make_tuple(x.start, x.end));
            out["timings"] = times;
            out["makespan"] = r.makespan;
            out["link_bytes"] = r.link_bytes;
            out["rate_updates"] = r.rate_updates;
            return out;
          },
          py::arg("topology"), py::arg("transfers"), py::arg("link_model") = "fair", py::arg("endpoint_delay_s") = 0.0,
          py::arg("local_memory_bandwidth_bytes_per_s") = 0.0,
          "transfers: dicts with src, dst (vertex ids), bytes, and optional deps, not_before, reduce_bytes");
}
