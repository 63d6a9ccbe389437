// CPU kernel: at::parallel_for over groups; per group an O(n log n) sort, then the shared
// per-group mathematics (group_math.h) in float64, and one rounding to the output dtype.
#include "advantages_cpu.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <type_traits>
#include <vector>

#include "bonkernels/serial_exec.h"

namespace bk {
namespace {

template <typename scalar_t>
void run_groups(const scalar_t* values, const int64_t* offsets, const scalar_t* deltas, scalar_t* out,
                int64_t num_groups, int64_t total, const Params& p, int64_t bound) {
  const int64_t mean_size = num_groups > 0 ? total / num_groups : 1;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, mean_size));
  const bool off_policy = needs_deltas(p.code) && deltas != nullptr;
  at::parallel_for(0, num_groups, grain, [&](int64_t g_begin, int64_t g_end) {
    SerialExec ex;
    std::vector<std::pair<double, int32_t>> pairs;
    std::vector<std::pair<uint64_t, int32_t>> radix_buffer;
    SerialExec::Vec x, delta;
    for (int64_t g = g_begin; g < g_end; ++g) {
      const int64_t base = offsets[g];
      const int64_t size = offsets[g + 1] - base;
      if (size <= 0) continue;
      if (bound >= 0 && size > bound) {  // the max_group_size promise was wrong: mark the group
        for (int64_t i = 0; i < size; ++i) out[base + i] = static_cast<scalar_t>(BK_NAN);
        continue;
      }
      const int n = int(size);
      ex.begin_group(n);
      ex.alloc(x);
      ex.alloc(delta);
      if (pairs.size() < size_t(n)) pairs.resize(n);
      if (order_free(p.code)) {  // reductions only: any order will do
        for (int i = 0; i < n; ++i) pairs[i] = {double(values[base + i]), int32_t(i)};
      } else if (!std::is_same<scalar_t, double>::value && n <= kNetworkSortMax) {
        uint64_t packed[kNetworkSortMax];  // float bits and index in one word: a branch-free network
        for (int i = 0; i < n; ++i)
          packed[i] = (uint64_t(orderable_bits32(float(values[base + i]))) << 32) | uint32_t(i);
        network_sort_packed(packed, n);
        for (int s = 0; s < n; ++s) {
          const int32_t i = int32_t(uint32_t(packed[s]));
          pairs[s] = {double(values[base + i]), i};
        }
      } else {
        for (int i = 0; i < n; ++i) pairs[i] = {double(values[base + i]), int32_t(i)};
        sort_pairs(pairs.data(), n, &radix_buffer);
      }
      for (int s = 0; s < n; ++s) x[s] = pairs[s].first;
      if (off_policy) {
        for (int s = 0; s < n; ++s) {
          double dl = double(deltas[base + pairs[s].second]);
          // A non-finite delta poisons its group (the NaN contract); the clamp must not hide it.
          if (!std::isfinite(dl)) dl = BK_NAN;
          else if (p.has_clamp) {  // clamp in the input dtype, as the reference does
            dl = dl < -p.clamp_delta ? -p.clamp_delta : (dl > p.clamp_delta ? p.clamp_delta : dl);
            dl = double(static_cast<scalar_t>(dl));
          }
          delta[s] = dl;
        }
      }  // (only the off-policy estimators read delta)
      compute_group(ex, p, x, delta);
      const double* v = ex.values();
      for (int s = 0; s < n; ++s) out[base + pairs[s].second] = static_cast<scalar_t>(v[s]);
    }
  });
}

}  // namespace

void advantages_cpu(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& deltas,
                    const Params& p, at::Tensor& out, int64_t max_group_size) {
  const int64_t num_groups = offsets.numel() - 1;
  const int64_t total = values.numel();
  const int64_t* off = offsets.data_ptr<int64_t>();
  // Bounds check (cheap, O(G)): a malformed offsets tensor must not read or write out of range.
  for (int64_t g = 0; g < num_groups; ++g) {
    TORCH_CHECK_VALUE(off[g] >= 0 && off[g] <= off[g + 1] && off[g + 1] <= total,
                      "bonkernels: malformed offsets at group ", g);
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, values.scalar_type(), "bonkernels_advantages_cpu", [&] {
    run_groups<scalar_t>(values.data_ptr<scalar_t>(), off, deltas.defined() ? deltas.data_ptr<scalar_t>() : nullptr,
                         out.data_ptr<scalar_t>(), num_groups, total, p, max_group_size);
  });
}

}  // namespace bk
