// Torch-free interface of the CUDA kernels: raw pointers, a stream, an error code.
#pragma once

#include <stdint.h>

#include "bonkernels/common.h"

// Element types of values/deltas/out.
enum BkDtype : int { BK_FLOAT32 = 0, BK_FLOAT64 = 1, BK_FLOAT16 = 2, BK_BFLOAT16 = 3 };

// Largest group the CUDA kernels handle (one block per group; the segmented path is not written).
#define BK_CUDA_MAX_GROUP 4096

#ifdef __cplusplus
extern "C" {
#endif

// The whole batch in one or two launches (size buckets), on `stream` (a cudaStream_t: the caller's current stream; the
// caller has made the tensors' device current). values, deltas and out hold `total` elements;
// offsets holds num_groups + 1 entries, not validated: a malformed group or one larger than
// max_group_size (the host-side bound that picks the kernel shape) is NaN-filled inside [0, total)
// and nothing outside is read or written. Returns a cudaError_t value (0 = success); on failure
// writes a message into err (errlen bytes).
int bk_cuda_advantages(int dtype, const void* values, const int64_t* offsets, const void* deltas, void* out,
                       int64_t total, int64_t num_groups, int max_group_size, bk::Params params, void* stream,
                       char* err, int errlen);

#ifdef __cplusplus
}
#endif
