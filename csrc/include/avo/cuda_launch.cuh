// Device-side building blocks for generated CUDA kernels: 16-byte vectors, alignment
// checks, grid sizing and the math precision per element type. CUDA headers only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "dtype.h"
#include "map_args.h"
#include "math.h"

namespace avo {

// Threads per block of elementwise kernels.
constexpr int kMapThreads = 256;

// V elements of T, loaded and stored as one 16-byte (for V * sizeof(T) == 16) access.
template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

template <int V, typename T>
__device__ __forceinline__ Vec<T, V> load_vec(const T* p) {
  return *reinterpret_cast<const Vec<T, V>*>(p);
}

// The same load through the read-only data cache (LDG.CONSTANT): for inputs that no
// thread of the kernel writes. A plain load of a pointer the compiler cannot prove
// read-only goes through the ordinary path, which sustains less bandwidth on streams.
template <int V, typename T>
__device__ __forceinline__ Vec<T, V> load_vec_readonly(const T* p) {
  static_assert(sizeof(Vec<T, V>) == sizeof(uint4), "read-only vector loads are 16 bytes");
  const uint4 bits = __ldg(reinterpret_cast<const uint4*>(p));
  Vec<T, V> value;
  memcpy(&value, &bits, sizeof(value));
  return value;
}

// One element through the read-only data cache.
template <typename T>
__device__ __forceinline__ T load_readonly(const T* p) {
  if constexpr (sizeof(T) == 4) {
    const unsigned bits = __ldg(reinterpret_cast<const unsigned*>(p));
    T value;
    memcpy(&value, &bits, sizeof(value));
    return value;
  } else {
    static_assert(sizeof(T) == 2, "element loads are 2 or 4 bytes");
    const unsigned short bits = __ldg(reinterpret_cast<const unsigned short*>(p));
    T value;
    memcpy(&value, &bits, sizeof(value));
    return value;
  }
}

template <int V, typename T>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, V>& value) {
  *reinterpret_cast<Vec<T, V>*>(p) = value;
}

// Asynchronous 16-byte copies from global to shared memory (cp.async, sm_80 and newer;
// older GPUs copy synchronously). `commit` closes a group of copies; `wait<N>` returns
// when at most N groups are still in flight. The copies bypass L1 (streamed data).
__device__ __forceinline__ void cp_async_16(void* shared, const void* global) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(address), "l"(global));
#else
  *static_cast<uint4*>(shared) = *static_cast<const uint4*>(global);
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

inline bool is_aligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// True when every present pointer of `args` is `bytes`-aligned.
template <int NumInputs, int NumOutputs>
bool all_aligned(const MapArgs<NumInputs, NumOutputs>& args, uintptr_t bytes) {
  for (int k = 0; k < NumInputs; ++k)
    if (args.inputs[k] != nullptr && !is_aligned(args.inputs[k], bytes)) return false;
  for (int k = 0; k < NumOutputs; ++k)
    if (!is_aligned(args.outputs[k], bytes)) return false;
  return true;
}

// Blocks for a grid-stride loop over `work_items`: as many as the work needs, but no
// more than one wave of blocks resident at once (read from the occupancy calculator for
// this kernel, so register use cannot push part of the grid into a second wave).
template <typename Kernel>
unsigned resident_grid_size(Kernel kernel, int64_t work_items, int threads, size_t shared_bytes = 0) {
  int device = 0, multiprocessors = 1, blocks_per_multiprocessor = 1;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_multiprocessor, kernel, threads, shared_bytes);
  const int64_t needed = (work_items + threads - 1) / threads;
  const int64_t resident = int64_t(multiprocessors) * (blocks_per_multiprocessor > 0 ? blocks_per_multiprocessor : 1);
  const int64_t blocks = needed < resident ? needed : resident;
  return unsigned(blocks > 0 ? blocks : 1);
}

// The math precision of kernels on element type T: exact for float32, fast for the
// 16-bit types whose rounding hides the difference (avo/math.h).
template <typename T>
struct PrecisionOf {
  using type = Fast;
};
template <>
struct PrecisionOf<float> {
  using type = Exact;
};
template <typename T>
using PrecisionFor = typename PrecisionOf<T>::type;

}  // namespace avo
