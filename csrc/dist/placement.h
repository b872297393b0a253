#pragma once
// Where a rank sits on the modeled platform: which node, which OAM, and so
// which global device (node-major, OAM-minor) the collective model prices.

#include "sim/platform.h"

namespace zion::dist {

struct RankPlacement {
  int node = 0;
  int oam = 0;
  int device = 0;  // node * devices_per_node + oam
};

// `local_rank` is the OAM when known (torchrun's LOCAL_RANK), else -1: then
// ranks fill the platform node by node. `node_rank` (torchrun's GROUP_RANK)
// overrides the node when known, else -1. A rank that does not fit the
// platform is an error naming the platform's size.
RankPlacement place_rank(const sim::Platform& platform, int global_rank, int local_rank, int node_rank);

}  // namespace zion::dist
