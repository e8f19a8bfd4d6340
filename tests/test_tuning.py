"""The row kernels' dispatch table: tuning/sm_<arch>.json files reach the generated .cu
sources, bad files are rejected with their name, and the threshold rule of
benchmarks/tune_rows.py picks what it documents."""
from __future__ import annotations

import json
import os
import shutil
import sys
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from generator.build import generate  # noqa: E402
from generator.errors import SpecError  # noqa: E402
from generator.tuning import gpu_file_key, load_tunings, tuning_for  # noqa: E402


def _tree(tmp_path, tuning: dict | None, name: str = "sm_90.json"):
    """A copy of the specs (softmax only) and, optionally, one tuning file."""
    specs = tmp_path / "specs"
    specs.mkdir()
    shutil.copy(os.path.join(ROOT, "specs", "softmax.yaml"), specs)
    if tuning is not None:
        (tmp_path / "tuning").mkdir()
        (tmp_path / "tuning" / name).write_text(json.dumps(tuning))
    return tmp_path


def _softmax_cu(root) -> str:
    generate(str(root), str(root / "specs"), check=False)
    return (root / "csrc" / "generated" / "softmax.cu").read_text()


def test_without_tuning_files_every_gpu_gets_the_default(tmp_path):
    cu = _softmax_cu(_tree(tmp_path, None))
    assert "//   | forward  | any other GPU | staged    |    never |    never |    never |" in cu
    assert "//   | forward  | any other GPU | global    |    never |    never |    never |" in cu
    assert "//   | forward  | any other GPU | pipelined |    never |    never |    never |" in cu
    assert "//   | backward | any other GPU | tiled     |    never |    never |    never |" in cu
    assert "//   | backward | any other GPU | cluster   |    never |    never |    never |" in cu
    assert "//   | forward  | any other GPU | wide      |    never |    never |    never |" in cu
    never = "{avo::kNever, avo::kNever, avo::kNever}"
    assert "//   | backward | any other GPU | coarse    |    never |    never |    never |" in cu
    assert "//   | forward  | any other GPU | narrow    |    never |    never |    never |" in cu
    assert "//   | forward  | any other GPU | small     |    never |    never |    never |" in cu
    assert "//   | backward | any other GPU | one       |    never |    never |    never |" in cu
    assert "//   | backward | any other GPU | prefetch  |    never |    never |    never |" in cu
    # the narrow line gives rows up to a length: never is 0 vectors there
    never_up_to = "{avo::kNeverUpTo, avo::kNeverUpTo, avo::kNeverUpTo}"
    assert (f"{{0, {never}, {never}, {never}, {never}, {never}, {never}, {never}, {never_up_to}, {never}, "
            f"{never}, {never}}},") in cu
    assert "(args, ForwardMath{}, kForwardTuning, stream)" in cu and "kBackwardTuning, stream)" in cu


def test_a_tuning_file_sets_the_thresholds_of_its_arch(tmp_path):
    tuning = {"arch": 90, "gpu": "NVIDIA H200",
              "staged_min_vectors": {"softmax": {"forward": {"float16": 512, "bfloat16": None, "float32": 2048},
                                                 "backward": {"float32": 1024}}},
              "global_min_vectors": {"softmax": {"forward": {"float32": 4096}}},
              "pipelined_min_vectors": {"softmax": {"forward": {"bfloat16": 256}}},
              "tiled_min_vectors": {"softmax": {"backward": {"float16": 2048}}},
              "cluster_min_vectors": {"softmax": {"backward": {"bfloat16": 1024}}},
              "wide_min_vectors": {"softmax": {"forward": {"float32": 2048}}},
              "coarse_chunks_min_vectors": {"softmax": {"backward": {"float16": 2048}}},
              "narrow_max_vectors": {"softmax": {"forward": {"float16": 64, "bfloat16": 32}}},
              "small_cluster_blocks_min_vectors": {"softmax": {"forward": {"bfloat16": 8192}}},
              "one_kernel_min_vectors": {"softmax": {"backward": {"float32": 4096}}},
              "prefetch_min_vectors": {"softmax": {"backward": {"float16": 512}}}}
    cu = _softmax_cu(_tree(tmp_path, tuning))
    assert "//   | forward  | sm_90 (NVIDIA H200) | staged    |      512 |    never |     2048 |" in cu
    assert "//   | forward  | sm_90 (NVIDIA H200) | global    |    never |    never |     4096 |" in cu
    assert "//   | backward | sm_90 (NVIDIA H200) | staged    |    never |    never |     1024 |" in cu
    assert "//   | backward | sm_90 (NVIDIA H200) | global    |    never |    never |    never |" in cu
    assert "//   | forward  | sm_90 (NVIDIA H200) | pipelined |    never |      256 |    never |" in cu
    assert "//   | backward | sm_90 (NVIDIA H200) | pipelined |    never |    never |    never |" in cu
    assert "//   | backward | sm_90 (NVIDIA H200) | tiled     |     2048 |    never |    never |" in cu
    assert "//   | backward | sm_90 (NVIDIA H200) | cluster   |    never |     1024 |    never |" in cu
    assert "//   | forward  | sm_90 (NVIDIA H200) | cluster   |    never |    never |    never |" in cu
    assert "//   | forward  | sm_90 (NVIDIA H200) | wide      |    never |    never |     2048 |" in cu
    assert "//   | backward | sm_90 (NVIDIA H200) | wide      |    never |    never |    never |" in cu
    assert "//   | backward | sm_90 (NVIDIA H200) | coarse    |     2048 |    never |    never |" in cu
    assert "//   | forward  | sm_90 (NVIDIA H200) | narrow    |       64 |       32 |    never |" in cu
    assert "//   | backward | sm_90 (NVIDIA H200) | narrow    |    never |    never |    never |" in cu
    assert "//   | forward  | sm_90 (NVIDIA H200) | small     |    never |     8192 |    never |" in cu
    assert "//   | backward | sm_90 (NVIDIA H200) | small     |    never |    never |    never |" in cu
    assert "//   | backward | sm_90 (NVIDIA H200) | one       |    never |    never |     4096 |" in cu
    assert "//   | backward | sm_90 (NVIDIA H200) | prefetch  |      512 |    never |    never |" in cu
    assert "//   | forward  | sm_90 (NVIDIA H200) | prefetch  |    never |    never |    never |" in cu
    forward = cu[cu.index("kForwardTuning[] = {"):]
    never = "{avo::kNever, avo::kNever, avo::kNever}"
    never_up_to = "{avo::kNeverUpTo, avo::kNeverUpTo, avo::kNeverUpTo}"
    assert forward.splitlines()[1].strip() == (
        "{90, {512, avo::kNever, 2048}, {avo::kNever, avo::kNever, 4096}, {avo::kNever, 256, avo::kNever}, "
        f"{never}, {never}, " + "{avo::kNever, avo::kNever, 2048}, " + f"{never}, " + "{64, 32, avo::kNeverUpTo}, "
        "{avo::kNever, 8192, avo::kNever}, " + f"{never}, {never}}},")
    assert forward.splitlines()[2].strip() == (
        f"{{0, {never}, {never}, {never}, {never}, {never}, {never}, {never}, {never_up_to}, {never}, {never}, "
        f"{never}}},")
    backward = cu[cu.index("kBackwardTuning[] = {"):]
    assert backward.splitlines()[1].strip() == (
        "{90, {avo::kNever, avo::kNever, 1024}, " + f"{never}, {never}, " + "{2048, avo::kNever, avo::kNever}, "
        "{avo::kNever, 1024, avo::kNever}, " + f"{never}, " + "{2048, avo::kNever, avo::kNever}, "
        f"{never_up_to}, {never}, " + "{avo::kNever, avo::kNever, 4096}, {512, avo::kNever, avo::kNever}},")


def test_a_tuning_file_of_the_staged_table_alone_never_picks_what_the_other_tables_give(tmp_path):
    tuning = {"arch": 90, "gpu": "NVIDIA H200", "staged_min_vectors": {"softmax": {"forward": {"float16": 512}}}}
    cu = _softmax_cu(_tree(tmp_path, tuning))
    assert "//   | forward  | sm_90 (NVIDIA H200) | global    |    never |    never |    never |" in cu
    assert "//   | forward  | sm_90 (NVIDIA H200) | pipelined |    never |    never |    never |" in cu
    assert "//   | backward | sm_90 (NVIDIA H200) | tiled     |    never |    never |    never |" in cu
    assert "//   | backward | sm_90 (NVIDIA H200) | cluster   |    never |    never |    never |" in cu
    assert "//   | forward  | sm_90 (NVIDIA H200) | wide      |    never |    never |    never |" in cu
    assert "//   | backward | sm_90 (NVIDIA H200) | coarse    |    never |    never |    never |" in cu
    assert "//   | forward  | sm_90 (NVIDIA H200) | narrow    |    never |    never |    never |" in cu
    assert "//   | forward  | sm_90 (NVIDIA H200) | small     |    never |    never |    never |" in cu
    assert "//   | backward | sm_90 (NVIDIA H200) | one       |    never |    never |    never |" in cu
    assert "//   | backward | sm_90 (NVIDIA H200) | prefetch  |    never |    never |    never |" in cu
    assert ("{avo::kNeverUpTo, avo::kNeverUpTo, avo::kNeverUpTo}, {avo::kNever, avo::kNever, avo::kNever}, "
            "{avo::kNever, avo::kNever, avo::kNever}, {avo::kNever, avo::kNever, avo::kNever}},") in cu


@pytest.mark.parametrize("content, name, phrase", [
    ({"arch": 80, "staged_min_vectors": {}}, "sm_90.json", "'arch' is 80 but the file name says 90"),
    ({"arch": 90}, "sm_90.json", "'staged_min_vectors' must map"),
    ({"arch": 90, "staged_min_vectors": {"softmax": {"sideways": {}}}}, "sm_90.json", "'softmax' must map"),
    ({"arch": 90, "staged_min_vectors": {"softmax": {"forward": {"float64": 4}}}}, "sm_90.json",
     "'softmax.forward' must map"),
    ({"arch": 90, "staged_min_vectors": {"softmax": {"forward": {"float32": -4}}}}, "sm_90.json",
     "'softmax.forward.float32' must be a positive number of vectors or null, got -4"),
    ({"arch": 90, "staged_min_vectors": {}, "global_min_vectors": [4]}, "sm_90.json", "'global_min_vectors' must map"),
    ({"arch": 90, "staged_min_vectors": {}, "global_min_vectors": {"softmax": {"backward": {"bfloat16": 0}}}},
     "sm_90.json", "'softmax.backward.bfloat16' must be a positive number of vectors or null, got 0"),
    ({"arch": 90, "staged_min_vectors": {}, "pipelined_min_vectors": {"softmax": {"forward": {"float16": 1.5}}}},
     "sm_90.json", "'softmax.forward.float16' must be a positive number of vectors or null, got 1.5"),
])
def test_bad_tuning_files_are_rejected_with_their_name(tmp_path, content, name, phrase):
    root = _tree(tmp_path, content, name)
    with pytest.raises(SpecError, match=f"tuning/{name}: .*{phrase}".replace("[", r"\[").replace("(", r"\(")):
        load_tunings(str(root))


H100 = "NVIDIA H100 80GB HBM3"


def test_a_gpus_own_file_comes_before_its_archs_in_the_generated_table(tmp_path):
    root = _tree(tmp_path, {"arch": 90, "gpu": "NVIDIA H200",
                            "staged_min_vectors": {"softmax": {"forward": {"float16": 512}}}})
    (root / "tuning" / "sm_90-nvidia-h100-80gb-hbm3.json").write_text(json.dumps(
        {"arch": 90, "gpu": H100, "staged_min_vectors": {"softmax": {"forward": {"float16": 256}}}}))
    cu = _softmax_cu(root)
    assert f"//   | forward  | sm_90, {H100} only | staged    |      256 |    never |    never |" in cu
    assert f"//   | forward  | {'sm_90 (NVIDIA H200)':{len(f'sm_90, {H100} only')}} | staged    |      512 |    never |    never |" in cu
    forward = cu[cu.index("kForwardTuning[] = {"):].splitlines()
    # the GPU's own row names it and comes first; the arch's row and the last name none
    assert forward[1].strip().startswith("{90, {256, avo::kNever, avo::kNever}, ")
    assert forward[1].strip().endswith(f'{{avo::kNever, avo::kNever, avo::kNever}}, "{H100}"}},')
    assert forward[2].strip().startswith("{90, {512, avo::kNever, avo::kNever}, ")
    assert forward[2].strip().endswith("{avo::kNever, avo::kNever, avo::kNever}},")
    assert forward[3].strip().startswith("{0, ")


def test_the_dispatch_takes_the_gpus_own_table_else_its_archs(tmp_path):
    root = _tree(tmp_path, {"arch": 90, "gpu": "NVIDIA H200", "staged_min_vectors": {}})
    (root / "tuning" / "sm_90-nvidia-h100-80gb-hbm3.json").write_text(json.dumps(
        {"arch": 90, "gpu": H100, "staged_min_vectors": {}}))
    (root / "tuning" / "sm_80.json").write_text(json.dumps({"arch": 80, "staged_min_vectors": {}}))
    tunings = load_tunings(str(root))
    assert [(t.arch, t.gpu, t.own) for t in tunings] == [(90, H100, True), (90, "NVIDIA H200", False), (80, "", False)]
    assert tuning_for(tunings, 90, H100).own
    assert tuning_for(tunings, 90, "NVIDIA H200").gpu == "NVIDIA H200"
    assert tuning_for(tunings, 90, "NVIDIA H100 PCIe").gpu == "NVIDIA H200"  # another name: the arch's
    assert tuning_for(tunings, 80, "NVIDIA A100-SXM4-80GB").arch == 80
    assert tuning_for(tunings, 100, "NVIDIA B200") is None


def test_gpu_file_key_names_the_gpu_in_lower_case_with_dashes():
    assert gpu_file_key(H100) == "nvidia-h100-80gb-hbm3"
    assert gpu_file_key("NVIDIA H100 PCIe") == "nvidia-h100-pcie"
    assert gpu_file_key("NVIDIA A100-SXM4-80GB") == "nvidia-a100-sxm4-80gb"


@pytest.mark.parametrize("content, phrase", [
    ({"arch": 90, "gpu": "NVIDIA H200", "staged_min_vectors": {}},
     "a GPU's own table must be named after its 'gpu' ('NVIDIA H200': sm_90-nvidia-h200.json)"),
    ({"arch": 90, "staged_min_vectors": {}}, "a GPU's own table must be named after its 'gpu' ('': none given)"),
    ({"arch": 90, "gpu": 7, "staged_min_vectors": {}}, "'gpu' must be the GPU's device name, got 7"),
])
def test_a_gpus_own_file_must_name_its_gpu(tmp_path, content, phrase):
    root = _tree(tmp_path, content, "sm_90-nvidia-h100-80gb-hbm3.json")
    with pytest.raises(SpecError, match=f"tuning/sm_90-nvidia-h100-80gb-hbm3.json: .*{phrase}"
                       .replace("(", r"\(").replace(")", r"\)")):
        load_tunings(str(root))


def test_a_run_writes_the_table_its_gpu_reads_and_never_another_gpus(tmp_path):
    from tune_rows import default_out, merged_file, previous_file

    folder = tmp_path / "tuning"
    shared = str(folder / "sm_90.json")
    own = str(folder / "sm_90-nvidia-h100-80gb-hbm3.json")
    # no file yet: the arch's, whichever GPU runs first
    assert default_out(str(tmp_path), 90, H100) == shared
    folder.mkdir()
    h200 = {"arch": 90, "gpu": "NVIDIA H200", "runs": [{"date": "d0"}],
            "staged_min_vectors": {"softmax": {"forward": {"float16": 512}}},
            "one_kernel_min_vectors": {"layernorm": {"backward": {"bfloat16": None}}},
            "measurements": [{"run": 0, "op": "softmax", "kernel": "forward", "dtype": "float16",
                              "row_length": 256, "register_us": 10.0}]}
    (folder / "sm_90.json").write_text(json.dumps(h200))
    assert default_out(str(tmp_path), 90, "NVIDIA H200") == shared
    assert default_out(str(tmp_path), 90, H100) == own
    # the H100's new file starts from the H200's tables, without its runs or times
    previous = previous_file(own, 90, H100)
    assert previous["staged_min_vectors"] == h200["staged_min_vectors"]
    assert previous["runs"] == [] and "measurements" not in previous
    assert previous["based_on"].startswith("tuning/sm_90.json (NVIDIA H200)")
    found = {("layernorm", "backward", "bfloat16"): {"one_kernel_min_vectors": 1024}}
    merged = merged_file(previous, found, [], {"date": "d1"}, {"arch": 90, "gpu": H100})
    assert merged["one_kernel_min_vectors"] == {"layernorm": {"backward": {"bfloat16": 1024}}}
    assert merged["staged_min_vectors"] == h200["staged_min_vectors"]
    assert merged["based_on"] == previous["based_on"] and [r["date"] for r in merged["runs"]] == ["d1"]
    (folder / "sm_90-nvidia-h100-80gb-hbm3.json").write_text(json.dumps(merged))
    assert default_out(str(tmp_path), 90, H100) == own
    assert previous_file(own, 90, H100)["runs"] == [{"date": "d1"}]
    # the H200's table is never written over from an H100, nor the H100's from an H200
    with pytest.raises(SystemExit, match="holds the table of the NVIDIA H200, this GPU is the NVIDIA H100 80GB HBM3"):
        previous_file(shared, 90, H100)
    with pytest.raises(SystemExit, match="holds the table of the NVIDIA H100 80GB HBM3"):
        previous_file(own, 90, "NVIDIA H200")
    assert load_tunings(str(tmp_path))[0].gpu == H100  # the file it wrote loads as the H100's own


def test_the_shipped_tuning_files_load():
    for tuning in load_tunings(ROOT):
        assert tuning.arch >= 50


def test_threshold_rule():
    from tune_rows import threshold

    # (vectors, register us, staged us)
    assert threshold([(32, 10, 12), (64, 10, 9), (128, 10, 8), (256, 10, 10)], 0.01, 0.03) == 64
    # staged faster at 64 but slower again at 128: only from 256 on
    assert threshold([(32, 10, 12), (64, 10, 9), (128, 10, 11), (256, 10, 8)], 0.01, 0.03) == 256
    # ... unless the loss is within the tolerance
    assert threshold([(32, 10, 12), (64, 10, 9), (128, 10, 10.2), (256, 10, 8)], 0.01, 0.03) == 64
    # equal everywhere (e.g. beyond the register limit both runs take one kernel): never
    assert threshold([(32, 10, 10), (64, 10, 10.05)], 0.01, 0.03) is None
    assert threshold([], 0.01, 0.03) is None


def test_global_threshold_is_against_the_fastest_other_version():
    from tune_rows import thresholds

    def m(n, register, staged, cluster, global_):
        return {"row_length": n, "vectors": n // 8, "register_us": register, "staged_us": staged,
                "cluster_us": cluster, "global_us": global_}

    tables = ["staged_min_vectors", "global_min_vectors"]
    # global beats register from 4096 on, but staged (faster) only from 16384 on
    points = [m(1024, 10, 10, 12, 11), m(4096, 10, 8, 12, 9), m(16384, 10, 8, 12, 7), m(65536, 20, 20, 15, 12)]
    assert thresholds(points, tables, 0.01, 0.03) == {"staged_min_vectors": 512, "global_min_vectors": 2048}
    # beyond every other version's limit all runs time the global kernel: noise within the
    # tolerance does not move the threshold
    points += [m(262144, 24.6, 24.1, 24.2, 24.5)]
    assert thresholds(points, tables, 0.01, 0.03) == {"staged_min_vectors": 512, "global_min_vectors": 2048}
    # staged is compared with register over N <= 32768 only; global never wins
    points = [m(16384, 10, 10, 10, 11), m(65536, 20, 10, 15, 16)]
    assert thresholds(points, tables, 0.01, 0.03) == {"staged_min_vectors": None, "global_min_vectors": None}


def test_pipelined_threshold_is_against_register_on_rows_registers_hold():
    from tune_rows import thresholds

    def m(n, register, pipelined):
        return {"row_length": n, "vectors": n // 8, "register_us": register, "pipelined_us": pipelined}

    # slower on short rows, faster from 4096 on; beyond 32768 neither runs (both times are
    # another version's) and a faster-looking time there does not count
    points = [m(256, 10, 10.8), m(1024, 10, 10.4), m(4096, 10, 9), m(16384, 10, 9.5), m(65536, 20, 15)]
    assert thresholds(points, ["pipelined_min_vectors"], 0.01, 0.03) == {"pipelined_min_vectors": 512}
    assert thresholds(points[:2] + points[4:], ["pipelined_min_vectors"], 0.01, 0.03) == {"pipelined_min_vectors": None}


def test_wide_threshold_is_against_register_and_pipelined_on_rows_registers_hold():
    from tune_rows import thresholds

    def m(n, register, pipelined, wide):
        times = {"register_us": register, "pipelined_us": pipelined, "wide_us": wide}
        return {"row_length": n, "vectors": n // 8, **{k: v for k, v in times.items() if v is not None}}

    # wide beats register from 8192 on but pipelined only from 16384 on; at 32768 only wide
    # holds the row (no register or pipelined time: not a point); beyond, none runs
    points = [m(4096, 10, 10.5, 11), m(8192, 10, 9.5, 9.8), m(16384, 10, 9.5, 9.0), m(32768, None, None, 9.0),
              m(65536, 20, 20, 12)]
    assert thresholds(points, ["wide_min_vectors"], 0.01, 0.03) == {"wide_min_vectors": 2048}
    # a backward with per-column sums has no wide time: never
    assert thresholds([m(4096, 10, 9, None), m(16384, 10, 9, None)], ["wide_min_vectors"], 0.01, 0.03) == \
        {"wide_min_vectors": None}


def test_narrow_threshold_is_the_longest_row_up_to_which_narrow_wins_at_every_shorter_one():
    from tune_rows import thresholds

    def m(n, register, pipelined, wide, narrow):
        times = {"register_us": register, "pipelined_us": pipelined, "wide_us": wide, "narrow_us": narrow}
        return {"row_length": n, "vectors": n // 8, **{k: v for k, v in times.items() if v is not None}}

    # narrow beats register by 3% at 256 and 2% at 1024; at 4096 pipelined is faster than
    # narrow, at 8192 wide by 4% (more than the tolerance), so that narrow's win at 16384
    # does not count; beyond 32768 no register row runs. Up to 1024 elements of 16 bits
    # (128 vectors) narrow wins at every length.
    points = [m(256, 10, 10.5, None, 9.7), m(1024, 10, 10.2, None, 9.8), m(4096, 10, 9.5, 10.4, 9.9),
              m(8192, 10, 9.5, 9.4, 9.8), m(16384, 10, 9.5, 9.0, 8.5), m(65536, 20, 20, 20, 10)]
    assert thresholds(points, ["narrow_max_vectors"], 0.01, 0.03) == {"narrow_max_vectors": 128}
    # by no more than the margin at 1024: up to 256 only
    points[1] = m(1024, 10, 10.2, None, 9.95)
    assert thresholds(points, ["narrow_max_vectors"], 0.01, 0.03) == {"narrow_max_vectors": 32}
    # a backward with per-column sums has no narrow time: never
    assert thresholds([m(256, 10, 9, None, None), m(1024, 10, 9, None, None)], ["narrow_max_vectors"], 0.01,
                      0.03) == {"narrow_max_vectors": None}


def test_staged_threshold_is_against_register_and_pipelined():
    from tune_rows import thresholds

    def m(n, register, pipelined, staged, kernel="forward"):
        return {"kernel": kernel, "row_length": n, "vectors": n // 8, "register_us": register,
                "pipelined_us": pipelined, "staged_us": staged}

    # staged beats register from 8192 on, but the pipelined rows (which the dispatch takes
    # there otherwise) only from 16384 on
    points = [m(4096, 10, 9, 11), m(8192, 20, 15, 16), m(16384, 40, 32, 30), m(32768, 80, 62, 60)]
    assert thresholds(points, ["staged_min_vectors"], 0.01, 0.03) == {"staged_min_vectors": 2048}
    # a backward's pipelined times count as a forward's (backwards with per-column sums
    # pipeline the rows of a chunk)
    backward = [m(n, r, p, st, "backward") for n, r, p, st in
                [(4096, 10, 9, 11), (8192, 20, 15, 16), (16384, 40, 32, 30), (32768, 80, 62, 60)]]
    assert thresholds(backward, ["staged_min_vectors", "pipelined_min_vectors"], 0.01, 0.03) == \
        {"staged_min_vectors": 2048, "pipelined_min_vectors": 512}


def test_cluster_threshold_is_against_register_pipelined_and_staged_on_rows_they_hold():
    from tune_rows import thresholds

    def m(n, register, pipelined, staged, cluster):
        times = {"register_us": register, "pipelined_us": pipelined, "staged_us": staged, "cluster_us": cluster}
        return {"kernel": "backward", "row_length": n, "vectors": n // 8,
                **{k: v for k, v in times.items() if v is not None}}

    # cluster beats register from 4096 on, but the staged version only from 16384 on;
    # beyond 32768 only the cluster version is timed, and that row is not compared
    points = [m(4096, 20, None, 18, 19), m(8192, 40, None, 30, 31), m(16384, None, None, 70, 60),
              m(32768, None, None, 150, 120), m(65536, None, None, None, 500)]
    assert thresholds(points, ["cluster_min_vectors"], 0.01, 0.03) == {"cluster_min_vectors": 2048}
    # slower than the staged version by more than the tolerance at 32768: never
    points[3] = m(32768, None, None, 100, 120)
    assert thresholds(points, ["cluster_min_vectors"], 0.01, 0.03) == {"cluster_min_vectors": None}


def test_coarse_chunks_threshold_is_against_fine_chunks_where_they_differ():
    from tune_rows import thresholds

    def m(n, fine, coarse):
        times = {"fine_chunks_us": fine, "coarse_chunks_us": coarse}
        return {"kernel": "backward", "row_length": n, "vectors": n // 8,
                **{k: v for k, v in times.items() if v is not None}}

    # the chunks differ at 16384 alone (shorter rows have 32 rows a chunk either way, the
    # longer ones the long rows' chunks): those lengths have no times and are no points
    points = [m(4096, None, None), m(8192, None, None), m(16384, 150, 132), m(32768, None, None)]
    assert thresholds(points, ["coarse_chunks_min_vectors"], 0.01, 0.03) == {"coarse_chunks_min_vectors": 2048}
    # slower with coarse chunks (fp32 on the H200): never
    points[2] = m(16384, 238, 258)
    assert thresholds(points, ["coarse_chunks_min_vectors"], 0.01, 0.03) == {"coarse_chunks_min_vectors": None}


def test_one_kernel_threshold_is_against_the_tiled_version_in_two_kernels_where_both_ran():
    from tune_rows import thresholds

    def m(n, two, one):
        times = {"two_tiled_kernels_us": two, "one_tiled_kernels_us": one}
        return {"kernel": "backward", "row_length": n, "vectors": n // 8,
                **{k: v for k, v in times.items() if v is not None}}

    # layernorm's bf16 backward on an H100: level at 8192 (no line there), ahead by
    # 9-36% from 16384 on; a row where only two kernels ran (time_choices kept none) is no point
    points = [m(8192, 254.0, 253.5), m(16384, 270.3, 247.8), m(65536, 278.4, 251.9), m(131072, None, None),
              m(262144, 307.1, 226.1)]
    assert thresholds(points, ["one_kernel_min_vectors"], 0.01, 0.03) == {"one_kernel_min_vectors": 2048}
    # slower in one kernel by more than the tolerance at the longest row: never
    points[-1] = m(262144, 344.4, 525.6)
    assert thresholds(points, ["one_kernel_min_vectors"], 0.01, 0.03) == {"one_kernel_min_vectors": None}


def test_time_tiled_kernels_forces_the_tiled_version_and_gives_it_back(monkeypatch):
    import bench_ops
    import tune_rows

    monkeypatch.setattr(bench_ops, "input_sets", lambda case, shape, dtype: [(1,)])
    state = {"version": "auto", "kernels": "auto", "choice": "auto", "during": []}
    c = types.SimpleNamespace(
        set_row_version=lambda v: state.update(version=v),
        set_tiled_kernels=lambda k: state.update(kernels=k, choice=k),
        last_row_version=lambda: state["version"],
        last_tiled_kernels=lambda: state["kernels"])
    avo_ops = types.SimpleNamespace(_C=c)
    case = types.SimpleNamespace(avo=lambda x: state["during"].append((state["version"], state["kernels"])))
    timer = _StubTimer({"two": [3.0], "one": [2.0]}, state)
    times = tune_rows.time_tiled_kernels(avo_ops, case, (4, 8), None, timer)
    assert times == {"two_tiled_kernels": 3.0, "one_tiled_kernels": 2.0}
    assert state["during"] == [("tiled", "two"), ("tiled", "one")]
    assert state["version"] == "auto" and state["kernels"] == "auto"


def test_small_cluster_blocks_threshold_is_against_full_blocks_where_they_differ():
    from tune_rows import thresholds

    def m(n, full, small):
        times = {"full_cluster_blocks_us": full, "small_cluster_blocks_us": small}
        return {"kernel": "forward", "row_length": n, "vectors": n // 8,
                **{k: v for k, v in times.items() if v is not None}}

    # rows the table gives another version have no times and are no points
    points = [m(16384, None, None), m(32768, 151.6, 147.6), m(65536, 161.4, 150.0), m(262144, 174.7, 173.9)]
    assert thresholds(points, ["small_cluster_blocks_min_vectors"], 0.01, 0.03) == {
        "small_cluster_blocks_min_vectors": 4096}
    # slower with small blocks by more than the tolerance at a longer row, no gain past it: never
    points[2] = m(65536, 88.0, 92.2)
    assert thresholds(points, ["small_cluster_blocks_min_vectors"], 0.01, 0.03) == {
        "small_cluster_blocks_min_vectors": None}


def test_prefetch_threshold_is_against_no_prefetch_where_the_call_took_the_cluster_rows():
    from tune_rows import thresholds

    def m(n, off, on):
        times = {"off_row_prefetch_us": off, "on_row_prefetch_us": on}
        return {"kernel": "backward", "row_length": n, "vectors": n // 8,
                **{k: v for k, v in times.items() if v is not None}}

    # add_layernorm's bf16 backward on an H100: level at 2048, ahead by 5-9% from 4096 on;
    # rows in another version (time_choices kept none) are no points
    points = [m(1024, None, None), m(2048, 220.0, 219.5), m(4096, 210.7, 200.0), m(16384, 226.7, 208.3),
              m(65536, None, None)]
    assert thresholds(points, ["prefetch_min_vectors"], 0.01, 0.03) == {"prefetch_min_vectors": 512}
    # slower with the prefetch by more than the tolerance at a longer row: never
    points[3] = m(16384, 200.0, 215.0)
    assert thresholds(points, ["prefetch_min_vectors"], 0.01, 0.03) == {"prefetch_min_vectors": None}


def test_time_row_prefetch_times_both_and_gives_the_choice_back(monkeypatch):
    import bench_ops
    import tune_rows

    monkeypatch.setattr(bench_ops, "input_sets", lambda case, shape, dtype: [(1,)])
    state = {"choice": "auto", "taken": "auto"}
    c = types.SimpleNamespace(set_row_prefetch=lambda p: state.update(choice=p),
                              last_row_prefetch=lambda: state["taken"])
    avo_ops = types.SimpleNamespace(_C=c)
    case = types.SimpleNamespace(avo=lambda x: state.update(taken=state["choice"]))
    timer = _StubTimer({"off": [3.0], "on": [2.0]}, state)
    assert tune_rows.time_row_prefetch(avo_ops, case, (4, 8), None, timer) == {
        "off_row_prefetch": 3.0, "on_row_prefetch": 2.0}
    assert state["choice"] == "auto"
    # a call that took no version that prefetches ("auto" after it ran) gives no times
    case = types.SimpleNamespace(avo=lambda x: state.update(taken="auto"))
    assert tune_rows.time_row_prefetch(avo_ops, case, (4, 8), None, timer) == {}


class _StubTimer:
    """Times nothing: `measure` runs the call once and returns the times `plan` gives the
    choice in force."""

    def __init__(self, plan, state):
        self.plan, self.state = plan, state

    def measure(self, call, arg_sets):
        call(*arg_sets[0])
        return self.plan[self.state["choice"]]


def _time_choices(monkeypatch, taken_by_choice):
    import bench_ops
    from tune_rows import time_choices

    monkeypatch.setattr(bench_ops, "input_sets", lambda case, shape, dtype: [(1,)])
    state = {"choice": "auto", "calls": []}
    case = types.SimpleNamespace(avo=lambda x: state["calls"].append(state["choice"]))

    def choose(choice):
        state["choice"] = choice

    timer = _StubTimer({"full": [3.0, 1.0, 2.0], "small": [5.0, 4.0, 6.0]}, state)
    times = time_choices(case, (4, 8), None, timer, choose, ("full", "small"), "cluster_blocks",
                         lambda: taken_by_choice[state["choice"]])
    return times, state


def test_time_choices_times_each_forced_choice_and_restores_auto(monkeypatch):
    times, state = _time_choices(monkeypatch, {"full": 1024, "small": 256})
    assert times == {"full_cluster_blocks": 2.0, "small_cluster_blocks": 5.0}  # the medians
    assert state["calls"] == ["full", "small"] and state["choice"] == "auto"


@pytest.mark.parametrize("taken", [{"full": 512, "small": 512}, {"full": 0, "small": 0}, {"full": 1024, "small": 0}])
def test_time_choices_keeps_no_times_where_the_choices_took_the_same_or_nothing(monkeypatch, taken):
    times, state = _time_choices(monkeypatch, taken)
    assert times == {} and state["choice"] == "auto"


def _narrow_points(n_us):
    """Measurements of channel_norm's bf16 forward: N -> (register us, narrow us)."""
    return [{"kernel": "forward", "row_length": n, "vectors": n // 8, "register_us": register, "narrow_us": narrow}
            for n, (register, narrow) in n_us.items()]


def test_a_line_the_file_has_stays_where_the_new_times_do_not_beat_it():
    from tune_rows import thresholds

    # narrow 0.7% ahead at 256 (the rule's margin is 1%): alone, this run's times give
    # never; the file's line (32 vectors) gives narrow rows at 256, no slower there
    points = _narrow_points({256: (70.1, 69.6), 512: (69.4, 70.7), 1024: (69.5, 71.0)})
    assert thresholds(points, ["narrow_max_vectors"], 0.01, 0.03) == {"narrow_max_vectors": None}
    assert thresholds(points, ["narrow_max_vectors"], 0.01, 0.03, previous={"narrow_max_vectors": 32}) == {
        "narrow_max_vectors": 32}
    # a table the file has no line for, or a line that would now cost more than the margin
    assert thresholds(points, ["narrow_max_vectors"], 0.01, 0.03, previous={}) == {"narrow_max_vectors": None}
    assert thresholds(points, ["narrow_max_vectors"], 0.01, 0.03, previous={"narrow_max_vectors": 64}) == {
        "narrow_max_vectors": None}  # narrow at 512: 70.7 against 69.4


def test_a_line_moves_where_the_new_times_beat_the_files_line_by_more_than_the_margin():
    from tune_rows import thresholds

    def m(n, full, small):
        return {"kernel": "forward", "row_length": n, "vectors": n // 8, "full_cluster_blocks_us": full,
                "small_cluster_blocks_us": small}

    table = ["small_cluster_blocks_min_vectors"]
    points = [m(32768, 152.3, 146.6), m(65536, 158.5, 149.3), m(131072, 162.4, 157.3)]
    # the file had never: small blocks from 32768 on beat it by 4-6%
    assert thresholds(points, table, 0.01, 0.03, previous={table[0]: None}) == {table[0]: 4096}
    # the file had 65536 (8192 vectors): 32768 gains 3.9%, so the line moves
    assert thresholds(points, table, 0.01, 0.03, previous={table[0]: 8192}) == {table[0]: 4096}
    # small blocks within the margin at 32768: alone, this run's times give 65536; the
    # file's line (32768) costs nothing there, and stays
    points[0] = m(32768, 150.0, 149.0)
    assert thresholds(points, table, 0.01, 0.03) == {table[0]: 8192}
    assert thresholds(points, table, 0.01, 0.03, previous={table[0]: 4096}) == {table[0]: 4096}


def test_previous_lines_are_the_files_lines_of_the_group_null_included():
    from tune_rows import previous_lines

    data = {"narrow_max_vectors": {"channel_norm": {"forward": {"bfloat16": 32, "float16": None}}},
            "staged_min_vectors": {"softmax": {"forward": {"bfloat16": 512}}}}
    tables = ["narrow_max_vectors", "staged_min_vectors", "wide_min_vectors"]
    assert previous_lines(data, ("channel_norm", "forward", "bfloat16"), tables) == {"narrow_max_vectors": 32}
    assert previous_lines(data, ("channel_norm", "forward", "float16"), tables) == {"narrow_max_vectors": None}
    assert previous_lines(data, ("channel_norm", "forward", "float32"), tables) == {}
    assert previous_lines({}, ("softmax", "forward", "bfloat16"), tables) == {}


def test_the_tuning_files_rule_says_whether_it_kept_lines():
    from tune_rows import rule_text

    assert "a line the file had stays" in rule_text(0.01, 0.03)
    assert "a line the file had stays" not in rule_text(0.01, 0.03, kept=False)


def test_recompute_takes_the_last_runs_measurements(tmp_path):
    from tune_rows import main

    def m(run, n, register, pipelined, staged):
        return {"run": run, "op": "softmax", "kernel": "forward", "dtype": "float16", "row_length": n,
                "vectors": n // 8, "register_us": register, "pipelined_us": pipelined, "staged_us": staged}

    data = {"arch": 90, "gpu": "NVIDIA H200", "runs": [{"date": "d0"}, {"date": "d1"}],
            "staged_min_vectors": {"softmax": {"forward": {"float16": 512}}},
            "global_min_vectors": {"softmax": {"forward": {"float16": 8192}}},
            "pipelined_min_vectors": {"softmax": {"forward": {"float16": 64}}},
            # run 0: staged faster everywhere; run 1 (the last): pipelined fastest from 8192 on
            "measurements": [m(0, 4096, 10, 10, 5), m(0, 8192, 20, 20, 10),
                             m(1, 4096, 10, 10.5, 12), m(1, 8192, 20, 15, 16)]}
    path = tmp_path / "sm_90.json"
    path.write_text(json.dumps(data))
    assert main(["--recompute", str(path), "--tables", "staged,pipelined"]) == 0
    out = json.loads(path.read_text())
    assert out["staged_min_vectors"] == {"softmax": {"forward": {"float16": None}}}
    assert out["pipelined_min_vectors"] == {"softmax": {"forward": {"float16": 1024}}}
    assert out["global_min_vectors"] == data["global_min_vectors"]  # not among --tables
    assert out["measurements"] == data["measurements"] and out["runs"] == data["runs"]
    assert "staged against the fastest of register, pipelined, wide and narrow" in out["rule"]
    assert "up to the longest row" in out["rule"] and "narrow against the fastest of register" in out["rule"]
    # the last run timed no global version: asked for, its table keeps its values
    assert main(["--recompute", str(path), "--tables", "global"]) == 0
    assert json.loads(path.read_text())["global_min_vectors"] == data["global_min_vectors"]


def test_recompute_writes_out_where_given(tmp_path):
    from tune_rows import main
    data = {"arch": 90, "runs": [{"date": "d0"}], "staged_min_vectors": {"softmax": {"forward": {"float16": 512}}},
            "measurements": [{"run": 0, "op": "softmax", "kernel": "forward", "dtype": "float16", "row_length": 4096,
                              "vectors": 512, "register_us": 10, "pipelined_us": 10, "staged_us": 12}]}
    path, out = tmp_path / "sm_90.json", tmp_path / "other.json"
    path.write_text(json.dumps(data))
    assert main(["--recompute", str(path), "--tables", "staged", "--out", str(out)]) == 0
    assert json.loads(path.read_text()) == data  # the file read is left as it was
    assert json.loads(out.read_text())["staged_min_vectors"] == {"softmax": {"forward": {"float16": None}}}


def test_tiled_threshold_is_against_the_fastest_other_version():
    from tune_rows import thresholds

    def m(n, register, staged, cluster, global_, tiled):
        return {"row_length": n, "vectors": n // 8, "register_us": register, "staged_us": staged,
                "cluster_us": cluster, "global_us": global_, "tiled_us": tiled}

    # tiled beats register from 16384 on, but staged too only from 65536 on
    points = [m(4096, 10, 11, 12, 13, 12), m(16384, 30, 20, 25, 26, 22), m(65536, 90, 90, 60, 70, 40),
              m(262144, 300, 300, 300, 280, 150)]
    assert thresholds(points, ["tiled_min_vectors"], 0.01, 0.03) == {"tiled_min_vectors": 8192}
    # a forced tiled run that took the table's choice times the same as one of the others
    same = [m(4096, 10, 11, 12, 13, 10.05), m(65536, 90, 90, 60, 70, 60.2)]
    assert thresholds(same, ["tiled_min_vectors"], 0.01, 0.03) == {"tiled_min_vectors": None}
    # forwards are not timed tiled
    for point in points:
        del point["tiled_us"]
    assert thresholds(points, ["tiled_min_vectors"], 0.01, 0.03) == {"tiled_min_vectors": None}


def test_versions_a_call_could_not_take_are_not_compared():
    """A forced run that took another version records no time for the forced one (the
    timing run asks avo_ops._C.last_row_version). Where a row fits no version but the
    challenger, the length is not compared; where it fits the challenger and others, the
    others that ran are the incumbents."""
    from tune_rows import thresholds

    def m(n, times):
        return {"kernel": "backward", "row_length": n, "vectors": n // 8, **{f"{v}_us": t for v, t in times.items()}}

    # register holds rows up to 8192, staged up to 16384, cluster up to 131072; global
    # and tiled take every length. Tiled wins from 65536 on, by far at the longest rows.
    points = [m(4096, {"register": 10, "staged": 11, "cluster": 12, "global": 13, "tiled": 12}),
              m(16384, {"staged": 30, "cluster": 28, "global": 40, "tiled": 29}),
              m(65536, {"cluster": 90, "global": 95, "tiled": 60}),
              m(262144, {"global": 300, "tiled": 150})]
    assert thresholds(points, ["tiled_min_vectors", "global_min_vectors"], 0.01, 0.03) == \
        {"tiled_min_vectors": 8192, "global_min_vectors": None}
    # only the challenger ran at a length: nothing to compare there, the shorter rows decide
    points[3] = m(262144, {"tiled": 150})
    assert thresholds(points, ["tiled_min_vectors"], 0.01, 0.03) == {"tiled_min_vectors": 8192}


def test_a_partial_run_keeps_what_it_did_not_measure():
    from tune_rows import merged_file

    previous = {"arch": 90, "gpu": "NVIDIA H200", "date": "d0", "command": "tune_rows.py", "torch": "t", "cuda": "c",
                "staged_min_vectors": {"softmax": {"forward": {"float16": 512}}},
                "global_min_vectors": {"softmax": {"forward": {"float16": 8192}}},
                "measurements": [{"op": "softmax", "kernel": "forward", "dtype": "float16", "row_length": 256,
                                  "register_us": 10.0}]}
    found = {("softmax", "forward", "float16"): {"pipelined_min_vectors": 64}}
    new = [{"op": "softmax", "kernel": "forward", "dtype": "float16", "row_length": 256, "pipelined_us": 9.0}]
    merged = merged_file(previous, found, new, {"date": "d1", "command": "tune_rows.py --tables pipelined"},
                         {"arch": 90, "gpu": "NVIDIA H200", "rule": "r"})
    assert merged["staged_min_vectors"] == previous["staged_min_vectors"]
    assert merged["global_min_vectors"] == previous["global_min_vectors"]
    assert merged["pipelined_min_vectors"] == {"softmax": {"forward": {"float16": 64}}}
    assert [r["date"] for r in merged["runs"]] == ["d0", "d1"]
    assert [(m["run"], "pipelined_us" in m) for m in merged["measurements"]] == [(0, False), (1, True)]
    # a second partial run adds a third entry and keeps the tags of the first two
    again = merged_file(merged, {}, new, {"date": "d2"}, {"arch": 90})
    assert [m["run"] for m in again["measurements"]] == [0, 1, 2]
    assert previous["staged_min_vectors"] == {"softmax": {"forward": {"float16": 512}}}  # not modified


def test_a_run_of_every_table_replaces_the_times_of_what_it_measured():
    from tune_rows import TABLE_VERSIONS, merged_file

    def m(op, us):
        return {"op": op, "kernel": "forward", "dtype": "float16", "row_length": 256, "register_us": us}

    previous = {"arch": 90, "runs": [{"date": "d0"}], "measurements": [{"run": 0, **m("softmax", 10.0)},
                                                                      {"run": 0, **m("rmsnorm", 11.0)}]}
    every = {name: None for name in TABLE_VERSIONS}
    merged = merged_file(previous, {("softmax", "forward", "float16"): every}, [m("softmax", 9.0)], {"date": "d1"},
                         {"arch": 90})
    # softmax's tables all come from the new run: its old time goes; rmsnorm's, not measured, stays
    assert [(x["run"], x["op"], x["register_us"]) for x in merged["measurements"]] == \
        [(0, "rmsnorm", 11.0), (1, "softmax", 9.0)]
    assert [r["date"] for r in merged["runs"]] == ["d0", "d1"]
    # a run of some tables keeps the times the other tables came from
    some = {"pipelined_min_vectors": None}
    again = merged_file(merged, {("softmax", "forward", "float16"): some}, [m("softmax", 8.0)], {"date": "d2"},
                        {"arch": 90})
    assert [(x["run"], x["op"]) for x in again["measurements"]] == [(0, "rmsnorm"), (1, "softmax"), (2, "softmax")]


def test_median_of_rounds_takes_each_keys_median_and_drops_what_a_round_lacks():
    from tune_rows import median_of_rounds
    rounds = [{"register": 10.0, "narrow": 9.0, "staged": None, "wide": 5.0},
              {"register": 12.0, "narrow": 11.0, "staged": None},
              {"register": 11.0, "narrow": 7.0, "staged": None, "wide": 6.0}]
    assert median_of_rounds(rounds) == {"register": 11.0, "narrow": 9.0, "staged": None}
    assert median_of_rounds([{"one": 3.0, "two": None}, {"one": 2.0, "two": 4.0}]) == {"one": 3.0, "two": None}
    assert median_of_rounds([{"fine_chunks": 1.0}, {}]) == {}
    assert median_of_rounds([{"register": 4.0}]) == {"register": 4.0}


def test_rounds_below_one_are_refused(capsys):
    from tune_rows import main
    with pytest.raises(SystemExit) as refused:
        main(["--rounds", "0"])
    assert refused.value.code == 2
    assert "--rounds must be at least 1, not 0" in capsys.readouterr().err


def test_changed_lines_names_each_line_that_moved_appeared_or_went_to_never():
    from tune_rows import changed_lines
    before = {"narrow_max_vectors": {"rmsnorm": {"forward": {"float16": 1024, "bfloat16": 1024, "float32": None}}}}
    after = {"narrow_max_vectors": {"rmsnorm": {"forward": {"float16": None, "bfloat16": 32, "float32": None}}},
             "one_kernel_min_vectors": {"layernorm": {"backward": {"float32": 4096}}}}
    assert changed_lines(before, after) == [
        "narrow_max_vectors rmsnorm forward float16: 1024 -> never",
        "narrow_max_vectors rmsnorm forward bfloat16: 1024 -> 32",
        "one_kernel_min_vectors layernorm backward float32: none -> 4096"]
    assert changed_lines(after, after) == []
