// The GEMM operand layouts, one enum for every family (dense row-major storage, C [M, N]):
//   NN: A [M, K], B [K, N], C = A B       (forward: Y = X W)
//   TN: A [K, M], B [K, N], C = A^T B     (dW = X^T dY)
//   NT: A [M, K], B [N, K], C = A B^T     (dX = dY W^T)
// Family files name a layout ("nn", "tn", "nt" under the instance key L); the catalog maps the name to these
// enumerators (mamba_forge/catalog/model.py: LAYOUTS) and refuses any other value.
#pragma once

namespace mf {

// Unscoped, so the enumerators convert to int: the GEMM templates take the layout as an int parameter because
// its value is part of the mangled names of their static members in the cubin, and an enum-typed parameter would
// rename those (different cubin bytes for the same code). Write mf::Layout::TN; never a bare number.
enum Layout : int { NN = 0, TN = 1, NT = 2 };

}  // namespace mf
