// Fused softmax over the last dimension, CUDA kernels (lesson 06, notebooks/06_fused_softmax.ipynb).
//
// The operator schemas are defined in softmax.cpp; this file adds their CUDA implementations
// (TORCH_LIBRARY_IMPL(..., CUDA, ...)). utils/kernels/__init__.py builds both files into one library with
// build(cuda=True) on a machine with a GPU, and compile-checks this file alone with nvcc where there is none.
//
// The forward picks one of four paths by where a row can live while it is normalized (softmax_forward_cuda):
//   1. n <= 1024       registers: a group of lanes per row (several tiny rows per warp; a whole warp from 33
//                      columns), each lane holding its share of the row: one global read, max and sum by shuffles.
//   2. fits in smem    shared memory: one block per row copies the row in once (16-byte vectors between a scalar
//                      head and tail), then max, sum and the write read shared memory: one global read.
//   3. longer rows     online two-pass: a running (max, sum) per thread from one read, merged across threads with
//                      (m1, s1) + (m2, s2) = (m, s1 e^(m1-m) + s2 e^(m2-m)), m = max(m1, m2); a second global
//                      read for the write. Only rows that fit nowhere on chip pay it.
//   4. few long rows   split-row: when the rows cannot fill the GPU, each row is cut into chunks, one block per
//                      chunk computes its (max, sum), and a second kernel merges the row's pairs and writes its chunk.
// Stores of y are streaming (__stcs, evict-first): nothing in the kernel reads y back. The backward keeps the simple
// shape: a warp per row up to 1024 elements, a block per row beyond, two reads of (g, y).

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#ifndef WB_NAMESPACE
#define WB_NAMESPACE workbook_kernels
#endif
#define WB_LIBRARY_IMPL(ns, k, m) TORCH_LIBRARY_IMPL(ns, k, m)

namespace {

constexpr int kWarp = 32;
constexpr int kWarpRowsPerBlock = 4;  // register kernel: 4 warps per block (each warp one row, or several tiny ones)
constexpr int64_t kWarpMaxCols = 1024;  // longest row held in registers: 32 lanes x 32 elements
constexpr int kSplitThreads = 512;      // split-row kernels: threads per block (one block per chunk of a row)
constexpr int64_t kSplitMinChunk = 8192;  // split-row: no chunk shorter than this (launch and merge costs)
constexpr int kSplitMaxChunks = 64;       // split-row: at most this many chunks (pairs merged per row)

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
  A s = m == st.m ? st.s : st.s * fast_exp(st.m - m);  // rescale only when the max moved (rare after a few vectors)
#pragma unroll
  for (int k = 0; k < VEC; ++k) s += fast_exp(v[k] - m);
  return {m, s};
}

// Shuffle reductions over a group of WIDTH lanes (a power of two dividing 32; xor offsets below WIDTH stay inside
// the group, so several rows can share one warp).
template <typename A, int WIDTH = kWarp>
__device__ __forceinline__ MaxSum<A> warp_reduce(MaxSum<A> st) {
#pragma unroll
  for (int offset = WIDTH / 2; offset > 0; offset >>= 1) {
    MaxSum<A> other{__shfl_xor_sync(0xffffffffu, st.m, offset), __shfl_xor_sync(0xffffffffu, st.s, offset)};
    st = merge(st, other);
  }
  return st;
}

template <typename A, int WIDTH = kWarp>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int offset = WIDTH / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

template <typename A, int WIDTH = kWarp>
__device__ __forceinline__ A warp_max(A v) {
#pragma unroll
  for (int offset = WIDTH / 2; offset > 0; offset >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, offset));
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

// Block-wide sum (MAX = false) or NaN-propagating max (MAX = true), the result in every thread. The trailing
// __syncthreads lets the caller reduce again with the same scratch.
template <typename A, bool MAX>
__device__ __forceinline__ A block_reduce_one(A v) {
  __shared__ A shm[kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  const A identity = MAX ? -std::numeric_limits<A>::infinity() : A(0);
  v = MAX ? warp_max(v) : warp_sum(v);
  if (lane == 0) shm[warp] = v;
  __syncthreads();
  if (warp == 0) {
    A w = lane < warps ? shm[lane] : identity;
    w = MAX ? warp_max(w) : warp_sum(w);
    if (lane == 0) shm[0] = w;
  }
  __syncthreads();
  const A out = shm[0];
  __syncthreads();
  return out;
}

template <typename A>
__device__ __forceinline__ A block_sum(A v) { return block_reduce_one<A, false>(v); }

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

// Streaming (evict-first) stores for y: 16 bytes at a time where the type allows, element by element otherwise.
__device__ __forceinline__ void store_stream(float* p, float v) { __stcs(p, v); }
__device__ __forceinline__ void store_stream(double* p, double v) { __stcs(p, v); }
template <typename T>
__device__ __forceinline__ void store_stream(T* p, T v) { *p = v; }  // half, bfloat16: a plain store

template <typename T, typename A, int VEC>
__device__ __forceinline__ void store_vec_stream(T* p, const A (&in)[VEC]) {
  if constexpr (sizeof(T) * VEC == 16 && sizeof(T) == 4) {
    __stcs(reinterpret_cast<float4*>(p), make_float4(in[0], in[1], in[2], in[3]));
  } else if constexpr (sizeof(T) * VEC == 16 && sizeof(T) == 8) {
    __stcs(reinterpret_cast<double2*>(p), make_double2(in[0], in[1]));
  } else if constexpr (sizeof(T) * VEC == 16) {  // 8 halves or bfloat16s: pack, then store the bits as a uint4
    Pack<T, VEC> pack;
#pragma unroll
    for (int k = 0; k < VEC; ++k) pack.v[k] = static_cast<T>(in[k]);
    __stcs(reinterpret_cast<uint4*>(p), *reinterpret_cast<const uint4*>(&pack));
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) store_stream(p + k, static_cast<T>(in[k]));
  }
}

// The elements before the first 16-byte boundary of p: a row (or chunk) starts anywhere when n is not a multiple of
// the vector width, so it is walked as a scalar head, a body of VEC-element vectors and a scalar tail.
template <typename T, int VEC>
__device__ __forceinline__ int64_t head_len(const T* p, int64_t len) {
  const int64_t misaligned = int64_t((reinterpret_cast<std::uintptr_t>(p) / sizeof(T)) % VEC);
  return misaligned == 0 ? 0 : (len < VEC - misaligned ? len : VEC - misaligned);
}

// Visit [0, len) of a row with threads t = 0..lanes-1: f(i, v) with v an array of VEC values at i (the body) or of
// one value (head and tail). Every element is visited exactly once.
template <typename T, int VEC, typename Scalar, typename Vector>
__device__ __forceinline__ void for_each(const T* p, int64_t len, int t, int lanes, Scalar&& scalar, Vector&& vector) {
  const int64_t head = head_len<T, VEC>(p, len);
  const int64_t body_end = head + (len - head) / VEC * VEC;
  for (int64_t i = t; i < head; i += lanes) scalar(i);
  for (int64_t i = head + int64_t(t) * VEC; i < body_end; i += int64_t(lanes) * VEC) vector(i);
  for (int64_t i = body_end + t; i < len; i += lanes) scalar(i);
}

// Online (max, sum) of x[0, len) across threads t of `lanes` (not yet reduced across them).
template <typename T, typename A, int VEC>
__device__ __forceinline__ MaxSum<A> online_stats(const T* __restrict__ x, int64_t len, int t, int lanes) {
  MaxSum<A> st{-std::numeric_limits<A>::infinity(), A(0)};
  for_each<T, VEC>(
      x, len, t, lanes,
      [&](int64_t i) {
        const A v[1] = {static_cast<A>(x[i])};
        st = update<A, 1>(st, v);
      },
      [&](int64_t i) {
        A v[VEC];
        load_vec<T, A, VEC>(x + i, v);
        st = update<A, VEC>(st, v);
      });
  return st;
}

// y[0, len) = exp(x - m) * inv, reading x from global memory (the online and split paths' second read).
template <typename T, typename A, int VEC>
__device__ __forceinline__ void write_normalized(const T* __restrict__ x, T* __restrict__ y, int64_t len, A m, A inv,
                                                 int t, int lanes) {
  for_each<T, VEC>(
      x, len, t, lanes,
      [&](int64_t i) { store_stream(y + i, static_cast<T>(fast_exp(static_cast<A>(x[i]) - m) * inv)); },
      [&](int64_t i) {
        A v[VEC];
        load_vec<T, A, VEC>(x + i, v);
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[k] = fast_exp(v[k] - m) * inv;
        store_vec_stream<T, A, VEC>(y + i, v);
      });
}

// BEGIN cuda-row
// Rows of up to 1024 elements live in registers. GROUP lanes share a row (a power of two: 32 for rows longer than
// 32 elements, fewer for tiny rows, so a warp holds 32 / GROUP rows); lane j of the group holds elements
// j, j + GROUP, j + 2 GROUP, ... (ITEMS of them), so neighbouring lanes read neighbouring addresses (coalesced).
// One read of x; the max and the sum reduce over registers and shuffles; one write of y. Elements past the row's
// end are -inf, which adds exp(-inf) = 0 to the sum.
template <typename T, int GROUP, int ITEMS>
__global__ void softmax_forward_warp(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t n) {
  using A = at::opmath_type<T>;
  constexpr int kRowsPerWarp = kWarp / GROUP;
  const int lane = threadIdx.x % GROUP;
  const int64_t row = (int64_t(blockIdx.x) * kWarpRowsPerBlock + threadIdx.y) * kRowsPerWarp + threadIdx.x / GROUP;
  const bool active = row < rows;  // inactive lanes stay for the shuffles, holding -inf, and never touch memory
  const T* xr = x + (active ? row : 0) * n;
  A v[ITEMS];
  A m = -std::numeric_limits<A>::infinity();
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int64_t i = lane + int64_t(k) * GROUP;
    v[k] = (active && i < n) ? static_cast<A>(xr[i]) : -std::numeric_limits<A>::infinity();
    m = nan_max(m, v[k]);
  }
  m = warp_max<A, GROUP>(m);
  A s = 0;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    v[k] = fast_exp(v[k] - m);  // an all -inf row: exp(NaN) = NaN everywhere, as torch.softmax gives
    s += (lane + int64_t(k) * GROUP < n) ? v[k] : A(0);
  }
  const A inv = A(1) / warp_sum<A, GROUP>(s);
  if (!active) return;
  T* yr = y + row * n;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int64_t i = lane + int64_t(k) * GROUP;
    if (i < n) store_stream(yr + i, static_cast<T>(v[k] * inv));
  }
}
// END cuda-row

// Rows that fit in shared memory: one block per row, one global read into shared memory (as A, so fp16/bf16 are
// widened once), then max, sum and the write read shared memory.
template <typename T, int VEC>
__global__ void softmax_forward_smem(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  using A = at::opmath_type<T>;
  extern __shared__ unsigned char smem_raw[];
  A* row_smem = reinterpret_cast<A*>(smem_raw);
  const int64_t row = blockIdx.x;
  const T* xr = x + row * n;
  T* yr = y + row * n;
  const int t = threadIdx.x, lanes = blockDim.x;
  A m = -std::numeric_limits<A>::infinity();
  for_each<T, VEC>(
      xr, n, t, lanes,
      [&](int64_t i) {
        const A v = static_cast<A>(xr[i]);
        row_smem[i] = v;
        m = nan_max(m, v);
      },
      [&](int64_t i) {
        A v[VEC];
        load_vec<T, A, VEC>(xr + i, v);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          row_smem[i + k] = v[k];
          m = nan_max(m, v[k]);
        }
      });
  m = block_reduce_one<A, true>(m);  // its __syncthreads also publishes row_smem to the whole block
  A s = 0;
  for (int64_t i = t; i < n; i += lanes) s += fast_exp(row_smem[i] - m);
  const A inv = A(1) / block_reduce_one<A, false>(s);
  for_each<T, VEC>(
      yr, n, t, lanes, [&](int64_t i) { store_stream(yr + i, static_cast<T>(fast_exp(row_smem[i] - m) * inv)); },
      [&](int64_t i) {
        A v[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[k] = fast_exp(row_smem[i + k] - m) * inv;
        store_vec_stream<T, A, VEC>(yr + i, v);
      });
}

// Rows too long for shared memory: online statistics in one read, the write in a second.
template <typename T, int VEC>
__global__ void softmax_forward_block(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  using A = at::opmath_type<T>;
  const int64_t row = blockIdx.x;
  const MaxSum<A> st = block_reduce(online_stats<T, A, VEC>(x + row * n, n, threadIdx.x, blockDim.x));
  const A inv = A(1) / st.s;  // all -inf row: m = -inf, s = 0 -> exp(NaN) * inf = NaN, as torch.softmax gives
  write_normalized<T, A, VEC>(x + row * n, y + row * n, n, st.m, inv, threadIdx.x, blockDim.x);
}

// Few long rows: blockIdx.y is the row, blockIdx.x its chunk of `chunk` elements. Pass 1 writes one (max, sum) per
// chunk; pass 2 merges the row's pairs (every block of the row does the same merge) and writes its chunk.
template <typename T, int VEC>
__global__ void softmax_split_stats(const T* __restrict__ x, int64_t n, int64_t chunk, float2* __restrict__ part,
                                    double2* __restrict__ part64) {
  using A = at::opmath_type<T>;
  const int64_t row = blockIdx.y, begin = int64_t(blockIdx.x) * chunk,
                len = chunk < n - begin ? chunk : n - begin;
  const MaxSum<A> st = block_reduce(online_stats<T, A, VEC>(x + row * n + begin, len, threadIdx.x, blockDim.x));
  if (threadIdx.x == 0) {
    const int64_t slot = row * gridDim.x + blockIdx.x;
    if constexpr (sizeof(A) == 8) {
      part64[slot] = make_double2(st.m, st.s);
    } else {
      part[slot] = make_float2(st.m, st.s);
    }
  }
}

template <typename T, int VEC>
__global__ void softmax_split_write(const T* __restrict__ x, T* __restrict__ y, int64_t n, int64_t chunk,
                                    const float2* __restrict__ part, const double2* __restrict__ part64) {
  using A = at::opmath_type<T>;
  const int64_t row = blockIdx.y, begin = int64_t(blockIdx.x) * chunk,
                len = chunk < n - begin ? chunk : n - begin;
  MaxSum<A> st{-std::numeric_limits<A>::infinity(), A(0)};
  for (int c = threadIdx.x; c < int(gridDim.x); c += blockDim.x) {  // at most kSplitMaxChunks pairs per row
    const int64_t slot = row * gridDim.x + c;
    if constexpr (sizeof(A) == 8) {
      st = merge(st, MaxSum<A>{part64[slot].x, part64[slot].y});
    } else {
      st = merge(st, MaxSum<A>{part[slot].x, part[slot].y});
    }
  }
  st = block_reduce(st);
  const A inv = A(1) / st.s;
  write_normalized<T, A, VEC>(x + row * n + begin, y + row * n + begin, len, st.m, inv, threadIdx.x, blockDim.x);
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

// Backward: 16-byte vectors when n is a multiple of the vector width and every pointer is 16-byte aligned.
template <typename T>
bool can_vectorize(int64_t n, std::initializer_list<const void*> ptrs) {
  constexpr int vec = 16 / sizeof(T);
  if (n % vec != 0) return false;
  for (const void* p : ptrs) {
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

// Forward: vectors between a scalar head and tail need only x and y to sit at the same offset from a 16-byte boundary
// (then every row of both starts at the same offset too).
bool same_alignment(const void* a, const void* b) {
  return reinterpret_cast<std::uintptr_t>(a) % 16 == reinterpret_cast<std::uintptr_t>(b) % 16;
}

int block_threads(int64_t n, int vec) {
  const int64_t per_thread_work = (n + vec - 1) / vec;
  int threads = 256;
  while (threads < 1024 && per_thread_work > int64_t(threads) * 8) threads *= 2;  // >= ~8 vectors per thread
  return threads;
}

// Register kernel for rows of n <= kWarpMaxCols: the smallest group of lanes and items per lane that hold the row.
template <typename T>
void launch_warp(const T* xp, T* yp, int64_t rows, int64_t n, cudaStream_t stream) {
  auto go = [&](auto group_c, auto items_c) {
    constexpr int G = decltype(group_c)::value, I = decltype(items_c)::value;
    const int64_t rows_per_block = int64_t(kWarpRowsPerBlock) * (kWarp / G);
    const dim3 block(kWarp, kWarpRowsPerBlock);
    const dim3 grid(static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block));
    softmax_forward_warp<T, G, I><<<grid, block, 0, stream>>>(xp, yp, rows, n);
  };
  using std::integral_constant;
  if (n <= 1) return go(integral_constant<int, 1>{}, integral_constant<int, 1>{});
  if (n <= 2) return go(integral_constant<int, 2>{}, integral_constant<int, 1>{});
  if (n <= 4) return go(integral_constant<int, 4>{}, integral_constant<int, 1>{});
  if (n <= 8) return go(integral_constant<int, 8>{}, integral_constant<int, 1>{});
  if (n <= 16) return go(integral_constant<int, 16>{}, integral_constant<int, 1>{});
  if (n <= 32) return go(integral_constant<int, 32>{}, integral_constant<int, 1>{});
  if (n <= 64) return go(integral_constant<int, 32>{}, integral_constant<int, 2>{});
  if (n <= 128) return go(integral_constant<int, 32>{}, integral_constant<int, 4>{});
  if (n <= 256) return go(integral_constant<int, 32>{}, integral_constant<int, 8>{});
  if (n <= 512) return go(integral_constant<int, 32>{}, integral_constant<int, 16>{});
  return go(integral_constant<int, 32>{}, integral_constant<int, 32>{});
}

// Longest row the shared-memory kernel takes: half the opt-in shared memory per block, so two blocks fit per SM.
int64_t smem_max_cols(int device, size_t bytes_per_element) {
  int optin = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return (int64_t(optin) / 2 - 1024) / int64_t(bytes_per_element);
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

// BEGIN cuda-dispatch
at::Tensor softmax_forward_cuda(const at::Tensor& x, int64_t algorithm) {
  check_input(x, "fused softmax (CUDA)", "x");
  TORCH_CHECK(algorithm >= 0 && algorithm <= 2,
              "fused softmax: algorithm must be 0 (auto), 1 (three-pass) or 2 (online), got ", algorithm);
  // `algorithm` selects the CPU kernel's loop; on the GPU the path follows from where a row fits.
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty_like(x);
  if (x.numel() == 0) return y;
  const int64_t n = x.size(-1);
  const int64_t rows = x.numel() / n;
  TORCH_CHECK(rows <= std::numeric_limits<int32_t>::max(), "fused softmax (CUDA): too many rows for one launch: ",
              rows);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int device = x.get_device();
  int sms = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fused_softmax_forward_cuda", [&] {
    using A = at::opmath_type<scalar_t>;
    constexpr int VEC = 16 / sizeof(scalar_t);
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    scalar_t* yp = y.mutable_data_ptr<scalar_t>();
    const bool vec = same_alignment(xp, yp);
    if (n <= kWarpMaxCols) {  // 1. the row in registers
      launch_warp<scalar_t>(xp, yp, rows, n, stream);
    } else if (vec && rows < sms && n >= 2 * kSplitMinChunk) {  // 4. too few rows to fill the GPU: split them
      int64_t chunks = std::min<int64_t>({kSplitMaxChunks, (2 * sms + rows - 1) / rows, n / kSplitMinChunk});
      const int64_t chunk = ((n + chunks - 1) / chunks + 15) / 16 * 16;
      chunks = (n + chunk - 1) / chunk;
      at::Tensor part = at::empty({rows, chunks, 2}, x.options().dtype(sizeof(A) == 8 ? at::kDouble : at::kFloat));
      float2* p32 = sizeof(A) == 8 ? nullptr : reinterpret_cast<float2*>(part.mutable_data_ptr());
      double2* p64 = sizeof(A) == 8 ? reinterpret_cast<double2*>(part.mutable_data_ptr()) : nullptr;
      const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(rows));
      softmax_split_stats<scalar_t, VEC><<<grid, kSplitThreads, 0, stream>>>(xp, n, chunk, p32, p64);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      softmax_split_write<scalar_t, VEC><<<grid, kSplitThreads, 0, stream>>>(xp, yp, n, chunk, p32, p64);
    } else if (n <= smem_max_cols(device, sizeof(A))) {  // 2. the row in shared memory
      const size_t bytes = size_t(n) * sizeof(A);
      auto kernel = softmax_forward_smem<scalar_t, VEC>;
      if (bytes > 48 * 1024) {
        C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
      }
      kernel<<<static_cast<unsigned>(rows), block_threads(n, VEC), bytes, stream>>>(xp, yp, n);
    } else if (vec) {  // 3. online: statistics in one read, the write in a second
      softmax_forward_block<scalar_t, VEC><<<static_cast<unsigned>(rows), block_threads(n, VEC), 0, stream>>>(xp, yp, n);
    } else {
      softmax_forward_block<scalar_t, 1><<<static_cast<unsigned>(rows), block_threads(n, 1), 0, stream>>>(xp, yp, n);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return y;
}
// END cuda-dispatch

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
