// Math functions the spec language offers beyond <cmath>, for host and device.
// Semantics follow torch: minimum/maximum propagate NaN, sign(0) == 0.
#pragma once

#include <cmath>

#include "common.h"

namespace avo {

AVO_HOST_DEVICE float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

AVO_HOST_DEVICE float rsqrt(float x) {
#if defined(__CUDA_ARCH__)
  return rsqrtf(x);
#else
  return 1.0f / sqrtf(x);
#endif
}

AVO_HOST_DEVICE float sign(float x) { return float((x > 0.0f) - (x < 0.0f)); }

AVO_HOST_DEVICE float minimum(float a, float b) { return (a != a || a < b) ? a : b; }
AVO_HOST_DEVICE float maximum(float a, float b) { return (a != a || a > b) ? a : b; }

}  // namespace avo
