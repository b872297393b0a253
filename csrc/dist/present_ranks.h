#pragma once
// A group whose world is bigger than its processes: of its `size` ranks,
// only the `present` ones run (`zion-emu run --world-size N --ranks LIST`).
// The inner gloo group holds the present ranks alone, in ascending order, and
// every collective is priced for all `size` ranks on their devices.
//
// Each absent rank has a counterpart, the present rank that stands in for
// it: the nearest present rank before it, counting down cyclically (a - 1,
// a - 2, ..., wrapping past 0 to size - 1). With ranks 0 and 8 of 16 present,
// ranks 1..7 stand on 0 and 9..15 on 8. An absent rank brings what its
// counterpart brings (dtype, size, root, reduce op), arrives when the latest
// present rank does, and sends each peer what its counterpart sends that
// peer, as in a model-parallel exchange, where the receiver's shards decide
// what it gets (see agree() in handshake.h for an all-to-all's exact counts).

#include <c10/util/Exception.h>

#include <sstream>
#include <string>
#include <vector>

namespace zion::dist {

struct PresentRanks {
  int size = 0;                  // ranks in the group, present or not
  std::vector<int> present;      // group ranks that run as processes, ascending
  std::vector<int> gloo_rank;    // group rank -> its rank in the inner gloo group; -1 when absent
  std::vector<int> counterpart;  // group rank -> the present rank standing in for it (itself when present)
  std::vector<int> device;       // group rank -> its global device (used for the absent ones)

  bool all() const { return static_cast<int>(present.size()) == size; }
  bool is_present(int group_rank) const { return gloo_rank[group_rank] >= 0; }
  // The inner gloo rank that plays `group_rank`: its own, or its counterpart's.
  int gloo_rank_for(int group_rank) const { return gloo_rank[counterpart[group_rank]]; }

  // `present` empty: every rank runs. `devices`: the global device of each group rank.
  static PresentRanks make(int size, std::vector<int> present, std::vector<int> devices) {
    PresentRanks r;
    r.size = size;
    if (present.empty()) {
      for (int i = 0; i < size; ++i) present.push_back(i);
    }
    r.gloo_rank.assign(size, -1);
    for (int g : present) {
      TORCH_CHECK_VALUE(g >= 0 && g < size, "zion backend: present rank ", g, " is not a rank of this group (0..", size - 1, ")");
      TORCH_CHECK_VALUE(r.gloo_rank[g] < 0, "zion backend: present rank ", g, " is listed twice");
      r.gloo_rank[g] = 0;
    }
    for (int g = 0; g < size; ++g) {
      if (r.gloo_rank[g] >= 0) {
        r.gloo_rank[g] = static_cast<int>(r.present.size());
        r.present.push_back(g);
      }
    }
    TORCH_CHECK_VALUE(!r.present.empty(), "zion backend: a group needs at least one present rank");
    TORCH_CHECK_VALUE(static_cast<int>(devices.size()) == size, "zion backend: ", devices.size(), " devices for ", size, " ranks");
    r.device = std::move(devices);
    r.counterpart.resize(size);
    for (int g = 0; g < size; ++g) {
      int p = g;
      while (r.gloo_rank[p] < 0) p = (p + size - 1) % size;
      r.counterpart[g] = p;
    }
    return r;
  }

  // "0, 8" (at most a dozen, then how many more), for messages.
  std::string present_list() const {
    std::ostringstream out;
    for (size_t i = 0; i < present.size() && i < 12; ++i) out << (i ? ", " : "") << present[i];
    if (present.size() > 12) out << " and " << present.size() - 12 << " more";
    return out.str();
  }
};

}  // namespace zion::dist
