// The Python module `avo_ops._C`. Importing it runs the static TORCH_LIBRARY
// registrations of the linked op sources; it exposes built_with_cuda(), cpu_threads(),
// set_row_version(), last_row_version(), set_chunk_size(), last_rows_per_chunk(),
// set_cluster_blocks(), last_cluster_block_threads(), last_fixed_group_threads(),
// set_tiled_kernels(), last_tiled_kernels(), set_row_prefetch(), last_row_prefetch(),
// cpu_copies(), set_cpu_copy(), cpu_copy() and last_cpu_copy() (for tests and
// benchmarks), and the ops' entry points for the functional API
// (generated/python_calls.cpp).
#include <Python.h>

#include <ATen/Parallel.h>

#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include <avo/cpu_copies.h>
#include <avo/row_version.h>

namespace {

PyObject* built_with_cuda(PyObject*, PyObject*) {
#if defined(AVO_WITH_CUDA)
  Py_RETURN_TRUE;
#else
  Py_RETURN_FALSE;
#endif
}

// cpu_threads(): how many threads an at::parallel_for of this extension runs on, as the
// CPU kernels call it (csrc/map_binding.h, csrc/row_binding.h): one task per intra-op
// thread of torch, and the distinct threads that ran them. 1 where the extension was
// built without torch's parallel backend (setup.py, openmp_flags).
PyObject* cpu_threads(PyObject*, PyObject*) {
  std::mutex mutex;
  std::set<int> threads;
  Py_BEGIN_ALLOW_THREADS
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    const std::lock_guard<std::mutex> lock(mutex);
    threads.insert(at::get_thread_num());
  });
  Py_END_ALLOW_THREADS
  return PyLong_FromSize_t(threads.size());
}

// The text of `function`'s str argument, or nullptr with a TypeError set.
const char* str_argument(const char* function, PyObject* arg) {
  const char* text = PyUnicode_Check(arg) ? PyUnicode_AsUTF8(arg) : nullptr;
  if (text == nullptr && !PyErr_Occurred()) PyErr_Format(PyExc_TypeError, "%s: expected a str", function);
  return text;
}

// A name the set_* functions take, and the value it stands for.
template <typename T>
struct Named {
  const char* name;
  T value;
};

// Sets `target` to the value of `choices` that `arg` names, or raises a ValueError of
// `function` naming the `kind` of choice and every name it takes.
template <typename T, size_t N>
PyObject* set_named(const char* function, const char* kind, PyObject* arg, const Named<T> (&choices)[N], T& target) {
  const char* name = str_argument(function, arg);
  if (name == nullptr) return nullptr;
  std::string expected;
  for (size_t i = 0; i < N; ++i) {
    if (std::strcmp(name, choices[i].name) == 0) {
      target = choices[i].value;
      Py_RETURN_NONE;
    }
    expected += std::string(i == 0 ? "'" : i + 1 == N ? " or '" : ", '") + choices[i].name + "'";
  }
  PyErr_Format(PyExc_ValueError, "%s: unknown %s '%s'; expected %s", function, kind, name, expected.c_str());
  return nullptr;
}

const Named<avo::RowVersion> kVersions[] = {{"auto", avo::RowVersion::kAuto},
                                            {"register", avo::RowVersion::kRegister},
                                            {"pipelined", avo::RowVersion::kPipelined},
                                            {"wide", avo::RowVersion::kWide},
                                            {"narrow", avo::RowVersion::kNarrow},
                                            {"staged", avo::RowVersion::kStaged},
                                            {"cluster", avo::RowVersion::kCluster},
                                            {"global", avo::RowVersion::kGlobal},
                                            {"tiled", avo::RowVersion::kTiled}};

// set_row_version(name): "auto", "register", "pipelined", "wide", "narrow", "staged", "cluster",
// "global" or "tiled".
PyObject* set_row_version(PyObject*, PyObject* arg) {
  return set_named("set_row_version", "version", arg, kVersions, avo::forced<avo::RowVersion>());
}

// The name `choices` give `value`, as a Python string ("auto" where none does).
template <typename T, size_t N>
PyObject* name_of(const Named<T> (&choices)[N], T value) {
  for (const auto& c : choices)
    if (c.value == value) return PyUnicode_FromString(c.name);
  return PyUnicode_FromString("auto");
}

// last_row_version(): the name of the version the last CUDA row-op call took ("auto"
// before any).
PyObject* last_row_version(PyObject*, PyObject*) { return name_of(kVersions, avo::last_row_version()); }

// set_chunk_size(name): "auto", "fine" or "coarse" (avo::ChunkSize).
PyObject* set_chunk_size(PyObject*, PyObject* arg) {
  static const Named<avo::ChunkSize> sizes[] = {
      {"auto", avo::ChunkSize::kAuto}, {"fine", avo::ChunkSize::kFine}, {"coarse", avo::ChunkSize::kCoarse}};
  return set_named("set_chunk_size", "size", arg, sizes, avo::forced<avo::ChunkSize>());
}

// last_rows_per_chunk(): the rows a chunk of the per-column sums of the last CUDA row-op
// call (0 when it had none, or before any).
PyObject* last_rows_per_chunk(PyObject*, PyObject*) { return PyLong_FromLongLong(avo::last_rows_per_chunk()); }

// set_cluster_blocks(name): "auto", "full" or "small" (avo::ClusterBlocks).
PyObject* set_cluster_blocks(PyObject*, PyObject* arg) {
  static const Named<avo::ClusterBlocks> blocks[] = {
      {"auto", avo::ClusterBlocks::kAuto}, {"full", avo::ClusterBlocks::kFull}, {"small", avo::ClusterBlocks::kSmall}};
  return set_named("set_cluster_blocks", "blocks", arg, blocks, avo::forced<avo::ClusterBlocks>());
}

// set_row_prefetch(name): "auto", "off" or "on" (avo::RowPrefetch).
const Named<avo::RowPrefetch> kPrefetches[] = {
    {"auto", avo::RowPrefetch::kAuto}, {"off", avo::RowPrefetch::kOff}, {"on", avo::RowPrefetch::kOn}};
PyObject* set_row_prefetch(PyObject*, PyObject* arg) {
  return set_named("set_row_prefetch", "prefetch", arg, kPrefetches, avo::forced<avo::RowPrefetch>());
}

// last_row_prefetch(): whether the last CUDA row-op call prefetched its rows ("on", "off";
// "auto" where it could not, or before any).
PyObject* last_row_prefetch(PyObject*, PyObject*) { return name_of(kPrefetches, avo::last_row_prefetch()); }

// last_cluster_block_threads(): the threads of a block of the last CUDA row-op call that
// took the cluster version (0 before any).
PyObject* last_cluster_block_threads(PyObject*, PyObject*) { return PyLong_FromLong(avo::last_cluster_block_threads()); }

// last_fixed_group_threads(): the group width of the last CUDA row-op call where its
// kernel fixes it when compiled, else 0.
PyObject* last_fixed_group_threads(PyObject*, PyObject*) { return PyLong_FromLong(avo::last_fixed_group_threads()); }

const Named<avo::TiledKernels> kTiledKernels[] = {
    {"auto", avo::TiledKernels::kAuto}, {"two", avo::TiledKernels::kTwo}, {"one", avo::TiledKernels::kOne}};

// set_tiled_kernels(name): "auto", "two" or "one" (avo::TiledKernels).
PyObject* set_tiled_kernels(PyObject*, PyObject* arg) {
  return set_named("set_tiled_kernels", "kernels", arg, kTiledKernels, avo::forced<avo::TiledKernels>());
}

// last_tiled_kernels(): "two" or "one", the kernels of the last CUDA row-op call that took
// the tiled version ("auto" before any).
PyObject* last_tiled_kernels(PyObject*, PyObject*) { return name_of(kTiledKernels, avo::last_tiled_kernels()); }

const struct {
  const char* name;
  avo::CpuCopy copy;
} kCpuCopies[] = {{"avx512", avo::CpuCopy::kAvx512}, {"avx2", avo::CpuCopy::kAvx2}, {"baseline", avo::CpuCopy::kBaseline}};

// cpu_copies(): the names of the copies of the CPU kernels this build has and this machine
// can run, best first (avo/cpu_copies.h).
PyObject* cpu_copies(PyObject*, PyObject*) {
  PyObject* names = PyList_New(0);
  for (const auto& c : kCpuCopies) {
    if (names == nullptr || !avo::cpu_copy_available(c.copy)) continue;
    PyObject* name = PyUnicode_FromString(c.name);
    if (name == nullptr || PyList_Append(names, name) < 0) Py_CLEAR(names);
    Py_XDECREF(name);
  }
  return names;
}

// set_cpu_copy(name): "auto" or one of cpu_copies().
PyObject* set_cpu_copy(PyObject*, PyObject* arg) {
  const char* name = str_argument("set_cpu_copy", arg);
  if (name == nullptr) return nullptr;
  if (std::strcmp(name, "auto") == 0) {
    avo::forced_cpu_copy() = avo::CpuCopy::kAuto;
    Py_RETURN_NONE;
  }
  std::string available;
  for (const auto& c : kCpuCopies) {
    if (!avo::cpu_copy_available(c.copy)) continue;
    if (std::strcmp(name, c.name) == 0) {
      avo::forced_cpu_copy() = c.copy;
      Py_RETURN_NONE;
    }
    available += std::string(", '") + c.name + "'";
  }
  PyErr_Format(PyExc_ValueError, "set_cpu_copy: '%s' is not a copy of the CPU kernels this build and machine run; expected 'auto'%s",
               name, available.c_str());
  return nullptr;
}

// The name of a copy ("auto" for kAuto).
PyObject* cpu_copy_name(avo::CpuCopy copy) {
  for (const auto& c : kCpuCopies)
    if (c.copy == copy) return PyUnicode_FromString(c.name);
  return PyUnicode_FromString("auto");
}

// cpu_copy(): the name of the copy the CPU kernels run now.
PyObject* cpu_copy(PyObject*, PyObject*) { return cpu_copy_name(avo::cpu_copy()); }

// last_cpu_copy(): the name of the copy the last CPU kernel ran ("auto" before any).
PyObject* last_cpu_copy(PyObject*, PyObject*) { return cpu_copy_name(avo::last_cpu_copy().load()); }

PyMethodDef methods[] = {
    {"built_with_cuda", built_with_cuda, METH_NOARGS, "True when the extension has CUDA kernels."},
    {"cpu_threads", cpu_threads, METH_NOARGS,
     "How many threads the CPU kernels run on now: torch.get_num_threads(), or 1 where the extension was built "
     "without torch's parallel backend. For tests."},
    {"set_row_version", set_row_version, METH_O,
     "Makes every CUDA row-op call take one kernel version ('register', 'pipelined', 'wide', 'narrow', 'staged', 'cluster', "
     "'global', 'tiled') where it can, or the dispatch table's choice ('auto'). For tests and benchmarks."},
    {"last_row_version", last_row_version, METH_NOARGS,
     "The version the last CUDA row-op call took ('auto' before any). For tests and benchmarks."},
    {"set_chunk_size", set_chunk_size, METH_O,
     "Makes every CUDA row-op call with per-column sums take fine or coarse chunks of rows ('fine', 'coarse'), or "
     "the dispatch table's choice ('auto'). For tests and benchmarks."},
    {"last_rows_per_chunk", last_rows_per_chunk, METH_NOARGS,
     "The rows a chunk of the per-column sums of the last CUDA row-op call (0 without them). For tests and "
     "benchmarks."},
    {"set_cluster_blocks", set_cluster_blocks, METH_O,
     "Makes every CUDA row-op call that takes the cluster version without per-column sums take full or small "
     "blocks ('full', 'small'), or the dispatch table's choice ('auto'). For tests and benchmarks."},
    {"set_row_prefetch", set_row_prefetch, METH_O,
     "Makes every CUDA row-op call that takes the cluster version with per-column sums prefetch the rows of its "
     "chunks into L2 ('on') or not ('off'), or do as the dispatch table says ('auto'). For tests and benchmarks."},
    {"last_row_prefetch", last_row_prefetch, METH_NOARGS,
     "Whether the last CUDA row-op call prefetched its rows ('on', 'off'; 'auto' where it took no version that "
     "can, or before any). For tests and benchmarks."},
    {"last_cluster_block_threads", last_cluster_block_threads, METH_NOARGS,
     "The threads of a block of the last CUDA row-op call that took the cluster version (0 before any). For tests "
     "and benchmarks."},
    {"last_fixed_group_threads", last_fixed_group_threads, METH_NOARGS,
     "The threads of a group of the last CUDA row-op call where it took a register, lean or narrow rows' kernel "
     "compiled for that width, else 0 (0 before any). For tests and benchmarks."},
    {"set_tiled_kernels", set_tiled_kernels, METH_O,
     "Makes every CUDA row-op call that takes the tiled version run it as two kernels or as one ('two', 'one'; one "
     "where all its blocks fit on the GPU at once), or as the dispatch table says ('auto'). For tests and "
     "benchmarks."},
    {"last_tiled_kernels", last_tiled_kernels, METH_NOARGS,
     "The kernels of the last CUDA row-op call that took the tiled version ('two', 'one'; 'auto' before any). For "
     "tests and benchmarks."},
    {"cpu_copies", cpu_copies, METH_NOARGS,
     "The copies of the CPU kernels this build has and this machine can run, best first ('avx512', 'avx2', "
     "'baseline'). For tests and benchmarks."},
    {"set_cpu_copy", set_cpu_copy, METH_O,
     "Makes every CPU kernel run one of cpu_copies(), or the best this machine has ('auto'). For tests and "
     "benchmarks."},
    {"cpu_copy", cpu_copy, METH_NOARGS, "The copy of the CPU kernels that calls run now. For tests and benchmarks."},
    {"last_cpu_copy", last_cpu_copy, METH_NOARGS,
     "The copy of the CPU kernels the last CPU call ran ('auto' before any). For tests."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", "avo_ops compiled ops", -1, methods};

}  // namespace

namespace avo::python {
PyMethodDef* op_calls();
}

PyMODINIT_FUNC PyInit__C() {
  PyObject* created = PyModule_Create(&module);
  if (created != nullptr && PyModule_AddFunctions(created, avo::python::op_calls()) < 0) Py_CLEAR(created);
  return created;
}
