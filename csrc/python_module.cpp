// The Python module `avo_ops._C`. Importing it runs the static TORCH_LIBRARY
// registrations of the linked op sources; it exposes one function, built_with_cuda().
#include <Python.h>

namespace {

PyObject* built_with_cuda(PyObject*, PyObject*) {
#if defined(AVO_WITH_CUDA)
  Py_RETURN_TRUE;
#else
  Py_RETURN_FALSE;
#endif
}

PyMethodDef methods[] = {
    {"built_with_cuda", built_with_cuda, METH_NOARGS, "True when the extension has CUDA kernels."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", "avo_ops compiled ops", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__C() { return PyModule_Create(&module); }
