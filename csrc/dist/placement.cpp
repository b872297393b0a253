#include "dist/placement.h"

#include <c10/util/Exception.h>

namespace zion::dist {

RankPlacement place_rank(const sim::Platform& platform, int global_rank, int local_rank, int node_rank) {
  const int per_node = platform.devices_per_node();
  TORCH_CHECK(global_rank >= 0, "zion backend: rank ", global_rank, " is negative");
  RankPlacement p;
  if (local_rank >= 0) {
    TORCH_CHECK(local_rank < per_node, "zion backend: LOCAL_RANK ", local_rank, " is not an OAM of platform '", platform.name,
                "', which has ", per_node, " OAMs per node (0..", per_node - 1, ")");
    p.oam = local_rank;
    p.node = node_rank >= 0 ? node_rank : global_rank / per_node;
  } else {
    p.oam = global_rank % per_node;
    p.node = node_rank >= 0 ? node_rank : global_rank / per_node;
  }
  TORCH_CHECK(p.node < platform.nodes, "zion backend: rank ", global_rank, " would be OAM ", p.oam, " of node ", p.node,
              ", but platform '", platform.name, "' has ", platform.nodes, " node(s) x ", per_node, " OAMs = ",
              platform.total_devices(), " devices; choose a platform with more nodes (ZION_PLATFORM or zion_emu.set_platform)");
  p.device = p.node * per_node + p.oam;
  return p;
}

}  // namespace zion::dist
