#pragma once
// Sparse COO tensors on zion (see sparse.cpp).

#include <ATen/Tensor.h>

namespace zion::device {

class AliasSet;

// A sparse CPU result as a sparse zion tensor: its indices and values become
// zion tensors through `aliases` (views of arguments, or adopted).
at::Tensor sparse_to_zion(const at::Tensor& cpu_sparse, AliasSet& aliases, c10::DeviceIndex device);
// The same for a result the caller hands over: a fresh one that nothing else
// holds becomes the zion tensor itself (no new SparseTensorImpl is made).
at::Tensor sparse_to_zion(at::Tensor&& cpu_sparse, AliasSet& aliases, c10::DeviceIndex device);

// zion takes strided and sparse COO tensors. A tensor of any other layout
// (CSR, CSC, BSR, BSC, MKL-DNN, ...) is refused where it would be made, naming
// `what` made it and the layouts allowed, as NotImplementedError.
[[noreturn]] void refuse_layout(c10::Layout layout, const std::string& what);

}  // namespace zion::device
