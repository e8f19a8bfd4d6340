"""The arithmetic functions of the CPU kernels (csrc/include/avo/math.h) against the C
library's double-precision ones, and their float16 conversions (avo/dtype.h) against the
compiler's _Float16, by the checker in tests/cpp/check_cpu_math.cpp, compiled with the C++
compiler and the flags of the kernels; and the ops that use the functions at the ends of
their ranges, against float64 torch."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import torch

import avo_ops  # noqa: F401  (registers torch.ops.avo)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Every 32nd float, and every float near the ends of each range: about 12 s for the six
# functions.
STRIDE = 32


@pytest.fixture(scope="module")
def checker(tmp_path_factory):
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler to build tests/cpp/check_cpu_math.cpp with")
    binary = str(tmp_path_factory.mktemp("cpu_math") / "check_cpu_math")
    subprocess.run([compiler, "-O3", "-std=c++17", "-ffp-contract=off", "-I", os.path.join(REPO, "csrc", "include"),
                    os.path.join(REPO, "tests", "cpp", "check_cpu_math.cpp"), "-o", binary], check=True)
    return binary


def test_exp_tanh_and_erf_are_within_their_bounds(checker):
    """Functions<Exact> (float32 kernels): exp within 1 ulp of the rounded double result,
    tanh and erf within 2; Functions<Fast> (16-bit kernels): exp within 2 ulps, sigmoid
    within 4, erf within 1e-6 absolutely (the bounds are in the checker)."""
    result = subprocess.run([checker, str(STRIDE)], capture_output=True, text=True)
    print(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    assert [line.split(":")[0] for line in result.stdout.splitlines()] == [
        "exp", "tanh", "erf", "exp_fast", "sigmoid_fast", "erf_fast"]


def test_float16_conversions_round_as_the_compilers_float16(checker):
    """Every half to float, and float to half on every 64th float and every float near the
    rounding boundaries (subnormal halves, the largest half, infinity): the same bits as
    the compiler's _Float16 (round to nearest, ties to even), any NaN for a NaN; and
    Element<Half>::round (the float16 rows' as_stored, in float arithmetic) the same bits
    as the two conversions on those floats, NaN payloads included."""
    result = subprocess.run([checker, "64", "half"], capture_output=True, text=True)
    print(result.stdout)
    if result.returncode == 3:
        pytest.skip("this C++ compiler has no _Float16 to compare with")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("half: ")


def test_f16c_conversions_give_the_bits_of_the_software_ones(checker):
    """The float16 rows of the AVX2 and AVX-512 copies convert with F16C (halves_to_floats,
    floats_to_halves): every half to float, and float to half on every 64th float and
    every float near the rounding boundaries and among the NaNs, give the same bits as
    Element<Half>'s conversions, which the baseline copy uses, NaN payloads included."""
    result = subprocess.run([checker, "64", "f16c"], capture_output=True, text=True)
    print(result.stdout)
    if result.returncode == 3:
        pytest.skip(result.stdout.strip())
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("f16c: ")


def test_softmax_and_silu_at_the_ends_of_exps_range():
    """exp's results among the subnormals and its underflow to zero through softmax (exp of
    x - max); silu (exp of -|x|) down to where sigmoid(x) leaves the normal floats (below
    that, x * sigmoid(x) in fp32 loses the bits any fp32 sigmoid loses), with infinities
    and NaN."""
    x = torch.cat([torch.linspace(-87.0, 95.0, 4097), torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0])])
    got = torch.ops.avo.silu(x)
    want = torch.nn.functional.silu(x.double()).float()
    # A few ulps: the product of x and a sigmoid within a few ulps.
    torch.testing.assert_close(got, want, rtol=5e-7, atol=0.0, equal_nan=True)

    rows = torch.stack([torch.linspace(-104.0, 0.0, 1001), torch.linspace(-90.0, -86.0, 1001)])
    got = torch.ops.avo.softmax(rows)
    want = torch.softmax(rows.double(), dim=-1)
    # Results among the subnormals keep fewer bits: bounded absolutely, by two of the
    # smallest.
    torch.testing.assert_close(got.double(), want, rtol=5e-7, atol=3e-45)


def _row_with(length, changes):
    row = torch.linspace(-3.0, 2.0, length)
    for position, value in changes:
        row[position] = value
    return row


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_row_maximum_with_nan_infinities_and_the_largest_in_the_tail(op):
    """The CPU rows take the row maximum with a plain comparison in their lanes and reduce
    a row again the NaN-propagating way when it holds a NaN: a NaN in the blocks of 64 or
    in the tail after them makes the whole row NaN, as in torch; infinities, a row of
    -inf, and a largest element in the tail or at the first position give torch's values."""
    length = 200  # three blocks of 64, then a tail of 8
    rows = torch.stack([
        _row_with(length, [(5, float("nan"))]),
        _row_with(length, [(196, float("nan"))]),
        _row_with(length, [(70, float("inf"))]),
        _row_with(length, [(199, float("inf")), (3, float("inf"))]),
        torch.full((length,), float("-inf")),
        _row_with(length, [(197, 40.0)]),
        _row_with(length, [(0, 40.0)]),
        _row_with(length, [(n, float("-inf")) for n in range(0, length, 3)]),
    ])
    got = getattr(torch.ops.avo, op)(rows)
    want = getattr(torch, op)(rows.double(), dim=-1)
    assert torch.equal(got.isnan(), want.isnan())
    torch.testing.assert_close(got.double(), want, rtol=2e-6, atol=1e-7, equal_nan=True)
