// One row of a row kernel on the GPU, processed by a whole thread block: loops stride
// over the row by thread, reductions go through warp shuffles then shared memory and
// reach every thread. Every thread of the block must make the same calls in the same
// order (the generated math does).
#pragma once

#include <cuda_runtime.h>

#include "math.h"
#include "row_args.h"

namespace avo {

// Threads per block of row kernels.
constexpr int kRowThreads = 256;

// Combines `value` over the block; every thread gets the result. The order of the
// combination is fixed by the block size, so results are deterministic.
template <typename Combine>
__device__ __forceinline__ float block_reduce(float value, Combine combine, float identity) {
  __shared__ float per_warp[32];
  for (int offset = 16; offset > 0; offset /= 2) value = combine(value, __shfl_xor_sync(0xffffffffu, value, offset));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // the previous reduction may still be reading per_warp
  if (lane == 0) per_warp[warp] = value;
  __syncthreads();
  value = lane < int((blockDim.x + 31) / 32) ? per_warp[lane] : identity;
  for (int offset = 16; offset > 0; offset /= 2) value = combine(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

template <typename T, typename Args>
struct BlockRow : RowView<T, Args> {
  using RowView<T, Args>::RowView;
  using RowView<T, Args>::args;
  using RowView<T, Args>::r;

  template <typename F>
  __device__ float sum(F term) const {
    float partial = 0.0f;
    for (int64_t n = threadIdx.x; n < args.length; n += blockDim.x) partial += term(n);
    return block_reduce(partial, [](float a, float b) { return a + b; }, 0.0f);
  }
  template <typename F>
  __device__ float max(F term) const {
    float best = -INFINITY;
    for (int64_t n = threadIdx.x; n < args.length; n += blockDim.x) best = Functions<Exact>::maximum(best, term(n));
    return block_reduce(best, [](float a, float b) { return Functions<Exact>::maximum(a, b); }, -INFINITY);
  }
  template <typename F>
  __device__ float min(F term) const {
    float best = INFINITY;
    for (int64_t n = threadIdx.x; n < args.length; n += blockDim.x) best = Functions<Exact>::minimum(best, term(n));
    return block_reduce(best, [](float a, float b) { return Functions<Exact>::minimum(a, b); }, INFINITY);
  }
  template <typename F>
  __device__ void for_each(F body) const {
    for (int64_t n = threadIdx.x; n < args.length; n += blockDim.x) body(n);
  }
  __device__ void store_row(int k, float value) const {
    if (threadIdx.x == 0) static_cast<T*>(args.outputs[k])[r] = Element<T>::from_float(value);
  }
  // A per-row value kept in fp32 (output k is a float buffer of one value per row).
  __device__ void store_row_f32(int k, float value) const {
    if (threadIdx.x == 0 && args.outputs[k] != nullptr) static_cast<float*>(args.outputs[k])[r] = value;
  }
  __device__ void save(int j, float value) const {
    if (threadIdx.x == 0 && args.saved != nullptr) args.saved[r * args.saved_per_row + j] = value;
  }
};

}  // namespace avo
