// The fused op's C++ entry, shared by its torch registration (bindings.cpp) and the direct entry
// of prepared calls (prepared_call.cpp).
#pragma once

#include <Python.h>

#include <ATen/ATen.h>

#include <optional>

namespace bk_op {

// torch.ops.bonkernels.advantages_packed: a new tensor shaped like values (read flat).
at::Tensor advantages_packed(const at::Tensor& values, const at::Tensor& offsets,
                             const std::optional<at::Tensor>& deltas, int64_t k, int64_t code,
                             std::optional<double> clamp_delta, double clip_lo, double clip_hi, bool mean_scale,
                             int64_t small_groups, double eps, std::optional<int64_t> max_group_size,
                             const std::optional<at::Tensor>& bank, const std::optional<at::Tensor>& bank_index);

}  // namespace bk_op

// bonkernels._C.prepare and bonkernels._C.prepared_call (prepared_call.cpp).
extern PyMethodDef bk_prepared_call_methods[];
