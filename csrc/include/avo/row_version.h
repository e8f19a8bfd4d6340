// Which version of the row kernels launch_row_op takes (avo/row_cuda.cuh): the one its
// table picks for the call, unless a caller forced one. Forcing is for tests and
// benchmarks, which run every version on the same inputs (avo_ops._C.set_row_version).
// Plain C++, so that the Python module can set it.
#pragma once

#include <cstdint>

namespace avo {

// The measured part of the dispatch of one row kernel (forward or backward of an op):
// on GPUs of compute capability `arch` (major * 10 + minor; 0: any other GPU), rows of
// at least staged_min_vectors[t] 16-byte vectors take the staged version where it fits,
// t indexing float16, bfloat16, float32. The generated sources hold these tables, from
// the files of tuning/ (benchmarks/tune_rows.py writes them).
struct RowTuning {
  int arch;
  int64_t staged_min_vectors[3];
};

// Staged only for rows that registers cannot hold.
constexpr int64_t kStagedNever = INT64_MAX;

enum class RowVersion { kAuto = -1, kRegister, kStaged, kCluster, kGlobal };

// The process-wide choice. A forced version that a call cannot take (a row too long
// for registers, say) is ignored for that call.
inline RowVersion& forced_row_version() {
  static RowVersion forced = RowVersion::kAuto;
  return forced;
}

}  // namespace avo
