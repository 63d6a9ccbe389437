// Registers the fused op for the CPU and (when compiled in) CUDA dispatch keys:
//   bonkernels::advantages_packed(...) -> Tensor        the functional op
//                                                       (values of any shape are read flat, in
//                                                       row-major order: a plan passes [G, n]
//                                                       rewards and gets [G, n] back, no views)
//   bonkernels::advantages_packed_out(..., out) -> ()   writes into a caller's tensor (tests poison it)
//   bonkernels::build_info() -> int                     bit 0: CUDA kernels compiled in; bit 1: by the
//                                                       torch-CUDA route (CUDAExtension), not bare nvcc
// The fake (meta) implementation for torch.compile is registered in bonkernels/_native.py.
#include <Python.h>

#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>
#include <optional>

#include "bonkernels/common.h"
#include "bonkernels/group_math.h"
#include "cpu/advantages_cpu.h"
#include "op.h"

#ifdef BK_WITH_CUDA
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "cuda/launch.h"
#endif

namespace {

bk::Params make_params(int64_t k, int64_t code, std::optional<double> clamp_delta, double clip_lo,
                       double clip_hi, bool mean_scale, int64_t small_groups, double eps) {
  TORCH_CHECK_VALUE(code >= 0 && code < bk::NUM_CODES && bk::known_code(int(code)),
                    "bonkernels: unknown estimator code ", code);
  TORCH_CHECK_VALUE(bk::native_supports(int(code)), "bonkernels: estimator code ", code,
                    " is reference-only; the native backends do not implement it (use backend='torch')");
  TORCH_CHECK_VALUE(k >= 1, "bonkernels: k must be >= 1, got ", k);
  TORCH_CHECK_VALUE(small_groups >= 0 && small_groups <= 2, "bonkernels: small_groups code must be 0, 1 or 2");
  bk::Params p;
  // No group has 2^31 samples, so a larger k acts like any k above every group size (the k rules
  // compare k with n only): cap it to the kernels' int.
  p.k = int(std::min<int64_t>(k, std::numeric_limits<int>::max()));
  p.code = int(code);
  p.small_groups = int(small_groups);
  p.has_clamp = clamp_delta.has_value() ? 1 : 0;
  p.clamp_delta = clamp_delta.value_or(0.0);
  p.clip_lo = clip_lo;
  p.clip_hi = clip_hi;
  p.mean_scale = mean_scale ? 1 : 0;
  p.eps = eps;
  p.bank = nullptr;
  p.bank_index = nullptr;
  p.bank_len = 0;
  p.bank_index_len = 0;
  return p;
}

// The mixture-table bank of a call with k weights (float64 blocks, int64 index by group size, on the
// values' device); the kernels bounds-check every block they read.
void attach_bank(bk::Params& p, const std::optional<at::Tensor>& bank, const std::optional<at::Tensor>& bank_index,
                 const at::Tensor& values) {
  const bool has_bank = bank.has_value() && bank->defined();
  const bool has_index = bank_index.has_value() && bank_index->defined();
  TORCH_CHECK_VALUE(has_bank == has_index, "bonkernels: bank and bank_index go together");
  if (!has_bank) return;
  TORCH_CHECK_VALUE(bk::reads_weight_tables(p.code), "bonkernels: estimator code ", p.code,
                    " is not linear in its weight tables and takes no mixture bank (k_weights)");
  TORCH_CHECK_TYPE(bank->scalar_type() == at::kDouble && bank_index->scalar_type() == at::kLong,
                   "bonkernels: bank must be float64 and bank_index int64");
  TORCH_CHECK_VALUE(bank->dim() == 1 && bank->is_contiguous() && bank_index->dim() == 1 &&
                        bank_index->is_contiguous(),
                    "bonkernels: bank and bank_index must be contiguous 1-D tensors");
  TORCH_CHECK_VALUE(bank->device() == values.device() && bank_index->device() == values.device(),
                    "bonkernels: bank and bank_index must be on the values' device (", values.device(), ")");
  p.bank = bank->data_ptr<double>();
  p.bank_index = bank_index->data_ptr<int64_t>();
  p.bank_len = bank->numel();
  p.bank_index_len = bank_index->numel();
}

void check_tensors(const at::Tensor& values, const at::Tensor& offsets, const std::optional<at::Tensor>& deltas,
                   int64_t code, const at::Tensor& out) {
  TORCH_CHECK_TYPE(at::isFloatingType(values.scalar_type()) &&
                       (values.scalar_type() == at::kFloat || values.scalar_type() == at::kDouble ||
                        values.scalar_type() == at::kHalf || values.scalar_type() == at::kBFloat16),
                   "bonkernels: values must be float16/bfloat16/float32/float64, got ", values.scalar_type());
  TORCH_CHECK_TYPE(offsets.scalar_type() == at::kLong, "bonkernels: offsets must be int64");
  TORCH_CHECK_VALUE(offsets.dim() == 1 && offsets.numel() >= 1, "bonkernels: offsets must be a 1-D tensor of G+1 entries");
  TORCH_CHECK_VALUE(offsets.device() == values.device(), "bonkernels: offsets is on ", offsets.device(),
                    " but values are on ", values.device());
  TORCH_CHECK_VALUE(out.sizes() == values.sizes() && out.scalar_type() == values.scalar_type() &&
                        out.device() == values.device() && out.is_contiguous(),
                    "bonkernels: out must be a contiguous tensor like values");
  if (bk::needs_deltas(int(code))) {
    TORCH_CHECK_VALUE(deltas.has_value() && deltas->defined(), "bonkernels: this estimator needs deltas");
    TORCH_CHECK_VALUE(deltas->sizes() == values.sizes() && deltas->scalar_type() == values.scalar_type() &&
                          deltas->device() == values.device(),
                      "bonkernels: deltas must be a tensor with the shape, dtype and device of values");
  }
}

// The kernels read dense arrays: strided inputs (offsets=t[::2], a transposed view) are copied
// first, contiguous ones pass through untouched (no copy, no sync).
at::Tensor deltas_or_undefined(const std::optional<at::Tensor>& deltas, int64_t code) {
  return (bk::needs_deltas(int(code)) && deltas.has_value() && deltas->defined()) ? deltas->contiguous() : at::Tensor();
}

void out_cpu(const at::Tensor& values, const at::Tensor& offsets, const std::optional<at::Tensor>& deltas, int64_t k,
             int64_t code, std::optional<double> clamp_delta, double clip_lo, double clip_hi, bool mean_scale,
             int64_t small_groups, double eps, std::optional<int64_t> max_group_size, const at::Tensor& out,
             const std::optional<at::Tensor>& bank, const std::optional<at::Tensor>& bank_index) {
  bk::Params p = make_params(k, code, clamp_delta, clip_lo, clip_hi, mean_scale, small_groups, eps);
  check_tensors(values, offsets, deltas, code, out);
  attach_bank(p, bank, bank_index, values);
  at::Tensor o = out;
  TORCH_CHECK_VALUE(!max_group_size.has_value() || *max_group_size >= 0, "bonkernels: max_group_size must be >= 0");
  bk::advantages_cpu(values.contiguous(), offsets.contiguous(), deltas_or_undefined(deltas, code), p, o,
                     max_group_size.value_or(-1));
}

#ifdef BK_WITH_CUDA
// torch's current stream on `device`, as a cudaStream_t, through c10's device-generic interface
// (which torch's CUDA library registers when it loads). The same code in both build routes: the
// bare-nvcc build needs no c10 CUDA headers and still never launches on the legacy default
// stream, so it is ordered with torch's side streams and valid under CUDA-graph capture.
void* current_cuda_stream(const c10::Device& device) {
  const c10::impl::DeviceGuardImplInterface* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  return impl->getStreamNativeHandle(impl->getStream(device));
}

int dtype_code(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return BK_FLOAT32;
    case at::kDouble: return BK_FLOAT64;
    case at::kHalf: return BK_FLOAT16;
    default: return BK_BFLOAT16;
  }
}

void out_cuda(const at::Tensor& values, const at::Tensor& offsets, const std::optional<at::Tensor>& deltas, int64_t k,
              int64_t code, std::optional<double> clamp_delta, double clip_lo, double clip_hi, bool mean_scale,
              int64_t small_groups, double eps, std::optional<int64_t> max_group_size, const at::Tensor& out,
              const std::optional<at::Tensor>& bank, const std::optional<at::Tensor>& bank_index) {
  bk::Params p = make_params(k, code, clamp_delta, clip_lo, clip_hi, mean_scale, small_groups, eps);
  check_tensors(values, offsets, deltas, code, out);
  attach_bank(p, bank, bank_index, values);
  const int64_t num_groups = offsets.numel() - 1;
  if (num_groups == 0 || values.numel() == 0) return;
  const c10::DeviceGuard guard(values.device());  // tensors on cuda:1 while cuda:0 is current
  const at::Tensor v = values.contiguous(), off = offsets.contiguous();
  int64_t bound;
  if (max_group_size.has_value()) {
    bound = *max_group_size;  // the caller's promise: no host sync
  } else {                    // no hint: find it (this syncs with the host)
    bound = (off.slice(0, 1) - off.slice(0, 0, num_groups)).max().item<int64_t>();
    TORCH_CHECK_VALUE(bound >= 0, "bonkernels: malformed offsets: every group has a negative size");
  }
  TORCH_CHECK_VALUE(bound >= 0, "bonkernels: max_group_size must be >= 0");
  TORCH_CHECK_VALUE(bound <= BK_CUDA_MAX_GROUP, "bonkernels: the CUDA backend handles groups of at most ",
                    BK_CUDA_MAX_GROUP, " samples (max_group_size = ", bound,
                    "); use backend='cpu', 'triton' or 'torch' for larger groups");
  void* stream = current_cuda_stream(values.device());
  at::Tensor d = deltas_or_undefined(deltas, code);
  char err[512] = {0};
  const int rc = bk_cuda_advantages(dtype_code(v.scalar_type()), v.data_ptr(), off.data_ptr<int64_t>(),
                                    d.defined() ? d.data_ptr() : nullptr, out.data_ptr(), v.numel(), num_groups,
                                    int(bound), p, stream, err, int(sizeof(err)));
  TORCH_CHECK(rc == 0, "bonkernels CUDA kernel failed: ", err);
}
#endif

}  // namespace

namespace bk_op {

at::Tensor advantages_packed(const at::Tensor& values, const at::Tensor& offsets,
                             const std::optional<at::Tensor>& deltas, int64_t k, int64_t code,
                             std::optional<double> clamp_delta, double clip_lo, double clip_hi, bool mean_scale,
                             int64_t small_groups, double eps, std::optional<int64_t> max_group_size,
                             const std::optional<at::Tensor>& bank, const std::optional<at::Tensor>& bank_index) {
  at::Tensor out = at::empty_like(values, at::MemoryFormat::Contiguous);
  if (values.is_cuda()) {
#ifdef BK_WITH_CUDA
    out_cuda(values, offsets, deltas, k, code, clamp_delta, clip_lo, clip_hi, mean_scale, small_groups, eps,
             max_group_size, out, bank, bank_index);
#else
    TORCH_CHECK(false, "bonkernels: the extension was built without CUDA kernels");
#endif
  } else {
    out_cpu(values, offsets, deltas, k, code, clamp_delta, clip_lo, clip_hi, mean_scale, small_groups, eps,
            max_group_size, out, bank, bank_index);
  }
  return out;
}

}  // namespace bk_op

namespace {

int64_t build_info() {
  int64_t info = 0;
#ifdef BK_WITH_CUDA
  info |= 1;
#endif
#ifdef BK_TORCH_CUDA
  info |= 2;
#endif
  return info;
}

}  // namespace

TORCH_LIBRARY(bonkernels, m) {
  m.def(
      "advantages_packed(Tensor values, Tensor offsets, Tensor? deltas, int k, int estimator_code, "
      "float? clamp_delta, float clip_lo, float clip_hi, bool mean_scale, int small_groups, float eps, "
      "int? max_group_size, Tensor? bank=None, Tensor? bank_index=None) -> Tensor");
  m.def(
      "advantages_packed_out(Tensor values, Tensor offsets, Tensor? deltas, int k, int estimator_code, "
      "float? clamp_delta, float clip_lo, float clip_hi, bool mean_scale, int small_groups, float eps, "
      "int? max_group_size, Tensor(a!) out, Tensor? bank=None, Tensor? bank_index=None) -> ()");
  m.def("build_info() -> int", &build_info);
}

TORCH_LIBRARY_IMPL(bonkernels, CPU, m) {
  m.impl("advantages_packed", &bk_op::advantages_packed);
  m.impl("advantages_packed_out", &out_cpu);
}

#ifdef BK_WITH_CUDA
TORCH_LIBRARY_IMPL(bonkernels, CUDA, m) {
  m.impl("advantages_packed", &bk_op::advantages_packed);
  m.impl("advantages_packed_out", &out_cuda);
}
#endif

// `import bonkernels._C` loads the library and runs the registrations; the module's own functions
// are the direct entry of prepared calls (prepared_call.cpp).
static PyModuleDef bonkernels_module = {PyModuleDef_HEAD_INIT, "_C", "bonkernels native ops (torch.ops.bonkernels)",
                                        -1, bk_prepared_call_methods};
PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&bonkernels_module); }
