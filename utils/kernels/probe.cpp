// `make doctor`'s probe (lesson 06): can an error raised by a C++ extension built on this machine come back to
// Python as a RuntimeError? It builds with the same compiler and flags as softmax.cpp and fails the same way
// softmax.cpp's input check does (TORCH_CHECK with the tensor's sizes and strides in the message). Where the
// compiler and the installed torch disagree about how C++ exceptions cross the library boundary, the process dies
// instead; utils.kernels.raw_errors() runs such calls in a child process, so that is reported, not fatal.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#ifndef WB_NAMESPACE
#define WB_NAMESPACE workbook_probe
#endif
#define WB_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)

namespace {

at::Tensor check_contiguous(const at::Tensor& t) {
  TORCH_CHECK(t.is_contiguous(), "probe: expected a contiguous tensor, got sizes ", t.sizes(), " with strides ",
              t.strides(), "; call .contiguous() first");
  return t;
}

}  // namespace

WB_LIBRARY(WB_NAMESPACE, m) {
  m.def("check_contiguous(Tensor t) -> Tensor", &check_contiguous);
}
