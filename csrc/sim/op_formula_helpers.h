#pragma once
// What the work formulas of op_formulas.cpp and op_formulas_fbgemm.cpp share:
// byte sums over an op's tensors and the error for a call a formula cannot read.

#include <stdexcept>
#include <string>
#include <vector>

#include "op_cost.h"

namespace zion::sim {

inline std::string describe(const std::vector<TensorDesc>& tensors) {
  std::string s = "(";
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (i) s += ", ";
    s += "[";
    for (size_t d = 0; d < tensors[i].sizes.size(); ++d) {
      if (d) s += ", ";
      s += std::to_string(tensors[i].sizes[d]);
    }
    s += "]";
  }
  return s + ")";
}

[[noreturn]] inline void bad_call(const OpCall& call, const char* expected) {
  throw std::invalid_argument(call.name + ": the op cost formula expects " + expected + "; got inputs " +
                              describe(call.inputs) + ", outputs " + describe(call.outputs));
}

inline double sum_bytes(const std::vector<TensorDesc>& tensors, size_t first = 0) {
  double bytes = 0;
  for (size_t i = first; i < tensors.size(); ++i) bytes += tensors[i].bytes();
  return bytes;
}

inline double io_bytes(const OpCall& call) { return sum_bytes(call.inputs) + sum_bytes(call.outputs); }

inline OpWork make_work(OpClass op_class, double flops, double bytes, double gathered_bytes = 0) {
  OpWork work;
  work.op_class = op_class;
  work.flops = flops;
  work.bytes = bytes;
  work.gathered_bytes = gathered_bytes;
  return work;
}

// The table entries of op_formulas_fbgemm.cpp: fbgemm's embedding and sparse-data ops.
std::vector<std::pair<std::string, WorkFormula>> fbgemm_op_formulas();

}  // namespace zion::sim
