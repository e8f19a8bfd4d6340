// The row kernels on the GPU. launch_row_op picks one of five versions per call, from
// the row length, the dtype and the alignment of the rows (the table is in
// pick_row_version, below):
//
//  - RegisterRow, for short rows: the row is read from global memory once and kept in
//    registers. A group of G threads (a power of two, up to kMaxGroupThreads<Math>) takes
//    a row; each thread holds up to P vectors of V elements of every per-element input,
//    vector i of thread `lane` being the row's vector i * G + lane (coalesced). P is
//    kRowVectors<Math>, for a cluster row too. V is 16 bytes' worth of elements when
//    every row starts 16-byte aligned and the length is a multiple of it, else 1. Short
//    rows share a block (several groups of G < kRowBlockThreads, or
//    kShortRowBlockThreads where the call sums no columns). Pipelined (from a measured
//    length on, where the kernel has the registers: kCanPipeline), a group loads its
//    next row before it computes the current one, on a grid of resident blocks (with
//    per-column sums, the next row of its chunk); unpipelined, the grid covers the rows
//    (a lean row's kernel with fewer registers: kLeanRow). On wide rows (kWideRow, from
//    a measured length on) a group of up to 512 threads holds 2P vectors a thread; on
//    narrow rows (up to a measured length, maths without per-column sums) twice the
//    threads hold P/2 vectors each, and the per-column vectors (weight, bias) too,
//    loaded with the row (kNarrowColumnsAhead). Unpipelined rows of 16-byte vectors
//    without per-column sums in groups of 8 to 64 threads (to 512 for maths that keep
//    no values, to 1024 in the register rows of kLightRow maths) take kernels whose G is
//    fixed when they are compiled (kFixedGroupWidths).
//  - StagedRow, for longer aligned rows that fit in shared memory: a block takes a row;
//    its per-element inputs are copied into shared memory with cp.async, kStages rows
//    at a time, so that the next rows arrive while the block computes the current one.
//    Every pass over the row then reads shared memory.
//  - Cluster rows (RegisterRow with kClustered, cluster_row_kernel), for rows the
//    registers of one block cannot hold, or from a measured length on (sm_90): the row
//    is split over the 2 to 16 blocks of a thread-block cluster, each block holding its
//    part in registers; reductions combine the blocks through mailboxes in shared
//    memory (cluster_exchange), without a cluster barrier; the outputs are stored with
//    the evict-first hint (RegisterRow::OutputRows). Pipelined where it can be
//    and sums no columns, or sums columns in a kernel of one block a multiprocessor
//    (then in blocks of 256 threads up to 8 a cluster, two clusters a multiprocessor).
//    Rows of two per-element inputs that 16 blocks of 512 threads cannot hold take
//    wide cluster rows (wide_cluster_row_kernel: 2P vectors a thread).
//    Where the call sums no columns, each thread copies its vectors of the per-column
//    inputs (weight, bias) into shared memory once per kernel (ColumnStage), and from a
//    measured length on the row takes small blocks, several a multiprocessor
//    (cluster_block_threads).
//  - GlobalRow, for the rest: each pass reads the row from global memory again (from L2
//    after the first pass: launch_global_rows keeps few enough rows in flight). A block
//    takes a row, or on sm_90 a cluster of up to 8 blocks shares a long row of 16-byte
//    vectors, each thread loading kGlobalBatch vectors ahead.
//  - TiledRow, for the long rows of a backward with per-column sums whose math reduces
//    the row in one pass (kCanTile): rows are cut into tiles of columns, a block each.
//    A first kernel writes each tile's part of its row's reduction; a second adds the
//    parts up and runs the last pass over a tile of a chunk of rows, the tile's
//    per-column sums in registers for the whole chunk. The row is read twice, but the
//    work splits over (tile, chunk) pairs instead of chunks alone, and the partials are
//    few: with a chunk of rows per cluster or block, layernorm's backward at 1024x65536
//    ran 64 workers at a time and reached a fifth of the copy bandwidth. From a measured
//    length on (where all its blocks fit on the GPU at once), one kernel does both, its
//    blocks waiting for each other's parts a row behind, and reads the row once
//    (one_kernel_tiled_rows_kernel).
//
// Reductions accumulate in fp32: warp shuffles, then shared memory across the warps of a
// group, in an order fixed by the launch configuration (itself fixed by the shapes), so
// results are deterministic. Per-column sums (gradients of [N] parameters) are summed
// per chunk of rows by one group, rows in order, into fp32 partials; a last kernel adds
// the chunks' partials in an order fixed by the shapes (column_finish_kernel). No atomics.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <type_traits>
#include <utility>

#include "cuda_launch.cuh"
#include "math.h"
#include "row_args.h"
#include "row_version.h"

namespace avo {

// Block of RegisterRow kernels with smaller groups: kRowBlockThreads where the call sums
// columns (each group keeps its chunk's sums), kShortRowBlockThreads where it does not.
// A block's threads leave the multiprocessor together, so a block of 32 short rows
// holds its registers until its slowest row is done. On the H200 blocks of 64 threads
// instead of 256 ran the forwards at N = 256 and 1024 1-3% faster (layernorm's 16-bit
// 2.5-3%, swish_layernorm's 3% and its fp32 one at 1024 7%), the backwards without
// per-column sums 0.3%; the backwards with them lost 13-33% at 256 and 1024.
constexpr int kRowBlockThreads = 256;
constexpr int kShortRowBlockThreads = 64;
constexpr int kGlobalRowThreads = 512; // block of GlobalRow kernels
constexpr int kGlobalBatch = 4;        // vectors a GlobalRow thread loads before it computes
constexpr int kStages = 3;             // rows a StagedRow block holds: one computed, two arriving
constexpr int kStagedVectors = 4;      // vectors per thread of a StagedRow (its block: vectors / 4)

// `p`, a pointer into a tensor, with the compiler told that it points to global memory:
// where it cannot see where a pointer came from (opaque_pointer, a pointer chosen
// between a row and nullptr), it loads and stores through generic addresses (LD/ST, not
// LDG/STG).
template <typename P>
__device__ __forceinline__ P* in_global(P* p) {
  __builtin_assume(__isGlobal(p));
  return p;
}

// `p` as the compiler cannot see through: a row's base pointer computed once, so that
// each vector's address stays one multiply-add of its 32-bit index. Left visible, the
// compiler folds the row offset back into every vector's address (a 64-bit product and
// carry per vector: about 8 instructions where one does).
template <typename P>
__device__ __forceinline__ P* opaque_pointer(P* p) {
  asm("" : "+l"(p));
  return in_global(p);
}

// V elements of T as a row keeps them in registers: the 32-bit words of a 16-byte (or
// 4-byte) vector, two 16-bit elements to a word, each element converted to float where
// it is read. Held as V separate 16-bit values instead, a bf16 vector takes eight
// registers rather than four and a repack per element, and the row kernels are bound by
// the instructions they issue. A single 16-bit element (rows that are not 16-byte
// aligned) is kept as it is.
template <typename T, int V, bool kWords = (sizeof(T) * V) % 4 == 0>
struct Packed {
  unsigned w[sizeof(T) * V / 4];

  __device__ __forceinline__ void load(const T* p) {
    if constexpr (sizeof(w) == 16) {
      const uint4 bits = *reinterpret_cast<const uint4*>(p);
      w[0] = bits.x, w[1] = bits.y, w[2] = bits.z, w[3] = bits.w;
    } else {
      static_assert(sizeof(w) == 4, "a packed vector is 16 or 4 bytes");
      w[0] = *reinterpret_cast<const unsigned*>(p);
    }
  }
  __device__ __forceinline__ void store(T* p) const {
    if constexpr (sizeof(w) == 16) *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
    else *reinterpret_cast<unsigned*>(p) = w[0];
  }
  // Every element set to `value` (a missing parameter's default).
  __device__ __forceinline__ void fill(float value) {
    unsigned word = __float_as_uint(value);
    if constexpr (sizeof(T) == 2) {
      const T element = Element<T>::from_float(value);
      unsigned short bits;
      memcpy(&bits, &element, sizeof(bits));
      word = unsigned(bits) | (unsigned(bits) << 16);
    }
    AVO_UNROLL
    for (int i = 0; i < int(sizeof(w) / 4); ++i) w[i] = word;
  }
  __device__ __forceinline__ void zero() {
    AVO_UNROLL
    for (int i = 0; i < int(sizeof(w) / 4); ++i) w[i] = 0u;
  }
  // Element j as float: bf16 by one shift or mask, fp16 by one conversion of a half word.
  __device__ __forceinline__ float get(int j) const {
    if constexpr (sizeof(T) == 4) {
      return __uint_as_float(w[j]);
    } else if constexpr (std::is_same<T, __nv_bfloat16>::value) {
      return __uint_as_float(j % 2 ? w[j / 2] & 0xffff0000u : w[j / 2] << 16);
    } else {
      return __half2float(__ushort_as_half((unsigned short)(j % 2 ? w[j / 2] >> 16 : w[j / 2] & 0xffffu)));
    }
  }
};

template <typename T, int V>
struct Packed<T, V, false> {
  Vec<T, V> vec;
  __device__ __forceinline__ void load(const T* p) { vec = load_vec<V>(p); }
  __device__ __forceinline__ void store(T* p) const { store_vec<V>(p, vec); }
  __device__ __forceinline__ void fill(float value) {
    AVO_UNROLL
    for (int j = 0; j < V; ++j) vec.v[j] = Element<T>::from_float(value);
  }
  __device__ __forceinline__ void zero() { fill(0.0f); }
  __device__ __forceinline__ float get(int j) const { return Element<T>::to_float(vec.v[j]); }
};

// Waits for the threads of this thread's group of `group_threads` (a power of two, at
// least a warp). kBlockBarrier: __syncthreads, every thread of the block waiting (the
// rows whose group is the block, and the register rows that sum no columns:
// RegisterRow::kBlockBarrier). Else the group's own named barrier, 1 + its index in the
// block (0 is __syncthreads'; groups wider than a warp are at most kRowBlockThreads / 64
// = 4 to a block, of the 16 barriers), so that the groups of a block do not wait for
// each other.
template <bool kBlockBarrier>
__device__ __forceinline__ void group_barrier(int group_threads) {
  if constexpr (kBlockBarrier) {
    __syncthreads();
  } else {
    const unsigned barrier = 1u + (threadIdx.x >> (__ffs(group_threads) - 1));  // a power of two: no division
    __barrier_sync_count(barrier, unsigned(group_threads));
  }
}

// `value` combined over each group of `group_threads` consecutive threads (a power of
// two), every thread of the group getting the result: butterfly(value, width) combines it
// over aligned runs of `width` lanes of a warp (width <= 32) by shuffles; a group wider
// than a warp then combines its warps' results through shared memory by the same
// butterfly. Every thread of the block must call it, in the same order: groups wider than
// a warp synchronise their warps (group_barrier).
template <bool kBlockBarrier, typename Value, typename Butterfly>
__device__ __forceinline__ Value group_combine(Value value, int group_threads, Butterfly butterfly) {
  value = butterfly(value, group_threads < 32 ? group_threads : 32);
  if (group_threads <= 32) return value;
  __shared__ Value per_warp[32];
  const int warp = threadIdx.x / 32, warps = group_threads / 32;
  const int first = warp & ~(warps - 1);  // the group's first warp (warps: a power of two)
  group_barrier<kBlockBarrier>(group_threads);  // a previous reduction may still be reading per_warp
  if (threadIdx.x % 32 == 0) per_warp[warp] = value;
  group_barrier<kBlockBarrier>(group_threads);
  // Every warp combines its group's per-warp values by the same butterfly of shuffles, so
  // every thread gets the same value. Read one after the other, 16 values (a group of 512
  // threads) made a chain of 16 dependent shared-memory loads in every thread.
  return butterfly(per_warp[first + (threadIdx.x & (warps - 1))], warps);
}

// Calls step(offset) for the shuffle offsets of a butterfly over `width` lanes (a power
// of two up to 32): width / 2, ..., 2, 1. kUnrolled: the five offsets from 16 down,
// those not below the width skipped, with no loop. The rows whose group is the block
// (cluster, global, staged and tiled rows) take it: a loop over a width known only at
// run time spent a shift, a compare and a branch on each shuffle, and on the H200 the
// cluster forwards at 65536 and 262144 ran 3-6% faster without it. The register rows
// keep the loop: unrolled, their kernels took more registers (log_softmax's 16-bit
// forward 35 -> 42, two blocks of 512 threads a multiprocessor instead of three, 9%
// slower at 4096x16384).
template <bool kUnrolled, typename Step>
__device__ __forceinline__ void butterfly_offsets(int width, Step step) {
  if constexpr (kUnrolled) {
    AVO_UNROLL
    for (int offset = 16; offset > 0; offset /= 2)
      if (offset < width) step(offset);
  } else {
    for (int offset = width / 2; offset > 0; offset /= 2) step(offset);
  }
}

// values[k] combined by `combine` (commutative) over aligned runs of `width` lanes of a
// warp (a power of two up to 32), every lane getting the result; kUnrolled as in
// butterfly_offsets.
template <bool kUnrolled, int K, typename Combine>
__device__ __forceinline__ void combine_lanes(float (&values)[K], int width, Combine combine) {
  butterfly_offsets<kUnrolled>(width, [&](int offset) {
    AVO_UNROLL
    for (int k = 0; k < K; ++k) values[k] = combine(values[k], __shfl_xor_sync(0xffffffffu, values[k], offset));
  });
}

// Combines `value` over each group of `group_threads` consecutive threads by `combine`
// (commutative), as group_combine; kUnrolled as in butterfly_offsets, kBlockBarrier as in
// group_barrier.
template <bool kUnrolled = false, bool kBlockBarrier = kUnrolled, typename Combine>
__device__ __forceinline__ float group_reduce(float value, Combine combine, int group_threads) {
  return group_combine<kBlockBarrier>(value, group_threads, [&](float mine, int width) {
    butterfly_offsets<kUnrolled>(width, [&](int offset) { mine = combine(mine, __shfl_xor_sync(0xffffffffu, mine, offset)); });
    return mine;
  });
}

// K sums over each group of `group_threads` consecutive threads at once (see
// group_reduce): one exchange across the warps of a group for all K.
template <int K, bool kUnrolled = false, bool kBlockBarrier = kUnrolled>
__device__ __forceinline__ void group_sums(float (&values)[K], int group_threads) {
  const auto add = [](float a, float b) { return a + b; };
  combine_lanes<kUnrolled>(values, group_threads < 32 ? group_threads : 32, add);
  if (group_threads <= 32) return;
  __shared__ float per_warp[K][32];
  const int warp = threadIdx.x / 32, warps = group_threads / 32;
  const int first = warp & ~(warps - 1);  // the group's first warp (warps: a power of two)
  group_barrier<kBlockBarrier>(group_threads);  // a previous reduction may still be reading per_warp
  if (threadIdx.x % 32 == 0) {
    AVO_UNROLL
    for (int k = 0; k < K; ++k) per_warp[k][warp] = values[k];
  }
  group_barrier<kBlockBarrier>(group_threads);
  // As in group_reduce, a butterfly in every warp; over all 32 lanes, those past the
  // group's warps adding zeros. With a loop of log2(warps) steps, ptxas gave layernorm's
  // fp32 backward 73 registers instead of 64 (three blocks of 256 threads per
  // multiprocessor, not four), and it lost 15% at 262144x256.
  const int lane = threadIdx.x % 32;
  AVO_UNROLL
  for (int k = 0; k < K; ++k) values[k] = lane < warps ? per_warp[k][first + lane] : 0.0f;
  combine_lanes<true>(values, 32, add);
}

// Blocks in a cluster at most: the portable limit, 8; and for a cluster row, sm_90's
// limit, 16, which a kernel must ask for (raise_kernel_attribute). On the H200, clusters
// of 16 blocks of 512 threads ran rows that had taken the global version 10-23% faster
// (16-bit rows of 262144: add_layernorm's and add_rmsnorm's forwards, softmax's and
// log_softmax's backwards). Clusters of 16 blocks of 1024 threads (fp32 forwards at
// 262144) lost 14-20% to the global version while the blocks exchanged through a
// cluster barrier; with the mailboxes (cluster_exchange) they beat it: layernorm's fp32
// forward at 256x262144 1.70x, swish_layernorm's 1.56x, rmsnorm's 1.37x, softmax's and
// log_softmax's 1.13x. The global version's own clusters lost with 16 blocks instead of
// 8 in the fp32 forwards at 262144 (9-16%): it keeps 8.
constexpr int kMaxClusterBlocks = 8;
constexpr int kMaxWideClusterBlocks = 16;

// Combining values (the same in every thread of a block) over the blocks of the
// thread-block cluster, without a cluster barrier: each block sends its values to every
// block of the cluster (thread t to block t, one st.async of 16 bytes into that block's
// mailbox, which completes bytes on the mailbox's mbarrier), then waits on its own
// mbarrier until all the blocks' values have arrived, and every thread combines them
// from its block's shared memory in the same order in every block (deterministic; see
// cluster_combine). A cluster barrier (cluster.sync()) instead fences every memory access
// at GPU scope (MEMBAR.ALL.GPU): at each exchange it waits for the loads of the next row
// that a pipelined row has just issued, and for the last row's stores (on the H200 the
// cluster rows of 65536 and 262144 elements ran up to 1.46x faster without it).
// The wait acquires at the scope of the block, as a wait for a bulk copy does: the
// values it waits for are in the block's own shared memory, counted in by the mbarrier.
// Acquiring at the scope of the cluster also invalidates the multiprocessor's L1
// (CCTL.IVALL), which only loads of global memory that other blocks wrote would need,
// and the rows read none: that took 5% of the stall samples of layernorm's cluster
// forward on the H200.
//
// Two mailbox slots in turn, each with its mbarrier: exchange e uses slot e % 2, in
// that slot's phase e / 2. A block sends exchange e + 2 into slot e % 2 of block b only
// after it received b's values of exchange e + 1, which b sends after a reduction
// across its threads (a __syncthreads, or a warp's shuffles where the block is a warp)
// that each of its threads reaches only once it has read exchange e's values: no
// block overwrites values another still reads. `exchanges` counts them per thread.
constexpr int kMailboxValues = 4;  // values an exchange carries at most (one 16-byte store)

struct ClusterMailbox {
  float4 slot[2][kMaxWideClusterBlocks];  // [exchange % 2][sending block's rank]
  unsigned long long arrived[2];          // mbarrier of each slot
};

// The kernel's mailbox (one per block: a static shared variable of a function that is
// not a template is one object for the whole kernel).
__device__ __forceinline__ ClusterMailbox& cluster_mailbox() {
  __shared__ ClusterMailbox mailbox;
  return mailbox;
}

__device__ __forceinline__ unsigned shared_address(const void* p) { return unsigned(__cvta_generic_to_shared(p)); }

// Every thread of a cluster kernel calls this once, before the first exchange: the
// mbarriers are initialised, and visible to the other blocks, before any block sends.
__device__ __forceinline__ void cluster_mailbox_init() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  ClusterMailbox& mailbox = cluster_mailbox();
  if (threadIdx.x == 0) {
    AVO_UNROLL
    for (int s = 0; s < 2; ++s)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(&mailbox.arrived[s])) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  cooperative_groups::this_cluster().sync();
#endif
}

// Sends values[0..K) to every block of the cluster and returns this block's slot once
// every block's values are in it (slot[b]: block b's values).
template <int K>
__device__ __forceinline__ const float4* cluster_exchange(const float (&values)[K], unsigned& exchanges) {
  static_assert(K <= kMailboxValues, "a cluster exchange carries 4 values at most");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  ClusterMailbox& mailbox = cluster_mailbox();
  const unsigned s = exchanges & 1u, phase = (exchanges >> 1) & 1u;
  ++exchanges;
  const unsigned blocks = cluster.num_blocks();
  const unsigned arrived = shared_address(&mailbox.arrived[s]);
  if (threadIdx.x == 0)  // this block's arrival: the phase ends once blocks * 16 bytes came
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(arrived), "r"(blocks * 16u)
                 : "memory");
  if (threadIdx.x < blocks) {
    float v[kMailboxValues] = {};
    AVO_UNROLL
    for (int k = 0; k < K; ++k) v[k] = values[k];
    // This block's slot in block threadIdx.x's mailbox, and that mailbox's mbarrier.
    const unsigned mine = shared_address(&mailbox.slot[s][cluster.block_rank()]);
    unsigned to, to_arrived;
    asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(to) : "r"(mine), "r"(threadIdx.x));
    asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(to_arrived) : "r"(arrived), "r"(threadIdx.x));
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];"
                 ::"r"(to), "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3]), "r"(to_arrived)
                 : "memory");
  }
  unsigned done = 0;
  do {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(arrived), "r"(phase)
        : "memory");
  } while (!done);
  return mailbox.slot[s];
#else
  return nullptr;
#endif
}

// values[k] combined over the blocks of the cluster, for each k. Where the blocks are a
// power of two (every cluster row's, and a global row's of a power-of-two length), lane
// l of each warp takes block (l mod blocks)'s values and the lanes combine them in a
// butterfly over `blocks` lanes: one shared-memory load and log2(blocks) shuffles, where
// reading every block's values took `blocks` loads and combines in every thread (16 of
// each in the fp32 cluster rows of 262144 forwards and 65536 backwards, whose threads
// hold 8 or 16 elements). Every thread still gets the same values: each step combines
// the same two values in both lanes, and every group of `blocks` lanes holds the same
// values in the same places. Other counts combine in rank order.
template <int K, typename Combine>
__device__ __forceinline__ void cluster_combine(float (&values)[K], Combine combine, unsigned& exchanges) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const float4* slot = cluster_exchange(values, exchanges);
  const unsigned blocks = cooperative_groups::this_cluster().num_blocks();
  if ((blocks & (blocks - 1)) == 0) {
    const float4 mine = slot[threadIdx.x & (blocks - 1)];
    const float taken[kMailboxValues] = {mine.x, mine.y, mine.z, mine.w};
    AVO_UNROLL
    for (int k = 0; k < K; ++k) values[k] = taken[k];
    combine_lanes<true>(values, int(blocks), combine);
    return;
  }
  const float4 first = slot[0];
  float total[kMailboxValues] = {first.x, first.y, first.z, first.w};
  for (unsigned b = 1; b < blocks; ++b) {
    const float4 other = slot[b];
    const float next[kMailboxValues] = {other.x, other.y, other.z, other.w};
    AVO_UNROLL
    for (int k = 0; k < K; ++k) total[k] = combine(total[k], next[k]);
  }
  AVO_UNROLL
  for (int k = 0; k < K; ++k) values[k] = total[k];
#endif
}

// The count, mean and sum of squared deviations from the mean (m2) of a set of values.
// Two sets combine into the moments of their union (Chan, Golub and LeVeque's pairwise
// update), as accurately as two passes over the union would give them: a global row's
// mean and variance then take one read of the row and one exchange between its threads
// instead of two (Reductions::moments).
struct Moments {
  float count, mean, m2;
};
__device__ __forceinline__ Moments combine_moments(const Moments& a, const Moments& b) {
  const float count = a.count + b.count;
  const float share = count > 0.0f ? b.count / count : 0.0f;  // of b in the union
  const float delta = b.mean - a.mean;
  return {count, a.mean + delta * share, a.m2 + b.m2 + delta * delta * a.count * share};
}
// The moments of `count` values x from their sums about `shift`, one of the values:
// sum (x - shift) and sum (x - shift)^2. With the shift among the values, the
// cancellation in m2 loses at most log2(count + 1) bits, however far the values lie from
// zero (a register row's thread holds 32 values at most).
__device__ __forceinline__ Moments shifted_moments(int count, float shift, float sum, float squares) {
  if (count == 0) return {0.0f, 0.0f, 0.0f};
  const float n = float(count);
  const float m2 = squares - sum * (sum / n);
  return {n, shift + sum / n, m2 < 0.0f ? 0.0f : m2};  // keeps a NaN
}
// combine_moments over each group of `group_threads` consecutive threads, as group_reduce
// combines values. The update is not symmetric in its rounding: each butterfly step takes
// the lower lane's moments first, so that every thread of the group ends with the same
// result.
template <bool kUnrolled = false, bool kBlockBarrier = kUnrolled>
__device__ __forceinline__ Moments group_moments(Moments value, int group_threads) {
  return group_combine<kBlockBarrier>(value, group_threads, [](Moments mine, int width) {
    butterfly_offsets<kUnrolled>(width, [&](int offset) {
      const Moments other = {__shfl_xor_sync(0xffffffffu, mine.count, offset),
                             __shfl_xor_sync(0xffffffffu, mine.mean, offset),
                             __shfl_xor_sync(0xffffffffu, mine.m2, offset)};
      mine = (threadIdx.x & offset) == 0 ? combine_moments(mine, other) : combine_moments(other, mine);
    });
    return mine;
  });
}
// combine_moments over the blocks of the thread-block cluster, in rank order (see
// cluster_exchange).
__device__ __forceinline__ Moments cluster_moments(Moments value, unsigned& exchanges) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const float4* slot = cluster_exchange({value.count, value.mean, value.m2}, exchanges);
  const unsigned blocks = cooperative_groups::this_cluster().num_blocks();
  value = {slot[0].x, slot[0].y, slot[0].z};
  for (unsigned b = 1; b < blocks; ++b) {
    const float4 other = slot[b];
    value = combine_moments(value, {other.x, other.y, other.z});
  }
#endif
  return value;
}

// How a reduction combines: `accumulate` adds one element's term to a thread's partial,
// operator() merges two partials (between threads).
struct Plus {
  __device__ float operator()(float a, float b) const { return a + b; }
  __device__ float accumulate(float partial, float term) const { return partial + term; }
};
// The sum of the squares of the terms: each square added in one fused multiply-add (one
// rounding, one instruction where a product and a sum take two).
struct SquaresPlus {
  __device__ float operator()(float a, float b) const { return a + b; }
  __device__ float accumulate(float partial, float term) const { return fmaf(term, term, partial); }
};
// Adds one element's terms to a thread's K partial sums: as Plus, or as SquaresPlus where
// bit k of kSquares is set (RegisterRow::reduce_sums, for Reductions::moments in one pass).
template <unsigned kSquares, int K>
__device__ __forceinline__ void add_terms(float (&sums)[K], const float (&terms)[K]) {
  AVO_UNROLL
  for (int k = 0; k < K; ++k)
    sums[k] = (kSquares >> k) & 1u ? SquaresPlus{}.accumulate(sums[k], terms[k]) : Plus{}.accumulate(sums[k], terms[k]);
}

// A row's maximum and minimum propagate NaN, as Functions::maximum and minimum do: from
// sm_80 on in one instruction (max.NaN), where those take a compare, a NaN test and a
// select per element. Which zero a tie of -0 and +0 gives is left open (torch's amax too).
template <bool kMaximum>
struct Extremum {
  __device__ float operator()(float a, float b) const {
    float m;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (kMaximum) {
      asm("max.NaN.f32 %0, %1, %2;" : "=f"(m) : "f"(a), "f"(b));
    } else {
      asm("min.NaN.f32 %0, %1, %2;" : "=f"(m) : "f"(a), "f"(b));
    }
#else
    m = kMaximum ? Functions<Exact>::maximum(a, b) : Functions<Exact>::minimum(a, b);
#endif
    return m;
  }
  __device__ float accumulate(float partial, float term) const { return (*this)(partial, term); }
};
using Max = Extremum<true>;
using Min = Extremum<false>;

// sum, max and min over a row, for a row type that provides reduce<M>(term, combine,
// identity); M lists the per-column inputs the pass reads (Columns, avo/row_args.h).
// Reductions::moments: the most that a row's sum of squared terms may exceed the sum of
// their squared deviations from the mean (m2) by, for m2 to be taken from the two sums of
// one pass (Row::kOnePassMoments), in 16-bit kernels, whose results are rounded to 11 or
// 8 bits.
constexpr float kOnePassMomentsBound = 64.0f;

template <typename Row>
struct Reductions {
  template <unsigned M, typename F>
  __device__ __forceinline__ float sum(Columns<M>, F term) const { return self().template reduce<M>(term, Plus{}, 0.0f); }
  template <unsigned M, typename F>
  __device__ __forceinline__ float max(Columns<M>, F term) const { return self().template reduce<M>(term, Max{}, -INFINITY); }
  template <unsigned M, typename F>
  __device__ __forceinline__ float min(Columns<M>, F term) const { return self().template reduce<M>(term, Min{}, INFINITY); }
  // The sum of the squares of term.
  template <unsigned M, typename F>
  __device__ __forceinline__ float sum_squares(Columns<M>, F term) const {
    return self().template reduce<M>(term, SquaresPlus{}, 0.0f);
  }
  // Several sums in one pass over the row: out[k] = the sum of terms[k].
  template <unsigned M, int K, typename F>
  __device__ __forceinline__ void sums(Columns<M>, float (&out)[K], F terms_at) const {
    self().template reduce_sums<M, K>(terms_at, out);
  }
  // The sum of term over the row (out[0]) and the sum of the squares of its deviations
  // from their mean (out[1]). A row type whose every pass reads the row from memory
  // (kMergesMoments: GlobalRow) merges per-thread Moments, one pass and one exchange
  // (reduce_moments); on the H200 merging them lost up to 27% on the register and
  // cluster rows, which hold the values. The 16-bit cluster rows that keep no values
  // (kOnePassMoments) instead sum the terms and their squares in one pass and one exchange
  // of two sums, and take m2 = squares - sum^2 / n where that cancels little: where
  // squares <= kOnePassMomentsBound * m2, it loses at most log2 of the bound in bits
  // (6: within the rounding to 16 bits that follows). Elsewhere (a row far from zero
  // against its spread, a NaN or an infinity), and in the other rows, they make a second
  // pass over the squares about the mean, reading back the values the first one kept
  // (reduce<M, true>). Every thread of a row holds the same sums, so the whole row (the
  // whole cluster) takes the same branch.
  static constexpr bool kMergesMoments = false;
  static constexpr bool kOnePassMoments = false;
  template <unsigned M, typename F>
  __device__ __forceinline__ void moments(Columns<M> columns, float (&out)[2], F term) const {
    if constexpr (Row::kMergesMoments) {
      self().template reduce_moments<M>(term, out);
    } else {
      if constexpr (Row::kOnePassMoments) {
        float sums[2];
        self().template reduce_sums<M, 2, 0x2u>([&](const auto& at, float* terms) { terms[0] = terms[1] = term(at); },
                                                 sums);
        out[0] = sums[0];
        const float m2 = sums[1] - sums[0] * (sums[0] / float(self().length()));
        if (sums[1] <= kOnePassMomentsBound * m2) {  // false for a NaN
          out[1] = m2;
          return;
        }
      } else {
        out[0] = sum(columns, term);
      }
      const float mean = out[0] / float(self().length());
      out[1] = self().template reduce<M, true>([&](const auto& at) { return term(at) - mean; }, SquaresPlus{}, 0.0f);
    }
  }
  __device__ __forceinline__ const Row& self() const { return static_cast<const Row&>(*this); }
};

// Stores the vector that starts at element `at` of the [rows, length] outputs, in every
// per-element output that the call asked for.
template <typename Math, typename T, typename Args, int V>
__device__ __forceinline__ void store_output_vectors(const Args& args, int64_t at, const Vec<T, V> (&out)[Args::kOutputs]) {
  AVO_UNROLL
  for (int k = 0; k < Args::kOutputs; ++k) {
    if (!((Math::kElementOutputs >> k) & 1u) || args.outputs[k] == nullptr) continue;
    store_vec<V>(static_cast<T*>(args.outputs[k]) + at, out[k]);
  }
}

// Vector v (of V elements) of the per-column inputs in ColumnMask, one 16-byte load
// each, or Math's default for an input the call left out (so that reading an element
// needs no test): the register and staged rows read weight and bias this way, in the
// passes that use them only (the mask comes from the generated math), or once for a
// chunk of rows (RegisterRow::kKeepsColumns). Read one element at a time instead, a
// warp's load touches four cache lines for two bytes of each: the H200 measured
// layernorm's bf16 forward at 65536x1024 with the L1 83% busy and DRAM at 48%.
template <unsigned ColumnMask, typename Math, typename T, typename Args, int V>
__device__ __forceinline__ void load_column_vectors(const Args& args, int64_t v, Packed<T, V> (&columns)[Args::kInputs]) {
  AVO_UNROLL
  for (int k = 0; k < Args::kInputs; ++k) {
    if (!((ColumnMask >> k) & 1u)) continue;
    if (args.inputs[k] == nullptr) columns[k].fill(Math::column_default(k));
    else columns[k].load(static_cast<const T*>(args.inputs[k]) + v * V);
  }
}

// Per-element inputs of Math: how many.
template <typename Math>
constexpr int kElementInputCount = __builtin_popcount(Math::kElementInputs);

// A cluster row's copy of this thread's vectors of the per-column inputs (weight, bias),
// in shared memory: a thread holds the same columns in every row it takes, so it loads
// them from global memory once per kernel, not in every row's passes that read them.
// Without it, those loads were L2 reads issued only in the last pass of each row, after
// the reductions' barriers, and waited for with nothing else in flight (layernorm's bf16
// forward at 1024x65536 read 70% of its bytes from L2). The copy is kept in shared memory,
// not registers: the 64 registers of a 1024-thread block hold the row and the next row.
// Input k's vector i of thread t is at ((slot(k) * P + i) * blockDim.x + t) * V, so a
// warp reads consecutive 16-byte vectors. Missing inputs are copied as Math's default.
// The copy is the kernel's dynamic shared memory, whose address is a constant: the row
// holds only whether there is one (a pointer took two of the 64 registers that
// add_layernorm's 16-bit forward has, and it spilled).
template <typename T, typename Args, typename Math, int P, int V>
struct ColumnStage {
  using Cached = Packed<T, V>;
  static constexpr int kSlots = __builtin_popcount(Math::kColumnInputs);
  bool present;  // false: the kernel was launched without the copy

  __host__ __device__ static constexpr int slot(int k) { return __builtin_popcount(Math::kColumnInputs & ((1u << k) - 1u)); }
  static size_t bytes(int block_threads) { return size_t(kSlots) * P * size_t(block_threads) * V * sizeof(T); }

  __device__ __forceinline__ static T* at(int k, int i) {
    extern __shared__ __align__(16) unsigned char column_stage_memory[];
    return reinterpret_cast<T*>(column_stage_memory) + (int(slot(k) * P + i) * int(blockDim.x) + int(threadIdx.x)) * V;
  }
  // Copies this thread's vectors i * threads + lane (i < P) of the per-column inputs.
  __device__ __forceinline__ void fill(const Args& args, int lane, int threads) const {
    const int vectors = int(args.length / V);
    AVO_UNROLL
    for (int i = 0; i < P; ++i) {
      const int v = i * threads + lane;
      if (v >= vectors) continue;
      Cached columns[Args::kInputs];
      load_column_vectors<Math::kColumnInputs, Math>(args, v, columns);
      AVO_UNROLL
      for (int k = 0; k < Args::kInputs; ++k)
        if ((Math::kColumnInputs >> k) & 1u) columns[k].store(at(k, i));
    }
  }
  // This thread's vector i of the per-column inputs in ColumnMask.
  template <unsigned ColumnMask>
  __device__ __forceinline__ void load(int i, Cached (&columns)[Args::kInputs]) const {
    AVO_UNROLL
    for (int k = 0; k < Args::kInputs; ++k)
      if ((ColumnMask >> k) & 1u) columns[k].load(at(k, i));
  }
};

// Vectors per thread of a RegisterRow (a cluster row's too), and its largest group (its
// block): smaller when the thread also keeps per-column sums, or caches several inputs,
// so nothing spills. Kept values (V floats a vector) do not halve it: the row's first
// pass turns each input vector into them, so the two are not held at once. With four
// vectors, swish_layernorm's forward computes its sigmoid once per element also in fp32
// rows of 16384 and in the cluster rows, and its register rows do the per-row work
// (reductions, setup) for twice the elements. Against two vectors and cluster rows that
// computed the kept values in every pass, on the H200: 1.12-1.30x in 16 bits, 1.05-1.69x
// in fp32 rows up to 65536 (the most at 16384, which had taken the staged version). In
// 16 bits the pipelined kernel then spills (60 bytes; the dispatch table does not take
// it) and the cluster kernel too (48 bytes), which is still 1.25-1.30x faster than
// computing the values again.
template <typename Math>
constexpr int kRowVectors = Math::kColumnSums > 0 ? 2 : 4;
template <typename Math>
constexpr int kMaxGroupThreads = Math::kColumnSums > 0 || (Math::kElementInputs & (Math::kElementInputs - 1)) ? 512 : 1024;

// Blocks of a RegisterRow kernel that must fit on a multiprocessor together: two of 512
// threads (64 registers a thread) where the threads keep no per-column sums, so that one
// block's loads overlap the other's reductions. Left free, ptxas gave the fp32 forwards of
// add_layernorm and add_rmsnorm 82-97 registers (one block); capped, they need 64 and
// spill nothing. Most backwards' column sums do not fit 64 registers (they would spill).
// 0 sets no minimum: an explicit 1 is not the same as none, it let ptxas take up to 90
// registers for rmsnorm's backward (60 without it), one block where there were two.
// An unpipelined kernel with one per-column sum (rmsnorm's and add_rmsnorm's backwards)
// fits 64 registers too: with the named barriers of group_barrier, ptxas gave
// add_rmsnorm's 16-bit one 88 registers where it had taken 64 (two blocks of 256
// threads a multiprocessor instead of four).
template <typename Math, bool kPipelined = false>
constexpr int kRowBlocksPerSM =
    kMaxGroupThreads<Math> <= 512 && (Math::kColumnSums == 0 || (Math::kColumnSums == 1 && !kPipelined)) ? 2 : 0;
// The same for a cluster row, also where its per-column sums take 16 registers or fewer
// (sums * kRowVectors * V floats: two sums in fp32 rows, one in 16-bit rows). ptxas gave
// add_layernorm's fp32 backward 91 registers (one block) once its sums went from three to
// two, where it had taken 64, and it lost 21% at 2048x16384; add_rmsnorm's 16-bit
// backward 77-83 (one block; capped: 64, a 16-byte spill in fp16), and on the H200 the
// cap made it 1.23x faster at 4096x16384 and 1.21x at 2048x32768. Two 16-bit sums take
// 32 registers: capped, those kernels would spill much more.
template <typename T, typename Math>
constexpr int kClusterBlocksPerSM =
    kMaxGroupThreads<Math> <= 512 && Math::kColumnSums * kRowVectors<Math> * int(16 / sizeof(T)) <= 16 ? 2 : 0;

// A row held in registers by a group of threads (see the top of this file); with
// kClustered the group is every thread of a thread-block cluster. kColumnsAhead: the row
// loads its vectors of the per-column inputs (weight, bias) with its per-element ones
// (the narrow rows: kNarrowColumnsAhead). kGroupThreads: the group's width where the
// kernel fixes it (kFixedGroupWidths), else 0.
template <typename T, typename Args, typename Math, int V, bool kClustered = false, int kVectors = kRowVectors<Math>,
          bool kColumnsAhead = false, int kGroupThreads = 0>
struct RegisterRow
    : RowView<T, Args>,
      Reductions<RegisterRow<T, Args, Math, V, kClustered, kVectors, kColumnsAhead, kGroupThreads>> {
  static constexpr int P = kVectors;
  static_assert(!kColumnsAhead || (!kClustered && Math::kColumnSums == 0),
                "a row that loads its per-column vectors ahead keeps them for one row: no chunk sums them");
  static constexpr bool kKeeps = Math::kKeptValues > 0;
  using RowView<T, Args>::args;
  using RowView<T, Args>::r;
  using Vector = Vec<T, V>;
  using Cached = Packed<T, V>;
  static constexpr int kSums = Math::kColumnSums > 0 ? Math::kColumnSums : 1;
  // A thread holds the same columns in every row of its chunk, so where the call wants
  // per-column outputs it can load its vectors of the per-column inputs once, not in
  // every pass of every row. That takes 8 more registers: where the thread's sums and
  // cached vectors take fewer than 48 words, the kernel fits 64 registers without them
  // and four blocks of 256 threads on a multiprocessor, and with them three (on the
  // H200 rmsnorm's 16-bit backward went from 64 to 77 registers and ran 20% slower at
  // N = 1024 and 4096, layernorm's fp32 backward 12-26%). Past that it shares the
  // multiprocessor with one other block either way, and gains: swish_layernorm's
  // 16-bit backward by 9% at N = 256, add_layernorm's by 4% at 1024 and 4096. A cluster
  // row keeps them always (add_rmsnorm's backward at N = 16384: 4-9% faster).
  static constexpr int kStateWords = kSums * P * V + kElementInputCount<Math> * P * int(sizeof(Cached) / 4);
  static constexpr bool kKeepsColumns = Math::kColumnSums > 0 && (kClustered || kStateWords >= 48);
  // A group of a backward's register row (per-column sums) waits only for its own warps
  // in a reduction (group_barrier): on the H200 the 16-bit backwards at N = 1024 (groups
  // of 64 threads, four to a block) ran 8-19% faster than with __syncthreads. The other
  // register rows keep the block's barrier: with named ones softmax's 16-bit forward at
  // 16384x4096 (groups of 128 threads) lost 4-5%.
  static constexpr bool kBlockBarrier = Math::kColumnSums == 0;
  // Cluster rows of 16-bit kernels that keep no values take a row's moments in one pass
  // (Reductions::moments): one exchange of the cluster fewer.
  static constexpr bool kOnePassMoments = kClustered && sizeof(T) == 2 && Math::kKeptValues == 0;
  // A fixed width unrolls the butterflies of the group's reductions (butterfly_offsets).
  static constexpr bool kUnrolledGroup = kGroupThreads > 0;
  static_assert(kGroupThreads == 0 || (!kClustered && kGroupThreads <= 1024), "a fixed group is one block at most");

  // This thread's vectors of every per-element input of a row (zero where it has none),
  // and the row's values of the per-row inputs the forward saved (Math::kSavedInputs).
  // Loaded with the vectors, a pipelined row has them before its math starts: read in
  // the math, each row waited for their loads (the backwards' first instructions).
  // Where kColumnsAhead, also this thread's vectors of the per-column inputs.
  struct Vectors {
    Cached v[Args::kInputs][P];
    float saved[Args::kInputs];
    Cached columns[kColumnsAhead ? P : 1][Args::kInputs];
  };
  // What a group keeps for the chunk of rows it takes (calls with per-column outputs):
  // this thread's part of the chunk's per-column sums and, where kKeepsColumns, its
  // vectors of the per-column inputs.
  struct Chunk {
    float sums[kSums][P][V];
    Cached columns[kKeepsColumns ? P : 1][Args::kInputs];

    __device__ __forceinline__ void load_columns(const Args& args, int lane, int threads) {
      if constexpr (kKeepsColumns) {
        const int vectors = int(args.length / V);
        AVO_UNROLL
        for (int i = 0; i < P; ++i) {
          const int v = i * threads + lane;
          if (v < vectors) load_column_vectors<Math::kColumnInputs, Math>(args, v, columns[i]);
        }
      }
    }
  };

  bool active;    // false for the idle groups of the last block: they only join reductions
  int lane;       // thread index in the group
  int group_threads;
  // Vectors of V elements per row (an int: a register or cluster row holds at most
  // kRowVectors * kMaxGroupThreads * 8 of them, 4 * 1024 * 8 = 4 * 512 * 16), and the row's
  // first element. Vector indices are 32-bit and the row's offset is added once per
  // pass (opaque_pointer), so an address takes one multiply-add instead of a 64-bit
  // product per vector.
  int vectors;
  int64_t start;
  Chunk* chunk;         // nullptr when the call wants no per-column outputs
  unsigned* exchanges;  // kClustered: the cluster exchanges so far (cluster_combine)
  Vectors cache;
  // kClustered: the kernel's copy of this thread's per-column vectors, if it made one.
  ColumnStage<T, Args, Math, P, V> column_stage = {false};
  // The kept values of this thread's elements (at.keep, in the row's first pass that
  // reads them); later passes read them here instead of computing them again.
  mutable float kept[kKeeps ? Math::kKeptValues : 1][kKeeps ? P : 1][kKeeps ? V : 1];

  // Loads this thread's vectors of row `row`.
  __device__ __forceinline__ RegisterRow(const Args& a, int64_t row, bool is_active, int group_lane, int threads,
                                         Chunk* chunk_kept, unsigned* exchange_count = nullptr)
      : RowView<T, Args>(a, row), active(is_active), lane(group_lane), group_threads(threads),
        vectors(int(a.length / V)), start(row * a.length), chunk(chunk_kept), exchanges(exchange_count) {
    load_vectors(args, r, active, lane, group_threads, cache);
  }

  // Takes this thread's vectors of row `row` loaded earlier (pipelined_rows).
  __device__ __forceinline__ RegisterRow(const Args& a, int64_t row, bool is_active, int group_lane, int threads,
                                         Chunk* chunk_kept, const Vectors& loaded, unsigned* exchange_count = nullptr)
      : RowView<T, Args>(a, row), active(is_active), lane(group_lane), group_threads(threads),
        vectors(int(a.length / V)), start(row * a.length), chunk(chunk_kept), exchanges(exchange_count),
        cache(loaded) {}

  // Loads this thread's vectors of row `row`: vector i is the row's vector i * threads + lane.
  __device__ __forceinline__ static void load_vectors(const Args& args, int64_t row, bool is_active, int lane,
                                                      int threads, Vectors& out) {
    const int vectors = int(args.length / V);
    AVO_UNROLL
    for (int k = 0; k < Args::kInputs; ++k) {
      if ((Math::kSavedInputs >> k) & 1u)
        out.saved[k] = is_active && row < args.rows ? static_cast<const float*>(args.inputs[k])[row] : 0.0f;
      if (!((Math::kElementInputs >> k) & 1u)) continue;
      const T* p = opaque_pointer(static_cast<const T*>(args.inputs[k]) + row * args.length);
      AVO_UNROLL
      for (int i = 0; i < P; ++i) {
        const int v = i * threads + lane;
        if (is_active && v < vectors) out.v[k][i].load(p + v * V);
        else out.v[k][i].zero();
      }
    }
    if constexpr (kColumnsAhead) {
      AVO_UNROLL
      for (int i = 0; i < P; ++i) {
        const int v = i * threads + lane;
        if (is_active && v < vectors) load_column_vectors<Math::kColumnInputs, Math>(args, v, out.columns[i]);
      }
    }
  }

  // Asks L2 for row `row` of every per-element input, which this row's threads load
  // later (sm_90, rows of 16-byte vectors; one thread calls it). A bulk prefetch holds no
  // registers: the row is on its way from memory while the threads hold another.
  __device__ __forceinline__ static void prefetch_row(const Args& args, int64_t row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (sizeof(T) * V == 16) {
      const unsigned bytes = unsigned(args.length) * unsigned(sizeof(T));
      AVO_UNROLL
      for (int k = 0; k < Args::kInputs; ++k) {
        if (!((Math::kElementInputs >> k) & 1u)) continue;
        const T* p = static_cast<const T*>(args.inputs[k]) + row * args.length;
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes));
      }
    }
#endif
  }

  __device__ __forceinline__ int vector_index(int i) const { return i * group_threads + lane; }

  // Per-row value k that the forward saved (RowView::load_saved), loaded with the vectors.
  __device__ __forceinline__ float load_saved(int k) const { return cache.saved[k]; }

  // Element j of this thread's vector i, for the generated lambdas.
  struct At {
    const RegisterRow& row;
    int i, j;
    const Cached* columns;  // this vector of the pass's per-column inputs (load_column_vectors)
    Vector* staged;         // for_each: the outputs of this vector, stored after the body ran
    bool again = false;     // a second call of one pass's term: its kept values are there
    __device__ __forceinline__ float load(int k) const { return row.cache.v[k][i].get(j); }
    // A missing input's vector holds Math::column_default(k), the same value as `missing`.
    __device__ __forceinline__ float load_col(int k, float) const { return columns[k].get(j); }
    __device__ __forceinline__ void store(int k, float value) const { staged[k].v[j] = Element<T>::from_float(value); }
    // Kept value h: computed by `value` and stored (keep), or read back (kept).
    template <typename F>
    __device__ __forceinline__ float keep(int h, F value) const {
      if constexpr (kKeeps) return again ? row.kept[h][i][j] : (row.kept[h][i][j] = value());
      else return value();
    }
    template <typename F>
    __device__ __forceinline__ float kept(int h, F value) const {
      if constexpr (kKeeps) return row.kept[h][i][j];
      else return value();
    }
    // Host-kept values are computed again in every pass: the registers are sized for the
    // kept values alone.
    template <typename F>
    __device__ __forceinline__ float keep_on_host(int, F value) const { return value(); }
    template <typename F>
    __device__ __forceinline__ float kept_on_host(int, F value) const { return value(); }
  };

  // Calls visit(i, v, columns) for each of this thread's vectors, `columns` holding
  // vector v of the per-column inputs in ColumnMask (the chunk's, where it keeps them).
  template <unsigned ColumnMask, typename Visit>
  __device__ __forceinline__ void each_vector(Visit visit) const {
    AVO_UNROLL
    for (int i = 0; i < P; ++i) {
      const int v = vector_index(i);
      if (!active || v >= vectors) continue;
      if constexpr (kColumnsAhead) {
        visit(i, v, cache.columns[i]);
        continue;
      }
      if constexpr (kKeepsColumns) {
        if (chunk != nullptr) {
          visit(i, v, chunk->columns[i]);
          continue;
        }
      }
      Cached columns[Args::kInputs];
      if constexpr (kClustered && Math::kColumnInputs != 0) {
        if (column_stage.present) {
          column_stage.template load<ColumnMask>(i, columns);
          visit(i, v, columns);
          continue;
        }
      }
      load_column_vectors<ColumnMask, Math>(args, v, columns);
      visit(i, v, columns);
    }
  }

  // kAgain: a second pass over a term whose kept values the first pass stored.
  template <unsigned M, bool kAgain = false, typename Combine, typename F>
  __device__ __forceinline__ float reduce(F term, Combine combine, float identity) const {
    float partial = identity;
    each_vector<M>([&](int i, int v, const Cached* cols) {
      AVO_UNROLL
      for (int j = 0; j < V; ++j) partial = combine.accumulate(partial, term(At{*this, i, j, cols, nullptr, kAgain}));
    });
    if constexpr (kClustered) {
      float value[1] = {group_reduce<true>(partial, combine, int(blockDim.x))};
      cluster_combine(value, combine, *exchanges);
      return value[0];
    }
    return group_reduce<kUnrolledGroup, kBlockBarrier>(partial, combine, group_threads);
  }

  template <unsigned M, int K, unsigned kSquares = 0u, typename F>
  __device__ __forceinline__ void reduce_sums(F terms_at, float (&out)[K]) const {
    AVO_UNROLL
    for (int k = 0; k < K; ++k) out[k] = 0.0f;
    each_vector<M>([&](int i, int v, const Cached* cols) {
      AVO_UNROLL
      for (int j = 0; j < V; ++j) {
        float terms[K];
        terms_at(At{*this, i, j, cols, nullptr}, terms);
        add_terms<kSquares>(out, terms);
      }
    });
    if constexpr (kClustered) {
      group_sums<K, true>(out, int(blockDim.x));
      cluster_combine(out, Plus{}, *exchanges);
    } else {
      group_sums<K, kUnrolledGroup, kBlockBarrier>(out, group_threads);
    }
  }

  // This row of each per-element output the call asked for (nullptr for the others).
  // A cluster row stores them with the evict-first hint (store_vec's kStreaming): on an
  // H100 the cluster forwards at N = 65536 ran 1.027x faster (geomean of 24 cases,
  // 0.987-1.074), those at 262144 1.000x. The hint in every row version cost the
  // register, narrow and wide rows 0.1-0.2%; the cluster rows' loads with the streaming
  // hint too lost 1-4%.
  struct OutputRows {
    T* p[Args::kOutputs];
    __device__ __forceinline__ void store(int v, const Vector (&out)[Args::kOutputs]) const {
      AVO_UNROLL
      for (int k = 0; k < Args::kOutputs; ++k)
        if (((Math::kElementOutputs >> k) & 1u) && p[k] != nullptr) store_vec<V, kClustered>(in_global(p[k]) + v * V, out[k]);
    }
  };
  __device__ __forceinline__ OutputRows output_rows() const {
    OutputRows rows;
    AVO_UNROLL
    for (int k = 0; k < Args::kOutputs; ++k) {
      T* base = static_cast<T*>(args.outputs[k]);
      rows.p[k] = ((Math::kElementOutputs >> k) & 1u) && base != nullptr ? opaque_pointer(base + start) : nullptr;
    }
    return rows;
  }

  template <unsigned M, typename F>
  __device__ __forceinline__ void for_each(Columns<M>, F body) const {
    const OutputRows rows = output_rows();
    each_vector<M>([&](int i, int v, const Cached* cols) {
      Vector staged[Args::kOutputs];
      AVO_UNROLL
      for (int j = 0; j < V; ++j) body(At{*this, i, j, cols, staged});
      rows.store(v, staged);
    });
  }

  // for_each whose body also yields the K per-column terms of its element, added to this
  // thread's sums (when the call wants them; `columns` is then known at compile time
  // after inlining, and otherwise the terms' arithmetic is dropped).
  template <int K, unsigned M, typename F>
  __device__ __forceinline__ void for_each_with_column_sums(Columns<M>, F body) const {
    const OutputRows rows = output_rows();
    each_vector<M>([&](int i, int v, const Cached* cols) {
      Vector staged[Args::kOutputs];
      AVO_UNROLL
      for (int j = 0; j < V; ++j) {
        float terms[K];
        body(At{*this, i, j, cols, staged}, terms);
        if (chunk == nullptr) continue;
        AVO_UNROLL
        for (int k = 0; k < K; ++k) chunk->sums[k][i][j] += terms[k];
      }
      rows.store(v, staged);
    });
  }

  __device__ __forceinline__ void store_row(int k, float value) const {
    if (active && lane == 0) static_cast<T*>(args.outputs[k])[r] = Element<T>::from_float(value);
  }
  // A per-row value kept in fp32 (output k is a float buffer of one value per row).
  __device__ __forceinline__ void store_row_f32(int k, float value) const {
    if (active && lane == 0 && args.outputs[k] != nullptr) static_cast<float*>(args.outputs[k])[r] = value;
  }
};

// Element j of one vector of a row, every input it reads loaded (the per-element ones and
// the pass's per-column ones), for the generated lambdas of StagedRow and GlobalRow.
template <typename T, int V>
struct VectorAt {
  const Packed<T, V>* in;
  int j;
  Vec<T, V>* staged_out;  // for_each: the outputs of this vector, stored after the body ran
  __device__ __forceinline__ float load(int k) const { return in[k].get(j); }
  // A missing input's vector holds Math::column_default(k), the same value as `missing`.
  __device__ __forceinline__ float load_col(int k, float) const { return in[k].get(j); }
  __device__ __forceinline__ void store(int k, float value) const { staged_out[k].v[j] = Element<T>::from_float(value); }
  // Kept values are computed again in every pass: these rows hold no element values.
  template <typename F>
  __device__ __forceinline__ float keep(int, F value) const { return value(); }
  template <typename F>
  __device__ __forceinline__ float kept(int, F value) const { return value(); }
  template <typename F>
  __device__ __forceinline__ float keep_on_host(int, F value) const { return value(); }
  template <typename F>
  __device__ __forceinline__ float kept_on_host(int, F value) const { return value(); }
};

// The passes of a row type whose vectors arrive with every input they need loaded
// (StagedRow, GlobalRow, TiledRow). Row provides each_vector<M>(visit), which calls
// visit(slot, v, in) for each of this thread's vectors (`in`: vector v of every
// per-element input and of the per-column inputs in M), and combine_threads(value,
// combine) and sum_threads(values), which combine per-thread values over the threads
// that share the row; where it sets kMergesMoments, merge_moments(moments); for
// for_each_with_column_sums, `columns`, its per-column sums.
template <typename Row, typename T, typename Args, typename Math, int V>
struct LoadedVectorPasses : Reductions<Row> {
  using At = VectorAt<T, V>;

  // kAgain as in RegisterRow::reduce; these rows keep no values, so it changes nothing.
  template <unsigned M, bool kAgain = false, typename Combine, typename F>
  __device__ __forceinline__ float reduce(F term, Combine combine, float identity) const {
    float partial = identity;
    this->self().template each_vector<M>([&](int, int64_t, const Packed<T, V>* in) {
      AVO_UNROLL
      for (int j = 0; j < V; ++j) partial = combine.accumulate(partial, term(At{in, j, nullptr}));
    });
    return this->self().combine_threads(partial, combine);
  }

  template <unsigned M, int K, typename F>
  __device__ __forceinline__ void reduce_sums(F terms_at, float (&out)[K]) const {
    AVO_UNROLL
    for (int k = 0; k < K; ++k) out[k] = 0.0f;
    this->self().template each_vector<M>([&](int, int64_t, const Packed<T, V>* in) {
      AVO_UNROLL
      for (int j = 0; j < V; ++j) {
        float terms[K];
        terms_at(At{in, j, nullptr}, terms);
        AVO_UNROLL
        for (int k = 0; k < K; ++k) out[k] += terms[k];
      }
    });
    this->self().sum_threads(out);
  }

  // Merged Moments, one pass and one exchange (Reductions::moments, for a Row whose
  // kMergesMoments is true: it provides merge_moments).
  template <unsigned M, typename F>
  __device__ __forceinline__ void reduce_moments(F term, float (&out)[2]) const {
    float shift = 0.0f, sum = 0.0f, squares = 0.0f;
    int count = 0;
    this->self().template each_vector<M>([&](int, int64_t, const Packed<T, V>* in) {
      AVO_UNROLL
      for (int j = 0; j < V; ++j) {
        const float x = term(At{in, j, nullptr});
        if (j == 0 && count == 0) shift = x;  // the thread's first value
        const float d = x - shift;
        sum += d;
        squares = fmaf(d, d, squares);
      }
      count += V;
    });
    const Moments moments = this->self().merge_moments(shifted_moments(count, shift, sum, squares));
    out[0] = moments.mean * moments.count;
    out[1] = moments.m2;
  }

  template <unsigned M, typename F>
  __device__ __forceinline__ void for_each(Columns<M>, F body) const {
    const Row& row = this->self();
    row.template each_vector<M>([&](int, int64_t v, const Packed<T, V>* in) {
      Vec<T, V> out[Args::kOutputs];
      AVO_UNROLL
      for (int j = 0; j < V; ++j) body(At{in, j, out});
      store_output_vectors<Math>(row.args, row.r * row.args.length + v * V, out);
    });
  }

  // for_each whose body also yields the K per-column terms of its element, added to the
  // row's per-column sums in registers (`row.columns`, indexed by the visit's slot; none
  // when it is nullptr), as RegisterRow's. GlobalRow adds them to partials instead.
  template <int K, unsigned M, typename F>
  __device__ __forceinline__ void for_each_with_column_sums(Columns<M>, F body) const {
    const Row& row = this->self();
    row.template each_vector<M>([&](int i, int64_t v, const Packed<T, V>* in) {
      Vec<T, V> out[Args::kOutputs];
      AVO_UNROLL
      for (int j = 0; j < V; ++j) {
        float terms[K];
        body(At{in, j, out}, terms);
        if (row.columns == nullptr) continue;
        AVO_UNROLL
        for (int k = 0; k < K; ++k) (*row.columns)[k][i][j] += terms[k];
      }
      store_output_vectors<Math>(row.args, row.r * row.args.length + v * V, out);
    });
  }
};

// A row whose per-element inputs the block has copied into shared memory (see the top of
// this file). Thread t handles the row's vectors t, t + B, ... (B threads, at most P
// vectors each: P fixes the size of its per-column sums).
template <typename T, typename Args, typename Math, int V>
struct StagedRow : RowView<T, Args>, LoadedVectorPasses<StagedRow<T, Args, Math, V>, T, Args, Math, V> {
  static constexpr int P = kStagedVectors;
  using RowView<T, Args>::args;
  using RowView<T, Args>::r;
  using Vector = Vec<T, V>;
  using Cached = Packed<T, V>;
  static constexpr int kSums = Math::kColumnSums > 0 ? Math::kColumnSums : 1;
  using ColumnSums = float[kSums][P][V];

  const T* staged[Args::kInputs];  // input k's row in shared memory (per-element inputs only)
  int64_t vectors;
  ColumnSums* columns;  // nullptr when the call wants no per-column outputs

  __device__ __forceinline__ StagedRow(const Args& a, int64_t row, const T* const (&rows)[Args::kInputs],
                                       ColumnSums* column_sums)
      : RowView<T, Args>(a, row), vectors(a.length / V), columns(column_sums) {
    AVO_UNROLL
    for (int k = 0; k < Args::kInputs; ++k) staged[k] = rows[k];
  }

  using At = VectorAt<T, V>;

  // Calls visit(i, v, in) for each of this thread's vectors, `in` holding vector v of
  // every per-element input (from shared memory) and of the per-column inputs in
  // ColumnMask (from global).
  template <unsigned ColumnMask, typename Visit>
  __device__ __forceinline__ void each_vector(Visit visit) const {
    AVO_UNROLL
    for (int i = 0; i < P; ++i) {
      const int64_t v = int64_t(i) * blockDim.x + threadIdx.x;
      if (v >= vectors) continue;
      Cached in[Args::kInputs];
      AVO_UNROLL
      for (int k = 0; k < Args::kInputs; ++k)
        if ((Math::kElementInputs >> k) & 1u) in[k].load(staged[k] + v * V);
      load_column_vectors<ColumnMask, Math>(args, v, in);
      visit(i, v, in);
    }
  }

  template <typename Combine>
  __device__ __forceinline__ float combine_threads(float value, Combine combine) const {
    return group_reduce<true>(value, combine, blockDim.x);
  }
  template <int K>
  __device__ __forceinline__ void sum_threads(float (&values)[K]) const {
    group_sums<K, true>(values, blockDim.x);
  }

  __device__ __forceinline__ void store_row(int k, float value) const {
    if (threadIdx.x == 0) static_cast<T*>(args.outputs[k])[r] = Element<T>::from_float(value);
  }
  __device__ __forceinline__ void store_row_f32(int k, float value) const {
    if (threadIdx.x == 0 && args.outputs[k] != nullptr) static_cast<float*>(args.outputs[k])[r] = value;
  }
};

// A row read from global memory by every pass (from L2 after the first: the launch keeps
// few enough rows in flight that their inputs fit there). A block takes a row, or on
// sm_90 the blocks of a thread-block cluster share it: thread `lane` of the `threads`
// handles the row's vectors lane, lane + threads, ..., kGlobalBatch at a time, so that
// each thread has that many loads of every input in flight before it computes.
template <typename T, typename Args, typename Math, int V, bool kClustered>
struct GlobalRow : RowView<T, Args>, LoadedVectorPasses<GlobalRow<T, Args, Math, V, kClustered>, T, Args, Math, V> {
  using RowView<T, Args>::args;
  using RowView<T, Args>::r;
  using Vector = Vec<T, V>;
  using Cached = Packed<T, V>;
  int64_t chunk;  // the chunk whose partial sums this row adds to, or -1 for none
  int lane, threads;
  int64_t vectors;
  unsigned* exchanges;  // kClustered: the cluster exchanges so far (cluster_combine)

  __device__ __forceinline__ GlobalRow(const Args& a, int64_t row, int64_t its_chunk, int row_lane, int row_threads,
                                       unsigned* exchange_count)
      : RowView<T, Args>(a, row), chunk(its_chunk), lane(row_lane), threads(row_threads), vectors(a.length / V),
        exchanges(exchange_count) {}

  using At = VectorAt<T, V>;

  // Calls visit(b, v, in) for each of this thread's vectors, `in` holding vector v of
  // every per-element input and of the per-column inputs in ColumnMask, all loaded from
  // global memory kGlobalBatch vectors ahead (b: its place in the batch).
  template <unsigned ColumnMask, typename Visit>
  __device__ __forceinline__ void each_vector(Visit visit) const {
    for (int64_t first = lane; first < vectors; first += int64_t(kGlobalBatch) * threads) {
      Cached in[kGlobalBatch][Args::kInputs];
      AVO_UNROLL
      for (int b = 0; b < kGlobalBatch; ++b) {
        const int64_t v = first + int64_t(b) * threads;
        if (v >= vectors) continue;
        AVO_UNROLL
        for (int k = 0; k < Args::kInputs; ++k)
          if ((Math::kElementInputs >> k) & 1u) in[b][k].load(static_cast<const T*>(args.inputs[k]) + r * args.length + v * V);
        load_column_vectors<ColumnMask, Math>(args, v, in[b]);
      }
      AVO_UNROLL
      for (int b = 0; b < kGlobalBatch; ++b) {
        const int64_t v = first + int64_t(b) * threads;
        if (v < vectors) visit(b, v, in[b]);
      }
    }
  }

  // Per-thread values combined over the row's threads: the block, then the cluster.
  template <typename Combine>
  __device__ __forceinline__ float combine_threads(float value, Combine combine) const {
    float values[1] = {group_reduce<true>(value, combine, int(blockDim.x))};
    if constexpr (kClustered) cluster_combine(values, combine, *exchanges);
    return values[0];
  }
  template <int K>
  __device__ __forceinline__ void sum_threads(float (&values)[K]) const {
    group_sums<K, true>(values, int(blockDim.x));
    if constexpr (kClustered) cluster_combine(values, Plus{}, *exchanges);
  }
  static constexpr bool kMergesMoments = true;
  __device__ __forceinline__ Moments merge_moments(const Moments& value) const {
    const Moments block = group_moments<true>(value, int(blockDim.x));
    if constexpr (kClustered) return cluster_moments(block, *exchanges);
    return block;
  }

  // for_each whose body also yields the K per-column terms of its element, added to the
  // chunk's partials. Each thread owns the same columns in every row of the chunk: no
  // races, fixed order. The chunk's first row sets the partials (they start
  // uninitialised), the others add.
  template <int K, unsigned M, typename F>
  __device__ __forceinline__ void for_each_with_column_sums(Columns<M>, F body) const {
    const bool first = r == chunk * args.rows_per_chunk;
    each_vector<M>([&](int, int64_t v, const Cached* in) {
      Vector out[Args::kOutputs];
      float terms[K][V];
      AVO_UNROLL
      for (int j = 0; j < V; ++j) {
        float at_j[K];
        body(At{in, j, out}, at_j);
        AVO_UNROLL
        for (int k = 0; k < K; ++k) terms[k][j] = at_j[k];
      }
      store_output_vectors<Math>(args, r * args.length + v * V, out);
      if (chunk < 0) return;
      AVO_UNROLL
      for (int k = 0; k < K; ++k) set_or_add<V>(args.partials + (k * args.chunks + chunk) * args.length + v * V, terms[k], first);
    });
  }

  __device__ __forceinline__ void store_row(int k, float value) const {
    if (lane == 0) static_cast<T*>(args.outputs[k])[r] = Element<T>::from_float(value);
  }
  __device__ __forceinline__ void store_row_f32(int k, float value) const {
    if (lane == 0 && args.outputs[k] != nullptr) static_cast<float*>(args.outputs[k])[r] = value;
  }

 private:
  // p[0, V) = values (first) or p[0, V) + values; four floats at a time where V allows
  // (p is then 16-byte aligned: the partials start aligned and the row is whole vectors).
  template <int W>
  __device__ __forceinline__ static void set_or_add(float* p, const float (&values)[W], bool first) {
    if constexpr (W % 4 == 0) {
      AVO_UNROLL
      for (int q = 0; q < W; q += 4) {
        float4 sum = make_float4(values[q], values[q + 1], values[q + 2], values[q + 3]);
        if (!first) {
          const float4 old = *reinterpret_cast<const float4*>(p + q);
          sum.x += old.x, sum.y += old.y, sum.z += old.z, sum.w += old.w;
        }
        *reinterpret_cast<float4*>(p + q) = sum;
      }
    } else {
      AVO_UNROLL
      for (int q = 0; q < W; ++q) p[q] = first ? values[q] : p[q] + values[q];
    }
  }
};

// A part of a row's reduction that one block writes and others wait for while the
// kernel runs (the tiled version's one kernel): the float's bits and, above them, 1 for
// written, in one 64-bit word, which a load sees whole (the words start at 0: the launch
// clears them). Relaxed at GPU scope, without a fence: a release would wait for the
// writer's loads of the rows ahead (MEMBAR), and the word carries its own mark. The
// loads go to L2, past the multiprocessor's L1, which does not see other blocks' writes.
struct TaggedPart {
  static constexpr unsigned long long kWritten = 1ull << 32;
  __device__ __forceinline__ static void write(unsigned long long* word, float value) {
    const unsigned long long tagged = kWritten | __float_as_uint(value);
    asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(word), "l"(tagged) : "memory");
  }
  __device__ __forceinline__ static unsigned long long load(const unsigned long long* word) {
    unsigned long long tagged;
    asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(tagged) : "l"(word) : "memory");
    return tagged;
  }
  // The word, once written: `loaded` if it was, else loaded again until it is.
  __device__ __forceinline__ static unsigned long long wait(const unsigned long long* word, unsigned long long loaded) {
    while (!(loaded & kWritten)) {
      __nanosleep(32);
      loaded = load(word);
    }
    return loaded;
  }
  __device__ __forceinline__ static float value(unsigned long long tagged) { return __uint_as_float(unsigned(tagged)); }
};

// Calls visit(k, i, v) for each per-element input k of Math and each of this thread's
// vectors i of a tile whose first is the row's vector `first` (TiledRow::first_vector):
// the row's vector v = first + i * kTileThreads, where v < vectors.
template <typename Math, int kInputs, typename Visit>
__device__ __forceinline__ void each_tile_vector(int64_t first, int64_t vectors, Visit visit) {
  AVO_UNROLL
  for (int k = 0; k < kInputs; ++k) {
    if (!((Math::kElementInputs >> k) & 1u)) continue;
    AVO_UNROLL
    for (int i = 0; i < kTileVectors; ++i) {
      const int64_t v = first + int64_t(i) * kTileThreads;
      if (v < vectors) visit(k, i, v);
    }
  }
}

// A thread's vectors of a tile of a row (TiledRow): of every per-element input.
template <typename T, typename Args, int V>
struct TileVectors {
  Packed<T, V> v[Args::kInputs][kTileVectors];
};

// A tile of a row, for the tiled version of the backwards with per-column sums whose
// math reduces the row in one pass (kCanTile): block b of a kernel takes tile
// b % tiles, the vectors tile * kTileThreads * P + i * kTileThreads + threadIdx.x (P =
// kTileVectors; avo/row_args.h). A row loads its vectors of the per-element inputs when
// it is made (load_vectors), so that they are in flight while it adds up the tiles'
// parts of the reduction, or is made from vectors loaded before (the one kernel).
//  - kTotals false (the parts): the pass's reduction over the tile goes to the row's
//    tile sums; the rest of the row's math does nothing.
//  - kTotals true (the totals): the reduction is the sum of the tiles' parts, in the same
//    order in every warp of every block of the row, and the last pass runs over the
//    tile, its per-column terms summed into the thread's sums for the chunk.
//  - kOneKernel: the parts are written and read while the other tiles' blocks run, each
//    as one 64-bit word holding the value and a mark that it is written (TaggedPart); a
//    reader waits for the mark.
template <typename T, typename Args, typename Math, int V, bool kTotals, bool kOneKernel = false>
struct TiledRow : RowView<T, Args>,
                  LoadedVectorPasses<TiledRow<T, Args, Math, V, kTotals, kOneKernel>, T, Args, Math, V> {
  using Passes = LoadedVectorPasses<TiledRow<T, Args, Math, V, kTotals, kOneKernel>, T, Args, Math, V>;
  static constexpr int P = kTileVectors;
  using RowView<T, Args>::args;
  using RowView<T, Args>::r;
  using Cached = Packed<T, V>;
  static constexpr int kSums = Math::kColumnSums > 0 ? Math::kColumnSums : 1;
  using ColumnSums = float[kSums][P][V];
  // Whether a row's tile parts of tile `lane` (lane = threadIdx.x % 32, where lane <
  // tiles) are loaded when the row is made (kTiledMaxSums of them, whether the math sums
  // that many or fewer), not after its vectors in tile_total: on the H200 the 16-bit
  // backwards of 16384 to 262144 gained 3-18% (layernorm's at 1024x65536 0.41 -> 0.45 of
  // copy), the fp32 ones of 262144 (128 tiles) lost 12-14%, for a reason not found (the
  // registers are the same). Not in the one kernel, which waits for each part.
  static constexpr bool kLoadsParts = kTotals && !kOneKernel && sizeof(T) == 2;
  static constexpr int kVectorElements = V;
  using Vectors = TileVectors<T, Args, V>;

  int64_t tile, tiles;
  ColumnSums* columns;
  Vectors cache;
  float first_parts[kLoadsParts ? kTiledMaxSums : 1];

  __device__ __forceinline__ TiledRow(const Args& a, int64_t row, int64_t its_tile, int64_t row_tiles,
                                      ColumnSums* column_sums)
      : TiledRow(a, row, its_tile, row_tiles, column_sums, load_vectors(a, row, its_tile)) {}
  __device__ __forceinline__ TiledRow(const Args& a, int64_t row, int64_t its_tile, int64_t row_tiles,
                                      ColumnSums* column_sums, const Vectors& loaded)
      : RowView<T, Args>(a, row), tile(its_tile), tiles(row_tiles), columns(column_sums), cache(loaded) {
    if constexpr (kLoadsParts) {
      const int lane = threadIdx.x % 32;
      AVO_UNROLL
      for (int k = 0; k < kTiledMaxSums; ++k) first_parts[k] = lane < tiles ? tile_parts(k)[lane] : 0.0f;
    }
  }

  // This thread's vector i of a tile is the row's vector i * kTileThreads + first_vector(tile).
  __device__ __forceinline__ static int64_t first_vector(int64_t tile) {
    return tile * P * kTileThreads + threadIdx.x;
  }
  __device__ __forceinline__ static Vectors load_vectors(const Args& args, int64_t row, int64_t tile) {
    Vectors out;
    each_tile_vector<Math, Args::kInputs>(first_vector(tile), args.length / V, [&](int k, int i, int64_t v) {
      out.v[k][i].load(static_cast<const T*>(args.inputs[k]) + row * args.length + v * V);
    });
    return out;
  }

  // Calls visit(i, v, in) for each of this thread's vectors of the tile, `in` holding its
  // vectors of the per-element inputs and of the per-column inputs in ColumnMask.
  template <unsigned ColumnMask, typename Visit>
  __device__ __forceinline__ void each_vector(Visit visit) const {
    const int64_t vectors = args.length / V;
    AVO_UNROLL
    for (int i = 0; i < P; ++i) {
      const int64_t v = first_vector(tile) + int64_t(i) * kTileThreads;
      if (v >= vectors) continue;
      Cached in[Args::kInputs];
      AVO_UNROLL
      for (int k = 0; k < Args::kInputs; ++k)
        if ((Math::kElementInputs >> k) & 1u) in[k] = cache.v[k][i];
      load_column_vectors<ColumnMask, Math>(args, v, in);
      visit(i, v, in);
    }
  }

  template <typename Combine>
  __device__ __forceinline__ float combine_threads(float value, Combine combine) const {
    return group_reduce<true>(value, combine, int(blockDim.x));
  }
  template <int K>
  __device__ __forceinline__ void sum_threads(float (&values)[K]) const {
    group_sums<K, true>(values, int(blockDim.x));
  }

  // The tile parts of value k of a row's reduction: [rows, kTiledMaxSums, tiles] floats,
  // or in the one kernel as many TaggedPart words.
  __device__ __forceinline__ float* tile_parts(int k) const {
    return args.tile_sums + (r * kTiledMaxSums + k) * tiles;
  }
  __device__ __forceinline__ unsigned long long* tagged_parts(int k) const {
    return reinterpret_cast<unsigned long long*>(args.tile_sums) + (r * kTiledMaxSums + k) * tiles;
  }
  __device__ __forceinline__ void write_part(int k, float value) const {
    if constexpr (kOneKernel) TaggedPart::write(tagged_parts(k) + tile, value);
    else tile_parts(k)[tile] = value;
  }

  // The tiles' parts of value k combined: lane l takes tiles l (loaded with the vectors
  // where kLoadsParts), l + 32, ... in order, then the lanes combine in a butterfly
  // (every lane gets the same value).
  template <typename Combine>
  __device__ __forceinline__ float tile_total(int k, Combine combine, float identity) const {
    const int lane = threadIdx.x % 32;
    float total = identity;
    int64_t t = lane;
    if constexpr (kLoadsParts) {
      if (lane < tiles) total = combine(total, first_parts[k]);
      t += 32;
    }
    for (; t < tiles; t += 32) total = combine(total, tile_parts(k)[t]);
    butterfly_offsets<true>(32, [&](int offset) { total = combine(total, __shfl_xor_sync(0xffffffffu, total, offset)); });
    return total;
  }

  // In the one kernel, the K values' tiles' parts combined likewise, each lane loading
  // its words of up to kWaitBatch tiles for all K at once before it waits for any, so
  // that a row waits about one trip to L2 for its parts instead of one per word.
  static constexpr int kWaitBatch = 2;
  template <int K, typename Combine>
  __device__ __forceinline__ void tagged_totals(float (&out)[K], Combine combine, float identity) const {
    const int lane = threadIdx.x % 32;
    AVO_UNROLL
    for (int k = 0; k < K; ++k) out[k] = identity;
    for (int64_t first = lane; first < tiles; first += 32 * kWaitBatch) {
      unsigned long long words[K][kWaitBatch];
      AVO_UNROLL
      for (int k = 0; k < K; ++k) {
        AVO_UNROLL
        for (int b = 0; b < kWaitBatch; ++b) {
          const int64_t t = first + 32 * b;
          words[k][b] = t < tiles ? TaggedPart::load(tagged_parts(k) + t) : TaggedPart::kWritten;
        }
      }
      AVO_UNROLL
      for (int k = 0; k < K; ++k) {
        AVO_UNROLL
        for (int b = 0; b < kWaitBatch; ++b) {
          const int64_t t = first + 32 * b;
          if (t >= tiles) continue;
          out[k] = combine(out[k], TaggedPart::value(TaggedPart::wait(tagged_parts(k) + t, words[k][b])));
        }
      }
    }
    AVO_UNROLL
    for (int k = 0; k < K; ++k)
      butterfly_offsets<true>(32, [&](int offset) { out[k] = combine(out[k], __shfl_xor_sync(0xffffffffu, out[k], offset)); });
  }

  template <unsigned M, typename Combine, typename F>
  __device__ __forceinline__ float reduce(F term, Combine combine, float identity) const {
    if constexpr (kTotals && kOneKernel) {
      float total[1];
      tagged_totals(total, combine, identity);
      return total[0];
    } else if constexpr (kTotals) {
      return tile_total(0, combine, identity);
    } else {
      const float partial = Passes::template reduce<M>(term, combine, identity);
      if (threadIdx.x == 0) write_part(0, partial);
      return partial;
    }
  }

  template <unsigned M, int K, typename F>
  __device__ __forceinline__ void reduce_sums(F terms_at, float (&out)[K]) const {
    static_assert(K <= kTiledMaxSums, "the tile sums hold kTiledMaxSums values of a row");
    if constexpr (kTotals && kOneKernel) {
      tagged_totals(out, Plus{}, 0.0f);
    } else if constexpr (kTotals) {
      AVO_UNROLL
      for (int k = 0; k < K; ++k) out[k] = tile_total(k, Plus{}, 0.0f);
    } else {
      Passes::template reduce_sums<M, K>(terms_at, out);
      if (threadIdx.x == 0) {
        AVO_UNROLL
        for (int k = 0; k < K; ++k) write_part(k, out[k]);
      }
    }
  }

  template <unsigned M, typename F>
  __device__ __forceinline__ void for_each(Columns<M> pass, F body) const {
    if constexpr (kTotals) Passes::for_each(pass, body);
  }
  template <int K, unsigned M, typename F>
  __device__ __forceinline__ void for_each_with_column_sums(Columns<M> pass, F body) const {
    if constexpr (kTotals) Passes::template for_each_with_column_sums<K>(pass, body);
  }

  __device__ __forceinline__ void store_row(int k, float value) const {
    if (kTotals && tile == 0 && threadIdx.x == 0) static_cast<T*>(args.outputs[k])[r] = Element<T>::from_float(value);
  }
  __device__ __forceinline__ void store_row_f32(int k, float value) const {
    if (kTotals && tile == 0 && threadIdx.x == 0 && args.outputs[k] != nullptr)
      static_cast<float*>(args.outputs[k])[r] = value;
  }
};

// ---------------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------------

template <typename Math, typename Args>
__host__ __device__ bool wants_column_sums(const Args& args) {
  return Math::kColumnSums > 0 && args.partials != nullptr;
}

// Writes a thread's per-column sums (its vectors i * threads + lane) as chunk `chunk`'s partials.
template <typename Math, typename Args, int P, int V>
__device__ __forceinline__ void write_partials(const Args& args, const float (&sums)[Math::kColumnSums > 0 ? Math::kColumnSums : 1][P][V],
                                               int64_t chunk, int threads, int lane) {
  const int64_t vectors = args.length / V;
  AVO_UNROLL
  for (int k = 0; k < Math::kColumnSums; ++k) {
    float* partial = args.partials + (k * args.chunks + chunk) * args.length;
    AVO_UNROLL
    for (int i = 0; i < P; ++i) {
      const int64_t v = int64_t(i) * threads + lane;
      if (v >= vectors) continue;
      AVO_UNROLL
      for (int j = 0; j < V; ++j) partial[v * V + j] = sums[k][i][j];
    }
  }
}

// One row of a RegisterRow kernel's sequence: its index, and whether this thread's group
// takes part (idle groups only join the reductions).
struct RowTurn {
  int64_t row;
  bool active;
};

// Whether the row kernels of Math can load the next row while they compute one
// (pipelined_rows): where the threads' vectors of a row take at most 16 registers (one
// per-element input of four vectors, or two of two: the backwards with per-column sums).
// With more, the two rows' vectors do not fit the 64 registers of two blocks per
// multiprocessor (softmax's backward and add_layernorm's forward spilled 116-216 bytes).
// With per-column sums the next row's vectors take registers that another block may
// have needed (rmsnorm's fp32 backward: 56 to 80 registers, 4-7% slower at N = 512 to
// 4096 on the H200), so the dispatch table says where it pays (the pipelined line of
// the backward); the cluster version pipelines such rows only where its kernel holds one
// block a multiprocessor anyway (kPipelinedClusterSums).
template <typename Math>
constexpr bool kCanPipeline = kElementInputCount<Math> * kRowVectors<Math> * 4 <= 16;

// Runs run(turn, vectors) for the rows turn_at(0), ..., turn_at(count - 1) in order, with
// this thread's vectors of each, those of row t + 1 loaded before row t's math runs: the
// group's loads of the next row are then in flight while it reduces this one (otherwise
// it waits for memory at the start of every row). It costs registers and instructions
// (copying the vectors): on the H200 it cost some short rows 5-11%, and the dispatch
// table says from which length on it pays. kPrefetch: where args.prefetch_rows, the
// first thread also asks L2 for row t + 2 (RegisterRow::prefetch_row).
template <typename Row, bool kPrefetch = false, typename Args, typename TurnAt, typename Run>
__device__ __forceinline__ void pipelined_rows(const Args& args, int64_t count, int lane, int threads, TurnAt turn_at,
                                               Run run) {
  if (count <= 0) return;
  RowTurn next_turn = turn_at(int64_t(0));
  typename Row::Vectors next;
  Row::load_vectors(args, next_turn.row, next_turn.active, lane, threads, next);
  for (int64_t t = 0; t < count; ++t) {
    const RowTurn turn = next_turn;
    const typename Row::Vectors vectors = next;
    next_turn = turn_at(t + 1);
    Row::load_vectors(args, next_turn.row, next_turn.active && t + 1 < count, lane, threads, next);
    if constexpr (kPrefetch) {
      if (args.prefetch_rows && lane == 0 && t + 2 < count) {
        const RowTurn later = turn_at(t + 2);
        if (later.active) Row::prefetch_row(args, later.row);
      }
    }
    run(turn, vectors);
  }
}

// Whether the register rows of a thread holding kVectors load their per-column vectors
// ahead (RegisterRow's kColumnsAhead): the narrow rows, whose threads hold half the
// vectors of the plain register row and have the registers for them. Otherwise the
// row's last pass loads them after the row's reductions, and the group waits for those
// loads with nothing else in flight. On the H200 (2^26 elements) rmsnorm's narrow
// forward at N = 4096 ran in 69.4 us instead of 70.4 in bf16, at 2048 in 68.0 instead of
// 68.6, add_rmsnorm's fp32 one at 4096 in 259.5 instead of 262.8. In groups of 512
// threads or more the extra registers cost more than they save (rmsnorm's bf16 at 8192
// 72.8 us instead of 70.0, its fp32 at 4096 136.6 instead of 132.9): the narrow line of
// the dispatch table (benchmarks/tune_rows.py) ends below them.
template <typename Math, bool kPipelined, int kVectors>
constexpr bool kNarrowColumnsAhead = !kPipelined && kVectors < kRowVectors<Math> && Math::kColumnInputs != 0;

// Groups of `group_threads` take rows; with per-column sums, group c of the grid takes
// chunk c and keeps its columns' sums in registers until the chunk is done. kPipelined
// (only where kCanPipeline<Math>): see pipelined_rows. kVectors: the vectors a thread
// holds (RegisterRow's P; twice kRowVectors in a wide row, see kWideRow).
// kGroupThreads: the group's width fixed when the kernel is compiled (0: group_threads,
// known at run time; see kFixedGroupWidths).
template <typename T, typename Args, typename Math, int V, bool kPipelined, int kVectors = kRowVectors<Math>,
          int kGroupThreads = 0>
__device__ __forceinline__ void register_rows(const Args& args, const Math& math, int group_threads) {
  if constexpr (kGroupThreads > 0) group_threads = kGroupThreads;
  using Row =
      RegisterRow<T, Args, Math, V, false, kVectors, kNarrowColumnsAhead<Math, kPipelined, kVectors>, kGroupThreads>;
  // group_threads is a power of two: shifts and a mask, not integer divisions.
  const int shift = __ffs(group_threads) - 1;
  const int groups = blockDim.x >> shift;
  const int group = threadIdx.x >> shift, lane = threadIdx.x & (group_threads - 1);
  static_assert(!kPipelined || kCanPipeline<Math>, "a kernel whose rows take too many registers is not pipelined");
  if (!wants_column_sums<Math>(args)) {
    if constexpr (kPipelined) {
      // The block takes rows first, first + step, ... (plus its group's place).
      const int64_t first = int64_t(blockIdx.x) * groups, step = int64_t(gridDim.x) * groups;
      const int64_t count = first < args.rows ? (args.rows - first + step - 1) / step : 0;
      pipelined_rows<Row>(
          args, count, lane, group_threads,
          [&](int64_t t) {
            const int64_t r = first + t * step + group;
            return RowTurn{r, r < args.rows};
          },
          [&](const RowTurn& turn, const typename Row::Vectors& vectors) {
            math.template apply<PrecisionFor<T>>(Row(args, turn.row, turn.active, lane, group_threads, nullptr, vectors));
          });
    } else {
      for (int64_t first = int64_t(blockIdx.x) * groups; first < args.rows; first += int64_t(gridDim.x) * groups) {
        const int64_t r = first + group;
        math.template apply<PrecisionFor<T>>(Row(args, r, r < args.rows, lane, group_threads, nullptr));
      }
    }
    return;
  }
  typename Row::Chunk kept = {};
  kept.load_columns(args, lane, group_threads);
  const int64_t chunk = int64_t(blockIdx.x) * groups + group;
  const bool has_chunk = chunk < args.chunks;  // the same count of rows either way: groups share barriers
  const auto turn_at = [&](int64_t i) {
    const int64_t r = chunk * args.rows_per_chunk + i;
    return RowTurn{r, has_chunk && r < args.rows};
  };
  if constexpr (kPipelined) {
    pipelined_rows<Row>(args, args.rows_per_chunk, lane, group_threads, turn_at,
                        [&](const RowTurn& turn, const typename Row::Vectors& vectors) {
                          math.template apply<PrecisionFor<T>>(
                              Row(args, turn.row, turn.active, lane, group_threads, &kept, vectors));
                        });
  } else {
    for (int64_t i = 0; i < args.rows_per_chunk; ++i) {
      const RowTurn turn = turn_at(i);
      math.template apply<PrecisionFor<T>>(Row(args, turn.row, turn.active, lane, group_threads, &kept));
    }
  }
  if (has_chunk) write_partials<Math, Args, Row::P, V>(args, kept.sums, chunk, group_threads, lane);
}

// A light row: one per-element input, one per-column input, nothing kept between passes
// and no per-column sums (rmsnorm's forward; without a per-column input it is a lean row,
// whose kernel has a bound of its own: kLeanRow). Its kernels of a fixed group width
// are held to 32 registers, so that a multiprocessor runs all the warps it can (2048
// threads): ptxas gave rmsnorm's fp32 register rows 40 (six blocks of 256 threads, 71%
// of the warps; torch.compile's kernel 92%, benchmarks/results/2026-12-06-h100-rows-
// behind-profile/), and 32 spill nothing. Every other math's fixed kernels spilled
// 8-272 bytes under that bound (nvcc 13.0, sm_90). Its register rows also have a kernel
// for groups of 1024 threads (two blocks a multiprocessor: rows of 16384 fp32 elements,
// which otherwise take wide rows, two blocks of 512 threads).
template <typename Math>
constexpr bool kLightRow = kElementInputCount<Math> == 1 && __builtin_popcount(Math::kColumnInputs) == 1 &&
                           Math::kKeptValues == 0 && Math::kColumnSums == 0;
// The block of a RegisterRow version's launch for groups of `group` threads: short rows
// share a block (kRowBlockThreads where the call sums columns, kShortRowBlockThreads
// where it does not), longer ones take a block each. launch_row_op launches with it, and
// a kernel of fixed group width (never chunked) is bounded by it: its blocks a
// multiprocessor must hold are all its threads for a light row, else
// register_row_kernel's usual bound.
constexpr int register_row_block_threads(int group, bool chunked) {
  const int row_block = chunked ? kRowBlockThreads : kShortRowBlockThreads;
  return group < row_block ? row_block : group;
}
template <int kGroupThreads>
constexpr int kFixedGroupBlockThreads = register_row_block_threads(kGroupThreads, false);
constexpr int kMultiprocessorThreads = 2048;  // sm_80 and sm_90

// The kernel of register_rows, except for the unpipelined lean and wide rows
// (lean_row_kernel, wide_row_kernel).
template <typename T, typename Args, typename Math, int V, bool kPipelined, int kGroupThreads = 0>
__global__ void __launch_bounds__(
    kGroupThreads > 0 && kLightRow<Math> ? kFixedGroupBlockThreads<kGroupThreads> : kMaxGroupThreads<Math>,
    kGroupThreads > 0 && kLightRow<Math> ? kMultiprocessorThreads / kFixedGroupBlockThreads<kGroupThreads>
                                         : kRowBlocksPerSM<Math, kPipelined>)
    register_row_kernel(const Args args, const Math math, int group_threads) {
  register_rows<T, Args, Math, V, kPipelined, kRowVectors<Math>, kGroupThreads>(args, math, group_threads);
}

// Narrow rows: the register version (unpipelined) with groups holding half the vectors
// a thread (narrow_row_kernel), twice the threads a row, for maths without per-column
// sums; the threads load their per-column vectors with the row (kNarrowColumnsAhead).
// The dispatch table's "narrow" line says up to which length they run: short rows,
// where a thread of the plain register row does the row's setup and reductions for more
// elements. On the H200 (262144x256 bf16) rmsnorm's forward ran in 68.4 us instead of
// 69.9, add_rmsnorm's in 131.0 instead of 134.2, add_layernorm's in 131.0 instead of
// 134.8; layernorm's lost 3.5% and swish_layernorm's 12% (they keep more per thread
// between passes), so each op's line is measured (benchmarks/tune_rows.py).
template <typename Math>
constexpr bool kNarrowRow = Math::kColumnSums == 0;
template <typename Math>
constexpr int kNarrowRowVectors = kRowVectors<Math> / 2;

template <typename T, typename Args, typename Math, int V, int kGroupThreads = 0>
__global__ void __launch_bounds__(kMaxGroupThreads<Math>)
    narrow_row_kernel(const Args args, const Math math, int group_threads) {
  static_assert(kNarrowRow<Math>, "narrow rows keep no per-column sums");
  register_rows<T, Args, Math, V, false, kNarrowRowVectors<Math>, kGroupThreads>(args, math, group_threads);
}

// Wide rows: the register version (unpipelined) with groups of up to kWideRowThreads
// threads holding kWideRowVectors each, twice kRowVectors (wide_row_kernel), for maths
// that keep one or two per-element inputs and no per-column sums or kept values (the
// forwards of layernorm, rmsnorm, softmax, log_softmax, channel_norm without swish,
// add_layernorm and add_rmsnorm; the backwards of softmax, log_softmax and channel_norm).
// The dispatch table's "wide" line says from which length on they run, and rows that
// only they hold in registers take them anyway.
// One input: a row of 16384 fp32 elements takes a group of 512 threads instead of a
// block of 1024, so that two blocks share a multiprocessor, one loading while the other
// reduces, and a reduction waits for 16 warps instead of 32. On the H200 the fp32
// forwards at 4096x16384 ran in 132-137 us where the block of 1024 threads, pipelined (the
// faster of its two kernels), took 144-148 (channel_norm's 132 against 148); rows of 32768
// in 16 bits in 71-76 us against 76-80 (the faster of the pipelined and cluster
// versions); layernorm's 16-bit forward at 4096x16384 in 73 us against 77 pipelined and
// 80 unpipelined. A thread's 8 vectors take 32 registers: the kernels fit 64 without
// spilling, two blocks a multiprocessor.
// Two inputs: rows twice as long as the register version otherwise holds (its groups
// have at most 512 threads there), which took the cluster version: on the H200
// softmax's fp32 backward at 4096x16384 ran in 191 us instead of 209, log_softmax's in
// 190 instead of 203, add_rmsnorm's fp32 forward in 268 instead of 284. A thread's 8
// vectors of two inputs take 64 registers: one block a multiprocessor.
template <typename Math>
constexpr bool kWideRow = kElementInputCount<Math> <= 2 && Math::kColumnSums == 0 && Math::kKeptValues == 0;
constexpr int kWideRowThreads = 512;
template <typename Math>
constexpr int kWideRowVectors = 2 * kRowVectors<Math>;
template <typename Math>
constexpr int kWideRowBlocksPerSM = kElementInputCount<Math> == 1 ? 2 : 1;

template <typename T, typename Args, typename Math, int V>
__global__ void __launch_bounds__(kWideRowThreads, kWideRowBlocksPerSM<Math>)
    wide_row_kernel(const Args args, const Math math, int group_threads) {
  static_assert(kWideRow<Math>, "only a wide row fits kWideRowBlocksPerSM blocks of kWideRowThreads");
  register_rows<T, Args, Math, V, false, kWideRowVectors<Math>>(args, math, group_threads);
}

// A lean row: a wide-row math (one per-element input, no per-column sums or kept values)
// without per-column inputs either, as softmax's, log_softmax's and channel_norm's
// (without swish) forwards. Unpipelined, its kernel (lean_row_kernel) takes at most kLeanRowRegisters
// registers, so that three blocks of 512 threads share a multiprocessor instead of two:
// in a row of 16384 16-bit elements a group is a block of 512 threads, whose reductions
// stop all its warps at the block's barriers, and the third block's loads fill that time.
// On the H200 ptxas had given softmax's 16-bit forward 46 registers: bounded to 40 (no
// spill) it ran 4096x16384 in 71 us instead of 79 (77.6 pipelined); channel_norm's 41 to
// 40, 72 us instead of 77. log_softmax's took 35 already, and ran at 0.90 of copy there.
// Bounded to 40, kernels that keep more spilled and lost (layernorm's forward up to 14%,
// softmax's backward 30%): they keep __launch_bounds__.
template <typename Math>
constexpr bool kLeanRow = kWideRow<Math> && kElementInputCount<Math> == 1 && Math::kColumnInputs == 0;
constexpr int kLeanRowRegisters = 40;

// __maxnreg__ (nvcc 12.4 on) cannot be given with __launch_bounds__; older compilers get
// __launch_bounds__(1024), the bounds register_row_kernel has for a lean row.
#if defined(__CUDACC_VER_MAJOR__) && (__CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 4))
#define AVO_LEAN_ROW_BOUNDS __maxnreg__(kLeanRowRegisters)
#else
#define AVO_LEAN_ROW_BOUNDS __launch_bounds__(1024)
#endif

template <typename T, typename Args, typename Math, int V, int kGroupThreads = 0>
__global__ void AVO_LEAN_ROW_BOUNDS lean_row_kernel(const Args args, const Math math, int group_threads) {
  static_assert(kLeanRow<Math>, "only a lean row fits kLeanRowRegisters");
  register_rows<T, Args, Math, V, false, kRowVectors<Math>, kGroupThreads>(args, math, group_threads);
}

// Whether a cluster row of Math with per-column sums (its threads holding kVectors) is
// pipelined: where the kernel is not held to two blocks a multiprocessor
// (kClusterBlocksPerSM 0: the 16-bit backwards of layernorm and swish_layernorm, two sums
// of 16 floats a thread). On an H100 those ran 1.14-1.22x faster at N = 4096 to 65536
// (layernorm's bf16 at 4096x16384 in 245 us instead of 288, where the tiled version takes
// 270); on the H200 they beat the tiled version at 32768 by 2-3%, are within 2-3% of it
// either way at 16384 and trail from 65536, where the table gives these rows to the tiled
// version (layernorm's bf16 from 16384); layernorm's kernels
// went from 95-96 registers to 122-128, swish_layernorm's stayed at 125-128, none
// spills. Where the kernel is capped at 64 registers (the fp32 backwards, rmsnorm's),
// pipelined rows spilled and lost (layernorm's fp32 at 16384 0.79 -> 0.70 of copy;
// rmsnorm's bf16 up to 3%). Such clusters also take smaller blocks
// (cluster_block_threads).
template <typename T, typename Math, int kVectors>
constexpr bool kPipelinedClusterSums =
    kCanPipeline<Math> && kVectors == kRowVectors<Math> && kClusterBlocksPerSM<T, Math> == 0;

// A row over the blocks of a thread-block cluster: block `rank` of the cluster holds the
// vectors i * (C * B) + rank * B + t, as RegisterRow does for a group of C * B threads.
// Cluster q takes rows q, q + clusters, ...; with per-column sums cluster c takes chunk c.
// Pipelined wherever kCanPipeline<Math> and Math sums no columns (on the H200 that gained
// 3-13% on every row the cluster version takes). With per-column sums, only where
// kPipelinedClusterSums; and where args.prefetch_rows (the dispatch table's "prefetch"
// line), the cluster's first thread asks L2 for the chunk's row after the one the
// threads load next (RegisterRow::prefetch_row). On an H100 (2^26 elements, two runs)
// that ran the 16-bit backwards of add_layernorm 1.02-1.09x faster at N = 2048 to 16384
// and swish_layernorm's 1.02-1.05x, kernels of one block a multiprocessor, layernorm's
// 1.05x at 16384 but 0.94-0.97x at 2048-4096. Where two blocks share a multiprocessor
// (the fp32 backwards, rmsnorm's and add_rmsnorm's 16-bit ones) it lost up to 24%,
// except layernorm's, rmsnorm's and swish_layernorm's fp32 rows of 16384-32768
// (1.01-1.08x). The register rows lost up to 14% with it, the cluster rows without
// per-column sums up to 24%: they do not prefetch.
// With `stage_columns` (a call without per-column sums: launch_cluster_rows then gives
// the kernel ColumnStage::bytes of shared memory) each thread first copies its vectors of
// the per-column inputs there.
// kVectors: the vectors a thread holds (kRowVectors, or a wide cluster row's
// kWideRowVectors: wide_cluster_row_kernel).
template <typename T, typename Args, typename Math, int V, int kVectors>
__device__ __forceinline__ void cluster_rows(const Args& args, const Math& math, bool stage_columns) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Row = RegisterRow<T, Args, Math, V, true, kVectors>;
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  const int blocks = int(cluster.num_blocks());
  const int threads = blocks * int(blockDim.x);
  const int lane = int(cluster.block_rank()) * int(blockDim.x) + int(threadIdx.x);
  const int64_t cluster_index = blockIdx.x / blocks, clusters = gridDim.x / blocks;
  unsigned exchanges = 0;
  cluster_mailbox_init();
  const decltype(Row::column_stage) stage = {Math::kColumnInputs != 0 && stage_columns};
  if (stage.present) stage.fill(args, lane, threads);  // each thread reads back only what it wrote: no barrier
  if constexpr (kCanPipeline<Math> && Math::kColumnSums == 0 && kVectors == kRowVectors<Math>) {
    // The same rows, and so the same count, for every block of the cluster.
    const int64_t count = cluster_index < args.rows ? (args.rows - cluster_index + clusters - 1) / clusters : 0;
    pipelined_rows<Row>(
        args, count, lane, threads, [&](int64_t t) { return RowTurn{cluster_index + t * clusters, true}; },
        [&](const RowTurn& turn, const typename Row::Vectors& vectors) {
          Row row(args, turn.row, true, lane, threads, nullptr, vectors, &exchanges);
          row.column_stage = stage;
          math.template apply<PrecisionFor<T>>(row);
        });
  } else if (!wants_column_sums<Math>(args)) {
    for (int64_t r = cluster_index; r < args.rows; r += clusters) {
      Row row(args, r, true, lane, threads, nullptr, &exchanges);
      row.column_stage = stage;
      math.template apply<PrecisionFor<T>>(row);
    }
  } else {
    typename Row::Chunk kept = {};
    kept.load_columns(args, lane, threads);
    const int64_t first = cluster_index * args.rows_per_chunk;
    if constexpr (kPipelinedClusterSums<T, Math, kVectors>) {
      // The same rows, and so the same count, for every block of the cluster.
      const int64_t left = args.rows - first;
      const int64_t count = left < args.rows_per_chunk ? left : args.rows_per_chunk;
      pipelined_rows<Row, true>(
          args, count, lane, threads, [&](int64_t t) { return RowTurn{first + t, true}; },
          [&](const RowTurn& turn, const typename Row::Vectors& vectors) {
            math.template apply<PrecisionFor<T>>(Row(args, turn.row, true, lane, threads, &kept, vectors, &exchanges));
          });
    } else {
      for (int64_t i = 0; i < args.rows_per_chunk; ++i) {
        const int64_t r = first + i;
        if (r >= args.rows) break;  // the same for the whole cluster
        if (args.prefetch_rows && lane == 0 && i + 1 < args.rows_per_chunk && r + 1 < args.rows)
          Row::prefetch_row(args, r + 1);
        math.template apply<PrecisionFor<T>>(Row(args, r, true, lane, threads, &kept, &exchanges));
      }
    }
    write_partials<Math, Args, Row::P, V>(args, kept.sums, cluster_index, threads, lane);
  }
  cluster.sync();  // no block may leave while another may still send to its mailbox
#endif
}

template <typename T, typename Args, typename Math, int V>
__global__ void __launch_bounds__(kMaxGroupThreads<Math>, kClusterBlocksPerSM<T, Math>)
    cluster_row_kernel(const Args args, const Math math, bool stage_columns) {
  cluster_rows<T, Args, Math, V, kRowVectors<Math>>(args, math, stage_columns);
}

// A wide cluster row: the rows of a math of two per-element inputs with no per-column sums
// or kept values (kWideRow) that clusters of kMaxWideClusterBlocks blocks of 512 threads
// holding kRowVectors cannot hold (in fp32, rows of 131073 to 262144 elements: the
// forwards of add_layernorm and add_rmsnorm, the backwards of softmax, log_softmax and
// channel_norm) take blocks of kWideRowThreads threads holding kWideRowVectors, as the
// wide rows do (one block a multiprocessor, unpipelined), instead of the global version.
template <typename Math>
constexpr bool kWideCluster = kWideRow<Math> && kElementInputCount<Math> == 2;

template <typename T, typename Args, typename Math, int V>
__global__ void __launch_bounds__(kWideRowThreads, 1)
    wide_cluster_row_kernel(const Args args, const Math math, bool stage_columns) {
  static_assert(kWideCluster<Math>, "only a wide row of two inputs takes a wide cluster row");
  cluster_rows<T, Args, Math, V, kWideRowVectors<Math>>(args, math, stage_columns);
}

// The block size of a cluster row launch whose threads hold P vectors: `threads` (a power
// of two) over at least two blocks, as few as the block size allows, except:
//  - a pipelined cluster row with per-column sums (`chunked`, kPipelinedClusterSums: its
//    kernel holds one block a multiprocessor) takes blocks of half the threads where the
//    cluster stays portable, so that two clusters share a multiprocessor and one's loads
//    fill the other's reductions and exchanges: on an H100 the 16-bit backwards of
//    layernorm and swish_layernorm at 16384 ran 1.03-1.06x faster (4 blocks of 256
//    instead of 2 of 512), at 32768 1.14-1.19x (8 instead of 4). add_layernorm's 16-bit
//    backward holds one block too, but is not pipelined and its blocks of 256 have not
//    been timed;
//  - a row without per-column sums in `small` blocks (the dispatch table's "small"
//    line): a quarter of the threads, or as small as kMaxWideClusterBlocks blocks allow,
//    and no fewer than kMinSmallClusterBlockThreads. Small blocks put more
// blocks of a cluster row on a multiprocessor (two to four instead of one or two): while
// one waits at its reductions and cluster exchanges, the others load. On the H200 (2^26
// elements) the 16-bit forwards at N = 65536 ran 2-8% faster with them (log_softmax's
// bf16 in 78.7 us instead of 84.8, add_layernorm's in 149.3 instead of 158.5,
// swish_layernorm's in 114.1 instead of 121.8, softmax's in 84.4 instead of 89.2), the
// 16-bit backwards of softmax and log_softmax 3-4%, add_layernorm's fp32 forward at
// 16384 in 277.9 instead of 288.9; layernorm's bf16 forward at 65536 lost 3% and
// softmax's fp32 one 3%, so each op's line is measured (benchmarks/tune_rows.py).
constexpr int kMinSmallClusterBlockThreads = 128;
template <typename T, typename Math, int P>
int cluster_block_threads(int64_t threads, bool chunked, bool small) {
  const int64_t half = threads / 2 < 32 ? 32 : threads / 2;
  int block = int(half < kMaxGroupThreads<Math> ? half : kMaxGroupThreads<Math>);
  if (chunked) {
    if (kPipelinedClusterSums<T, Math, P> && block == kMaxGroupThreads<Math> && threads / (block / 2) <= kMaxClusterBlocks)
      block /= 2;
    return block;
  }
  for (int halvings = 0; small && halvings < 2 && block / 2 >= kMinSmallClusterBlockThreads &&
                         threads / (block / 2) <= kMaxWideClusterBlocks;
       ++halvings)
    block /= 2;
  return block;
}

// Bytes of shared memory a StagedRow block needs: kStages rows of every per-element input.
template <typename T, typename Math>
size_t staged_row_bytes(int64_t length) {
  return size_t(kStages) * kElementInputCount<Math> * size_t(length) * sizeof(T);
}

// A block per row, kStages rows in shared memory: while the block computes row t, the
// copies of rows t + 1 and t + 2 are in flight. With per-column sums block c takes
// chunk c (its rows in order); otherwise every gridDim.x-th row.
template <typename T, typename Args, typename Math, int V>
__global__ void __launch_bounds__(kMaxGroupThreads<Math>) staged_row_kernel(const Args args, const Math math) {
  using Row = StagedRow<T, Args, Math, V>;
  extern __shared__ __align__(16) unsigned char stage_memory[];
  const bool chunked = wants_column_sums<Math>(args);
  const int64_t first = chunked ? int64_t(blockIdx.x) * args.rows_per_chunk : int64_t(blockIdx.x);
  const int64_t step = chunked ? 1 : int64_t(gridDim.x);
  const int64_t end = chunked && (first + args.rows_per_chunk < args.rows) ? first + args.rows_per_chunk : args.rows;
  const int64_t count = first < end ? (end - first + step - 1) / step : 0;
  const int64_t vectors = args.length / V;
  // The rows of stage s: one after the other, a row per per-element input.
  const auto stage_rows = [&](int64_t t, const T* (&rows)[Args::kInputs]) {
    T* next = reinterpret_cast<T*>(stage_memory) + (t % kStages) * kElementInputCount<Math> * args.length;
    AVO_UNROLL
    for (int k = 0; k < Args::kInputs; ++k) {
      rows[k] = nullptr;
      if (!((Math::kElementInputs >> k) & 1u)) continue;
      rows[k] = next;
      next += args.length;
    }
  };
  // Starts the copies of row t (if any) and closes a group: an empty group past the last
  // row keeps the count of groups in flight the same on every iteration.
  const auto fetch = [&](int64_t t) {
    if (t < count) {
      const T* rows[Args::kInputs];
      stage_rows(t, rows);
      const int64_t r = first + t * step;
      AVO_UNROLL
      for (int k = 0; k < Args::kInputs; ++k) {
        if (rows[k] == nullptr) continue;
        const T* source = static_cast<const T*>(args.inputs[k]) + r * args.length;
        T* target = const_cast<T*>(rows[k]);
        for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) cp_async_16(target + v * V, source + v * V);
      }
    }
    cp_async_commit();
  };
  // `columns` is a compile-time nullptr or the address of `sums` below (each call is
  // inlined), so the sums stay in registers.
  const auto run = [&](typename Row::ColumnSums* columns) {
    AVO_UNROLL
    for (int t = 0; t < kStages - 1; ++t) fetch(t);
    for (int64_t t = 0; t < count; ++t) {
      cp_async_wait<kStages - 2>();  // this thread's copies of row t are done ...
      __syncthreads();               // ... and everyone's; and everyone is done with row t - 1
      fetch(t + kStages - 1);        // into the stage row t - 1 used
      const T* rows[Args::kInputs];
      stage_rows(t, rows);
      math.template apply<PrecisionFor<T>>(Row(args, first + t * step, rows, columns));
    }
  };
  if (!chunked) {
    run(nullptr);
    return;
  }
  typename Row::ColumnSums sums = {};
  run(&sums);
  write_partials<Math, Args, Row::P, V>(args, sums, blockIdx.x, blockDim.x, threadIdx.x);
}

// A GlobalRow per block, or per thread-block cluster (kClustered, sm_90). Worker w (a
// block or a cluster) takes rows w, w + workers, ...; with per-column sums it takes
// chunks w, w + workers, ..., each chunk's rows in order.
template <typename T, typename Args, typename Math, int V, bool kClustered>
__global__ void __launch_bounds__(kGlobalRowThreads) global_row_kernel(const Args args, const Math math) {
  using Row = GlobalRow<T, Args, Math, V, kClustered>;
  int blocks = 1, rank = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  if constexpr (kClustered) {
    blocks = int(cg::this_cluster().num_blocks());
    rank = int(cg::this_cluster().block_rank());
    cluster_mailbox_init();
  }
#endif
  const int lane = rank * int(blockDim.x) + int(threadIdx.x), threads = blocks * int(blockDim.x);
  const int64_t worker = blockIdx.x / blocks, workers = gridDim.x / blocks;
  unsigned exchanges = 0;
  if (!wants_column_sums<Math>(args)) {
    for (int64_t r = worker; r < args.rows; r += workers)
      math.template apply<PrecisionFor<T>>(Row(args, r, -1, lane, threads, &exchanges));
  } else {
    for (int64_t chunk = worker; chunk < args.chunks; chunk += workers) {
      const int64_t end = (chunk + 1) * args.rows_per_chunk < args.rows ? (chunk + 1) * args.rows_per_chunk : args.rows;
      for (int64_t r = chunk * args.rows_per_chunk; r < end; ++r)
        math.template apply<PrecisionFor<T>>(Row(args, r, chunk, lane, threads, &exchanges));
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (kClustered) cg::this_cluster().sync();  // no block may leave while another may still send to it
#endif
}

// The column finish, one kernel: a block of kFinishThreads threads takes a group of
// columns of one per-column output. Each thread owns W consecutive columns: W = 4, one
// 16-byte load per chunk, where the length is a multiple of 4 (every chunk's row of
// partials then starts 16-byte aligned: the partials start aligned), else W = 1.
// `across` threads side by side cover across * W columns, and the block's
// kFinishThreads / across slices split the chunks: slice s adds chunks s, s + slices,
// ... in order, kFinishBatch loads at a time, all issued before the first is added
// (unrolled by `#pragma unroll 8` instead, the loop of 16-byte loads tested its end
// between the loads and added each before it issued the next: one load in flight). The
// slices' sums then meet in a fixed tree in shared memory, half the slices adding the
// other half's each step: log2(slices) barriers, where one slice adding all the others'
// would make 128 dependent shared-memory reads for 128 slices. `across` comes from the
// length alone (finish_column_threads), so the order of the additions, and the result,
// depends on the shapes only. Summing the chunks in groups first, by blocks of their
// own, cost the rows of 1024 to 16384 elements 3-10% on the H200.
constexpr int kFinishThreads = 1024;
// Loads a finish thread issues before it adds them, each under a test of its own: 7, one
// for each predicate register. With 8 tests, or 8 loads without tests, the compiler added
// the first loads of a batch before it issued the last (3 to 6 in flight, not 8).
constexpr int kFinishBatch = 7;
// Blocks wanted per per-column output: about one per multiprocessor of an H200 (132), where
// a block of 16-byte loads fits once. Against 256 (narrower blocks), rows of 16384 and more
// gained 0.5-1.5% on the H200.
constexpr int64_t kFinishBlocks = 128;

// Threads side by side in a finish block (a power of two): the most that still leave
// kFinishBlocks blocks per per-column output, and at least a 128-byte line of each chunk
// row (8 threads of W = 4, a warp of W = 1). Wide rows so get warps that read 512 bytes
// or more of a chunk row (from 16384 elements with W = 4) and few slices (with 32,
// layernorm's backward at 256x262144 spent 487 us in the finish, a quarter of the copy
// bandwidth); short rows (few columns, many chunks) the narrowest blocks and the most
// slices, since their blocks are few. From the length alone, not the device's
// multiprocessor count, so that the result bits do not depend on the machine. The finish
// this replaced (scalar loads, 32 columns and 32 slices below 32768 elements, slice 0 adding
// the slices' sums in turn) read the partials of bf16 backwards at 2^26 elements at
// 0.45 TB/s (length 256, 2048 chunks), 1.9 (1024, 2048), 1.1 (4096, 512) and 0.84
// (16384, 256: the tiled version's) on an H200 copying at 4.2 TB/s; this one at 0.67,
// 3.1, 2.4 and 2.5 TB/s.
inline int finish_column_threads(int64_t length, int width) {
  const int64_t owners = length / width;  // threads with columns to sum
  int across = width == 4 ? 8 : 32;
  while (across < kFinishThreads && owners / (2 * across) >= kFinishBlocks) across *= 2;
  return across;
}

// Item k of a kernel parameter's array, looked up with constant indices: an index
// computed at run time into the kernel's parameters copies them all to the stack.
template <typename P>
__device__ __forceinline__ P parameter_item(const P (&items)[kMaxColumnTotals], int k) {
  P item = nullptr;
  AVO_UNROLL
  for (int j = 0; j < kMaxColumnTotals; ++j)
    if (j == k) item = items[j];
  return item;
}

template <int W>
__device__ __forceinline__ void add_to(Vec<float, W>& sum, const Vec<float, W>& term) {
  AVO_UNROLL
  for (int j = 0; j < W; ++j) sum.v[j] += term.v[j];
}

// W consecutive floats of the partials, through the read-only data cache (no thread of
// the finish writes them): one 16-byte load for W = 4.
template <int W>
__device__ __forceinline__ Vec<float, W> load_partials(const float* p) {
  if constexpr (W == 4) {
    return load_vec_readonly<4>(p);
  } else {
    static_assert(W == 1, "a finish thread owns 4 columns or 1");
    return Vec<float, 1>{{load_readonly(p)}};
  }
}

// Adds the partials at p, p + step, ..., `count` of them (kFinishBatch at most), to sum
// in that order, all loads issued before the first add.
template <int W>
__device__ __forceinline__ void add_chunks(Vec<float, W>& sum, const float* p, int64_t step, int count) {
  Vec<float, W> batch[kFinishBatch];
  AVO_UNROLL
  for (int i = 0; i < kFinishBatch; ++i)
    if (i < count) batch[i] = load_partials<W>(p + i * step);
  AVO_UNROLL
  for (int i = 0; i < kFinishBatch; ++i)
    if (i < count) add_to(sum, batch[i]);
}

// Column total blockIdx.y (avo/row_args.h): its source's rows ("chunks") summed per
// column. Thread t owns columns (blockIdx.x * across + t % across) * W and on, in slice
// t / across; its slice's sum lives in slice_sums[t], so the tree adds slot t + stride
// to slot t. A warp's threads read consecutive 16-byte (or 4-byte) slots there: no bank
// conflicts without padding. Columns past the length add nothing but reach every barrier.
template <typename T, int W>
__global__ void __launch_bounds__(kFinishThreads) column_finish_kernel(const ColumnTotals totals, int across) {
  __shared__ Vec<float, W> slice_sums[kFinishThreads];
  T* out = static_cast<T*>(parameter_item(totals.targets, blockIdx.y));
  if (out == nullptr) return;  // the same for the whole block, and before any barrier
  const int t = threadIdx.x, slices = kFinishThreads / across;
  const int64_t n = (int64_t(blockIdx.x) * across + t % across) * W, chunks = totals.rows;
  Vec<float, W> sum{};
  if (n < totals.length) {  // then so are the W - 1 columns after it: the length is a multiple of W
    const int slice = t / across;
    const int64_t step = int64_t(slices) * totals.length;  // from a chunk of the slice to its next
    const float* p = parameter_item(totals.sources, blockIdx.y) + slice * totals.length + n;
    for (int64_t left = (chunks - slice + slices - 1) / slices; left > 0; left -= kFinishBatch, p += kFinishBatch * step)
      add_chunks<W>(sum, p, step, left < kFinishBatch ? int(left) : kFinishBatch);
  }
  slice_sums[t] = sum;
  for (int stride = kFinishThreads / 2; stride >= across; stride /= 2) {
    __syncthreads();
    if (t < stride) {
      add_to(sum, slice_sums[t + stride]);
      if (stride > across) slice_sums[t] = sum;  // read by the next step; after the last, slice 0 holds the totals
    }
  }
  if (t < across && n < totals.length) {
    AVO_UNROLL
    for (int j = 0; j < W; ++j) out[n + j] = Element<T>::from_float(sum.v[j]);
  }
}

// Column totals (avo/row_args.h) on `stream`. W = 4 needs every source 16-byte aligned:
// the partials and torch's allocations are, and a source's rows then are too where the
// length is a multiple of 4.
template <typename T>
void launch_column_totals(const ColumnTotals& totals, cudaStream_t stream) {
  if (totals.count == 0 || totals.length == 0) return;
  bool aligned = totals.length % 4 == 0;
  for (int k = 0; k < totals.count; ++k) aligned &= totals.sources[k] == nullptr || is_aligned(totals.sources[k], 16);
  const int width = aligned ? 4 : 1;
  const int across = finish_column_threads(totals.length, width);
  const int64_t columns = int64_t(across) * width;
  const dim3 blocks(unsigned((totals.length + columns - 1) / columns), unsigned(totals.count));
  if (width == 4)
    column_finish_kernel<T, 4><<<blocks, kFinishThreads, 0, stream>>>(totals, across);
  else
    column_finish_kernel<T, 1><<<blocks, kFinishThreads, 0, stream>>>(totals, across);
}

// True when every per-element and per-column tensor of the call starts `bytes`-aligned.
template <typename Math, typename Args>
bool element_tensors_aligned(const Args& args, uintptr_t bytes) {
  for (int k = 0; k < Args::kInputs; ++k)
    if (((Math::kElementInputs | Math::kColumnInputs) >> k & 1u) && args.inputs[k] != nullptr &&
        !is_aligned(args.inputs[k], bytes))
      return false;
  for (int k = 0; k < Args::kOutputs; ++k)
    if (((Math::kElementOutputs >> k) & 1u) && args.outputs[k] != nullptr && !is_aligned(args.outputs[k], bytes))
      return false;
  return true;
}

// Shared memory a block may use on `device` (beyond the 48 KiB default, on request), less
// room for the kernels' static shared memory.
inline size_t max_dynamic_shared_bytes(const DeviceInfo& device) {
  const size_t bytes = device.max_shared_optin;
  return bytes > 1024 ? bytes - 1024 : 0;
}

// A power of two of threads for `vectors` vectors, `per_thread` each.
inline int threads_for(int64_t vectors, int per_thread) {
  int threads = 1;
  while (int64_t(threads) * per_thread < vectors) threads *= 2;
  return threads;
}

// The version a call takes (see the top of this file): the tiled version for rows of
// at least `thresholds.tiled_min_vectors` vectors where the call can take it, GlobalRow
// for rows of at least `thresholds.global_min_vectors`, the cluster version for rows of
// at least `thresholds.cluster_min_vectors` where it fits, StagedRow for rows of at
// least `thresholds.staged_min_vectors` (all from the generated, measured table) or
// that registers cannot hold; else RegisterRow: on narrow rows up to
// `thresholds.narrow_max_vectors` where they fit (that line is measured against the
// other three), else on wide rows from `thresholds.wide_min_vectors` on and where only
// they hold the row (fits_wide without fits_registers: rows of two per-element inputs),
// else pipelined from `thresholds.pipelined_min_vectors` on where the kernel can be;
// the cluster version, then GlobalRow, for what none of them takes.
inline RowVersion pick_row_version(int64_t vectors, bool fits_registers, bool fits_wide, bool fits_narrow,
                                   bool fits_staged, bool fits_cluster, bool can_pipeline, bool can_tile,
                                   const RowThresholds& thresholds) {
  const RowVersion forced_version = forced<RowVersion>();
  const RowVersion in_registers =
      fits_narrow && vectors <= thresholds.narrow_max_vectors                    ? RowVersion::kNarrow
      : fits_wide && (vectors >= thresholds.wide_min_vectors || !fits_registers) ? RowVersion::kWide
      : can_pipeline && vectors >= thresholds.pipelined_min_vectors              ? RowVersion::kPipelined
                                                                                 : RowVersion::kRegister;
  if (forced_version == RowVersion::kRegister && fits_registers) return RowVersion::kRegister;
  if (forced_version == RowVersion::kPipelined && fits_registers) return can_pipeline ? RowVersion::kPipelined : RowVersion::kRegister;
  if (forced_version == RowVersion::kWide && fits_wide) return RowVersion::kWide;
  if (forced_version == RowVersion::kNarrow && fits_narrow) return RowVersion::kNarrow;
  if (forced_version == RowVersion::kStaged && fits_staged) return RowVersion::kStaged;
  if (forced_version == RowVersion::kCluster && fits_cluster) return RowVersion::kCluster;
  if (forced_version == RowVersion::kTiled && can_tile) return RowVersion::kTiled;
  if (forced_version == RowVersion::kGlobal) return RowVersion::kGlobal;
  if (can_tile && vectors >= thresholds.tiled_min_vectors) return RowVersion::kTiled;
  if (vectors >= thresholds.global_min_vectors) return RowVersion::kGlobal;
  if (fits_cluster && vectors >= thresholds.cluster_min_vectors) return RowVersion::kCluster;
  const bool in_any_registers = fits_registers || fits_wide;
  if (fits_staged && (vectors >= thresholds.staged_min_vectors || !in_any_registers)) return RowVersion::kStaged;
  if (in_any_registers) return in_registers;
  return fits_cluster ? RowVersion::kCluster : RowVersion::kGlobal;
}

// The launch of a grid of clusters of `blocks` blocks of `threads` threads each.
struct ClusterLaunch {
  cudaLaunchAttribute shape[1] = {};
  cudaLaunchConfig_t config = {};

  ClusterLaunch(int64_t blocks, int threads, cudaStream_t stream) {
    shape[0].id = cudaLaunchAttributeClusterDimension;
    shape[0].val.clusterDim.x = unsigned(blocks);
    shape[0].val.clusterDim.y = 1;
    shape[0].val.clusterDim.z = 1;
    config.blockDim = dim3(unsigned(threads));
    config.gridDim = dim3(unsigned(blocks));
    config.stream = stream;
    config.attrs = shape;
    config.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;  // config points into shape

  // Clusters of `kernel` resident at once; 0 when the GPU cannot run such clusters.
  template <typename Kernel>
  int resident(Kernel kernel) {
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) {
      cudaGetLastError();  // the query's error is an answer here, not a failure of the call
      return 0;
    }
    return clusters;
  }

  template <typename Kernel, typename... Params>
  void launch(Kernel kernel, int64_t clusters, const Params&... params) {
    config.gridDim = dim3(unsigned(clusters * shape[0].val.clusterDim.x));
    cudaLaunchKernelEx(&config, kernel, params...);
  }
};

// Whether `kernel` may be launched with `bytes` of dynamic shared memory: beyond 48 KiB a
// kernel must ask (the limit counts its static shared memory too, so it asks from a
// little below that).
template <typename Kernel>
bool allow_dynamic_shared_bytes(Kernel kernel, size_t bytes, const DeviceInfo& device) {
  return bytes <= 40 * 1024 ||
         raise_kernel_attribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes), device);
}

// Launches `kernel`, a cluster row kernel whose threads hold P vectors, for rows of
// `vectors` vectors over clusters of `blocks` blocks of `threads` (up to
// kMaxWideClusterBlocks blocks); false when the GPU cannot run such clusters (the caller
// then takes another version).
template <typename T, typename Args, typename Math, int V, int P, typename Kernel>
bool launch_cluster_kernel(Kernel kernel, const Args& args, const Math& math, int64_t vectors, bool chunked,
                           bool small_blocks, const DeviceInfo& device, cudaStream_t stream, bool dry_run) {
  const int64_t threads = threads_for(vectors, P);
  const int block = cluster_block_threads<T, Math, P>(threads, chunked, small_blocks);
  const int64_t blocks = (threads + block - 1) / block < 2 ? 2 : (threads + block - 1) / block;
  if (blocks > kMaxWideClusterBlocks) return false;
  if (blocks > kMaxClusterBlocks &&
      !raise_kernel_attribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1, device))
    return false;
  ClusterLaunch clusters(blocks, block, stream);
  const int resident = clusters.resident(kernel);
  if (resident < 1) return false;
  if (dry_run) return true;
  last_cluster_block_threads() = block;
  // The copy of the per-column inputs (ColumnStage), where the call has some and wants no
  // per-column sums, and where it leaves as many clusters resident as without it.
  using Stage = ColumnStage<T, Args, Math, P, V>;
  const size_t stage_bytes = Stage::kSlots > 0 && !chunked ? Stage::bytes(block) : 0;
  bool stage_columns = false;
  if (stage_bytes > 0 && allow_dynamic_shared_bytes(kernel, stage_bytes, device)) {
    clusters.config.dynamicSmemBytes = stage_bytes;
    stage_columns = clusters.resident(kernel) == resident;
    if (!stage_columns) clusters.config.dynamicSmemBytes = 0;
  }
  clusters.launch(kernel, chunked ? args.chunks : (args.rows < resident ? args.rows : resident), args, math, stage_columns);
  return true;
}

// Launches the cluster version for rows of `vectors` vectors: cluster_row_kernel, or
// wide_cluster_row_kernel for the rows of 16-byte vectors that only it holds; in small
// blocks where `small_blocks` and the call sums no columns (cluster_block_threads).
template <typename T, typename Args, typename Math, int V>
bool launch_cluster_rows(const Args& args, const Math& math, int64_t vectors, bool chunked, bool small_blocks,
                         const DeviceInfo& device, cudaStream_t stream, bool dry_run) {
  if (device.arch < 90) return false;
  if constexpr (kWideCluster<Math> && V > 1) {
    if (threads_for(vectors, kRowVectors<Math>) > int64_t(kMaxWideClusterBlocks) * kMaxGroupThreads<Math>)
      return launch_cluster_kernel<T, Args, Math, V, kWideRowVectors<Math>>(
          wide_cluster_row_kernel<T, Args, Math, V>, args, math, vectors, chunked, small_blocks, device, stream,
          dry_run);
  }
  return launch_cluster_kernel<T, Args, Math, V, kRowVectors<Math>>(cluster_row_kernel<T, Args, Math, V>, args, math,
                                                                     vectors, chunked, small_blocks, device, stream,
                                                                     dry_run);
}

// Launches global_row_kernel. On sm_90, rows of 16-byte vectors longer than
// kGlobalRowThreads * kGlobalVectorsPerThread vectors are shared by the blocks of a
// cluster (up to kMaxClusterBlocks). The workers (blocks or clusters) are as many as fit
// at once, but no more than half the L2 holds (their rows' per-element inputs and their
// chunks' partials) unless that would leave multiprocessors idle: every pass after the
// first then reads the row from L2, and the rows of a chunk add to partials there. With
// a block per row and every row in flight, layernorm's fp32 backward at 256x262144 read
// 512 MiB of rows at a time, and each pass went back to DRAM.
constexpr int kGlobalVectorsPerThread = 8;
template <typename T, typename Args, typename Math, int V>
void launch_global_rows(const Args& args, const Math& math, int64_t vectors, bool chunked, const DeviceInfo& device,
                        cudaStream_t stream) {
  constexpr int64_t kPerBlock = int64_t(kGlobalRowThreads) * kGlobalVectorsPerThread;
  const int64_t wanted_blocks = V > 1 && device.arch >= 90 ? (vectors + kPerBlock - 1) / kPerBlock : 1;
  const int64_t blocks = wanted_blocks < kMaxClusterBlocks ? wanted_blocks : kMaxClusterBlocks;
  const int64_t work = chunked ? args.chunks : args.rows;
  // What a worker keeps re-reading: its row's per-element inputs, and its chunk's partials.
  const int64_t row_bytes = int64_t(kElementInputCount<Math>) * args.length * int64_t(sizeof(T)) +
                            (chunked ? int64_t(Math::kColumnSums) * args.length * int64_t(sizeof(float)) : 0);
  const int64_t fill = (device.multiprocessors + blocks - 1) / blocks;
  const int64_t in_l2 = row_bytes > 0 ? int64_t(device.l2_bytes / 2) / row_bytes : work;
  const int64_t cap = in_l2 > fill ? in_l2 : fill;
  const int64_t workers = work < cap ? work : cap;
  if constexpr (V > 1) {  // rows of single elements take a block each (blocks is 1)
    if (blocks > 1) {
      const auto kernel = global_row_kernel<T, Args, Math, V, true>;
      ClusterLaunch clusters(blocks, kGlobalRowThreads, stream);
      const int resident = clusters.resident(kernel);
      if (resident > 0) {
        clusters.launch(kernel, workers < resident ? workers : resident, args, math);
        return;
      }
    }
  }
  const auto kernel = global_row_kernel<T, Args, Math, V, false>;
  const unsigned grid = resident_grid_size(kernel, workers * kGlobalRowThreads, kGlobalRowThreads, device);
  kernel<<<grid, kGlobalRowThreads, 0, stream>>>(args, math);
}

// Whether the tiled version can run Math: a backward with per-column sums whose row is
// reduced in one pass (its later kernel reads the reduction back, not recomputes it).
template <typename Math>
constexpr bool kCanTile = Math::kColumnSums > 0 && Math::kReductionPasses == 1;

// The tiled version's first kernel: block b takes tile b % tiles of row b / tiles (and
// more such pairs, a grid apart) and writes that tile's part of the row's reduction.
template <typename T, typename Args, typename Math, int V>
__global__ void __launch_bounds__(kTileThreads) tile_sums_kernel(const Args args, const Math math, int64_t tiles) {
  static_assert(kCanTile<Math>, "the tiled version takes backwards with per-column sums and one reduction pass");
  for (int64_t b = blockIdx.x; b < args.rows * tiles; b += gridDim.x)
    math.template apply<PrecisionFor<T>>(TiledRow<T, Args, Math, V, false>(args, b / tiles, b % tiles, tiles, nullptr));
}

// Writes tile `tile`'s columns of chunk `chunk`'s partials ([column sums, chunks,
// length]) from a thread's per-column sums over the chunk's rows.
template <typename Row, typename Args>
__device__ __forceinline__ void write_tile_partials(const Args& args, const typename Row::ColumnSums& sums,
                                                    int64_t chunk, int64_t chunks, int64_t tile) {
  const int64_t vectors = args.length / Row::kVectorElements;
  AVO_UNROLL
  for (int k = 0; k < Row::kSums; ++k) {
    AVO_UNROLL
    for (int i = 0; i < Row::P; ++i) {
      const int64_t v = Row::first_vector(tile) + int64_t(i) * kTileThreads;
      if (v >= vectors) continue;
      float* partial = args.partials + (k * chunks + chunk) * args.length + v * Row::kVectorElements;
      AVO_UNROLL
      for (int j = 0; j < Row::kVectorElements; ++j) partial[j] = sums[k][i][j];
    }
  }
}

// The tiled version's second kernel: block b takes tile b % tiles of the rows of chunk
// b / tiles (chunks of rows_per_chunk rows) and writes the tile's columns of the chunk's
// partials, [column sums, chunks, length].
template <typename T, typename Args, typename Math, int V>
__global__ void __launch_bounds__(kTileThreads) tiled_rows_kernel(const Args args, const Math math, int64_t tiles,
                                                                  int64_t chunks, int64_t rows_per_chunk) {
  static_assert(kCanTile<Math>, "the tiled version takes backwards with per-column sums and one reduction pass");
  using Row = TiledRow<T, Args, Math, V, true>;
  for (int64_t b = blockIdx.x; b < chunks * tiles; b += gridDim.x) {
    const int64_t chunk = b / tiles, tile = b % tiles;
    const int64_t first = chunk * rows_per_chunk;
    const int64_t last = first + rows_per_chunk < args.rows ? first + rows_per_chunk : args.rows;
    typename Row::ColumnSums sums = {};
    for (int64_t r = first; r < last; ++r) math.template apply<PrecisionFor<T>>(Row(args, r, tile, tiles, &sums));
    write_tile_partials<Row>(args, sums, chunk, chunks, tile);
  }
}

// How the tiled version's one kernel holds the rows it has loaded ahead: where the math
// has at most two per-element inputs, in shared memory, copied in with cp.async, three
// blocks a multiprocessor (80 registers each); else in registers, two blocks a
// multiprocessor (128 registers each). The kernel is bound by its instructions and the
// waits between them more than by memory: on an H100 the registers' form issued an
// instruction in 48% of a scheduler's cycles with 0.9 warps eligible, and rows staged
// in shared memory freed the registers a third block needs: layernorm's, rmsnorm's and
// swish_layernorm's backwards of 8192 to 262144 elements ran at 1.11x (1.00-1.26x),
// layernorm's bf16 at 0.60-0.66 of copy instead of 0.52-0.62
// (benchmarks/results/2026-12-06-h100-staged-one-kernel). With three inputs
// (add_layernorm, add_rmsnorm) 80 registers spill up to 320 bytes in 16 bits (0.94-0.99x),
// and staged rows at two blocks a multiprocessor did not pay either.
template <typename Math>
constexpr bool kStagedOneKernel = kElementInputCount<Math> <= 2;
template <typename Math>
constexpr int kOneKernelTiledBlocksPerMultiprocessor = kStagedOneKernel<Math> ? 3 : 2;
// The shared memory of the staged form: kStagedOneKernelRows rows of this thread block's
// tile of each per-element input.
constexpr int kStagedOneKernelRows = 3;
template <typename Math>
constexpr size_t one_kernel_staged_bytes() {
  return kStagedOneKernel<Math> ? size_t(kStagedOneKernelRows) * kElementInputCount<Math> * kTileVectors * kTileThreads * 16
                                : 0;
}

// The staged form's rows: kStagedOneKernelRows slots in turn, each holding a tile of a row
// of every per-element input, [slot][input][vector i][thread] in 16-byte vectors. Each
// thread copies in and reads back only its own vectors, so cp.async's wait_group alone
// (no block barrier) orders a slot's copy before its reads; the values read feed the
// row's stores, issued before the copy that next fills the slot.
template <typename T, typename Args, typename Math, int V>
struct StagedTileRows {
  static constexpr int kInputs = kElementInputCount<Math>, P = kTileVectors;
  using Vectors = TileVectors<T, Args, V>;
  static_assert(sizeof(Packed<T, V>) == 16, "the tiled version takes rows of 16-byte vectors");
  uint4* slots;
  const Args& args;
  int64_t first_vector, vectors;

  // Position of per-element input k among the per-element inputs.
  __device__ __forceinline__ static constexpr int input_slot(int k) {
    return __builtin_popcount(Math::kElementInputs & ((1u << k) - 1u));
  }
  __device__ __forceinline__ uint4* vector_at(int slot, int k, int i) const {
    return slots + ((slot * kInputs + input_slot(k)) * P + i) * kTileThreads + threadIdx.x;
  }
  // Copies this thread's vectors of `row` into `slot` (none past the chunk's last row) as
  // one cp.async group: every call commits one, so that the groups count rows.
  __device__ __forceinline__ void copy_in(int64_t row, bool in_chunk, int slot) const {
    if (in_chunk)
      each_tile_vector<Math, Args::kInputs>(first_vector, vectors, [&](int k, int i, int64_t v) {
        cp_async_16(vector_at(slot, k, i), static_cast<const T*>(args.inputs[k]) + row * args.length + v * V);
      });
    cp_async_commit();
  }
  __device__ __forceinline__ Vectors read(int slot) const {
    Vectors out;
    AVO_UNROLL
    for (int k = 0; k < Args::kInputs; ++k) {
      if (!((Math::kElementInputs >> k) & 1u)) continue;
      AVO_UNROLL
      for (int i = 0; i < P; ++i) out.v[k][i].load(reinterpret_cast<const T*>(vector_at(slot, k, i)));
    }
    return out;
  }
};

// The tiled version in one kernel, where all its blocks fit on the GPU at once (a
// cooperative launch): block b takes tile b % tiles of every row of chunk b / tiles, in
// order. For row r it writes the tile's part of the reduction of row r + 1, then waits for
// every tile's part of row r (TaggedPart) and runs the last pass over its tile of row r,
// from the vectors it loaded two rows before (kept in shared memory or in registers:
// kStagedOneKernel): the row is read once, where the two kernels read it twice, and the
// other tiles' parts of a row are written a row before the block waits for them. Only
// the `tiles` blocks of a chunk wait for each other, and each writes row r + 1's part
// before it waits for row r's, so no block waits for one that waits for it. On an H100 it ran the backwards of 8192 to 262144 elements
// at 0.97-1.44x the two kernels' speed (layernorm's bf16 at 1024x65536 1.10x, rmsnorm's
// 1.35x; rows in registers, before the staged form); with the parts counted under a
// release and an acquire instead of tagged, the release waited for the block's loads of
// the rows ahead and 2-sum backwards lost (the H200, layernorm's bf16 at 16384 to
// 65536: 0.83-0.84x).
template <typename T, typename Args, typename Math, int V>
__global__ void __launch_bounds__(kTileThreads, kOneKernelTiledBlocksPerMultiprocessor<Math>)
    one_kernel_tiled_rows_kernel(const Args args, const Math math, int64_t tiles, int64_t chunks,
                                 int64_t rows_per_chunk) {
  static_assert(kCanTile<Math>, "the tiled version takes backwards with per-column sums and one reduction pass");
  using Parts = TiledRow<T, Args, Math, V, false, true>;
  using Totals = TiledRow<T, Args, Math, V, true, true>;
  using Vectors = TileVectors<T, Args, V>;
  const int64_t chunk = blockIdx.x / tiles, tile = blockIdx.x % tiles;
  const int64_t first = chunk * rows_per_chunk;
  const int64_t last = first + rows_per_chunk < args.rows ? first + rows_per_chunk : args.rows;
  typename Totals::ColumnSums sums = {};
  const auto write_part = [&](int64_t r, const Vectors& vectors) {
    math.template apply<PrecisionFor<T>>(Parts(args, r, tile, tiles, nullptr, vectors));
  };
  const auto finish_row = [&](int64_t r, const Vectors& vectors) {
    math.template apply<PrecisionFor<T>>(Totals(args, r, tile, tiles, &sums, vectors));
  };
  if constexpr (kStagedOneKernel<Math>) {
    extern __shared__ uint4 staged_tiles[];
    const StagedTileRows<T, Args, Math, V> rows{staged_tiles, args, Totals::first_vector(tile), args.length / V};
    static_assert(kStagedOneKernelRows == 3, "row r's step copies in row r + 2 over row r - 1");
    rows.copy_in(first, first < last, 0);
    rows.copy_in(first + 1, first + 1 < last, 1);
    cp_async_wait<1>();
    if (first < last) write_part(first, rows.read(0));
    // Unrolled by three so that the slots are constants; row r is in slot (r - first) % 3.
    for (int64_t r = first; r < last; r += 3) {
      AVO_UNROLL
      for (int j = 0; j < 3; ++j) {
        if (r + j >= last) break;
        rows.copy_in(r + j + 2, r + j + 2 < last, (j + 2) % 3);
        cp_async_wait<1>();  // row r + j + 1's copies are in
        if (r + j + 1 < last) write_part(r + j + 1, rows.read((j + 1) % 3));
        finish_row(r + j, rows.read(j));
      }
    }
  } else {
    // One row's step: held = row r's vectors, next = row r + 1's, spare receives row r + 2's.
    const auto step = [&](int64_t r, const Vectors& held, const Vectors& next, Vectors& spare) {
      if (r + 2 < last) spare = Totals::load_vectors(args, r + 2, tile);
      if (r + 1 < last) write_part(r + 1, next);
      finish_row(r, held);
    };
    Vectors a, b, c;
    if (first < last) a = Totals::load_vectors(args, first, tile);
    if (first + 1 < last) b = Totals::load_vectors(args, first + 1, tile);
    if (first < last) write_part(first, a);
    // Unrolled by three so that the three row buffers stay in fixed registers.
    for (int64_t r = first; r < last; r += 3) {
      step(r, a, b, c);
      if (r + 1 < last) step(r + 1, b, c, a);
      if (r + 2 < last) step(r + 2, c, a, b);
    }
  }
  if (first < last) write_tile_partials<Totals>(args, sums, chunk, chunks, tile);
}

// Whether the tiled version's one kernel runs a call: all its `blocks` fit on the GPU at
// once with their shared memory, and its tagged parts are 8-byte aligned.
template <typename Kernel>
bool fits_one_kernel(Kernel kernel, int64_t blocks, const float* tile_sums, size_t shared_bytes, const DeviceInfo& device) {
  return is_aligned(tile_sums, sizeof(unsigned long long)) && allow_dynamic_shared_bytes(kernel, shared_bytes, device) &&
         blocks <= int64_t(device.multiprocessors) * blocks_per_multiprocessor(kernel, kTileThreads, shared_bytes, device);
}

// Launches the tiled version's kernels, one from `one_kernel_min_vectors` vectors on (or
// forced) where they fit, else two; returns the chunks of its partials.
template <typename T, typename Args, typename Math, int V>
int64_t launch_tiled_rows(const Args& args, const Math& math, int64_t vectors, int64_t one_kernel_min_vectors,
                          const DeviceInfo& device, cudaStream_t stream) {
  const int64_t tiles = row_tiles(args.length, sizeof(T));
  const bool one_wanted = takes(TiledKernels::kOne, vectors >= one_kernel_min_vectors);
  if (one_wanted) {
    const int64_t rows_per_chunk =
        one_kernel_tiled_rows_per_chunk(args.rows, tiles, args.chunks, kOneKernelTiledBlocksPerMultiprocessor<Math>);
    const int64_t chunks = (args.rows + rows_per_chunk - 1) / rows_per_chunk;
    const auto kernel = one_kernel_tiled_rows_kernel<T, Args, Math, V>;
    constexpr size_t shared_bytes = one_kernel_staged_bytes<Math>();
    if (fits_one_kernel(kernel, chunks * tiles, args.tile_sums, shared_bytes, device)) {
      cudaMemsetAsync(args.tile_sums, 0, size_t(tiled_one_kernel_part_bytes(args.rows, tiles)), stream);
      cudaLaunchAttribute cooperative[1] = {};
      cooperative[0].id = cudaLaunchAttributeCooperative;
      cooperative[0].val.cooperative = 1;
      cudaLaunchConfig_t config = {};
      config.gridDim = dim3(unsigned(chunks * tiles));
      config.blockDim = dim3(unsigned(kTileThreads));
      config.dynamicSmemBytes = shared_bytes;
      config.stream = stream;
      config.attrs = cooperative;
      config.numAttrs = 1;
      // Refused where the blocks cannot all run at once after all (another context holds
      // part of the GPU, say): then the two kernels run instead.
      if (cudaLaunchKernelEx(&config, kernel, args, math, tiles, chunks, rows_per_chunk) == cudaSuccess) {
        last_tiled_kernels() = TiledKernels::kOne;
        return chunks;
      }
      cudaGetLastError();  // the refusal is an answer here, not a failure of the call
    }
  }
  last_tiled_kernels() = TiledKernels::kTwo;
  const auto sums_kernel = tile_sums_kernel<T, Args, Math, V>;
  sums_kernel<<<resident_grid_size(sums_kernel, args.rows * tiles * kTileThreads, kTileThreads, device), kTileThreads, 0, stream>>>(
      args, math, tiles);
  const int64_t rows_per_chunk = tiled_rows_per_chunk(args.rows, tiles, args.chunks);
  const int64_t chunks = (args.rows + rows_per_chunk - 1) / rows_per_chunk;
  const auto rows_kernel = tiled_rows_kernel<T, Args, Math, V>;
  rows_kernel<<<resident_grid_size(rows_kernel, chunks * tiles * kTileThreads, kTileThreads, device), kTileThreads, 0, stream>>>(
      args, math, tiles, chunks, rows_per_chunk);
  return chunks;
}

// The thresholds of `table` for `device` and element type T: the GPU's own row, else its
// arch's, else the last (any other GPU, arch 0).
template <typename T, size_t N>
RowThresholds row_thresholds(const RowTuning (&table)[N], const DeviceInfo& device) {
  constexpr int index = std::is_same<T, __half>::value ? 0 : std::is_same<T, __nv_bfloat16>::value ? 1 : 2;
  for (const RowTuning& row : table)
    if ((row.arch == device.arch && (row.gpu == nullptr || std::strcmp(row.gpu, device.name) == 0)) || row.arch == 0)
      return {row.staged_min_vectors[index], row.global_min_vectors[index], row.pipelined_min_vectors[index],
              row.tiled_min_vectors[index], row.cluster_min_vectors[index], row.wide_min_vectors[index],
              row.coarse_chunks_min_vectors[index], row.narrow_max_vectors[index],
              row.small_cluster_blocks_min_vectors[index], row.one_kernel_min_vectors[index],
              row.prefetch_min_vectors[index]};
  return {};
}

// The call's arguments with coarse chunks of rows for the per-column sums where the
// table (coarse_chunks_min_vectors, rows of 16-byte vectors) or a forced choice says so;
// otherwise as the binding chunked them.
template <typename Args>
Args with_table_chunks(const Args& given, bool chunked, bool vectorized, int64_t vectors, const RowThresholds& table) {
  Args args = given;
  const bool coarse = takes(ChunkSize::kCoarse, vectorized && vectors >= table.coarse_chunks_min_vectors);
  if (chunked && coarse) chunk_rows(args, true);
  last_rows_per_chunk() = chunked ? args.rows_per_chunk : 0;
  return args;
}

// A RegisterRow kernel: (args, math, group_threads).
template <typename Args, typename Math>
using RegisterRowKernel = void (*)(const Args, const Math, int);

// The kernel of a RegisterRow version (register, pipelined, wide or narrow rows), with
// groups of kGroupThreads threads fixed when it is compiled where it is unpipelined
// register, lean or narrow rows (0: of the width its launch gives).
template <typename T, typename Args, typename Math, int V, int kGroupThreads = 0>
RegisterRowKernel<Args, Math> register_version_kernel(RowVersion version) {
  if constexpr (V > 1) {  // only rows of 16-byte vectors are pipelined, wide or narrow
    // Where Math cannot be pipelined both names are the same kernel.
    if (version == RowVersion::kPipelined) return register_row_kernel<T, Args, Math, V, kCanPipeline<Math>>;
    if constexpr (kWideRow<Math>)
      if (version == RowVersion::kWide) return wide_row_kernel<T, Args, Math, V>;
    if constexpr (kNarrowRow<Math>)
      if (version == RowVersion::kNarrow) return narrow_row_kernel<T, Args, Math, V, kGroupThreads>;
  }
  if constexpr (kLeanRow<Math>) return lean_row_kernel<T, Args, Math, V, kGroupThreads>;
  else return register_row_kernel<T, Args, Math, V, false, kGroupThreads>;
}

// Group widths that rows of 16-byte vectors without per-column sums (forwards, and the
// backwards of softmax, log_softmax and channel_norm) take fixed at compile time, in their
// unpipelined register, lean and narrow rows: groups of 8 to 64 threads (rows of 65 to
// 2048 16-bit or 33 to 1024 fp32 elements), and of 128 to 512 threads (to 16384 16-bit
// or 8192 fp32 elements) for the maths that keep no values between passes; kLightRow
// maths' register rows also in groups of 1024. With the width known, a butterfly is
// unrolled (a shuffle and an add a step, where a turn of the loop over a width known at
// run time takes seven instructions), a group of one warp has no barrier, and the
// group's lanes and rows are shifts and masks of constants. On an H100 these rows issued
// about twice the instructions of torch.compile's kernels for the same bytes, which fits
// their falling 3-4% behind it on the H200
// (benchmarks/results/2026-12-06-h100-short-row-profile/).
// In fp32 the fixed kernels gained 0.2% on an H100, where those rows run at copy
// (rmsnorm's, held to 32 registers, 0.3-0.6%;
// benchmarks/results/2026-12-07-h100-fp32-fixed-widths/).
// Other widths keep one kernel for every width: each fixed width is a kernel more to
// build. Widths 128-512 gained up to 1.9% on an H100 (rmsnorm's 16-bit forward at
// 16384; benchmarks/results/2026-12-07-h100-fixed-widths-to-512/); swish_layernorm's
// forward, which keeps each element's sigmoid, lost 9% at 512 threads: under the
// 64-register bound ptxas loads a row's second vector only after the first pass
// (benchmarks/results/2026-12-07-h100-wide-fixed-widths/), so the maths with kept
// values stop at 64.
template <typename Math>
constexpr bool kFixedGroupWidths = Math::kColumnSums == 0;

// The kernel of a RegisterRow version for rows of 16-byte vectors in groups of `group`
// threads: one of a fixed width where there is one (recorded in last_fixed_group_threads).
// A Math of kFixedGroupWidths has no per-column sums, so these calls are never chunked.
template <typename T, typename Args, typename Math, int V>
RegisterRowKernel<Args, Math> fixed_or_any_group_kernel(RowVersion version, int group) {
  RegisterRowKernel<Args, Math> fixed = nullptr;
  if constexpr (kFixedGroupWidths<Math>) {
    if (version == RowVersion::kRegister || version == RowVersion::kNarrow) {
      if (group == 8) fixed = register_version_kernel<T, Args, Math, V, 8>(version);
      if (group == 16) fixed = register_version_kernel<T, Args, Math, V, 16>(version);
      if (group == 32) fixed = register_version_kernel<T, Args, Math, V, 32>(version);
      if (group == 64) fixed = register_version_kernel<T, Args, Math, V, 64>(version);
      if constexpr (Math::kKeptValues == 0) {
        if (group == 128) fixed = register_version_kernel<T, Args, Math, V, 128>(version);
        if (group == 256) fixed = register_version_kernel<T, Args, Math, V, 256>(version);
        if (group == 512) fixed = register_version_kernel<T, Args, Math, V, 512>(version);
      }
      if constexpr (kLightRow<Math>)
        if (version == RowVersion::kRegister && group == 1024)
          fixed = register_version_kernel<T, Args, Math, V, 1024>(version);
    }
  }
  last_fixed_group_threads() = fixed != nullptr ? group : 0;
  return fixed != nullptr ? fixed : register_version_kernel<T, Args, Math, V>(version);
}

// Picks the kernel version for the call (pick_row_version, with the thresholds of the
// op's dispatch table for the current GPU) and launches it, then the column finish when
// the call wants per-column outputs. The device is looked up once, here: each lookup
// costs host time.
template <typename T, typename Args, typename Math, size_t N>
void launch_row_op(const Args& given, const Math& math, const RowTuning (&tuning)[N], cudaStream_t stream) {
  if (given.rows == 0) return;
  const DeviceInfo device = current_device_info();
  const RowThresholds table = row_thresholds<T>(tuning, device);
  constexpr int V = 16 / sizeof(T);
  const bool chunked = wants_column_sums<Math>(given);
  const bool vectorized = given.length % V == 0 && element_tensors_aligned<Math>(given, 16);
  const int64_t vectors = vectorized ? given.length / V : given.length;
  const Args args = with_table_chunks(given, chunked, vectorized, vectors, table);
  const bool fits_registers = vectors <= int64_t(kRowVectors<Math>) * kMaxGroupThreads<Math>;
  const bool fits_wide = kWideRow<Math> && vectorized && vectors <= int64_t(kWideRowVectors<Math>) * kWideRowThreads;
  const bool fits_narrow =
      kNarrowRow<Math> && vectorized && vectors <= int64_t(kNarrowRowVectors<Math>) * kMaxGroupThreads<Math>;
  const size_t staged_bytes = staged_row_bytes<T, Math>(args.length);
  const bool fits_staged = vectorized && vectors <= int64_t(kStagedVectors) * kMaxGroupThreads<Math> &&
                           staged_bytes <= max_dynamic_shared_bytes(device);
  // The table counts 16-byte vectors: rows of single elements take the global and cluster
  // versions only where nothing else fits, and are not pipelined.
  RowThresholds thresholds = table;
  if (!vectorized) thresholds.global_min_vectors = thresholds.cluster_min_vectors = kNever;
  // Asked only where it could be chosen: the occupancy query costs host time.
  const bool may_cluster = forced<RowVersion>() == RowVersion::kCluster ||
                           (!fits_registers && !fits_wide && !fits_staged) || vectors >= thresholds.cluster_min_vectors;
  // Small cluster blocks from the table's "small" line on (rows of 16-byte vectors), or forced.
  const bool small_blocks =
      takes(ClusterBlocks::kSmall, vectorized && vectors >= thresholds.small_cluster_blocks_min_vectors);
  const bool fits_cluster =
      may_cluster && (vectorized ? launch_cluster_rows<T, Args, Math, V>(args, math, vectors, chunked, small_blocks,
                                                                         device, stream, true)
                                 : launch_cluster_rows<T, Args, Math, 1>(args, math, vectors, chunked, small_blocks,
                                                                         device, stream, true));
  // The tiled version: rows of two tiles or more (the binding then allocates the tile sums).
  const bool can_tile = kCanTile<Math> && chunked && vectorized && args.tile_sums != nullptr;
  const RowVersion version = pick_row_version(vectors, fits_registers, fits_wide, fits_narrow, fits_staged,
                                              fits_cluster, kCanPipeline<Math> && vectorized, can_tile, thresholds);
  last_row_version() = version;
  last_fixed_group_threads() = 0;
  last_row_prefetch() = RowPrefetch::kAuto;
  int64_t partial_chunks = args.chunks;  // the chunks of the partials the version writes
  switch (version) {
    case RowVersion::kRegister:
    case RowVersion::kPipelined:
    case RowVersion::kWide:
    case RowVersion::kNarrow: {
      const bool wide = version == RowVersion::kWide, narrow = version == RowVersion::kNarrow;
      const int group = threads_for(vectors, wide     ? kWideRowVectors<Math>
                                             : narrow ? kNarrowRowVectors<Math>
                                                      : kRowVectors<Math>);
      const int block = register_row_block_threads(group, chunked);
      const int groups = block / group;
      const auto kernel = vectorized ? fixed_or_any_group_kernel<T, Args, Math, V>(version, group)
                                     : register_version_kernel<T, Args, Math, 1>(version);
      // A pipelined kernel needs a resident grid (each group loops over its rows, the next
      // one loading); without pipelining a block takes one row per group and the hardware
      // starts the next block as one leaves. On the H200 that ran rmsnorm's 16-bit forward
      // at 262144x256 at 0.89 of copy instead of 0.79 and softmax's backward at 0.95
      // instead of 0.82 (layernorm's 16-bit forward there lost 2-4%).
      const int64_t row_blocks = (args.rows + groups - 1) / groups;
      const unsigned blocks = chunked ? unsigned((args.chunks + groups - 1) / groups)
                              : version == RowVersion::kPipelined ? resident_grid_size(kernel, row_blocks * block, block, device)
                                                                  : full_grid_size(row_blocks);
      kernel<<<blocks, block, 0, stream>>>(args, math, group);
      break;
    }
    case RowVersion::kStaged: {
      const int threads = threads_for(vectors, kStagedVectors) < 32 ? 32 : threads_for(vectors, kStagedVectors);
      const auto kernel = staged_row_kernel<T, Args, Math, V>;
      allow_dynamic_shared_bytes(kernel, staged_bytes, device);
      const unsigned blocks = chunked ? unsigned(args.chunks)
                                      : resident_grid_size(kernel, args.rows * threads, threads, device, staged_bytes);
      kernel<<<blocks, threads, staged_bytes, stream>>>(args, math);
      break;
    }
    case RowVersion::kCluster:
      if (vectorized) {
        // Only the chunks of a backward with per-column sums prefetch (cluster_rows).
        Args cluster_args = args;
        cluster_args.prefetch_rows = chunked && takes(RowPrefetch::kOn, vectors >= thresholds.prefetch_min_vectors);
        if (chunked) last_row_prefetch() = cluster_args.prefetch_rows ? RowPrefetch::kOn : RowPrefetch::kOff;
        launch_cluster_rows<T, Args, Math, V>(cluster_args, math, vectors, chunked, small_blocks, device, stream, false);
      } else {
        launch_cluster_rows<T, Args, Math, 1>(args, math, vectors, chunked, small_blocks, device, stream, false);
      }
      break;
    case RowVersion::kTiled:
      if constexpr (kCanTile<Math>)
        partial_chunks = launch_tiled_rows<T, Args, Math, V>(args, math, vectors, thresholds.one_kernel_min_vectors,
                                                             device, stream);
      break;
    default:  // RowVersion::kGlobal
      if (vectorized) launch_global_rows<T, Args, Math, V>(args, math, vectors, chunked, device, stream);
      else launch_global_rows<T, Args, Math, 1>(args, math, vectors, chunked, device, stream);
      break;
  }
  if (chunked) launch_column_totals<T>(column_totals<Math>(args, partial_chunks), stream);
}

}  // namespace avo
