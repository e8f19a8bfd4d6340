// The row kernels on the GPU. launch_row_op picks one of two versions per call, from the
// row length and the alignment of the rows:
//
//  - RegisterRow: the row is read from global memory once and kept in registers. A group
//    of G threads (a power of two, up to kMaxGroupThreads<Math>) takes a row; each thread holds
//    up to P vectors of V elements of every per-element input, vector i of thread `lane`
//    being the row's vector i * G + lane (coalesced). P is kRowVectors<Math>. V is 16 bytes' worth
//    of elements when every row starts 16-byte aligned and the length is a multiple of
//    it, else 1. Short rows share a block (several groups of G < kRowBlockThreads).
//  - GlobalRow, for longer rows: a block per row, each pass reading the row from global
//    memory again (from L2 after the first pass).
//
// Reductions accumulate in fp32: warp shuffles, then shared memory across the warps of a
// group, in an order fixed by the launch configuration (itself fixed by the shapes), so
// results are deterministic. Per-column sums (gradients of [N] parameters) are summed
// per chunk of rows by one group, rows in order, into fp32 partials; a last kernel adds
// the chunks' partials in chunk order. No atomics.
#pragma once

#include <cuda_runtime.h>

#include "cuda_launch.cuh"
#include "math.h"
#include "row_args.h"

namespace avo {

constexpr int kRowBlockThreads = 256;  // block of RegisterRow kernels with smaller groups
constexpr int kGlobalRowThreads = 512; // block (and group) of GlobalRow kernels

// Combines `value` over each group of `group_threads` consecutive threads (a power of
// two); every thread of the group gets the result. Every thread of the block must call
// it, in the same order: groups wider than a warp synchronise the block.
template <typename Combine>
__device__ __forceinline__ float group_reduce(float value, Combine combine, int group_threads) {
  const int width = group_threads < 32 ? group_threads : 32;
  for (int offset = width / 2; offset > 0; offset /= 2) value = combine(value, __shfl_xor_sync(0xffffffffu, value, offset));
  if (group_threads <= 32) return value;
  __shared__ float per_warp[32];
  const int warp = threadIdx.x / 32, warps = group_threads / 32;
  const int first = warp - warp % warps;
  __syncthreads();  // a previous reduction may still be reading per_warp
  if (threadIdx.x % 32 == 0) per_warp[warp] = value;
  __syncthreads();
  value = per_warp[first];
  for (int w = 1; w < warps; ++w) value = combine(value, per_warp[first + w]);
  return value;
}

struct Plus {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct Max {
  __device__ float operator()(float a, float b) const { return Functions<Exact>::maximum(a, b); }
};
struct Min {
  __device__ float operator()(float a, float b) const { return Functions<Exact>::minimum(a, b); }
};

// sum, max and min over a row, for a row type that provides reduce(term, combine, identity).
template <typename Row>
struct Reductions {
  template <typename F>
  __device__ __forceinline__ float sum(F term) const { return self().reduce(term, Plus{}, 0.0f); }
  template <typename F>
  __device__ __forceinline__ float max(F term) const { return self().reduce(term, Max{}, -INFINITY); }
  template <typename F>
  __device__ __forceinline__ float min(F term) const { return self().reduce(term, Min{}, INFINITY); }
  __device__ __forceinline__ const Row& self() const { return static_cast<const Row&>(*this); }
};

// Vectors per thread of a RegisterRow, and its largest group (its block): smaller when
// the thread also keeps per-column sums or caches several inputs, so nothing spills.
template <typename Math>
constexpr int kRowVectors = Math::kColumnSums > 0 ? 2 : 4;
template <typename Math>
constexpr int kMaxGroupThreads = Math::kColumnSums > 0 || (Math::kElementInputs & (Math::kElementInputs - 1)) ? 512 : 1024;

// A row held in registers by a group of threads (see the top of this file).
template <typename T, typename Args, typename Math, int V>
struct RegisterRow : RowView<T, Args>, Reductions<RegisterRow<T, Args, Math, V>> {
  static constexpr int P = kRowVectors<Math>;
  using RowView<T, Args>::args;
  using RowView<T, Args>::r;
  using Vector = Vec<T, V>;
  static constexpr int kSums = Math::kColumnSums > 0 ? Math::kColumnSums : 1;
  // This thread's part of its chunk's per-column sums.
  using ColumnSums = float[kSums][P][V];

  bool active;    // false for the idle groups of the last block: they only join reductions
  int lane;       // thread index in the group
  int group_threads;
  int64_t vectors;      // vectors of V elements per row
  ColumnSums* columns;  // nullptr when the call wants no per-column outputs
  Vector cache[Args::kInputs][P];

  __device__ __forceinline__ RegisterRow(const Args& a, int64_t row, bool is_active, int group_lane, int threads,
                                         ColumnSums* column_sums)
      : RowView<T, Args>(a, row), active(is_active), lane(group_lane), group_threads(threads),
        vectors(a.length / V), columns(column_sums) {
    AVO_UNROLL
    for (int k = 0; k < Args::kInputs; ++k) {
      if (!((Math::kElementInputs >> k) & 1u)) continue;
      const T* p = static_cast<const T*>(args.inputs[k]);
      AVO_UNROLL
      for (int i = 0; i < P; ++i) {
        const int64_t v = vector_index(i);
        cache[k][i] = active && v < vectors ? load_vec<V>(p + r * args.length + v * V) : Vector{};
      }
    }
  }

  __device__ __forceinline__ int64_t vector_index(int i) const { return int64_t(i) * group_threads + lane; }

  // Element j of this thread's vector i (element n of the row), for the generated lambdas.
  struct At {
    const RegisterRow& row;
    int i, j;
    int64_t n;
    Vector* staged;  // for_each: the outputs of this vector, stored after the body ran
    __device__ __forceinline__ float load(int k) const { return Element<T>::to_float(row.cache[k][i].v[j]); }
    __device__ __forceinline__ float load_col(int k, float missing) const { return row.load_col(k, n, missing); }
    __device__ __forceinline__ void store(int k, float value) const { staged[k].v[j] = Element<T>::from_float(value); }
  };

  template <typename Combine, typename F>
  __device__ __forceinline__ float reduce(F term, Combine combine, float identity) const {
    float partial = identity;
    AVO_UNROLL
    for (int i = 0; i < P; ++i) {
      const int64_t v = vector_index(i);
      if (!active || v >= vectors) continue;
      AVO_UNROLL
      for (int j = 0; j < V; ++j) partial = combine(partial, term(At{*this, i, j, v * V + j, nullptr}));
    }
    return group_reduce(partial, combine, group_threads);
  }

  template <typename F>
  __device__ __forceinline__ void for_each(F body) const {
    AVO_UNROLL
    for (int i = 0; i < P; ++i) {
      const int64_t v = vector_index(i);
      if (!active || v >= vectors) continue;
      Vector staged[Args::kOutputs];
      AVO_UNROLL
      for (int j = 0; j < V; ++j) body(At{*this, i, j, v * V + j, staged});
      AVO_UNROLL
      for (int k = 0; k < Args::kOutputs; ++k) {
        if (!((Math::kElementOutputs >> k) & 1u) || args.outputs[k] == nullptr) continue;
        store_vec<V>(static_cast<T*>(args.outputs[k]) + r * args.length + v * V, staged[k]);
      }
    }
  }

  template <int K, typename F>
  __device__ __forceinline__ void column_sums(F terms_at) const {
    if (columns == nullptr) return;
    AVO_UNROLL
    for (int i = 0; i < P; ++i) {
      const int64_t v = vector_index(i);
      if (!active || v >= vectors) continue;
      AVO_UNROLL
      for (int j = 0; j < V; ++j) {
        float terms[K];
        terms_at(At{*this, i, j, v * V + j, nullptr}, terms);
        AVO_UNROLL
        for (int k = 0; k < K; ++k) (*columns)[k][i][j] += terms[k];
      }
    }
  }

  __device__ __forceinline__ void store_row(int k, float value) const {
    if (active && lane == 0) static_cast<T*>(args.outputs[k])[r] = Element<T>::from_float(value);
  }
  // A per-row value kept in fp32 (output k is a float buffer of one value per row).
  __device__ __forceinline__ void store_row_f32(int k, float value) const {
    if (active && lane == 0 && args.outputs[k] != nullptr) static_cast<float*>(args.outputs[k])[r] = value;
  }
};

// A row taken by a whole block, read from global memory by every pass.
template <typename T, typename Args>
struct GlobalRow : RowView<T, Args>, Reductions<GlobalRow<T, Args>> {
  using RowView<T, Args>::args;
  using RowView<T, Args>::r;
  int64_t chunk;  // the chunk whose partial sums this row adds to, or -1 for none

  __device__ GlobalRow(const Args& a, int64_t row, int64_t its_chunk) : RowView<T, Args>(a, row), chunk(its_chunk) {}

  struct At {
    const GlobalRow& row;
    int64_t n;
    __device__ float load(int k) const { return row.load(k, n); }
    __device__ float load_col(int k, float missing) const { return row.load_col(k, n, missing); }
    __device__ void store(int k, float value) const { row.store(k, n, value); }
  };

  template <typename Combine, typename F>
  __device__ float reduce(F term, Combine combine, float identity) const {
    float partial = identity;
    for (int64_t n = threadIdx.x; n < args.length; n += blockDim.x) partial = combine(partial, term(At{*this, n}));
    return group_reduce(partial, combine, blockDim.x);
  }
  template <typename F>
  __device__ void for_each(F body) const {
    for (int64_t n = threadIdx.x; n < args.length; n += blockDim.x) body(At{*this, n});
  }
  // Each thread owns the same columns in every row of the chunk: no races, fixed order.
  template <int K, typename F>
  __device__ void column_sums(F terms_at) const {
    if (chunk < 0) return;
    for (int64_t n = threadIdx.x; n < args.length; n += blockDim.x) {
      float terms[K];
      terms_at(At{*this, n}, terms);
      for (int k = 0; k < K; ++k) args.partials[(k * args.chunks + chunk) * args.length + n] += terms[k];
    }
  }
  __device__ void store_row(int k, float value) const {
    if (threadIdx.x == 0) static_cast<T*>(args.outputs[k])[r] = Element<T>::from_float(value);
  }
  __device__ void store_row_f32(int k, float value) const {
    if (threadIdx.x == 0 && args.outputs[k] != nullptr) static_cast<float*>(args.outputs[k])[r] = value;
  }
};

// ---------------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------------

template <typename Math, typename Args>
__host__ __device__ bool wants_column_sums(const Args& args) {
  return Math::kColumnSums > 0 && args.partials != nullptr;
}

// Groups of `group_threads` take rows; with per-column sums, group c of the grid takes
// chunk c and keeps its columns' sums in registers until the chunk is done.
template <typename T, typename Args, typename Math, int V>
__global__ void __launch_bounds__(kMaxGroupThreads<Math>) register_row_kernel(const Args args, const Math math,
                                                                        int group_threads) {
  using Row = RegisterRow<T, Args, Math, V>;
  const int groups = blockDim.x / group_threads;
  const int group = threadIdx.x / group_threads, lane = threadIdx.x % group_threads;
  if (!wants_column_sums<Math>(args)) {
    for (int64_t first = int64_t(blockIdx.x) * groups; first < args.rows; first += int64_t(gridDim.x) * groups) {
      const int64_t r = first + group;
      math.template apply<PrecisionFor<T>>(Row(args, r, r < args.rows, lane, group_threads, nullptr));
    }
    return;
  }
  typename Row::ColumnSums sums = {};
  const int64_t chunk = int64_t(blockIdx.x) * groups + group;
  for (int64_t i = 0; i < args.rows_per_chunk; ++i) {
    const int64_t r = chunk * args.rows_per_chunk + i;
    math.template apply<PrecisionFor<T>>(Row(args, r, chunk < args.chunks && r < args.rows, lane, group_threads, &sums));
  }
  if (chunk >= args.chunks) return;
  const int64_t vectors = args.length / V;
  AVO_UNROLL
  for (int k = 0; k < Math::kColumnSums; ++k) {
    float* partial = args.partials + (k * args.chunks + chunk) * args.length;
    AVO_UNROLL
    for (int i = 0; i < Row::P; ++i) {
      const int64_t v = int64_t(i) * group_threads + lane;
      if (v >= vectors) continue;
      AVO_UNROLL
      for (int j = 0; j < V; ++j) partial[v * V + j] = sums[k][i][j];
    }
  }
}

// A block per row; with per-column sums, block c takes chunk c.
template <typename T, typename Args, typename Math>
__global__ void __launch_bounds__(kGlobalRowThreads) global_row_kernel(const Args args, const Math math) {
  if (!wants_column_sums<Math>(args)) {
    for (int64_t r = blockIdx.x; r < args.rows; r += gridDim.x)
      math.template apply<PrecisionFor<T>>(GlobalRow<T, Args>(args, r, -1));
    return;
  }
  const int64_t chunk = blockIdx.x;
  const int64_t last = (chunk + 1) * args.rows_per_chunk < args.rows ? (chunk + 1) * args.rows_per_chunk : args.rows;
  for (int64_t r = chunk * args.rows_per_chunk; r < last; ++r)
    math.template apply<PrecisionFor<T>>(GlobalRow<T, Args>(args, r, chunk));
}

// Per-column outputs: each column's partials, summed in chunk order.
template <typename T, typename Args, typename Math>
__global__ void __launch_bounds__(kRowBlockThreads) column_finish_kernel(const Args args) {
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

// True when every per-element tensor of the call starts `bytes`-aligned.
template <typename Math, typename Args>
bool element_tensors_aligned(const Args& args, uintptr_t bytes) {
  for (int k = 0; k < Args::kInputs; ++k)
    if (((Math::kElementInputs >> k) & 1u) && args.inputs[k] != nullptr && !is_aligned(args.inputs[k], bytes))
      return false;
  for (int k = 0; k < Args::kOutputs; ++k)
    if (((Math::kElementOutputs >> k) & 1u) && args.outputs[k] != nullptr && !is_aligned(args.outputs[k], bytes))
      return false;
  return true;
}

// Picks the kernel version for the row length (see the top of this file) and launches
// it, then the column finish when the call wants per-column outputs.
template <typename T, typename Args, typename Math>
void launch_row_op(const Args& args, const Math& math, cudaStream_t stream) {
  if (args.rows == 0) return;
  constexpr int V = 16 / sizeof(T);
  const bool chunked = wants_column_sums<Math>(args);
  const bool vectorized = args.length % V == 0 && element_tensors_aligned<Math>(args, 16);
  const int64_t vectors = vectorized ? args.length / V : args.length;
  if (vectors <= int64_t(kRowVectors<Math>) * kMaxGroupThreads<Math>) {
    int group = 1;
    while (int64_t(group) * kRowVectors<Math> < vectors) group *= 2;
    const int block = group < kRowBlockThreads ? kRowBlockThreads : group;
    const int groups = block / group;
    const auto kernel = vectorized ? register_row_kernel<T, Args, Math, V> : register_row_kernel<T, Args, Math, 1>;
    const unsigned blocks = chunked ? unsigned((args.chunks + groups - 1) / groups)
                                    : resident_grid_size(kernel, (args.rows + groups - 1) / groups * block, block);
    kernel<<<blocks, block, 0, stream>>>(args, math, group);
  } else {
    const auto kernel = global_row_kernel<T, Args, Math>;
    const unsigned blocks = chunked ? unsigned(args.chunks)
                                    : resident_grid_size(kernel, args.rows * kGlobalRowThreads, kGlobalRowThreads);
    kernel<<<blocks, kGlobalRowThreads, 0, stream>>>(args, math);
  }
  if (chunked && args.length > 0) {
    const unsigned finish_blocks = unsigned((args.length + kRowBlockThreads - 1) / kRowBlockThreads);
    column_finish_kernel<T, Args, Math><<<finish_blocks, kRowBlockThreads, 0, stream>>>(args);
  }
}

}  // namespace avo
