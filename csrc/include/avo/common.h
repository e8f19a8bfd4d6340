// Portability macros shared by CUDA and CPU code. No torch headers here (DESIGN.md).
#pragma once

#if defined(__CUDACC__)
#define AVO_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define AVO_HOST_DEVICE inline
#endif

// Unroll a loop with a compile-time trip count (nvcc's pragma; gcc's equivalent).
#if defined(__CUDACC__)
#define AVO_UNROLL _Pragma("unroll")
#else
#define AVO_UNROLL _Pragma("GCC unroll 8")
#endif

