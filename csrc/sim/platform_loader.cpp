#include "platform_loader.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

#include "collective.h"
#include "json_fields.h"

namespace zion::sim {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// The largest machine the model builds: its routes and collective plans grow
// with the square of the OAMs. Measured on 2 cores, `zion-emu collectives`
// over every OAM of zionex with more nodes: 2,048 OAMs all_to_all 12 s and
// 1.4 GB of host memory; 4,096 OAMs 48 s and 4.8 GB; 8,192 all_reduce 118 s
// and 19 GB; 65,536 ran out of memory.
constexpr int kMaxModeledUnits = 4096;
// NCCL pipelines a channel's buffer in 8 steps; far more chunks than that
// only multiply the transfers a pipelined plan simulates.
constexpr int kMaxPipelineChunks = 1024;

// The length of the well-formed UTF-8 sequence at `s[i]` (RFC 3629: no
// overlong forms, no surrogates, nothing past U+10FFFF), or 0.
size_t utf8_sequence_length(const std::string& s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char b = byte(i);
  if (b < 0x80) return 1;
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (b >= 0xC2 && b <= 0xDF) {
    n = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    n = 3;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    n = 4;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > s.size() || byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  }
  return n;
}

std::mutex g_dirs_mutex;
std::vector<std::string> g_default_dirs;  // empty: not set by the caller

// The deepest nesting of objects and lists a platform document may have. A
// preset nests five levels; a document nested tens of thousands deep would
// overflow the stack when it is merged, checked or freed.
constexpr int kMaxJsonDepth = 64;

struct TooDeep {};

// Parses `text`, refusing nesting past kMaxJsonDepth with a ConfigError that
// names `what`; a syntax error is left to the caller as json::parse_error.
json parse_json(const std::string& text, const std::string& what) {
  try {
    return json::parse(text, [](int depth, json::parse_event_t, json&) {
      if (depth > kMaxJsonDepth) throw TooDeep{};
      return true;
    });
  } catch (const TooDeep&) {
    throw ConfigError(what + " nests objects or lists deeper than " + std::to_string(kMaxJsonDepth) +
                      " levels (the presets nest five)");
  }
}

json read_json_file(const fs::path& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw ConfigError("platform file '" + path.string() + "' is a directory, not a file");
  std::ifstream in(path);
  if (!in) throw ConfigError("platform file '" + path.string() + "' cannot be opened");
  std::stringstream text;
  text << in.rdbuf();
  try {
    return parse_json(text.str(), "platform file '" + path.string() + "'");
  } catch (const json::exception& e) {  // a syntax error, or a number past a double's range (1e400)
    throw ConfigError("platform file '" + path.string() + "' is not valid JSON: " + e.what());
  }
}

bool looks_like_path(const std::string& s) {
  return s.find('/') != std::string::npos || (s.size() > 5 && s.substr(s.size() - 5) == ".json");
}

fs::path resolve(const std::string& name_or_path, const std::vector<std::string>& dirs,
                 const fs::path& relative_to) {
  if (looks_like_path(name_or_path)) {
    fs::path p(name_or_path);
    if (p.is_relative() && !relative_to.empty() && fs::exists(relative_to / p)) return relative_to / p;
    if (!fs::exists(p)) throw ConfigError("platform file '" + name_or_path + "' does not exist");
    return p;
  }
  for (const auto& dir : dirs) {
    fs::path p = fs::path(dir) / (name_or_path + ".json");
    if (fs::exists(p)) return p;
  }
  throw ConfigError("unknown platform '" + name_or_path + "'; presets: " + join_names(preset_names(dirs)) +
                    " (or give the path of a .json file)");
}

// Objects merge field by field; anything else in `top` replaces `base`.
void merge_into(json& base, const json& top) {
  for (auto it = top.begin(); it != top.end(); ++it) {
    auto found = base.find(it.key());
    if (found != base.end() && found->is_object() && it->is_object()) {
      merge_into(*found, *it);
    } else {
      base[it.key()] = *it;
    }
  }
}

// `chain`: the files read so far, each the base of the one before it, as
// (canonical path, path as named).
using BaseChain = std::vector<std::pair<std::string, std::string>>;

json load_merged(const std::string& name_or_path, const std::vector<std::string>& dirs,
                 const fs::path& relative_to, BaseChain& chain, bool* has_base = nullptr) {
  fs::path path = resolve(name_or_path, dirs, relative_to);
  std::string key = fs::weakly_canonical(path).string();
  const auto again = std::find_if(chain.begin(), chain.end(), [&](const auto& link) { return link.first == key; });
  if (again != chain.end()) {
    std::string cycle;
    for (auto it = again; it != chain.end(); ++it) cycle += "'" + it->second + "' -> ";
    throw ConfigError("platform file '" + path.string() + "' is its own base, through a cycle of \"base\": " + cycle +
                      "'" + path.string() + "'");
  }
  chain.emplace_back(key, path.string());
  // Each "base" is a call deeper: a chain far past any real one would
  // exhaust the stack (10,000 files crashed the process).
  constexpr size_t kMaxBaseChain = 64;
  if (chain.size() > kMaxBaseChain) {
    throw ConfigError("platform file '" + chain.front().second + "' builds on more than " + std::to_string(kMaxBaseChain) +
                      " files through \"base\" (the last read: '" + path.string() + "'); at most " +
                      std::to_string(kMaxBaseChain) + " are followed");
  }
  json doc = read_json_file(path);
  if (!doc.is_object()) {
    throw ConfigError("platform file '" + path.string() + "' must hold a JSON object, got " + doc.type_name());
  }
  auto base_it = doc.find("base");
  if (has_base) *has_base = base_it != doc.end();
  if (base_it == doc.end()) return doc;
  if (!base_it->is_string()) {
    throw ConfigError("platform file '" + path.string() + "': field 'base' must be a preset name or a path");
  }
  json merged = load_merged(base_it->get<std::string>(), dirs, path.parent_path(), chain);
  doc.erase("base");
  merge_into(merged, doc);
  return merged;
}

// Fields that a platform may leave out, which an override may therefore add
// (every other field an override names must be in the document already).
const std::vector<std::string> kOptionalFields = {
    "collectives.nccl_tuner", "collectives.nccl_tuner.time_model", "collectives.nccl_tuner.cpu_vendor",
    "oam.peak_flops.tf32", "socket.peak_flops.tf32"};

// The optional fields directly under `parent` ("" for the top level).
std::vector<std::string> optional_fields_under(const std::string& parent) {
  std::vector<std::string> out;
  const std::string prefix = parent.empty() ? "" : parent + ".";
  for (const std::string& field : kOptionalFields) {
    if (field.compare(0, prefix.size(), prefix) == 0 && field.find('.', prefix.size()) == std::string::npos) {
      out.push_back(field.substr(prefix.size()));
    }
  }
  return out;
}

void apply_override(json& doc, const Override& ov, const std::string& origin) {
  const auto& [path, value_text] = ov;
  json value;
  try {
    value = parse_json(value_text, "override '" + path + "'");
  } catch (const json::parse_error&) {
    value = value_text;  // a bare word: take it as a string
  } catch (const json::exception& e) {  // a number past a double's range (1e400)
    throw ConfigError("override '" + path + "=" + value_text + "': " + e.what());
  }
  std::vector<std::string> parts;
  std::stringstream ss(path);
  for (std::string part; std::getline(ss, part, '.');) parts.push_back(part);
  if (parts.empty() || std::any_of(parts.begin(), parts.end(), [](auto& p) { return p.empty(); })) {
    throw ConfigError("override '" + path + "': a field path such as oam.hbm_bytes is needed");
  }
  bool is_source = parts[0] == "sources";
  json* node = &doc;
  std::string walked;
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string& part = parts[i];
    bool last = i + 1 == parts.size();
    if (node->is_object()) {
      const std::vector<std::string> optional = optional_fields_under(walked);
      // Within an optional object any field may be added; parsing checks it as any other.
      const bool in_optional = std::any_of(kOptionalFields.begin(), kOptionalFields.end(), [&](const std::string& f) {
        return walked == f || walked.compare(0, f.size() + 1, f + ".") == 0;
      });
      const bool may_add = (is_source && last) || in_optional ||
                           std::find(optional.begin(), optional.end(), part) != optional.end();
      if (!node->contains(part) && !may_add) {
        std::vector<std::string> keys = optional;
        for (auto it = node->begin(); it != node->end(); ++it) {
          if (std::find(keys.begin(), keys.end(), it.key()) == keys.end()) keys.push_back(it.key());
        }
        std::sort(keys.begin(), keys.end());
        throw ConfigError("platform " + origin + ": override of unknown field '" + path + "'" +
                          (walked.empty() ? "" : " (at '" + walked + "')") + "; allowed: " + join_names(keys));
      }
      if (!node->contains(part) && !last) (*node)[part] = json::object();  // an optional object, added
      node = &(*node)[part];
    } else if (node->is_array()) {
      char* end = nullptr;
      long index = std::strtol(part.c_str(), &end, 10);
      if (*end != '\0' || index < 0 || static_cast<size_t>(index) >= node->size()) {
        throw ConfigError("platform " + origin + ": override '" + path + "': '" + walked +
                          "' is a list of " + std::to_string(node->size()) + "; index '" + part +
                          "' must be 0.." + std::to_string(static_cast<long>(node->size()) - 1));
      }
      node = &(*node)[static_cast<size_t>(index)];
    } else {
      throw ConfigError("platform " + origin + ": override '" + path + "': '" + walked +
                        "' is a value, not an object");
    }
    walked += (walked.empty() ? "" : ".") + part;
  }
  *node = value;
  if (!is_source) doc["sources"][path] = "override: " + path + "=" + value.dump();
}

// tf32 may be left out: a unit without TensorFloat-32 units (its 0 peak makes
// the op cost model price TF32-allowed fp32 matmuls at the fp32 peak).
PeakFlops read_peak_flops(JsonFields fields) {
  PeakFlops peak{};
  const std::vector<std::string> present = fields.keys();
  for (int d = 0; d < kNumDTypes; ++d) {
    const std::string name = kDTypeNames[d];
    const bool optional = static_cast<DType>(d) == DType::kTf32;
    if (optional && std::find(present.begin(), present.end(), name) == present.end()) continue;
    peak[d] = fields.positive(name);
  }
  fields.finish();
  return peak;
}

std::vector<int> read_indices(JsonFields& parent, const std::string& key, int count, const std::string& what) {
  std::vector<int> out;
  for (const auto& v : parent.array(key)) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= count) {
      parent.fail(key, "lists " + what + " " + v.dump() + ", but there are " + std::to_string(count) + " " + what +
                           "s " + (count > 0 ? "(allowed 0.." + std::to_string(count - 1) + ")"
                                             : "(so the list must be empty)"));
    }
    out.push_back(v.get<int>());
  }
  return out;
}

void read_socket_and_upi(JsonFields& root, Platform& p) {
  JsonFields s = root.object("socket");
  p.socket.count = s.integer("count", 1);
  p.socket.cores = s.integer("cores", 1);
  p.socket.ddr_bytes = s.bytes("ddr_bytes");
  p.socket.ddr_bandwidth = s.positive("ddr_bandwidth_gb_per_s") * kGB;
  p.socket.ddr_random_access_efficiency = s.fraction("ddr_random_access_efficiency");
  p.socket.peak_flops = read_peak_flops(s.object("peak_flops"));
  s.finish();

  JsonFields u = root.object("upi");
  p.upi.link_bandwidth = u.positive("link_bandwidth_gb_per_s") * kGB;
  p.upi.latency = from_ns(u.non_negative("latency_ns"));
  for (const auto& link : u.array("links")) {
    bool ok = link.is_array() && link.size() == 2 && link[0].is_number_integer() && link[1].is_number_integer();
    int a = ok ? link[0].get<int>() : -1, b = ok ? link[1].get<int>() : -1;
    if (!ok || a < 0 || b < 0 || a >= p.socket.count || b >= p.socket.count || a == b) {
      u.fail("links", "has entry " + link.dump() + "; each entry is [a, b] with two different sockets in 0.." +
                          std::to_string(p.socket.count - 1));
    }
    p.upi.links.emplace_back(a, b);
  }
  u.finish();
}

void read_oam(JsonFields& root, Platform& p) {
  JsonFields o = root.object("oam");
  p.oam.count = o.integer("count", 1);
  p.oam.hbm_bytes = o.bytes("hbm_bytes");
  p.oam.hbm_bandwidth = o.positive("hbm_bandwidth_gb_per_s") * kGB;
  p.oam.peak_flops = read_peak_flops(o.object("peak_flops"));
  p.oam.launch_overhead = from_ns(o.non_negative("launch_overhead_ns"));
  JsonFields e = o.object("efficiency");
  p.oam.efficiency.matmul = e.fraction("matmul");
  p.oam.efficiency.convolution = e.fraction("convolution");
  p.oam.efficiency.elementwise = e.fraction("elementwise");
  p.oam.efficiency.reduction = e.fraction("reduction");
  p.oam.efficiency.embedding_random_access = e.fraction("embedding_random_access");
  e.finish();
  o.finish();
}

void read_nics(JsonFields& root, Platform& p) {
  JsonFields n = root.object("nic");
  p.nic.count = n.integer("count", 0);
  p.nic.bandwidth = n.positive("bandwidth_gbit_per_s") * kGB / 8;
  p.nic.latency = from_ns(n.non_negative("latency_ns"));
  p.nic.gpudirect = n.boolean("gpudirect");
  n.finish();

  JsonFields f = root.object("frontend_nic");
  p.frontend_nic.count = f.integer("count", 0);
  p.frontend_nic.bandwidth = f.positive("bandwidth_gbit_per_s") * kGB / 8;
  p.frontend_nic.latency = from_ns(f.non_negative("latency_ns"));
  p.frontend_nic.sockets = read_indices(f, "sockets", p.socket.count, "socket");
  if (static_cast<int>(p.frontend_nic.sockets.size()) != p.frontend_nic.count) {
    f.fail("sockets", "must name one socket for each of the " + std::to_string(p.frontend_nic.count) +
                          " front-end NICs (frontend_nic.count)");
  }
  f.finish();
}

void read_pcie(JsonFields& root, Platform& p) {
  JsonFields pc = root.object("pcie");
  JsonFields lanes = pc.object("lane_bandwidth_gb_per_s");
  std::vector<std::string> generations = lanes.keys();
  for (const auto& g : generations) p.pcie.lane_bandwidth_by_generation.emplace_back(g, lanes.positive(g) * kGB);
  if (generations.empty()) pc.fail("lane_bandwidth_gb_per_s", "must give at least one generation, e.g. \"gen4\"");
  p.pcie.latency = from_ns(pc.non_negative("latency_ns"));
  const auto& switches = pc.array("switches");
  std::vector<int> oam_switch(p.oam.count, -1), nic_switch(p.nic.count, -1);
  for (size_t i = 0; i < switches.size(); ++i) {
    JsonFields s(switches[i], "pcie.switches." + std::to_string(i), pc.origin());
    PcieSwitchSpec sw;
    sw.generation = s.choice("generation", generations);
    sw.uplink_generation = s.choice("uplink_generation", generations);
    sw.uplink_lanes = s.integer("uplink_lanes", 1);
    sw.oam_lanes = s.integer("oam_lanes", 1);
    sw.nic_lanes = s.integer("nic_lanes", 1);
    sw.sockets = read_indices(s, "sockets", p.socket.count, "socket");
    sw.oams = read_indices(s, "oams", p.oam.count, "OAM");
    sw.nics = read_indices(s, "nics", p.nic.count, "NIC");
    if (sw.sockets.empty()) s.fail("sockets", "must name at least one socket (the switch's uplink)");
    for (int o : sw.oams) {
      if (oam_switch[o] >= 0) s.fail("oams", "lists OAM " + std::to_string(o) + ", already on pcie.switches." + std::to_string(oam_switch[o]));
      oam_switch[o] = static_cast<int>(i);
    }
    for (int n : sw.nics) {
      if (nic_switch[n] >= 0) s.fail("nics", "lists NIC " + std::to_string(n) + ", already on pcie.switches." + std::to_string(nic_switch[n]));
      nic_switch[n] = static_cast<int>(i);
    }
    s.finish();
    p.pcie.switches.push_back(std::move(sw));
  }
  for (int o = 0; o < p.oam.count; ++o) {
    if (oam_switch[o] < 0) pc.fail("switches", "attach OAM " + std::to_string(o) + " to no switch; every OAM 0.." + std::to_string(p.oam.count - 1) + " must be listed in exactly one switch's \"oams\"");
  }
  for (int n = 0; n < p.nic.count; ++n) {
    if (nic_switch[n] < 0) pc.fail("switches", "attach NIC " + std::to_string(n) + " to no switch; every NIC 0.." + std::to_string(p.nic.count - 1) + " must be listed in exactly one switch's \"nics\"");
  }
  pc.finish();
}

void read_fabric(JsonFields& root, Platform& p) {
  JsonFields f = root.object("fabric");
  p.fabric.topology = parse_fabric_topology(f.choice("topology", fabric_topology_names()));
  if (p.fabric.topology == FabricTopology::kHybridCubeMesh && p.oam.count != 8) {
    f.fail("topology", "is hybrid_cube_mesh, which needs oam.count = 8 (got " + std::to_string(p.oam.count) + ")");
  }
  p.fabric.links_per_pair = f.integer("links_per_pair", 1);
  p.fabric.link_bandwidth = f.positive("link_bandwidth_gb_per_s") * kGB;
  p.fabric.latency = from_ns(f.non_negative("latency_ns"));
  p.fabric.in_switch_reduction = f.boolean("in_switch_reduction");
  p.fabric.in_switch_reduction_efficiency = f.fraction("in_switch_reduction_efficiency");
  p.fabric.in_switch_latency = from_ns(f.non_negative("in_switch_latency_ns"));
  if (p.fabric.in_switch_reduction && p.fabric.topology != FabricTopology::kSwitch) {
    f.fail("in_switch_reduction", "is true, but only fabric.topology = switch can reduce in the switch");
  }
  f.finish();
}

void read_collectives(JsonFields& root, Platform& p) {
  JsonFields c = root.object("collectives");
  p.collectives.algorithm = c.choice("algorithm", algorithm_names());
  std::vector<std::string> concrete;
  for (Algorithm a : concrete_algorithms()) concrete.emplace_back(algorithm_name(a));
  for (const auto& a : c.array("algorithms")) {
    if (!a.is_string() || std::find(concrete.begin(), concrete.end(), a.get<std::string>()) == concrete.end()) {
      c.fail("algorithms", "lists " + a.dump() + "; allowed: " + join_names(concrete));
    }
    p.collectives.algorithms.push_back(a.get<std::string>());
  }
  if (p.collectives.algorithms.empty()) c.fail("algorithms", "must list at least one algorithm for auto to choose from");
  p.collectives.base_latency = from_ns(c.non_negative("base_latency_ns"));
  p.collectives.pipeline_chunks = c.integer("pipeline_chunks", 1, kMaxPipelineChunks);
  JsonFields a = c.object("astra");
  p.collectives.astra.endpoint_delay = from_ns(a.non_negative("endpoint_delay_ns"));
  p.collectives.astra.preferred_dataset_splits = a.integer("preferred_dataset_splits", 1);
  p.collectives.astra.active_chunks_per_dimension = a.integer("active_chunks_per_dimension", 1);
  a.finish();
  const std::vector<std::string> present = c.keys();
  if (std::find(present.begin(), present.end(), "nccl_tuner") != present.end()) {
    JsonFields t = c.object("nccl_tuner");
    p.collectives.nccl_tuner.enabled = t.boolean("enabled");
    p.collectives.nccl_tuner.compute_capability = t.integer("compute_capability", 0);
    const int cc = p.collectives.nccl_tuner.compute_capability;
    if (cc != 70 && cc != 80 && cc != 90) {
      t.fail("compute_capability", "is " + std::to_string(cc) + "; NCCL's tuning model has figures for 70, 80 and 90");
    }
    const std::vector<std::string> tuner_keys = t.keys();
    if (std::find(tuner_keys.begin(), tuner_keys.end(), "time_model") != tuner_keys.end()) {
      p.collectives.nccl_tuner.time_model = t.choice("time_model", {"tuner", "pipeline"});
    }
    if (std::find(tuner_keys.begin(), tuner_keys.end(), "cpu_vendor") != tuner_keys.end()) {
      p.collectives.nccl_tuner.cpu_vendor = t.choice("cpu_vendor", {"intel", "amd", "other"});
    }
    t.finish();
  }
  c.finish();
}

// Every socket must reach every other over UPI: a copy between any socket
// and any OAM may cross it, and an unreachable one failed only at that copy.
void check_upi_joins_sockets(const Platform& p, const std::string& origin) {
  std::vector<int> group(p.socket.count);
  for (int i = 0; i < p.socket.count; ++i) group[i] = i;
  auto root_of = [&](int x) {
    while (group[x] != x) x = group[x] = group[group[x]];
    return x;
  };
  for (const auto& [a, b] : p.upi.links) group[root_of(a)] = root_of(b);
  for (int i = 1; i < p.socket.count; ++i) {
    if (root_of(i) != root_of(0)) {
      throw ConfigError("platform " + origin + ": field 'upi.links' leaves socket " + std::to_string(i) +
                        " unreachable from socket 0; the links must join all " + std::to_string(p.socket.count) +
                        " sockets");
    }
  }
}

void check_machine_size(const Platform& p, const std::string& origin) {
  const auto refuse_above = [&](const char* field, int per_node, const char* units) {
    const int64_t total = static_cast<int64_t>(p.nodes) * per_node;
    if (total > kMaxModeledUnits) {
      throw ConfigError("platform " + origin + ": nodes x " + field + " is " + std::to_string(p.nodes) + " x " +
                        std::to_string(per_node) + " = " + std::to_string(total) + " " + units + "; at most " +
                        std::to_string(kMaxModeledUnits) + " are modeled");
    }
  };
  refuse_above("oam.count", p.oam.count, "OAMs");
  refuse_above("socket.count", p.socket.count, "sockets");
}

Platform parse(const json& doc, const std::string& origin) {
  JsonFields root(doc, "", origin);
  Platform p;
  p.name = root.text("name");
  p.description = root.text("description");
  p.nodes = root.integer("nodes", 1, kMaxModeledUnits);
  read_socket_and_upi(root, p);
  read_oam(root, p);
  check_machine_size(p, origin);
  check_upi_joins_sockets(p, origin);
  read_nics(root, p);
  read_pcie(root, p);
  read_fabric(root, p);
  JsonFields tor = root.object("tor_switch");
  p.tor_latency = from_ns(tor.non_negative("latency_ns"));
  tor.finish();
  read_collectives(root, p);
  root.skip("sources");  // citations, checked by the preset tests, not part of the model
  if (auto it = doc.find("sources"); it != doc.end() && !it->is_object()) {
    throw ConfigError("platform " + origin + ": field 'sources' must map field paths to text");
  }
  root.finish();
  p.json = doc.dump();
  return p;
}

}  // namespace

Override parse_override(const std::string& assignment) {
  auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw ConfigError("override '" + assignment + "' must look like path.to.field=value (e.g. fabric.topology=ring)");
  }
  return {assignment.substr(0, eq), assignment.substr(eq + 1)};
}

std::vector<std::string> default_preset_dirs() {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("ZION_PLATFORM_PATH")) {
    std::stringstream ss(env);
    for (std::string d; std::getline(ss, d, ':');) {
      if (!d.empty()) dirs.push_back(d);
    }
  }
  std::lock_guard<std::mutex> lock(g_dirs_mutex);
  if (!g_default_dirs.empty()) {
    dirs.insert(dirs.end(), g_default_dirs.begin(), g_default_dirs.end());
  }
#ifdef ZION_PRESET_DIR
  else {
    dirs.push_back(ZION_PRESET_DIR);
  }
#endif
  return dirs;
}

void set_default_preset_dirs(std::vector<std::string> dirs) {
  std::lock_guard<std::mutex> lock(g_dirs_mutex);
  g_default_dirs = std::move(dirs);
}

std::vector<std::string> preset_names(const std::vector<std::string>& dirs) {
  std::set<std::string> names;
  for (const auto& dir : dirs) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      if (entry.path().extension() == ".json") names.insert(entry.path().stem().string());
    }
  }
  return {names.begin(), names.end()};
}

Platform load_platform(const std::string& name_or_path, const std::vector<Override>& overrides,
                       const std::vector<std::string>& dirs) {
  BaseChain chain;
  bool has_base = false;
  json doc = load_merged(name_or_path, dirs, {}, chain, &has_base);
  std::string origin = "'" + name_or_path + "'";
  for (const auto& ov : overrides) apply_override(doc, ov, origin);
  try {
    return parse(doc, origin);
  } catch (const ConfigError& e) {
    std::string what = e.what();
    // A preset is whole, so a field missing there was left out of an
    // optional object an override added (collectives.nccl_tuner).
    if (has_base || !looks_like_path(name_or_path) || what.find("is missing") == std::string::npos) throw;
    // A partial file most likely meant to change a preset.
    throw ConfigError(what + "; a platform file without \"base\" must give every field: to change only some, "
                      "start it with {\"base\": \"zion\", ...} (or another preset)");
  }
}

std::vector<std::string> platform_files(const std::string& name_or_path, const std::vector<std::string>& dirs) {
  BaseChain chain;
  load_merged(name_or_path, dirs, {}, chain);
  std::vector<std::string> files;
  for (const auto& link : chain) files.push_back(link.second);
  return files;
}

std::string escape_invalid_utf8(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8_sequence_length(text, i);
    if (n) {
      out.append(text, i, n);
      i += n;
    } else {
      static const char kHex[] = "0123456789abcdef";
      const auto b = static_cast<unsigned char>(text[i++]);
      out += "\\x";
      out += kHex[b >> 4];
      out += kHex[b & 0xF];
    }
  }
  return out;
}

ConfigError::ConfigError(const std::string& what) : std::invalid_argument(escape_invalid_utf8(what)) {}

Platform platform_from_json_text(const std::string& text, const std::string& origin) {
  json doc;
  try {
    doc = parse_json(text, "platform " + origin);
  } catch (const json::exception& e) {
    throw ConfigError("platform " + origin + " is not valid JSON: " + e.what());
  }
  return parse(doc, origin);
}

}  // namespace zion::sim
