// A direct Python entry point to the fused op, for prepared calls (bonkernels/plan.py):
//
//   bonkernels._C.prepare(k, code, clamp_delta, clip_lo, clip_hi, mean_scale, small_groups, eps,
//                         max_group_size, bank, bank_index) -> capsule
//   bonkernels._C.prepared_call(capsule, values, offsets, deltas) -> Tensor
//
// The same C++ as torch.ops.bonkernels.advantages_packed (op.h), reached without torch's
// dispatcher, whose Python entry converts each of the op's 14 arguments on every call: a few
// microseconds, a large share of a small call's host time. The scalars and the bank are converted
// once, when the plan is made. Eager only: under torch.compile a plan calls the registered op.
#include <Python.h>

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <memory>
#include <optional>

#include "op.h"

namespace {

constexpr const char* kCapsuleName = "bonkernels.prepared_advantages";

// Everything of a call but its tensors (the bank is kept alive by the capsule).
struct Prepared {
  int64_t k = 1, code = 0, small_groups = 0;
  std::optional<double> clamp_delta;
  double clip_lo = 0, clip_hi = 0, eps = 0;
  bool mean_scale = true;
  std::optional<int64_t> max_group_size;
  std::optional<at::Tensor> bank, bank_index;
};

void destroy(PyObject* capsule) {
  delete static_cast<Prepared*>(PyCapsule_GetPointer(capsule, kCapsuleName));
}

std::optional<at::Tensor> optional_tensor(PyObject* obj, const char* what) {
  if (obj == Py_None) return std::nullopt;
  TORCH_CHECK_TYPE(THPVariable_Check(obj), "bonkernels: ", what, " must be a tensor or None");
  return THPVariable_Unpack(obj);
}

const at::Tensor& tensor(PyObject* obj, const char* what) {
  TORCH_CHECK_TYPE(THPVariable_Check(obj), "bonkernels: ", what, " must be a tensor");
  return THPVariable_Unpack(obj);
}

PyObject* prepare(PyObject* /*module*/, PyObject* args) {
  HANDLE_TH_ERRORS
  long long k = 0, code = 0, small_groups = 0;
  double clip_lo = 0, clip_hi = 0, eps = 0;
  int mean_scale = 1;
  PyObject *clamp_delta = nullptr, *max_group_size = nullptr, *bank = nullptr, *bank_index = nullptr;
  if (!PyArg_ParseTuple(args, "LLOddpLdOOO", &k, &code, &clamp_delta, &clip_lo, &clip_hi, &mean_scale,
                        &small_groups, &eps, &max_group_size, &bank, &bank_index)) {
    return nullptr;
  }
  auto prepared = std::make_unique<Prepared>();
  prepared->k = k;
  prepared->code = code;
  prepared->small_groups = small_groups;
  prepared->clip_lo = clip_lo;
  prepared->clip_hi = clip_hi;
  prepared->eps = eps;
  prepared->mean_scale = mean_scale != 0;
  if (clamp_delta != Py_None) {
    const double value = PyFloat_AsDouble(clamp_delta);
    if (value == -1.0 && PyErr_Occurred()) return nullptr;
    prepared->clamp_delta = value;
  }
  if (max_group_size != Py_None) {
    const long long value = PyLong_AsLongLong(max_group_size);
    if (value == -1 && PyErr_Occurred()) return nullptr;
    prepared->max_group_size = value;
  }
  prepared->bank = optional_tensor(bank, "bank");
  prepared->bank_index = optional_tensor(bank_index, "bank_index");
  PyObject* capsule = PyCapsule_New(prepared.get(), kCapsuleName, destroy);
  if (capsule != nullptr) prepared.release();
  return capsule;
  END_HANDLE_TH_ERRORS
}

PyObject* prepared_call(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "prepared_call(prepared, values, offsets, deltas) takes 4 arguments");
    return nullptr;
  }
  auto* p = static_cast<Prepared*>(PyCapsule_GetPointer(args[0], kCapsuleName));
  if (p == nullptr) return nullptr;
  return THPVariable_Wrap(bk_op::advantages_packed(
      tensor(args[1], "values"), tensor(args[2], "offsets"), optional_tensor(args[3], "deltas"), p->k, p->code,
      p->clamp_delta, p->clip_lo, p->clip_hi, p->mean_scale, p->small_groups, p->eps, p->max_group_size, p->bank,
      p->bank_index));
  END_HANDLE_TH_ERRORS
}

}  // namespace

PyMethodDef bk_prepared_call_methods[] = {
    {"prepare", prepare, METH_VARARGS, "Everything of a call of the fused op but its tensors (a capsule)."},
    {"prepared_call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(prepared_call)), METH_FASTCALL,
     "The fused op on (values, offsets, deltas) with a prepared capsule's arguments."},
    {nullptr, nullptr, 0, nullptr}};
