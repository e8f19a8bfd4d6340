"""The parts of benchmarks/ that need no GPU: the sweep plan and its byte counts, the case
table against torch on CPU, the Markdown and PNG reports of a small synthetic result, the
host-overhead script on CPU, the comparison of two runs."""
from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys

import pytest
import torch
from conftest import needs_cuda

import avo_ops  # noqa: F401  (registers torch.ops.avo, which the cases call)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import bench_cases  # noqa: E402
import bench_cpu  # noqa: E402
import bench_host_overhead  # noqa: E402
import merge_runs  # noqa: E402
import bench_ops  # noqa: E402
import bench_report  # noqa: E402
import bench_transforms  # noqa: E402
import compare_runs  # noqa: E402
import liger_baselines  # noqa: E402

E = 1 << 26  # the default element count per input tensor


def planned(args, op, direction, dtype, n):
    return next(p for p in bench_ops.plan_cases(args)
                if (p.case.op, p.case.direction, p.dtype, p.row_length)
                == (op, direction, dtype, n))


# --------------------------------------------------------------------------- the plan

def test_default_sweep_fills_the_element_count_for_every_row_length():
    args = bench_ops.parse_args([])
    assert args.shapes == [(E // n, n) for n in (256, 1024, 2048, 4096, 8192, 16384, 65536, 262144)]
    assert args.shapes[0] == (262144, 256) and args.shapes[-1] == (256, 262144)
    assert args.dtypes == [torch.bfloat16, torch.float16, torch.float32]
    assert args.dirs == ["fwd", "bwd"]
    assert set(args.ops) == set(bench_cases.op_names()) - {"gelu_tanh"}
    plan = bench_ops.plan_cases(args)
    assert len(plan) == len(args.ops) * 2 * 3 * 8
    assert all(math.prod(p.shape) == E for p in plan)


@pytest.mark.parametrize("sweep_args", [
    "--no-compile --no-liger",
    "--no-compile --no-liger --row-lengths 256,2048,8192 --dtypes bf16,fp32",
    "--no-liger --ops=layernorm,softmax --dirs bwd --elements 1048576",
    "--no-compile --quick",
])
def test_gpu_tune_baselines_sweep_the_cases_of_the_avo_sweeps(sweep_args):
    # scripts/gpu_tune.sh runs its baselines as bench_ops.py --no-avo $(case_args): the
    # report sets avo against them case by case, so they must plan the same cases.
    script = os.path.join(ROOT, "scripts", "gpu_tune.sh")
    out = subprocess.run(
        ["bash", "-c", f'eval "$(sed -n "/^case_args()/,/^}}/p" {script})"; case_args'],
        env={**os.environ, "SWEEP_ARGS": sweep_args},
        capture_output=True, text=True, check=True).stdout.split()
    assert "--no-compile" not in out and "--no-liger" not in out

    def cases(argv):
        return [(p.case.op, p.case.direction, p.dtype, p.shape)
                for p in bench_ops.plan_cases(bench_ops.parse_args(argv))]
    assert cases(["--no-avo", *out]) == cases(sweep_args.split())


def test_every_avo_op_has_a_forward_and_a_backward_case():
    import avo_ops
    for op in avo_ops.OPS:
        for direction in ("fwd", "bwd"):
            assert bench_cases.find_case(op, direction)


def test_rows_rows_override_and_explicit_shapes():
    args = bench_ops.parse_args(["--row-lengths", "3000,4096", "--elements", "1000000"])
    assert args.shapes == [(333, 3000), (244, 4096)]  # 1000000 // N rows
    assert bench_ops.parse_args(["--rows", "8", "--row-lengths", "1024"]).shapes == [(8, 1024)]
    assert bench_ops.parse_args(["--shapes", "16x4096,2x3x5"]).shapes == [(16, 4096), (2, 3, 5)]
    quick = bench_ops.parse_args(["--quick"])
    assert quick.shapes == [(16384, 4096)]
    assert quick.ops == bench_ops.QUICK_OPS
    assert quick.dtypes == [torch.bfloat16, torch.float32]
    assert bench_ops.parse_args(["--quick", "--row-lengths", "256"]).shapes == [(E // 256, 256)]
    with pytest.raises(SystemExit):
        bench_ops.parse_args(["--ops", "no_such_op"])


def test_channel_norm_lays_rows_out_as_batch_x_64_channels():
    args = bench_ops.parse_args(["--ops", "channel_norm", "--dirs", "fwd"])
    assert [p.shape for p in bench_ops.plan_cases(args)][:8] == [
        (E // 256 // 64, 64, 256), (E // 1024 // 64, 64, 1024), (E // 2048 // 64, 64, 2048),
        (E // 4096 // 64, 64, 4096), (E // 8192 // 64, 64, 8192), (E // 16384 // 64, 64, 16384),
        (E // 65536 // 64, 64, 65536), (4, 64, 262144)]
    assert bench_cases.channel_layout((24, 100)) == (3, 8, 100)  # 8 = gcd(24, 64)


def test_bytes_per_case_match_the_hand_count():
    args = bench_ops.parse_args([])
    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
    # layernorm backward: dy, x read, dx written (3 tensors); w read, dw, db written.
    assert planned(args, "layernorm", "bwd", bf16, 1024).nbytes == 2 * (3 * E + 3 * 1024)
    # rmsnorm forward: x read, y written; w read.
    assert planned(args, "rmsnorm", "fwd", fp32, 256).nbytes == 4 * (2 * E + 256)
    # add_layernorm backward: grad_hidden, grad_y, x, residual read, grad_x, grad_residual
    # written; w read, dw, db written.
    assert planned(args, "add_layernorm", "bwd", fp16, 4096).nbytes == 2 * (6 * E + 3 * 4096)
    # gelu backward: dy, x read, dx written.
    assert planned(args, "gelu", "bwd", bf16, 65536).nbytes == 2 * 3 * E
    # channel_norm forward: x read, y written; gamma, beta (length C = 64) read.
    assert planned(args, "channel_norm", "fwd", fp32, 262144).nbytes == 4 * (2 * E + 2 * 64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_every_case_computes_what_its_eager_reference_computes_on_cpu(dtype):
    torch.manual_seed(0)
    for case in bench_cases.CASES:
        inputs = case.make_inputs(case.layout((8, 256)), dtype, torch.device("cpu"))
        check = bench_ops.compare(case.avo(*inputs), case.eager(*inputs), dtype)
        assert check["ok"], (case.label, check)


def test_liger_covers_only_benchmarked_cases():
    for op, direction in liger_baselines.COVERED:
        assert bench_cases.find_case(op, direction)


def test_missing_liger_gives_one_notice_and_no_baseline():
    try:
        import liger_kernel  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("liger-kernel is installed here")
    notices = bench_ops.Notices()
    assert bench_ops.load_liger(notices) == {}
    assert len(notices.items) == 1 and "Liger-Kernel baseline skipped" in notices.items[0]


# --------------------------------------------------------------------------- reports

COPY = 4000.0


def result(gbps, nbytes):
    return {"median_us": round(nbytes / (gbps * 1e3), 3), "gbps": gbps,
            "frac_copy": round(gbps / COPY, 4), "first_call_s": 0.5}


def synthetic_results() -> dict:
    """layernorm fwd/bwd with all four implementations (Liger missing at the longest row),
    gelu fwd without Liger; bf16 and fp32; N = 256, 4096, 65536."""
    rows = []
    for op, direction in [("layernorm", "fwd"), ("layernorm", "bwd"), ("gelu", "fwd")]:
        for dtype in ("bf16", "fp32"):
            for i, n in enumerate((256, 4096, 65536)):
                nbytes = 2 * (1 << 20) * (2 if dtype == "bf16" else 4)
                res = {"avo": result(1000.0 * (i + 1), nbytes),
                       "eager": result(1500.0, nbytes),
                       "compile": result(2000.0, nbytes)}
                if op == "layernorm":
                    res["liger"] = (result(2500.0, nbytes) if n < 65536
                                    else {"error": "RuntimeError: n = 65536 too long"})
                rows.append({"op": op, "dir": direction, "shape": [(1 << 20) // n, n],
                             "rows": (1 << 20) // n, "row_length": n, "dtype": dtype,
                             "bytes": nbytes, "buffers": 2, "results": res,
                             "check": {"ok": True, "max_abs_diff": 0.0},
                             "speedup_vs_best_other": bench_report.speedup(res)})
    return {"gpu": "Test GPU", "torch": "2.x", "cuda": "13.0", "triton": "3.6.0",
            "liger": "0.8.5", "python": "3.12", "date": "2026-01-01T00:00:00+00:00",
            "command": "bench_ops.py --out x", "impls": ["avo", "eager", "compile", "liger"],
            "reps": 50, "warmup": 10, "elements": 1 << 20, "l2_bytes": 60 << 20,
            "copy": [{"size_mib": 2048, "gbps": COPY}], "copy_gbps": COPY, "wall_s": 12.0,
            "notices": ["liger unavailable for layernorm.fwd: RuntimeError: too long"],
            "rows": rows}


def test_results_name_the_commit_given_or_the_checkouts(monkeypatch):
    """--commit names the tree where its .git is not the files' history; without it the
    results name `git describe` of the checkout."""
    monkeypatch.setattr(bench_ops.torch.cuda, "get_device_name", lambda: "a GPU")
    monkeypatch.setattr(bench_ops, "l2_bytes", lambda: 1 << 20)
    args = bench_ops.argparse.Namespace(commit="abc1234", reps=1, warmup=0, sweep_elements=1)
    assert bench_ops.run_meta(args, [], ["avo"], False)["avo_ops_commit"] == "abc1234"
    args.commit = None
    assert bench_ops.run_meta(args, [], ["avo"], False)["avo_ops_commit"] == bench_ops.git_commit()


def test_markdown_report_of_a_synthetic_run():
    md = bench_report.markdown_report(synthetic_results())
    assert md.startswith("# avo_ops benchmark — Test GPU\n")
    assert "Liger-Kernel 0.8.5" in md and "ratios to copy use 4000 GB/s" in md
    for section in ("## Summary", "## layernorm fwd", "## layernorm bwd", "## gelu fwd",
                    "## Notices"):
        assert section in md
    assert ("| dtype | N | shape | avo GB/s | avo/copy | eager GB/s | compile GB/s | "
            "liger GB/s | avo vs best |") in md
    # avo 1000 GB/s against the best other, Liger's 2500; avo 3000 where Liger failed.
    assert "| bf16 | 256 | 4096x256 | 1000 | 0.25 | 1500 | 2000 | 2500 | 0.40x |" in md
    assert "| fp32 | 65536 | 16x65536 | 3000 | 0.75 | 1500 | 2000 | – | 1.50x |" in md
    assert "| fp32 | 4096 | 256x4096 | 2000 | 0.50 | 1500 | 2000 | – | 1.00x |" in md  # gelu
    # Summary of layernorm fwd bf16: ratios 0.4, 0.8, 1.5 -> geomean (0.48)^(1/3).
    geomean = (0.4 * 0.8 * 1.5) ** (1 / 3)
    assert (f"| layernorm | fwd | bf16 | 256–65536 | 0.25–0.75 | {geomean:.2f}x | "
            "0.40x (N=256) | 1.50x (N=65536) | 1 of 3 |") in md
    text = bench_report.text_table(synthetic_results())
    assert text.splitlines()[0].split() == [
        "op", "dir", "shape", "dtype", "avo", "GB/s", "avo/copy", "eager", "GB/s", "compile",
        "GB/s", "liger", "GB/s", "avo", "vs", "best"]
    assert len(text.splitlines()) == 2 + 18


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(path: str) -> tuple[int, int]:
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == PNG_MAGIC and head[12:16] == b"IHDR", path
    return struct.unpack(">II", head[16:24])


def test_target_lines_count_the_rows_that_meet_each_target():
    """Synthetic avo: 1000/2000/3000 GB/s at N = 256/4096/65536 against a 4000 GB/s copy;
    compile 2000 GB/s, Liger 2500 (layernorm only, none at 65536): within 3% are the
    N = 65536 rows and gelu at N = 4096 (as fast as compile)."""
    lines = bench_report.target_lines(synthetic_results())
    assert lines[0] == "- Forwards at ≥ 90% of copy: 0 of 12."
    assert lines[1] == "- Backwards at ≥ 80% of copy: 0 of 6."
    assert lines[2] == "- Within 3% of the best other implementation or faster: 8 of 18."
    assert lines[3] == "- Geometric mean of avo over torch.compile, norm and softmax rows: 0.91x (12 rows)."
    assert lines[4] == ("- Geometric mean of avo over torch.compile, norm and softmax rows with N ≤ 16384: "
                        "0.71x (8 rows).")
    assert lines[5] == "- Geometric mean of avo over torch.compile, elementwise rows: 0.91x (6 rows)."
    # layernorm alone: no row at its line; within 3% only at N = 65536 (1.5x compile), 2 of 6
    # rows per direction.
    assert lines[6] == ("- Norm and softmax rows: forwards at ≥ 90% of copy 0 of 6, backwards at ≥ 80% of "
                        "copy 0 of 6, within 3% of the best other 4 of 12.")


def test_by_length_table_splits_the_rows_at_16384():
    """avo at 0.25 and 0.50 of copy for N = 256 and 4096, 0.75 for 65536, in both dtypes;
    over compile's 2000 GB/s 0.5x, 1x and 1.5x, whose geometric mean is 0.75^(1/3). gelu has
    no backward rows."""
    table = bench_report.by_length_table(synthetic_results())
    assert table[0] == ("| op | forward, N ≤ 16384 | forward, N > 16384 | backward, N ≤ 16384 | "
                        "backward, N > 16384 | over torch.compile (fwd / bwd) |")
    mean = f"{0.75 ** (1 / 3):.2f}×"
    assert table[2] == f"| layernorm | 0.25–0.50 | 0.75–0.75 | 0.25–0.50 | 0.75–0.75 | {mean} / {mean} |"
    assert table[3] == f"| gelu | 0.25–0.50 | 0.75–0.75 | – | – | {mean} / – |"
    assert len(table) == 4
    assert "## By row length" in bench_report.markdown_report(synthetic_results())


def test_misses_table_names_each_row_under_a_target_with_its_kernel():
    """Synthetic avo at 0.25/0.50/0.75 of copy misses every copy target; against Liger's
    2500 GB/s (layernorm, N < 65536) it is 0.40x and 0.80x, against compile's 2000 (gelu)
    0.50x at N = 256, so those rows also miss "best". The kernel a row recorded is shown,
    "–" where it has none (gelu; runs from before the record)."""
    results = synthetic_results()
    for row in results["rows"]:
        if row["op"] == "layernorm":
            row["kernel"] = "cluster 256" if row["row_length"] == 65536 else "register"
    table = bench_report.misses_table(results)
    assert table[0] == "| op | dir | dtype | N | avo/copy | avo vs best | misses | avo kernel |"
    body = table[2:]
    assert len(body) == 18
    assert body[0] == "| layernorm | fwd | bf16 | 256 | 0.250 | 0.40x | copy, best | register |"
    assert body[1] == "| layernorm | fwd | bf16 | 4096 | 0.500 | 0.80x | copy, best | register |"
    assert body[2] == "| layernorm | fwd | bf16 | 65536 | 0.750 | 1.50x | copy | cluster 256 |"
    assert body[6] == "| layernorm | bwd | bf16 | 256 | 0.250 | 0.40x | copy, best | register |"
    assert body[12] == "| gelu | fwd | bf16 | 256 | 0.250 | 0.50x | copy, best | – |"
    assert body[13] == "| gelu | fwd | bf16 | 4096 | 0.500 | 1.00x | copy | – |"
    assert "## Rows that miss a target" in bench_report.markdown_report(results)


def test_misses_table_of_rows_that_meet_every_target():
    """A backward at exactly 0.80 of copy and 0.97x the best other meets both targets; a
    forward at 0.89 misses its copy target only."""
    results = synthetic_results()
    for row in results["rows"]:
        row["results"]["avo"]["frac_copy"] = 0.80 if row["dir"] == "bwd" else 0.95
        row["speedup_vs_best_other"] = 0.97
    assert bench_report.misses_table(results) == ["Every row meets the targets."]
    results["rows"][0]["results"]["avo"]["frac_copy"] = 0.89
    assert bench_report.misses_table(results)[2:] == [
        "| layernorm | fwd | bf16 | 256 | 0.890 | 0.97x | copy | – |"]


def test_avo_kernel_names_the_row_version_with_its_blocks_or_kernels(monkeypatch):
    """The label bench_ops records for a row op's avo call, from what the extension says
    the call took; the elementwise ops have no row version."""
    ext = avo_ops._C
    monkeypatch.setattr(ext, "last_cluster_block_threads", lambda: 256)
    monkeypatch.setattr(ext, "last_tiled_kernels", lambda: "one")
    layernorm = bench_cases.find_case("layernorm", "bwd")
    for version, fixed, prefetch, label in (("cluster", 0, "off", "cluster 256"),
                                            ("cluster", 0, "on", "cluster 256 prefetch"),
                                            ("tiled", 0, "auto", "tiled one"), ("wide", 0, "auto", "wide"),
                                            ("register", 0, "auto", "register"),
                                            ("narrow", 16, "auto", "narrow fixed 16")):
        monkeypatch.setattr(ext, "last_row_version", lambda version=version: version)
        monkeypatch.setattr(ext, "last_fixed_group_threads", lambda fixed=fixed: fixed)
        monkeypatch.setattr(ext, "last_row_prefetch", lambda prefetch=prefetch: prefetch)
        assert bench_ops.avo_kernel(layernorm) == label
    assert bench_ops.avo_kernel(bench_cases.find_case("gelu", "fwd")) is None


@needs_cuda
@pytest.mark.parametrize("version", ["cluster", "tiled", "register"])
def test_bench_case_records_the_kernel_its_avo_call_took(version):
    """On the GPU: a layernorm backward forced onto a version records that version (with
    the cluster rows' block threads and the tiled version's kernels), as the extension
    reports it right after the call; gelu records none."""
    if version == "cluster" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the cluster rows need sm_90")
    timer = bench_ops.Timer(reps=2, warmup=1)
    notices = bench_ops.Notices()
    case = bench_cases.find_case("layernorm", "bwd")
    # register rows with parameter gradients hold up to 8192 bf16 elements
    planned = bench_ops.Planned(case, torch.bfloat16, (64, 4096 if version == "register" else 16384))
    avo_ops._C.set_row_version(version)
    try:
        row = bench_ops.bench_case(planned, bench_ops.case_impls(case, ["avo"], {}), timer, 4000.0, notices)
    finally:
        avo_ops._C.set_row_version("auto")
    assert row["check"]["ok"], row
    assert avo_ops._C.last_row_version() == version
    assert row["kernel"].split()[0] == version
    if version == "cluster":
        assert row["kernel"] == f"cluster {avo_ops._C.last_cluster_block_threads()}"
    if version == "tiled":
        assert row["kernel"] == f"tiled {avo_ops._C.last_tiled_kernels()}"
    gelu = bench_cases.find_case("gelu", "fwd")
    row = bench_ops.bench_case(bench_ops.Planned(gelu, torch.bfloat16, (64, 1024)),
                               bench_ops.case_impls(gelu, ["avo"], {}), timer, 4000.0, notices)
    assert row["kernel"] is None


def test_baselines_from_another_run_fill_the_missing_implementations(tmp_path):
    full = synthetic_results()
    quick = json.loads(json.dumps(full))  # a run without compile and Liger
    quick["impls"] = ["avo", "eager"]
    quick["command"] = "bench_ops.py --no-compile --no-liger"
    for row in quick["rows"]:
        row["results"] = {k: v for k, v in row["results"].items() if k in ("avo", "eager")}
        row["speedup_vs_best_other"] = bench_report.speedup(row["results"])
    merged = bench_report.merge_baselines(quick, full)
    assert [r["results"] for r in merged["rows"]] == [r["results"] for r in full["rows"]]
    assert [r["speedup_vs_best_other"] for r in merged["rows"]] == [r["speedup_vs_best_other"] for r in full["rows"]]
    assert merged["impls"] == ["avo", "eager", "compile", "liger"]
    md = bench_report.markdown_report(merged)
    assert "The compile, liger columns come from another run" in md and "`bench_ops.py --out x`" in md
    (tmp_path / "quick.json").write_text(json.dumps(quick))
    (tmp_path / "full.json").write_text(json.dumps(full))
    assert bench_report.main([str(tmp_path / "quick.json"), "--baselines", str(tmp_path / "full.json"),
                              "--no-plots"]) == 0
    assert (tmp_path / "results.md").read_text() == md


def test_baselines_from_two_runs_each_fill_what_the_earlier_left_missing(tmp_path):
    full = synthetic_results()

    def only(impls, command):
        run = json.loads(json.dumps(full))
        run["impls"], run["command"] = list(impls), command
        for row in run["rows"]:
            row["results"] = {k: v for k, v in row["results"].items() if k in impls}
        return run

    quick = only(("avo", "eager"), "bench_ops.py --no-compile --no-liger")
    with_compile = only(("avo", "eager", "compile"), "bench_ops.py --no-liger")
    with_compile["rows"][0]["results"]["compile"] = {**with_compile["rows"][0]["results"]["compile"], "gbps": 1.0}
    paths = []
    for name, run in (("quick", quick), ("compile", with_compile), ("full", full)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(run))
    assert bench_report.main([str(paths[0]), "--baselines", str(paths[1]), "--baselines", str(paths[2]),
                              "--no-plots"]) == 0
    md = (tmp_path / "results.md").read_text()
    assert "The compile columns come from another run" in md and "`bench_ops.py --no-liger`" in md
    assert "The liger columns come from another run" in md and "`bench_ops.py --out x`" in md
    # the first run that has an implementation gives it: compile from the second file
    merged = bench_report.merge_baselines(bench_report.merge_baselines(quick, with_compile), full)
    assert merged["rows"][0]["results"]["compile"]["gbps"] == 1.0
    assert merged["rows"][0]["results"]["liger"] == full["rows"][0]["results"]["liger"]
    assert [s["impls"] for s in merged["baselines_from"]] == [["compile"], ["liger"]]


def test_plots_of_a_synthetic_run_and_replot_from_json(tmp_path):
    pytest.importorskip("matplotlib")
    results = synthetic_results()
    paths = bench_report.plot_results(results, str(tmp_path / "plots"))
    assert sorted(os.path.basename(p) for p in paths) == [
        "gelu_fwd.png", "layernorm_bwd.png", "layernorm_fwd.png"]
    for path in paths:
        width, height = png_size(path)
        assert width > height > 100  # two dtype panels side by side
    # Redrawn from the saved JSON alone, into another folder.
    saved = tmp_path / "results.json"
    saved.write_text(json.dumps(results))
    assert bench_report.main([str(saved), "--out", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "results.md").read_text() == bench_report.markdown_report(results)
    for name in ("gelu_fwd.png", "layernorm_bwd.png", "layernorm_fwd.png"):
        png_size(str(tmp_path / "again" / "plots" / name))


def test_write_reports_writes_json_markdown_and_plots(tmp_path):
    pytest.importorskip("matplotlib")
    args = bench_ops.parse_args(["--out", str(tmp_path)])
    bench_ops.write_reports(args, synthetic_results())
    assert json.loads((tmp_path / "results.json").read_text()) == synthetic_results()
    assert (tmp_path / "results.md").read_text().startswith("# avo_ops benchmark")
    assert len(list((tmp_path / "plots").glob("*.png"))) == 3


def test_results_json_puts_one_case_a_line_and_reads_back_equal():
    results = synthetic_results()
    text = bench_report.results_json(results)
    assert json.loads(text) == results
    lines = text.splitlines()
    for row in results["rows"]:
        assert f"  {json.dumps(row)}," in lines or f"  {json.dumps(row)}" in lines
    # one line a header key, a row or a bracket: no value on a line of its own
    assert len(lines) == 2 + len(results) + sum(len(v) + 1 for v in results.values()
                                                if isinstance(v, list) and v and isinstance(v[0], dict))


# --------------------------------------------------------------------------- host overhead

def test_host_overhead_runs_on_cpu_and_reports_every_op(tmp_path, capsys):
    rc = bench_host_overhead.main(["--device", "cpu", "--iters", "4", "--warmup", "1",
                                   "--out", str(tmp_path)])
    assert rc == 0
    report = json.loads((tmp_path / "host_overhead.json").read_text())
    ops = {c.op for c in bench_host_overhead.op_table()}
    import avo_ops
    assert ops == set(avo_ops.OPS)
    assert {(r["op"], r["mode"]) for r in report["rows"]} == {
        (op, mode) for op in ops for mode in bench_host_overhead.MODES
        if mode != "fwd_ops" or op in bench_host_overhead.ATEN_CALLS}
    assert set(bench_host_overhead.ATEN_CALLS) == {
        "gelu", "silu", "layernorm", "rmsnorm", "softmax", "log_softmax"}
    for r in report["rows"]:
        assert r["avo_us"] > 0 and r["torch_us"] > 0
        assert r["ratio"] == pytest.approx(r["avo_us"] / r["torch_us"], rel=0.01, abs=0.001)
    md = (tmp_path / "host_overhead.md").read_text()
    assert md.count("\n| ") == 1 + len(report["rows"])  # header + one line per row
    assert "layernorm" in capsys.readouterr().out


@pytest.mark.parametrize("op", sorted(bench_host_overhead.ATEN_CALLS))
def test_host_overhead_aten_call_computes_what_the_torch_call_does(op):
    # fwd_ops sets torch.ops.avo.<op> against this aten call: the same op as the torch
    # call of the other modes, with the same inputs and eps.
    calls = next(c for c in bench_host_overhead.op_table() if c.op == op)
    torch.manual_seed(0)
    tensors = calls.case.make_inputs(calls.shape, torch.float32, torch.device("cpu"))
    aten_out = bench_host_overhead.ATEN_CALLS[op](*tensors)
    torch.testing.assert_close(aten_out, calls.case.eager(*tensors), rtol=0, atol=0)
    torch.testing.assert_close(aten_out, calls.case.avo(*tensors), rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- two runs

def _run_json(path, copy_gbps, cases):
    rows = [{"op": op, "dir": d, "dtype": dt, "shape": list(shape),
             "results": {"avo": {"gbps": gbps, "frac_copy": gbps / copy_gbps}}}
            for (op, d, dt, shape), gbps in cases.items()]
    path.write_text(json.dumps({"copy_gbps": copy_gbps, "rows": rows}))
    return str(path)


def test_compare_runs_divides_by_each_runs_copy_and_takes_the_geomean(tmp_path):
    """Two runs on GPUs whose copy bandwidth differs: each case is compared as a fraction of
    its own run's copy; the per-op line is the geometric mean of the ratios; a case in one
    run only is left out."""
    a, b = ("layernorm", "fwd", "bf16", (4, 8)), ("layernorm", "fwd", "bf16", (2, 16))
    before = _run_json(tmp_path / "before.json", 4000.0, {a: 2000.0, b: 1000.0, ("gelu", "fwd", "bf16", (4, 8)): 10.0})
    after = _run_json(tmp_path / "after.json", 2000.0, {a: 2000.0, b: 250.0})
    lines = compare_runs.compare(compare_runs.load_cases(before), compare_runs.load_cases(after))
    text = "\n".join(lines)
    # a: 0.50 -> 1.00 of copy (2x); b: 0.25 -> 0.125 (0.5x); geomean 1.0.
    assert "| layernorm | fwd | bf16 | 4x8 | 0.50 | 1.00 | 2.000 |" in text
    assert "| layernorm | fwd | bf16 | 2x16 | 0.25 | 0.12 | 0.500 |" in text
    assert "| layernorm | fwd | 2 | 1.000 | 0.500 | 2.000 |" in text
    assert "gelu" not in text


def test_compare_runs_shows_the_kernel_each_run_took_where_they_recorded_it(tmp_path):
    """With kernels recorded: the same kernel once, a changed one as "before -> after", "–"
    where a run has none; without any, no kernel column (runs from before the record)."""
    a, b, c = (("layernorm", "bwd", "bf16", (4, n)) for n in (8, 16, 32))
    before = json.loads(open(_run_json(tmp_path / "b.json", 1000.0, {a: 500.0, b: 500.0, c: 500.0})).read())
    after = json.loads(open(_run_json(tmp_path / "a.json", 1000.0, {a: 500.0, b: 600.0, c: 500.0})).read())
    for run, kernels in ((before, ("cluster 256", "tiled two", None)), (after, ("cluster 256", "tiled one", "register"))):
        for row, kernel in zip(run["rows"], kernels):
            row["kernel"] = kernel
    (tmp_path / "b.json").write_text(json.dumps(before))
    (tmp_path / "a.json").write_text(json.dumps(after))
    lines = compare_runs.compare(*(compare_runs.load_cases(str(tmp_path / f)) for f in ("b.json", "a.json")),
                                 *(compare_runs.load_kernels(str(tmp_path / f)) for f in ("b.json", "a.json")))
    assert lines[0].endswith("| after / before | avo kernel |")
    assert lines[2] == "| layernorm | bwd | bf16 | 4x8 | 0.50 | 0.50 | 1.000 | cluster 256 |"
    assert lines[3] == "| layernorm | bwd | bf16 | 4x16 | 0.50 | 0.60 | 1.200 | tiled two -> tiled one |"
    assert lines[4] == "| layernorm | bwd | bf16 | 4x32 | 0.50 | 0.50 | 1.000 | – -> register |"
    plain = compare_runs.compare(compare_runs.load_cases(str(tmp_path / "b.json")),
                                 compare_runs.load_cases(str(tmp_path / "a.json")))
    assert plain[2] == "| layernorm | bwd | bf16 | 4x8 | 0.50 | 0.50 | 1.000 |"


def test_merge_runs_keeps_each_runs_fractions_in_case_order_and_rejects_a_case_twice(tmp_path):
    """Runs of different cases become one file: rows in bench_cases order (layernorm's
    forward before its backward, gelu before both), each with its own run's fraction of
    copy; a case measured by two runs is an error, not a silent choice."""
    fwd, bwd, gelu = ("layernorm", "fwd", "bf16", (4, 8)), ("layernorm", "bwd", "bf16", (4, 8)), ("gelu", "fwd", "bf16", (4, 8))
    first = json.loads(open(_run_json(tmp_path / "a.json", 4000.0, {bwd: 2000.0, fwd: 1000.0})).read())
    second = json.loads(open(_run_json(tmp_path / "b.json", 2000.0, {gelu: 1500.0})).read())
    for run in (first, second):
        run.update(command="bench", impls=["avo"], copy=[{"gbps": run["copy_gbps"]}])
    merged = merge_runs.merge([first, second], ["a.json", "b.json"])
    assert [(r["op"], r["dir"]) for r in merged["rows"]] == [("gelu", "fwd"), ("layernorm", "fwd"), ("layernorm", "bwd")]
    assert [r["results"]["avo"]["frac_copy"] for r in merged["rows"]] == [0.75, 0.25, 0.5]
    assert merged["copy_gbps"] == 3000.0 and len(merged["copy"]) == 2
    assert [m["file"] for m in merged["merged_from"]] == ["a.json", "b.json"]
    with pytest.raises(ValueError, match="is in both a.json and b.json"):
        merge_runs.merge([first, first], ["a.json", "b.json"])


def test_cpu_benchmark_times_every_case_it_was_asked_for(tmp_path):
    out = tmp_path / "cpu.json"
    md = tmp_path / "cpu.md"
    assert bench_cpu.main(["--ops", "silu,layernorm", "--dtypes", "fp32,bf16", "--rows", "8", "--row-length", "64",
                           "--reps", "5", "--json", str(out), "--markdown", str(md)]) == 0
    data = json.loads(out.read_text())
    got = sorted((r["op"], r["dir"], r["dtype"]) for r in data["rows"])
    assert got == sorted((op, d, t) for op in ("silu", "layernorm") for d in ("fwd", "bwd") for t in ("fp32", "bf16"))
    assert all(r["avo_ms"] > 0 and r["torch_ms"] > 0 and r["avo_frac_copy"] > 0 for r in data["rows"])
    assert data["copy_gbps"] > 0
    assert md.read_text().count("\n| silu |") == 4


def test_cpu_benchmark_times_each_copy_of_the_cpu_kernels(tmp_path):
    from avo_ops import _C

    out = tmp_path / "cpu.json"
    assert bench_cpu.main(["--ops", "gelu", "--dirs", "fwd", "--dtypes", "bf16", "--rows", "8", "--row-length", "64",
                           "--reps", "3", "--cpu-copies", "all", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [r["copy"] for r in data["rows"]] == _C.cpu_copies() == data["cpu_copies"]
    assert all(r["avo_ms"] > 0 for r in data["rows"])
    assert _C.cpu_copy() == _C.cpu_copies()[0]  # back to the best one


def test_transforms_benchmark_times_every_mode(tmp_path, capsys):
    md = tmp_path / "transforms.md"
    assert bench_transforms.main(["--device", "cpu", "--ops", "layernorm,add_rmsnorm", "--rows", "8",
                                  "--row-length", "64", "--reps", "3", "--markdown", str(md)]) == 0
    table = md.read_text()
    for op in ("layernorm", "add_rmsnorm"):
        assert [m for m in bench_transforms.MODES if f"| {op} | {m} |" in table] == list(bench_transforms.MODES)
    with pytest.raises(SystemExit):
        bench_transforms.main(["--device", "cpu", "--modes", "hvp"])
    assert "known modes" in capsys.readouterr().err


def test_cpu_benchmark_names_a_copy_the_machine_does_not_run(capsys):
    with pytest.raises(SystemExit):
        bench_cpu.main(["--ops", "gelu", "--cpu-copies", "baseline,avx1024"])
    assert "do not run avx1024" in capsys.readouterr().err


def test_cpu_benchmark_names_an_unknown_op():
    with pytest.raises(SystemExit):
        bench_cpu.main(["--ops", "nope"])
