// Fused softmax over the last dimension, CUDA kernels (lesson 06, notebooks/06_fused_softmax.ipynb).
//
// The operator schemas are defined in softmax.cpp; this file adds their CUDA implementations
// (TORCH_LIBRARY_IMPL(..., CUDA, ...)). utils/kernels/__init__.py builds both files into one library with
// build(cuda=True) on a machine with a GPU, and compile-checks this file alone with nvcc where there is none.
//
// Design, for rows of n elements:
//   n <= 1024  one warp per row, four rows per 128-thread block: the reductions are warp shuffles only;
//   n >  1024  one block per row (256..1024 threads): warp shuffles, then one value per warp through shared memory.
// Both use online softmax: one read pass keeps a running max m and sum s (merged across lanes with the rule
// (m1, s1) + (m2, s2) = (m, s1 e^(m1-m) + s2 e^(m2-m)) with m = max(m1, m2)), then a second pass re-reads x, which
// mostly hits L2, and writes y = e^(x - m) / s. Loads and stores are 16-byte vectors when n and the pointers allow.

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <limits>

#ifndef WB_NAMESPACE
#define WB_NAMESPACE workbook_kernels
#endif
#define WB_LIBRARY_IMPL(ns, k, m) TORCH_LIBRARY_IMPL(ns, k, m)

namespace {

constexpr int kWarp = 32;
constexpr int kWarpRowsPerBlock = 4;  // warp-per-row kernel: 4 warps = 4 rows per block
constexpr int64_t kWarpMaxCols = 1024;

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

__device__ __forceinline__ float fast_exp(float x) { return __expf(x); }
__device__ __forceinline__ double fast_exp(double x) { return ::exp(x); }

template <typename A>
struct MaxSum {
  A m;  // running max
  A s;  // sum of exp(x - m)
};

// max that lets a NaN win, as torch.max does: a row holding a NaN must come out all NaN.
template <typename A>
__device__ __forceinline__ A nan_max(A a, A b) { return (a > b || isnan(a)) ? a : b; }

// Merge two partial (max, sum) pairs. When both maxima are -inf the sum stays 0 (exp(-inf - -inf) would be NaN).
template <typename A>
__device__ __forceinline__ MaxSum<A> merge(MaxSum<A> a, MaxSum<A> b) {
  const A m = nan_max(a.m, b.m);
  if (m == -std::numeric_limits<A>::infinity()) return {m, A(0)};
  return {m, a.s * fast_exp(a.m - m) + b.s * fast_exp(b.m - m)};
}

// Fold VEC new values into the running pair: one rescale per vector, not one per element.
template <typename A, int VEC>
__device__ __forceinline__ MaxSum<A> update(MaxSum<A> st, const A (&v)[VEC]) {
  A cmax = v[0];
#pragma unroll
  for (int k = 1; k < VEC; ++k) cmax = nan_max(cmax, v[k]);
  const A m = nan_max(cmax, st.m);  // NaN (if any) becomes m, and the sum below becomes NaN
  if (m == -std::numeric_limits<A>::infinity()) return st;
  A s = st.s * fast_exp(st.m - m);
#pragma unroll
  for (int k = 0; k < VEC; ++k) s += fast_exp(v[k] - m);
  return {m, s};
}

template <typename A>
__device__ __forceinline__ MaxSum<A> warp_reduce(MaxSum<A> st) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) {
    MaxSum<A> other{__shfl_xor_sync(0xffffffffu, st.m, offset), __shfl_xor_sync(0xffffffffu, st.s, offset)};
    st = merge(st, other);
  }
  return st;
}

template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Block-wide reduction: each warp reduces with shuffles, warp 0 reduces the per-warp results, all threads get it.
template <typename A>
__device__ __forceinline__ MaxSum<A> block_reduce(MaxSum<A> st) {
  __shared__ A shm_m[kWarp], shm_s[kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  st = warp_reduce(st);
  if (lane == 0) {
    shm_m[warp] = st.m;
    shm_s[warp] = st.s;
  }
  __syncthreads();
  if (warp == 0) {
    MaxSum<A> w{-std::numeric_limits<A>::infinity(), A(0)};
    if (lane < warps) w = {shm_m[lane], shm_s[lane]};
    w = warp_reduce(w);
    if (lane == 0) {
      shm_m[0] = w.m;
      shm_s[0] = w.s;
    }
  }
  __syncthreads();
  return {shm_m[0], shm_s[0]};
}

template <typename A>
__device__ __forceinline__ A block_sum(A v) {
  __shared__ A shm[kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  v = warp_sum(v);
  if (lane == 0) shm[warp] = v;
  __syncthreads();
  if (warp == 0) {
    A w = lane < warps ? shm[lane] : A(0);
    w = warp_sum(w);
    if (lane == 0) shm[0] = w;
  }
  __syncthreads();
  return shm[0];
}

template <typename T, typename A, int VEC>
__device__ __forceinline__ void load_vec(const T* p, A (&out)[VEC]) {
  const Pack<T, VEC> pack = *reinterpret_cast<const Pack<T, VEC>*>(p);
#pragma unroll
  for (int k = 0; k < VEC; ++k) out[k] = static_cast<A>(pack.v[k]);
}

template <typename T, typename A, int VEC>
__device__ __forceinline__ void store_vec(T* p, const A (&in)[VEC]) {
  Pack<T, VEC> pack;
#pragma unroll
  for (int k = 0; k < VEC; ++k) pack.v[k] = static_cast<T>(in[k]);
  *reinterpret_cast<Pack<T, VEC>*>(p) = pack;
}

// BEGIN cuda-row
// One row per group of `lanes` threads starting at thread `t`: the two passes shared by both forward kernels.
// Pass 1 reads the row from global memory into a running (max, sum) per thread, then merges them across the warp
// (or block). Pass 2 reads the row from global memory AGAIN: nothing is kept in registers or shared memory between
// the passes, so the second read is cheap only while the row is still in L1/L2 (long rows or many blocks in flight
// spill it to HBM: about 1.5x the minimal traffic).
template <typename T, int VEC, bool BLOCK>
__device__ __forceinline__ void softmax_row(const T* __restrict__ x, T* __restrict__ y, int64_t n, int t, int lanes) {
  using A = at::opmath_type<T>;
  MaxSum<A> st{-std::numeric_limits<A>::infinity(), A(0)};
  for (int64_t i = int64_t(t) * VEC; i < n; i += int64_t(lanes) * VEC) {
    A v[VEC];
    load_vec<T, A, VEC>(x + i, v);
    st = update<A, VEC>(st, v);
  }
  st = BLOCK ? block_reduce(st) : warp_reduce(st);
  const A inv = A(1) / st.s;  // all -inf row: m = -inf, s = 0 -> exp(NaN) * inf = NaN, as torch.softmax gives
  for (int64_t i = int64_t(t) * VEC; i < n; i += int64_t(lanes) * VEC) {
    A v[VEC];
    load_vec<T, A, VEC>(x + i, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[k] = fast_exp(v[k] - st.m) * inv;
    store_vec<T, A, VEC>(y + i, v);
  }
}
// END cuda-row

template <typename T, int VEC>
__global__ void softmax_forward_warp(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t n) {
  const int64_t row = int64_t(blockIdx.x) * kWarpRowsPerBlock + threadIdx.y;
  if (row >= rows) return;  // the whole warp leaves together, so the shuffles below stay full-warp
  softmax_row<T, VEC, false>(x + row * n, y + row * n, n, threadIdx.x, kWarp);
}

template <typename T, int VEC>
__global__ void softmax_forward_block(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  const int64_t row = blockIdx.x;
  softmax_row<T, VEC, true>(x + row * n, y + row * n, n, threadIdx.x, blockDim.x);
}

template <typename T, int VEC, bool BLOCK>
__device__ __forceinline__ void backward_row(const T* __restrict__ g, const T* __restrict__ y, T* __restrict__ gx,
                                             int64_t n, int t, int lanes) {
  using A = at::opmath_type<T>;
  A dot = 0;
  for (int64_t i = int64_t(t) * VEC; i < n; i += int64_t(lanes) * VEC) {
    A gv[VEC], yv[VEC];
    load_vec<T, A, VEC>(g + i, gv);
    load_vec<T, A, VEC>(y + i, yv);
#pragma unroll
    for (int k = 0; k < VEC; ++k) dot += gv[k] * yv[k];
  }
  dot = BLOCK ? block_sum(dot) : warp_sum(dot);
  for (int64_t i = int64_t(t) * VEC; i < n; i += int64_t(lanes) * VEC) {
    A gv[VEC], yv[VEC];
    load_vec<T, A, VEC>(g + i, gv);
    load_vec<T, A, VEC>(y + i, yv);
#pragma unroll
    for (int k = 0; k < VEC; ++k) gv[k] = yv[k] * (gv[k] - dot);
    store_vec<T, A, VEC>(gx + i, gv);
  }
}

template <typename T, int VEC>
__global__ void softmax_backward_warp(const T* __restrict__ g, const T* __restrict__ y, T* __restrict__ gx,
                                      int64_t rows, int64_t n) {
  const int64_t row = int64_t(blockIdx.x) * kWarpRowsPerBlock + threadIdx.y;
  if (row >= rows) return;
  backward_row<T, VEC, false>(g + row * n, y + row * n, gx + row * n, n, threadIdx.x, kWarp);
}

template <typename T, int VEC>
__global__ void softmax_backward_block(const T* __restrict__ g, const T* __restrict__ y, T* __restrict__ gx,
                                       int64_t n) {
  const int64_t row = blockIdx.x;
  backward_row<T, VEC, true>(g + row * n, y + row * n, gx + row * n, n, threadIdx.x, blockDim.x);
}

// 16-byte vectors when every row starts on a 16-byte boundary; otherwise one element at a time.
template <typename T>
bool can_vectorize(int64_t n, std::initializer_list<const void*> ptrs) {
  constexpr int vec = 16 / sizeof(T);
  if (n % vec != 0) return false;
  for (const void* p : ptrs) {
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

int block_threads(int64_t n, int vec) {
  const int64_t per_thread_work = (n + vec - 1) / vec;
  int threads = 256;
  while (threads < 1024 && per_thread_work > int64_t(threads) * 8) threads *= 2;  // >= ~8 vectors per thread
  return threads;
}

void check_input(const at::Tensor& t, const char* op, const char* arg) {
  TORCH_CHECK(t.is_cuda(), op, ": expected ", arg, " on a CUDA device, got ", t.device());
  const auto dt = t.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kHalf || dt == at::kBFloat16 || dt == at::kDouble, op, ": expected ",
              arg, " of dtype float32, float16, bfloat16 or float64, got ", dt);
  TORCH_CHECK(t.dim() >= 1, op, ": expected ", arg,
              " with at least 1 dimension (softmax runs over the last one), got a 0-d tensor");
  TORCH_CHECK(t.is_contiguous(), op, ": expected a contiguous ", arg, ", got sizes ", t.sizes(), " with strides ",
              t.strides(), "; call .contiguous() first");
}

at::Tensor softmax_forward_cuda(const at::Tensor& x, int64_t algorithm) {
  check_input(x, "fused softmax (CUDA)", "x");
  TORCH_CHECK(algorithm >= 0 && algorithm <= 2,
              "fused softmax: algorithm must be 0 (auto), 1 (three-pass) or 2 (online), got ", algorithm);
  // The GPU kernels are always online (one exp more per element, no stored intermediate). The row is NOT held in
  // registers or shared memory: the second pass re-reads x from global memory and relies on L1/L2 hits.
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty_like(x);
  if (x.numel() == 0) return y;
  const int64_t n = x.size(-1);
  const int64_t rows = x.numel() / n;
  TORCH_CHECK(rows <= int64_t(std::numeric_limits<int32_t>::max()) * kWarpRowsPerBlock,
              "fused softmax (CUDA): too many rows for one launch: ", rows);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fused_softmax_forward_cuda", [&] {
    constexpr int VEC = 16 / sizeof(scalar_t);
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    scalar_t* yp = y.mutable_data_ptr<scalar_t>();
    const bool vec = can_vectorize<scalar_t>(n, {xp, yp});
    if (n <= kWarpMaxCols) {
      const dim3 block(kWarp, kWarpRowsPerBlock);
      const dim3 grid(static_cast<unsigned>((rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock));
      if (vec) {
        softmax_forward_warp<scalar_t, VEC><<<grid, block, 0, stream>>>(xp, yp, rows, n);
      } else {
        softmax_forward_warp<scalar_t, 1><<<grid, block, 0, stream>>>(xp, yp, rows, n);
      }
    } else {
      TORCH_CHECK(rows <= std::numeric_limits<int32_t>::max(), "fused softmax (CUDA): too many rows: ", rows);
      const unsigned grid = static_cast<unsigned>(rows);
      if (vec) {
        softmax_forward_block<scalar_t, VEC><<<grid, block_threads(n, VEC), 0, stream>>>(xp, yp, n);
      } else {
        softmax_forward_block<scalar_t, 1><<<grid, block_threads(n, 1), 0, stream>>>(xp, yp, n);
      }
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return y;
}

at::Tensor softmax_backward_cuda(const at::Tensor& grad_y, const at::Tensor& y) {
  check_input(grad_y, "fused softmax backward (CUDA)", "grad_y");
  check_input(y, "fused softmax backward (CUDA)", "y");
  TORCH_CHECK(grad_y.sizes() == y.sizes(), "fused softmax backward: grad_y and y must have the same shape, got ",
              grad_y.sizes(), " and ", y.sizes());
  TORCH_CHECK(grad_y.scalar_type() == y.scalar_type() && grad_y.device() == y.device(),
              "fused softmax backward: grad_y and y must share dtype and device, got ", grad_y.scalar_type(), " on ",
              grad_y.device(), " and ", y.scalar_type(), " on ", y.device());
  const c10::cuda::CUDAGuard guard(y.device());
  at::Tensor gx = at::empty_like(y);
  if (y.numel() == 0) return gx;
  const int64_t n = y.size(-1);
  const int64_t rows = y.numel() / n;
  TORCH_CHECK(rows <= std::numeric_limits<int32_t>::max(), "fused softmax backward (CUDA): too many rows: ", rows);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, y.scalar_type(), "fused_softmax_backward_cuda", [&] {
    constexpr int VEC = 16 / sizeof(scalar_t);
    const scalar_t* gp = grad_y.const_data_ptr<scalar_t>();
    const scalar_t* yp = y.const_data_ptr<scalar_t>();
    scalar_t* op = gx.mutable_data_ptr<scalar_t>();
    const bool vec = can_vectorize<scalar_t>(n, {gp, yp, op});
    if (n <= kWarpMaxCols) {
      const dim3 block(kWarp, kWarpRowsPerBlock);
      const dim3 grid(static_cast<unsigned>((rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock));
      if (vec) {
        softmax_backward_warp<scalar_t, VEC><<<grid, block, 0, stream>>>(gp, yp, op, rows, n);
      } else {
        softmax_backward_warp<scalar_t, 1><<<grid, block, 0, stream>>>(gp, yp, op, rows, n);
      }
    } else {
      const unsigned grid = static_cast<unsigned>(rows);
      if (vec) {
        softmax_backward_block<scalar_t, VEC><<<grid, block_threads(n, VEC), 0, stream>>>(gp, yp, op, n);
      } else {
        softmax_backward_block<scalar_t, 1><<<grid, block_threads(n, 1), 0, stream>>>(gp, yp, op, n);
      }
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return gx;
}

}  // namespace

WB_LIBRARY_IMPL(WB_NAMESPACE, CUDA, m) {
  m.impl("softmax_forward", &softmax_forward_cuda);
  m.impl("softmax_backward", &softmax_backward_cuda);
}
