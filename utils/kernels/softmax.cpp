// Fused softmax over the last dimension, CPU kernels and operator registration (lesson 06,
// notebooks/06_fused_softmax.ipynb).
//
// utils/kernels/__init__.py builds this file with torch.utils.cpp_extension. It defines
//   WB_NAMESPACE      the operator namespace of this build (one per source hash, so two builds can be loaded in
//                     the same process: the lesson loads a vectorized and a scalar build side by side);
//   CPU_CAPABILITY_*  the instruction set at::vec::Vectorized may use (AVX2 or AVX512, with the matching -m flags).
//                     Without it Vectorized<float> silently falls back to plain loops over an array: the kernel
//                     still compiles and is still correct, it is just several times slower;
//   -fopenmp          at::parallel_for is header code too: without OpenMP it runs every row on one thread;
//   WB_ACCURATE_EXP   (optional) use Vectorized::exp(), Sleef's 1-ulp exp that torch.softmax uses, instead of the
//                     fast exp_u20: the lesson builds both to compare the kernel with torch like for like.
//
// Only light headers are included (no torch/extension.h, no pybind11): the build takes seconds, not a minute.

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#ifndef WB_NAMESPACE
#define WB_NAMESPACE workbook_kernels
#endif
// TORCH_LIBRARY pastes its namespace argument with ##, which would not expand a macro: one level of indirection
// expands WB_NAMESPACE first.
#define WB_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)
#define WB_LIBRARY_IMPL(ns, k, m) TORCH_LIBRARY_IMPL(ns, k, m)

namespace {

using at::vec::Vectorized;

// The type arithmetic runs in: bfloat16 is loaded into float lanes, float and double stay as they are.
template <typename T> struct AccType { using type = T; };
template <> struct AccType<at::BFloat16> { using type = float; };
template <typename T> using acc_t = typename AccType<T>::type;

template <typename T>
inline Vectorized<acc_t<T>> vload(const T* p) { return Vectorized<T>::loadu(p); }
template <>
inline Vectorized<float> vload(const at::BFloat16* p) {
  Vectorized<float> out;
  at::vec::load_to_float(p, out);  // 8 (AVX2) or 16 (AVX512) bfloat16 -> float lanes
  return out;
}
template <typename T>
inline void vstore(T* p, const Vectorized<acc_t<T>>& v) { v.store(p); }
template <>
inline void vstore(at::BFloat16* p, const Vectorized<float>& v) {
  at::vec::convert_from_float<at::BFloat16>(v, v).store(p, Vectorized<float>::size());
}

// exp_u20 is ATen's fast float exp (max error 20 ulp, about 1e-6 relative; its flash-attention kernel uses it).
// With WB_ACCURATE_EXP the build uses exp(), Sleef's expf_u10 (1 ulp), the exp of torch's own softmax kernel.
// Either way an exp is not one instruction: a range reduction, a polynomial of degree 5-7 and a rebuild of the
// exponent, some 15-25 vector instructions per vector, against one for a max or an add.
#if defined(WB_ACCURATE_EXP)
inline Vectorized<float> vexp(const Vectorized<float>& v) { return v.exp(); }
constexpr const char* kExpName = "exp (Sleef u10, 1 ulp)";
#else
inline Vectorized<float> vexp(const Vectorized<float>& v) { return v.exp_u20(); }
constexpr const char* kExpName = "exp_u20 (20 ulp)";
#endif
inline Vectorized<double> vexp(const Vectorized<double>& v) { return v.exp(); }

template <typename A>
inline A nan_max(A a, A b) { return (a > b || std::isnan(a)) ? a : b; }  // NaN wins, like torch.max

template <typename A>
inline A reduce_max(const Vectorized<A>& v) {
  return at::vec::vec_reduce_all<A>([](Vectorized<A>& a, Vectorized<A>& b) { return at::vec::maximum(a, b); }, v);
}
template <typename A>
inline A reduce_sum(const Vectorized<A>& v) {
  return at::vec::vec_reduce_all<A>([](Vectorized<A>& a, Vectorized<A>& b) { return a + b; }, v);
}

// A row whose maximum is not finite (all -inf, any +inf, any NaN) gives NaN everywhere, exactly as torch.softmax.
template <typename T>
inline void fill_nan(T* y, int64_t n) {
  std::fill(y, y + n, T(std::numeric_limits<acc_t<T>>::quiet_NaN()));
}

template <typename T>
acc_t<T> row_max(const T* x, int64_t n) {
  using A = acc_t<T>;
  using V = Vectorized<A>;
  constexpr int64_t W = V::size();
  const A neg_inf = -std::numeric_limits<A>::infinity();
  A m = neg_inf;
  int64_t i = 0;
  if (n >= 4 * W) {  // four independent accumulators keep the max units busy
    V m0(neg_inf), m1(neg_inf), m2(neg_inf), m3(neg_inf);
    for (; i + 4 * W <= n; i += 4 * W) {
      m0 = at::vec::maximum(m0, vload(x + i));
      m1 = at::vec::maximum(m1, vload(x + i + W));
      m2 = at::vec::maximum(m2, vload(x + i + 2 * W));
      m3 = at::vec::maximum(m3, vload(x + i + 3 * W));
    }
    m = reduce_max(at::vec::maximum(at::vec::maximum(m0, m1), at::vec::maximum(m2, m3)));
  }
  for (; i < n; ++i) m = nan_max(m, A(x[i]));
  return m;
}

// BEGIN three-pass
// Three passes over a row, one exp per element: (1) the max, (2) e = exp(x - max) stored into y while summing,
// (3) y *= 1/sum. Passes 2 and 3 hit x and y in L1/L2, so memory sees one read of x and one write of y.
template <typename T>
void row_three_pass(const T* x, T* y, int64_t n, acc_t<T> m) {  // m = row_max(x, n), computed by the caller
  using A = acc_t<T>;
  using V = Vectorized<A>;
  constexpr int64_t W = V::size();
  if (!std::isfinite(m)) return fill_nan(y, n);
  const V vm(m);
  V s0(A(0)), s1(A(0));
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    const V e0 = vexp(vload(x + i) - vm);
    const V e1 = vexp(vload(x + i + W) - vm);
    vstore(y + i, e0);
    vstore(y + i + W, e1);
    s0 = s0 + e0;
    s1 = s1 + e1;
  }
  A s = reduce_sum(s0 + s1);
  for (; i < n; ++i) {
    const A e = std::exp(A(x[i]) - m);
    y[i] = T(e);
    s += e;
  }
  const A inv = A(1) / s;
  const V vinv(inv);
  for (i = 0; i + W <= n; i += W) vstore(y + i, vload(y + i) * vinv);
  for (; i < n; ++i) y[i] = T(A(y[i]) * inv);
}

// Short rows go a block at a time (a block = as many rows as fit in 32 KiB, the L1 data cache): first the maxima of
// every row in the block, a pure streaming read that keeps the memory system busy, then exp and normalise row by row
// while the block sits in L1/L2. Blocking was kept because, out of cache, it timed faster than row by row for
// n <= 4096 when it was written (one AVX2 EPYC); the notebook does not time the row-by-row form, and its section 5
// measures this kernel's fraction of the copy on your machine. A row longer than a block is its own block (its max
// pass streams the whole row first anyway).
template <typename T>
void three_pass_rows(const T* xp, T* yp, int64_t rows, int64_t n) {
  using A = acc_t<T>;
  const int64_t block = std::max<int64_t>(1, int64_t{32768} / int64_t(sizeof(T)) / n);
  const int64_t blocks = (rows + block - 1) / block;
  const int64_t grain = std::max<int64_t>(1, int64_t{32768} / (block * n));  // >= ~32K elements per task
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    std::vector<A> maxima(block);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r0 = b * block, r1 = std::min(rows, r0 + block);
      for (int64_t r = r0; r < r1; ++r) maxima[r - r0] = row_max(xp + r * n, n);
      for (int64_t r = r0; r < r1; ++r) row_three_pass(xp + r * n, yp + r * n, n, maxima[r - r0]);
    }
  });
}
// END three-pass

// BEGIN online
// Online softmax (Milakov and Gimelshein, 2018): one read pass keeps, per vector lane, a running max m and the sum
// s of exp(x - m), rescaling s by exp(m_old - m_new) whenever the max grows; then one pass writes
// y = exp(x - M) / S. Memory sees x twice at most and never stores an intermediate, at the price of a second exp.
template <typename T>
void row_online(const T* x, T* y, int64_t n) {
  using A = acc_t<T>;
  using V = Vectorized<A>;
  constexpr int64_t W = V::size();
  const A neg_inf = -std::numeric_limits<A>::infinity();
  const V vneg_inf(neg_inf), vzero(A(0));
  V m(neg_inf), s(A(0));
  int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {  // one rescale per four vectors, not per element
    const V a = vload(x + i), b = vload(x + i + W), c = vload(x + i + 2 * W), d = vload(x + i + 3 * W);
    const V mn = at::vec::maximum(m, at::vec::maximum(at::vec::maximum(a, b), at::vec::maximum(c, d)));
    const V ref = V::blendv(mn, vzero, mn == vneg_inf);  // a lane that has seen only -inf keeps s = 0, not NaN
    s = s * vexp(m - ref) + ((vexp(a - ref) + vexp(b - ref)) + (vexp(c - ref) + vexp(d - ref)));
    m = mn;
  }
  // merge the lanes with the same rule (a lane still at -inf has s = 0 and contributes 0 * exp(-inf) = 0),
  // then the tail that did not fill four vectors
  A M = reduce_max(m);
  for (int64_t j = i; j < n; ++j) M = nan_max(M, A(x[j]));
  if (!std::isfinite(M)) return fill_nan(y, n);
  A S = reduce_sum(s * vexp(m - V(M)));
  for (int64_t j = i; j < n; ++j) S += std::exp(A(x[j]) - M);
  const A inv = A(1) / S;
  const V vM(M), vinv(inv);
  int64_t j = 0;
  for (; j + W <= n; j += W) vstore(y + j, vexp(vload(x + j) - vM) * vinv);
  for (; j < n; ++j) y[j] = T(std::exp(A(x[j]) - M) * inv);
}
// END online

// BEGIN naive
// The textbook loop, one scalar at a time: the baseline that shows what vectorization buys.
template <typename T>
void row_naive(const T* x, T* y, int64_t n) {
  using A = acc_t<T>;
  A m = -std::numeric_limits<A>::infinity();
  for (int64_t i = 0; i < n; ++i) m = nan_max(m, A(x[i]));
  A s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(A(x[i]) - m);
  for (int64_t i = 0; i < n; ++i) y[i] = T(std::exp(A(x[i]) - m) / s);
}
// END naive

// BEGIN backward
// dL/dx = y * (g - sum(g * y)) for each row: one dot product, then one fused elementwise pass.
template <typename T>
void row_backward(const T* g, const T* y, T* gx, int64_t n) {
  using A = acc_t<T>;
  using V = Vectorized<A>;
  constexpr int64_t W = V::size();
  V d0(A(0)), d1(A(0));
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    d0 = at::vec::fmadd(vload(g + i), vload(y + i), d0);
    d1 = at::vec::fmadd(vload(g + i + W), vload(y + i + W), d1);
  }
  A dot = reduce_sum(d0 + d1);
  for (; i < n; ++i) dot += A(g[i]) * A(y[i]);
  const V vdot(dot);
  for (i = 0; i + W <= n; i += W) vstore(gx + i, vload(y + i) * (vload(g + i) - vdot));
  for (; i < n; ++i) gx[i] = T(A(y[i]) * (A(g[i]) - dot));
}
// END backward

void check_input(const at::Tensor& t, const char* op, const char* arg) {
  TORCH_CHECK(t.device().is_cpu(), op, ": expected ", arg, " on the CPU, got a tensor on ", t.device(),
              " (the CUDA kernel lives in softmax.cu: build it with kernels.build(cuda=True))");
  const auto dt = t.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kDouble || dt == at::kBFloat16, op, ": expected ", arg,
              " of dtype float32, float64 or bfloat16, got ", dt);
  TORCH_CHECK(t.dim() >= 1, op, ": expected ", arg,
              " with at least 1 dimension (softmax runs over the last one), got a 0-d tensor");
  TORCH_CHECK(t.is_contiguous(), op, ": expected a contiguous ", arg, " (the kernel walks rows of the last ",
              "dimension in memory order), got sizes ", t.sizes(), " with strides ", t.strides(),
              "; call .contiguous() first");
}

// Rows are independent: at::parallel_for splits them over torch's intra-op threads, at least ~32K elements each
// so that small tensors do not pay for waking threads.
template <typename F>
void for_each_row(int64_t rows, int64_t n, const F& f) {
  const int64_t grain = std::max<int64_t>(1, int64_t{32768} / std::max<int64_t>(n, 1));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) f(r);
  });
}

// The forward kernel writes into `y`, a contiguous tensor of x's shape and dtype that already exists.
void softmax_into(const at::Tensor& x, at::Tensor& y, int64_t algorithm) {
  TORCH_CHECK(algorithm >= 0 && algorithm <= 2,
              "fused softmax: algorithm must be 0 (auto), 1 (three-pass) or 2 (online), got ", algorithm);
  if (x.numel() == 0) return;
  const int64_t n = x.size(-1);
  const int64_t rows = x.numel() / n;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "fused_softmax_forward", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    scalar_t* yp = y.mutable_data_ptr<scalar_t>();
    // auto: one exp per element where y can hold the unnormalized exps; bfloat16 would round them twice, so it
    // takes the online path, which rounds once.
    const bool online = algorithm == 2 || (algorithm == 0 && std::is_same_v<scalar_t, at::BFloat16>);
    if (online) {
      for_each_row(rows, n, [&](int64_t r) { row_online(xp + r * n, yp + r * n, n); });
    } else {
      three_pass_rows(xp, yp, rows, n);
    }
  });
}

at::Tensor softmax_forward(const at::Tensor& x, int64_t algorithm) {
  check_input(x, "fused softmax", "x");
  at::Tensor y = at::empty_like(x);  // a fresh output: above glibc's mmap threshold, fresh pages to fault in
  softmax_into(x, y, algorithm);
  return y;
}

// The same kernel into a caller's buffer (like torch's out= variants): no allocation, no first-touch page faults,
// so it can be timed against the copy into an existing buffer, the course's memory roof.
void softmax_forward_out(const at::Tensor& x, at::Tensor out, int64_t algorithm) {
  check_input(x, "fused softmax", "x");
  check_input(out, "fused softmax", "out");
  TORCH_CHECK(out.sizes() == x.sizes() && out.scalar_type() == x.scalar_type(),
              "fused softmax: out must have x's shape and dtype, got ", out.sizes(), " ", out.scalar_type(),
              " for x ", x.sizes(), " ", x.scalar_type());
  TORCH_CHECK(!out.is_same(x), "fused softmax: out must not be x itself (the kernel reads x after writing out)");
  softmax_into(x, out, algorithm);
}

at::Tensor softmax_naive(const at::Tensor& x) {
  check_input(x, "naive softmax", "x");
  at::Tensor y = at::empty_like(x);
  if (x.numel() == 0) return y;
  const int64_t n = x.size(-1);
  const int64_t rows = x.numel() / n;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "naive_softmax", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    scalar_t* yp = y.mutable_data_ptr<scalar_t>();
    for_each_row(rows, n, [&](int64_t r) { row_naive(xp + r * n, yp + r * n, n); });
  });
  return y;
}

at::Tensor softmax_backward(const at::Tensor& grad_y, const at::Tensor& y) {
  check_input(grad_y, "fused softmax backward", "grad_y");
  check_input(y, "fused softmax backward", "y");
  TORCH_CHECK(grad_y.sizes() == y.sizes(), "fused softmax backward: grad_y and y must have the same shape, got ",
              grad_y.sizes(), " and ", y.sizes());
  TORCH_CHECK(grad_y.scalar_type() == y.scalar_type(), "fused softmax backward: grad_y and y must have the same ",
              "dtype, got ", grad_y.scalar_type(), " and ", y.scalar_type());
  at::Tensor gx = at::empty_like(y);
  if (y.numel() == 0) return gx;
  const int64_t n = y.size(-1);
  const int64_t rows = y.numel() / n;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, y.scalar_type(), "fused_softmax_backward", [&] {
    const scalar_t* gp = grad_y.const_data_ptr<scalar_t>();
    const scalar_t* yp = y.const_data_ptr<scalar_t>();
    scalar_t* op = gx.mutable_data_ptr<scalar_t>();
    for_each_row(rows, n, [&](int64_t r) { row_backward(gp + r * n, yp + r * n, op + r * n, n); });
  });
  return gx;
}

// BEGIN exp-only
// y = exp(x) with the same vector exp as the softmax kernels, one read and one write per element: the arithmetic
// ceiling of any softmax built on this exp (lesson 06 measures it in cache against the copy into a buffer).
at::Tensor exp_only(const at::Tensor& x) {
  check_input(x, "exp_only", "x");
  TORCH_CHECK(x.scalar_type() == at::kFloat, "exp_only: expected x of dtype float32, got ", x.scalar_type());
  at::Tensor y = at::empty_like(x);
  const float* xp = x.const_data_ptr<float>();
  float* yp = y.mutable_data_ptr<float>();
  const int64_t n = x.numel();
  constexpr int64_t W = Vectorized<float>::size();
  at::parallel_for(0, n, 32768, [&](int64_t begin, int64_t end) {
    int64_t i = begin;
    for (; i + W <= end; i += W) vexp(Vectorized<float>::loadu(xp + i)).store(yp + i);
    for (; i < end; ++i) yp[i] = std::exp(xp[i]);
  });
  return y;
}
// END exp-only

std::string build_info() {
#if defined(CPU_CAPABILITY_AVX512)
  const std::string cap = "AVX512";
#elif defined(CPU_CAPABILITY_AVX2)
  const std::string cap = "AVX2";
#else
  const std::string cap = "DEFAULT (no CPU_CAPABILITY define: Vectorized is a plain loop over an array)";
#endif
#if defined(_OPENMP)
  const std::string par = "OpenMP, " + std::to_string(at::get_num_threads()) + " threads";
#else
  const std::string par = "none (built without -fopenmp: at::parallel_for runs serially)";
#endif
  return "cpu_capability=" + cap + ", Vectorized<float>::size()=" + std::to_string(Vectorized<float>::size()) +
         ", parallel=" + par + ", float exp=" + kExpName;
}

}  // namespace

WB_LIBRARY(WB_NAMESPACE, m) {
  m.def("softmax_forward(Tensor x, int algorithm=0) -> Tensor");
  m.def("softmax_forward_out(Tensor x, Tensor(a!) out, int algorithm=0) -> ()");
  m.def("softmax_backward(Tensor grad_y, Tensor y) -> Tensor");
  m.def("softmax_naive(Tensor x) -> Tensor");
  m.def("exp_only(Tensor x) -> Tensor");
  m.def("build_info() -> str", &build_info);
}

WB_LIBRARY_IMPL(WB_NAMESPACE, CPU, m) {
  m.impl("softmax_forward", &softmax_forward);
  m.impl("softmax_forward_out", &softmax_forward_out);
  m.impl("softmax_backward", &softmax_backward);
  m.impl("softmax_naive", &softmax_naive);
  m.impl("exp_only", &exp_only);
}
