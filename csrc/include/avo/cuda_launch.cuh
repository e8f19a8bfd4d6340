// Device-side building blocks for generated CUDA kernels: 16-byte vectors, alignment
// checks, grid sizing and the math precision per element type. CUDA headers only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

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

// One 16-byte store; kStreaming: with the evict-first hint (st.global.cs), for outputs
// that no kernel of the call reads back (store_vec).
template <bool kStreaming>
__device__ __forceinline__ void store_16(void* p, uint4 bits) {
  if constexpr (kStreaming) __stcs(static_cast<uint4*>(p), bits);
  else *static_cast<uint4*>(p) = bits;
}

// A 16-byte vector is stored as one uint4, 16-bit elements packed in pairs first: a
// plain struct store of elements written one by one is split by the compiler into 2-
// and 4-byte stores, 4 to 8 store instructions instead of one. kStreaming as in
// store_16 (16-byte vectors only).
template <int V, bool kStreaming = false, typename T>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, V>& value) {
  if constexpr (sizeof(Vec<T, V>) == sizeof(uint4) && sizeof(T) == 2) {
    unsigned words[4];
    AVO_UNROLL
    for (int i = 0; i < 4; ++i) {
      unsigned short low, high;
      memcpy(&low, &value.v[2 * i], 2);
      memcpy(&high, &value.v[2 * i + 1], 2);
      words[i] = unsigned(low) | (unsigned(high) << 16);
    }
    store_16<kStreaming>(p, make_uint4(words[0], words[1], words[2], words[3]));
  } else if constexpr (sizeof(Vec<T, V>) == sizeof(uint4)) {
    uint4 bits;
    memcpy(&bits, &value, sizeof(bits));
    store_16<kStreaming>(p, bits);
  } else {
    *reinterpret_cast<Vec<T, V>*>(p) = value;
  }
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

// What the launchers need to know of the current device. Read from the driver once per
// device: the queries would otherwise cost host time on every call. A launch reads it
// once (current_device_info) and hands it to the helpers below.
struct DeviceInfo {
  int index = 0;                // the device's ordinal
  int arch = 0;                 // compute capability, major * 10 + minor
  int multiprocessors = 1;
  size_t max_shared_optin = 0;  // shared memory a block may use when it asks for it
  size_t l2_bytes = 0;
  const char* name = "";        // its device name ("NVIDIA H200"), for the tuning tables
};

// `name`, where given, receives the device name, which the DeviceInfo then points to.
inline DeviceInfo read_device_info(int device, char (*name)[256] = nullptr) {
  DeviceInfo info;
  info.index = device;
  int major = 0, minor = 0, multiprocessors = 1, shared = 0, l2 = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device);
  cudaDeviceGetAttribute(&shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device);
  info.arch = major * 10 + minor;
  info.multiprocessors = multiprocessors > 0 ? multiprocessors : 1;
  info.max_shared_optin = size_t(shared > 0 ? shared : 0);
  info.l2_bytes = size_t(l2 > 0 ? l2 : 0);
  cudaDeviceProp properties;
  if (name != nullptr && cudaGetDeviceProperties(&properties, device) == cudaSuccess) {
    std::strncpy(*name, properties.name, sizeof(*name) - 1);
    (*name)[sizeof(*name) - 1] = '\0';
    info.name = *name;
  }
  return info;
}

inline DeviceInfo current_device_info() {
  constexpr int kCachedDevices = 64;
  static DeviceInfo cached[kCachedDevices];
  static char names[kCachedDevices][256];
  static std::once_flag read[kCachedDevices];
  int device = 0;
  cudaGetDevice(&device);
  // Beyond the cached devices, without a name: such a GPU takes its arch's tuning row.
  if (device < 0 || device >= kCachedDevices) return read_device_info(device);
  std::call_once(read[device], [device] { cached[device] = read_device_info(device, &names[device]); });
  return cached[device];
}

// Blocks of `kernel` that fit on one multiprocessor of `device` (the current one), from
// the occupancy calculator; remembered per kernel, block size, shared memory and device.
template <typename Kernel>
int blocks_per_multiprocessor(Kernel kernel, int threads, size_t shared_bytes, const DeviceInfo& device) {
  static std::mutex lock;
  static std::map<std::tuple<const void*, int, size_t, int>, int> known;
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), threads, shared_bytes, device.index);
  const std::lock_guard<std::mutex> guard(lock);
  const auto found = known.find(key);
  if (found != known.end()) return found->second;
  int blocks = 1;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, shared_bytes);
  known.emplace(key, blocks > 0 ? blocks : 1);
  return blocks > 0 ? blocks : 1;
}

// Sets `attribute` of `kernel` to at least `value` on `device` (the current one): a
// kernel asks before it launches with more than 48 KiB of dynamic shared memory, or
// with clusters past the portable size. Each setting costs host time, so the largest
// value granted so far is remembered per kernel, attribute and device, and so is a
// refusal (false: the GPU does not allow it; the caller then takes another version).
template <typename Kernel>
bool raise_kernel_attribute(Kernel kernel, cudaFuncAttribute attribute, int value, const DeviceInfo& device) {
  struct Known {
    int granted = 0;
    int refused = 0;  // the smallest value refused, 0 for none
  };
  static std::mutex lock;
  static std::map<std::tuple<const void*, int, int>, Known> known;
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), int(attribute), device.index);
  const std::lock_guard<std::mutex> guard(lock);
  Known& seen = known[key];
  if (value <= seen.granted) return true;
  if (seen.refused != 0 && value >= seen.refused) return false;
  if (cudaFuncSetAttribute(kernel, attribute, value) != cudaSuccess) {
    cudaGetLastError();  // an answer here, not a failure of the call
    seen.refused = value;
    return false;
  }
  seen.granted = value;
  return true;
}

// Blocks for a grid-stride loop over `work_items`: as many as the work needs, but no
// more than one wave of blocks resident at once (read from the occupancy calculator for
// this kernel, so register use cannot push part of the grid into a second wave).
template <typename Kernel>
unsigned resident_grid_size(Kernel kernel, int64_t work_items, int threads, const DeviceInfo& device,
                            size_t shared_bytes = 0) {
  const int64_t needed = (work_items + threads - 1) / threads;
  const int64_t resident =
      int64_t(device.multiprocessors) * blocks_per_multiprocessor(kernel, threads, shared_bytes, device);
  const int64_t blocks = needed < resident ? needed : resident;
  return unsigned(blocks > 0 ? blocks : 1);
}

// Blocks for a grid of `blocks` (a grid-stride kernel): all of them, up to the largest
// grid the launch takes.
inline unsigned full_grid_size(int64_t blocks) {
  constexpr int64_t kMaxGrid = 2147483647;  // gridDim.x
  return unsigned(blocks < 1 ? 1 : blocks > kMaxGrid ? kMaxGrid : blocks);
}

}  // namespace avo
