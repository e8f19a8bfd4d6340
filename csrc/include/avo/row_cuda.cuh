// One row of a row kernel on the GPU, processed by a whole thread block: loops stride
// over the row by thread, reductions go through warp shuffles then shared memory and
// reach every thread. Every thread of the block must make the same calls in the same
// order (the generated math does).
#pragma once

#include <cuda_runtime.h>

#include "math.h"
#include "cuda_launch.cuh"
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

// ---------------------------------------------------------------------------------
// The kernels of every row op; the generated math (Math::apply, Math::column_terms)
// is what differs between ops.
// ---------------------------------------------------------------------------------

namespace avo {

// One thread block per row; rows beyond the grid loop.
template <typename T, typename Args, typename Math>
__global__ void __launch_bounds__(kRowThreads) row_kernel(const Args args, const Math math) {
  for (int64_t r = blockIdx.x; r < args.rows; r += gridDim.x) {
    const BlockRow<T, Args> row(args, r);
    math.template apply<PrecisionFor<T>>(row);
  }
}

// Column pass, stage 1: block c sums the per-column terms of its chunk of rows.
template <typename T, typename Args, typename Math>
__global__ void __launch_bounds__(kRowThreads) column_partials_kernel(const Args args, const Math math) {
  constexpr int K = Math::kColumnSums > 0 ? Math::kColumnSums : 1;
  const int64_t chunk = blockIdx.x;
  const int64_t first = chunk * args.rows_per_chunk;
  const int64_t last = first + args.rows_per_chunk < args.rows ? first + args.rows_per_chunk : args.rows;
  for (int64_t n = threadIdx.x; n < args.length; n += blockDim.x) {
    float sums[K] = {};
    for (int64_t r = first; r < last; ++r) {
      float terms[K];
      math.template column_terms<PrecisionFor<T>>(RowView<T, Args>(args, r), n, terms);
      for (int k = 0; k < Math::kColumnSums; ++k) sums[k] += terms[k];
    }
    for (int k = 0; k < Math::kColumnSums; ++k) args.partials[(k * args.chunks + chunk) * args.length + n] = sums[k];
  }
}

// Column pass, stage 2: each column's partials, summed in chunk order.
template <typename T, typename Args, typename Math>
__global__ void __launch_bounds__(kRowThreads) column_finish_kernel(const Args args) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; n < args.length; n += step) {
    for (int k = 0; k < Math::kColumnSums; ++k) {
      T* out = static_cast<T*>(args.outputs[Math::column_output(k)]);
      if (out == nullptr) continue;
      float total = 0.0f;
      for (int64_t c = 0; c < args.chunks; ++c) total += args.partials[(k * args.chunks + c) * args.length + n];
      out[n] = Element<T>::from_float(total);
    }
  }
}

// The row kernel, then (when the call asked for per-column outputs) the column pass.
template <typename T, typename Args, typename Math>
void launch_row_op(const Args& args, const Math& math, cudaStream_t stream) {
  if (args.rows == 0) return;
  const unsigned blocks = resident_grid_size(row_kernel<T, Args, Math>, args.rows * kRowThreads, kRowThreads);
  row_kernel<T, Args, Math><<<blocks, kRowThreads, 0, stream>>>(args, math);
  if constexpr (Math::kColumnSums > 0) {
    if (args.partials == nullptr || args.length == 0) return;
    column_partials_kernel<T, Args, Math><<<unsigned(args.chunks), kRowThreads, 0, stream>>>(args, math);
    const unsigned finish_blocks = unsigned((args.length + kRowThreads - 1) / kRowThreads);
    column_finish_kernel<T, Args, Math><<<finish_blocks, kRowThreads, 0, stream>>>(args);
  }
}

}  // namespace avo
