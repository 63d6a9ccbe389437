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

// One launch for the whole batch. max_group_size is a host-side upper bound on every group size
// (it picks the kernel shape). Returns a cudaError_t value (0 = success); on failure writes a
// message into err (errlen bytes). stream is a cudaStream_t.
int bk_cuda_advantages(int dtype, const void* values, const int64_t* offsets, const void* deltas, void* out,
                       int64_t num_groups, int max_group_size, bk::Params params, void* stream, char* err,
                       int errlen);

#ifdef __cplusplus
}
#endif
