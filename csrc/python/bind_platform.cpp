// Bindings: Platform, the preset loader and the topology graph.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "sim/platform_loader.h"
#include "sim/platform_topology.h"

namespace py = pybind11;
using namespace zion::sim;

namespace {

py::dict link_dict(const Link& l, const Topology& t) {
  py::dict d;
  d["src"] = l.src;
  d["dst"] = l.dst;
  d["src_name"] = t.vertices()[l.src].name;
  d["dst_name"] = t.vertices()[l.dst].name;
  d["bandwidth_bytes_per_s"] = l.bandwidth;
  d["latency_s"] = l.latency;
  d["link_class"] = t.link_classes()[l.link_class].name;
  return d;
}

}  // namespace

void bind_platform(py::module_& sim) {
  py::class_<Platform, std::shared_ptr<Platform>>(sim, "Platform", "A modeled machine, as read from a preset file")
      .def_readonly("name", &Platform::name)
      .def_readonly("description", &Platform::description)
      .def_readonly("nodes", &Platform::nodes)
      .def_property_readonly("devices_per_node", &Platform::devices_per_node)
      .def_property_readonly("total_devices", &Platform::total_devices)
      .def_property_readonly("sockets_per_node", [](const Platform& p) { return p.socket.count; })
      .def_property_readonly("hbm_bytes", [](const Platform& p) { return p.oam.hbm_bytes; })
      .def_property_readonly("ddr_bytes", [](const Platform& p) { return p.socket.ddr_bytes; })
      .def("to_json", [](const Platform& p) { return p.json; }, "The merged preset, every field as given, as JSON text")
      .def("__repr__", [](const Platform& p) {
        return "<Platform '" + p.name + "': " + std::to_string(p.nodes) + " node(s) x " + std::to_string(p.oam.count) +
               " OAMs, " + std::to_string(p.socket.count) + " sockets>";
      });

  sim.def("load_platform", [](const std::string& name, const std::vector<Override>& overrides,
                              const std::vector<std::string>& dirs) {
            return std::make_shared<Platform>(load_platform(name, overrides, dirs));
          },
          py::arg("name_or_path"), py::arg("overrides"), py::arg("dirs"),
          "Loads a preset by name (searched in dirs) or a .json file; overrides are (dotted path, JSON text) pairs");
  sim.def("platform_files", &platform_files, py::arg("name_or_path"), py::arg("dirs"),
          "The files a platform reads: the one named and each \"base\" in turn");
  sim.def("parse_override", &parse_override, py::arg("assignment"));
  sim.def("preset_names", &preset_names, py::arg("dirs"));
  sim.def("set_default_preset_dirs", &set_default_preset_dirs, py::arg("dirs"));

  py::class_<Topology, std::shared_ptr<Topology>>(sim, "Topology", "Vertices joined by directed links; routes between them")
      .def_property_readonly("vertices", [](const Topology& t) {
        py::list out;
        for (const auto& v : t.vertices()) {
          py::dict d;
          d["kind"] = vertex_kind_name(v.kind);
          d["node"] = v.node;
          d["index"] = v.index;
          d["name"] = v.name;
          out.append(d);
        }
        return out;
      })
      .def_property_readonly("links", [](const Topology& t) {
        py::list out;
        for (const auto& l : t.links()) out.append(link_dict(l, t));
        return out;
      })
      .def_property_readonly("link_classes", [](const Topology& t) {
        py::list out;
        for (const auto& c : t.link_classes()) {
          py::dict d;
          d["name"] = c.name;
          d["bandwidth_bytes_per_s"] = c.bandwidth;
          d["latency_s"] = c.latency;
          out.append(d);
        }
        return out;
      })
      .def("find", [](const Topology& t, const std::string& kind, int node, int index) {
             for (size_t v = 0; v < t.vertices().size(); ++v) {
               const Vertex& x = t.vertices()[v];
               if (kind == vertex_kind_name(x.kind) && x.node == node && x.index == index) return static_cast<int>(v);
             }
             throw py::value_error("no " + kind + " " + std::to_string(index) + " on node " + std::to_string(node));
           },
           py::arg("kind"), py::arg("node"), py::arg("index"))
      .def("route", [](const Topology& t, int src, int dst) {
             if (src < 0 || dst < 0 || src >= static_cast<int>(t.vertices().size()) || dst >= static_cast<int>(t.vertices().size())) {
               throw py::index_error("vertex ids run 0.." + std::to_string(t.vertices().size() - 1));
             }
             const Route& r = t.route(src, dst);
             py::dict d;
             py::list paths;
             for (const auto& p : r.paths) paths.append(py::cast(p.links));
             d["paths"] = paths;
             d["latency_s"] = r.latency;
             d["bandwidth_bytes_per_s"] = r.bandwidth;
             d["hops"] = r.hops();
             return d;
           },
           py::arg("src"), py::arg("dst"));

  sim.def("topology_names", &fabric_topology_names, "The values of a platform's fabric.topology");
  sim.def("dimension_kind_names", &dimension_kind_names, "The blocks of an ASTRA-sim network's topology list");

  sim.def("build_topology", [](const Platform& p) { return std::make_shared<Topology>(build_topology(p)); }, py::arg("platform"));
  sim.def("build_dimension_topology", [](const std::vector<std::tuple<std::string, int, double, double>>& dims) {
            std::vector<DimensionBlock> blocks;
            for (const auto& [kind, npus, bw, lat] : dims) blocks.push_back({parse_dimension_kind(kind), npus, bw, lat});
            return std::make_shared<Topology>(build_dimension_topology(blocks));
          },
          py::arg("dims"), "dims: (kind, npus, bandwidth bytes/s, latency s) per dimension, innermost first");
}
