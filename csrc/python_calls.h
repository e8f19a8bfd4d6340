// The Python entry points of the ops (avo_ops._C.<op>; csrc/generated/python_calls.cpp
// lists them): reading the arguments against the op's C++ signature, the call and its result.
//
// The functional API (avo_ops.<op>) calls them instead of torch.ops.avo.<op>. That path,
// torch's OpOverloadPacket and OpOverload in Python, then the parsing of the arguments
// against the schema, costs more host time than the whole torch call (F.silu, say) on a
// small tensor. An entry point takes plain arguments only: torch.Tensor or nn.Parameter,
// None for a missing optional tensor, a Python float, bool, int or str, every argument
// given in order, no torch function mode active. For anything else it returns
// NotImplemented and the caller takes torch.ops.avo.<op>, which handles
// __torch_function__, the modes, conversions and the errors for arguments of the wrong type.
// The op itself runs through the dispatcher either way: autograd, tracing, fake tensors
// and torch dispatch modes see the same call.
#pragma once

#include <Python.h>

#include <cstdint>
#include <optional>
#include <tuple>
#include <utility>

#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/string_view.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

namespace avo::python {

// False where torch.ops.avo.<op> must take the call: a torch function mode is active.
inline bool plain_call() { return !at::impl::torch_function_mode_enabled(); }

// Each read_argument returns false where the value is not a plain argument of that type.
// A tensor is plain when it is a torch.Tensor or nn.Parameter: a subclass may override
// __torch_function__.
inline bool read_argument(PyObject* value, const at::Tensor*& out) {
  if (!THPVariable_CheckExact(value)) return false;
  out = &THPVariable_Unpack(value);
  return true;
}

inline bool read_argument(PyObject* value, std::optional<at::Tensor>& out) {
  if (value == Py_None) {
    out.reset();
    return true;
  }
  if (!THPVariable_CheckExact(value)) return false;
  out = THPVariable_Unpack(value);
  return true;
}

// A float argument: a Python float (torch.ops converts an int or a 0-dim tensor).
inline bool read_argument(PyObject* value, double& out) {
  if (!PyFloat_CheckExact(value)) return false;
  out = PyFloat_AS_DOUBLE(value);
  return true;
}

inline bool read_argument(PyObject* value, bool& out) {
  if (!PyBool_Check(value)) return false;
  out = value == Py_True;
  return true;
}

inline bool read_argument(PyObject* value, int64_t& out) {
  if (!PyLong_CheckExact(value)) return false;
  int overflow = 0;
  const long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
  if (overflow != 0 || (number == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    return false;
  }
  out = number;
  return true;
}

// The view stays valid while the str lives: the caller holds it for the whole call.
inline bool read_argument(PyObject* value, c10::string_view& out) {
  if (!PyUnicode_Check(value)) return false;
  Py_ssize_t size = 0;
  const char* text = PyUnicode_AsUTF8AndSize(value, &size);
  if (text == nullptr) {
    PyErr_Clear();
    return false;
  }
  out = c10::string_view(text, size_t(size));
  return true;
}

inline PyObject* wrap(at::Tensor&& tensor) { return THPVariable_Wrap(std::move(tensor)); }

// Steals `item`; false (with the Python error set) when it is nullptr.
inline bool set_item(PyObject* tuple, Py_ssize_t k, PyObject* item) {
  if (item == nullptr) return false;
  PyTuple_SET_ITEM(tuple, k, item);
  return true;
}

template <typename... Tensors>
PyObject* wrap(std::tuple<Tensors...>&& tensors) {
  PyObject* tuple = PyTuple_New(sizeof...(Tensors));
  if (tuple == nullptr) return nullptr;
  bool wrapped = true;
  Py_ssize_t k = 0;
  std::apply([&](auto&... t) { ((wrapped = wrapped && set_item(tuple, k++, wrap(std::move(t)))), ...); }, tensors);
  if (!wrapped) {
    Py_DECREF(tuple);
    return nullptr;
  }
  return tuple;
}

// How a parameter of the op's C++ signature is read from Python (into Stored, with
// read_argument) and handed to the op (pass).
template <typename Param>
struct Argument {
  using Stored = Param;  // double, bool, int64_t, c10::string_view
  static Param pass(const Stored& value) { return value; }
};
template <>
struct Argument<const at::Tensor&> {
  using Stored = const at::Tensor*;
  static const at::Tensor& pass(Stored value) { return *value; }
};
template <>
struct Argument<const std::optional<at::Tensor>&> {
  using Stored = std::optional<at::Tensor>;
  static const Stored& pass(const Stored& value) { return value; }
};

// Reads the arguments against the op's signature, calls it with the GIL released, as
// torch's own bindings do (other Python threads run meanwhile; a Python kernel the
// dispatcher reaches takes the GIL back), and wraps its result. NotImplemented where the
// arguments are not all plain.
template <typename Return, typename... Params, size_t... I>
PyObject* call_op(const c10::TypedOperatorHandle<Return(Params...)>& op, PyObject* const* args,
                  std::index_sequence<I...>) {
  std::tuple<typename Argument<Params>::Stored...> stored;
  if (!(read_argument(args[I], std::get<I>(stored)) && ...)) Py_RETURN_NOTIMPLEMENTED;
  struct ReleasedGil {
    PyThreadState* state = PyEval_SaveThread();
    ~ReleasedGil() { PyEval_RestoreThread(state); }  // also when the op throws, for HANDLE_TH_ERRORS
  };
  auto result = [&] {
    const ReleasedGil released;
    return op.call(Argument<Params>::pass(std::get<I>(stored))...);
  }();
  return wrap(std::move(result));
}

template <typename Return, typename... Params>
PyObject* call_op(const c10::TypedOperatorHandle<Return(Params...)>& op, PyObject* const* args, Py_ssize_t count) {
  if (count != Py_ssize_t(sizeof...(Params)) || !plain_call()) Py_RETURN_NOTIMPLEMENTED;
  return call_op(op, args, std::index_sequence_for<Params...>{});
}

// The METH_FASTCALL entry point of the op whose typed handle Handle() returns.
template <auto Handle>
PyObject* entry_point(PyObject*, PyObject* const* args, Py_ssize_t count) {
  HANDLE_TH_ERRORS
  return call_op(Handle(), args, count);
  END_HANDLE_TH_ERRORS
}

// entry_point<Handle> as a PyMethodDef takes it (METH_FASTCALL: the arguments arrive as an
// array, without a tuple built for them).
template <auto Handle>
PyCFunction entry_point_method() {
  return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&entry_point<Handle>));
}

}  // namespace avo::python
