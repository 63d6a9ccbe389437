// CPU kernel of the fused advantages op (one translation unit, templated on the dtype).
#pragma once

#include <ATen/ATen.h>

#include "bonkernels/common.h"

namespace bk {

// out[i] = the estimator's value for packed sample i. values/out: [N] contiguous, same dtype;
// offsets: int64 [G+1] on the CPU; deltas: [N] in values' dtype or undefined. max_group_size: the
// caller's bound on every group size (-1: none); a group above it is NaN-filled (checks off),
// as the CUDA kernels do.
void advantages_cpu(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& deltas,
                    const Params& p, at::Tensor& out, int64_t max_group_size = -1);

}  // namespace bk
