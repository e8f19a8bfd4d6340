// The kernels of every elementwise ("map") op on the GPU; the generated math (Math::apply,
// Math::missing) is what differs between ops, and the generated launcher picks the kernel.
// Inputs are loaded through the read-only data cache, or copied into shared memory with
// cp.async (the 16-bit vectorized kernels): the bindings always allocate fresh outputs,
// so no thread writes memory that any thread of the kernel reads.
#pragma once

#include <cuda_runtime.h>

#include "cuda_launch.cuh"
#include "map_args.h"

namespace avo {

// How map_vectorized_kernel moves vectors of T: kPerThread 16-byte vectors per input and
// output a thread, and whether the inputs arrive through shared memory (kStaged).
// ptxas places each vector's register load just before that vector's math, whatever the
// source order (to keep fewer registers live), so a thread has one load in flight while
// it computes its other vectors. A 16-bit vector holds 8 elements, and with math like
// gelu's (about 20 instructions an element) the loads then came too slowly: its bf16
// forward ran at 0.83 of copy on the H200. Copies into shared memory with cp.async
// cannot move past the wait that comes before the math, so all of a thread's loads are
// in flight together (0.90-0.91 of copy, two vectors a thread 0.5% ahead of four). A
// 32-bit vector holds 4 elements: staged, the fp32 kernels were 0-3% slower, and they
// keep registers.
template <typename T>
struct MapVectors {
  static constexpr bool kStaged = sizeof(T) == 2;
  static constexpr int kPerThread = kStaged ? 2 : 4;
};

// Every tensor dense and 16-byte aligned. Block b covers the U * kMapThreads 16-byte
// vectors from b * U * kMapThreads on (U = MapVectors<T>::kPerThread); each thread loads
// its U vectors per input (coalesced across the block) before computing any, then stores
// U vectors per output. Block 0 also takes the numel % V elements past the last full
// vector.
template <typename T, int NumInputs, int NumOutputs, typename Math>
__global__ void __launch_bounds__(kMapThreads) map_vectorized_kernel(const MapArgs<NumInputs, NumOutputs> args,
                                                                     const Math math) {
  constexpr int V = 16 / sizeof(T);
  constexpr int U = MapVectors<T>::kPerThread;
  using P = PrecisionFor<T>;
  const int64_t vectors = args.numel / V;
  const int64_t base = int64_t(blockIdx.x) * (U * kMapThreads) + threadIdx.x;
  if (base < vectors) {
    Vec<T, V> in[NumInputs][U];
    // Vector u of input k. Clamped: a thread whose vector u lies past the end re-reads
    // the last vector (and stores nothing), so the loads need no predicate.
    auto input_vector = [&](int k, int u) {
      const int64_t v = base + u * kMapThreads < vectors ? base + u * kMapThreads : vectors - 1;
      return static_cast<const T*>(args.inputs[k]) + v * V;
    };
    if constexpr (MapVectors<T>::kStaged) {
      // Each thread copies into its own slots and reads back only them: no barrier.
      __shared__ uint4 staged[NumInputs][U][kMapThreads];
      AVO_UNROLL
      for (int u = 0; u < U; ++u)
        AVO_UNROLL
        for (int k = 0; k < NumInputs; ++k)
          if (input_present<Math>(args, k)) cp_async_16(&staged[k][u][threadIdx.x], input_vector(k, u));
      cp_async_commit();
      cp_async_wait<0>();
      AVO_UNROLL
      for (int u = 0; u < U; ++u)
        AVO_UNROLL
        for (int k = 0; k < NumInputs; ++k)
          if (input_present<Math>(args, k)) memcpy(&in[k][u], &staged[k][u][threadIdx.x], sizeof(in[k][u]));
    } else {
      AVO_UNROLL
      for (int u = 0; u < U; ++u)
        AVO_UNROLL
        for (int k = 0; k < NumInputs; ++k)
          if (input_present<Math>(args, k)) in[k][u] = load_vec_readonly<V>(input_vector(k, u));
    }
    Vec<T, V> out[NumOutputs][U];
    AVO_UNROLL
    for (int u = 0; u < U; ++u) {
      AVO_UNROLL
      for (int e = 0; e < V; ++e) {
        T element_out[NumOutputs];
        map_element<P>(args, math, [&](int k) { return in[k][u].v[e]; }, element_out);
        AVO_UNROLL
        for (int k = 0; k < NumOutputs; ++k) out[k][u].v[e] = element_out[k];
      }
    }
    AVO_UNROLL
    for (int u = 0; u < U; ++u) {
      const int64_t v = base + u * kMapThreads;
      AVO_UNROLL
      for (int k = 0; k < NumOutputs; ++k)
        if (v < vectors) store_vec<V>(static_cast<T*>(args.outputs[k]) + v * V, out[k][u]);
    }
  }
  const int64_t i = vectors * V + threadIdx.x;
  if (blockIdx.x == 0 && i < args.numel) {
    T element_out[NumOutputs];
    map_element<P>(args, math, [&](int k) { return load_readonly(static_cast<const T*>(args.inputs[k]) + i); }, element_out);
    AVO_UNROLL
    for (int k = 0; k < NumOutputs; ++k) static_cast<T*>(args.outputs[k])[i] = element_out[k];
  }
}

// Any layout (strided, broadcast, misaligned): inputs are read through their strides;
// outputs are dense. A grid-stride loop.
template <typename T, int NumInputs, int NumOutputs, typename Math>
__global__ void __launch_bounds__(kMapThreads) map_strided_kernel(const MapArgs<NumInputs, NumOutputs> args,
                                                                  const Math math) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < args.numel; i += step) {
    int64_t offsets[NumInputs];
    input_offsets(args, i, offsets);
    T element_out[NumOutputs];
    map_element<PrecisionFor<T>>(
        args, math, [&](int k) { return load_readonly(static_cast<const T*>(args.inputs[k]) + offsets[k]); },
        element_out);
    AVO_UNROLL
    for (int k = 0; k < NumOutputs; ++k) static_cast<T*>(args.outputs[k])[i] = element_out[k];
  }
}

// One block per U * kMapThreads vectors.
template <typename T, int NumInputs, int NumOutputs, typename Math>
void launch_map_vectorized(const MapArgs<NumInputs, NumOutputs>& args, const Math& math, cudaStream_t stream) {
  constexpr int V = 16 / sizeof(T);
  const int64_t per_block = int64_t(MapVectors<T>::kPerThread) * kMapThreads;
  const int64_t blocks = (args.numel / V + per_block - 1) / per_block;
  map_vectorized_kernel<T><<<unsigned(blocks > 0 ? blocks : 1), kMapThreads, 0, stream>>>(args, math);
}

// One wave of resident blocks.
template <typename T, int NumInputs, int NumOutputs, typename Math>
void launch_map_strided(const MapArgs<NumInputs, NumOutputs>& args, const Math& math, cudaStream_t stream) {
  const auto kernel = map_strided_kernel<T, NumInputs, NumOutputs, Math>;
  kernel<<<resident_grid_size(kernel, args.numel, kMapThreads, current_device_info()), kMapThreads, 0, stream>>>(args, math);
}

}  // namespace avo
