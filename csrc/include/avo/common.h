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

// A CPU kernel's outermost loop (avo/row_cpu.h, avo/map_cpu.h). With GCC 12 or later on
// x86-64 Linux it is compiled for three instruction sets, AVX-512, AVX2 with FMA and the
// x86-64 baseline (SSE2), and the best one the machine has is chosen, by its features,
// when the library loads (target_clones; earlier GCCs may not take these levels' names).
// `flatten` inlines the generated math into each copy, so that it is compiled, and
// vectorized, for that instruction set too. The copies give the same bits: the build
// passes -ffp-contract=off, so a fused multiply-add is only ever the one the generated
// math asks for (F::fma), which every instruction set rounds alike. Elsewhere there is one
// copy, for the build's target; a build may also define the macro itself (-DAVO_CPU_KERNEL=
// for one copy compiled for -march).
#if !defined(AVO_CPU_KERNEL)
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12 && !defined(__CUDACC__) && defined(__x86_64__) && \
    defined(__linux__)
#define AVO_CPU_KERNEL __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"), flatten))
#else
#define AVO_CPU_KERNEL
#endif
#endif
